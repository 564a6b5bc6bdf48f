package mirror

import (
	"encoding/json"
	"unicode/utf16"
	"unicode/utf8"
)

// replaceModel appends to dst the JSON object body with every top-level
// "model" member's value replaced by model (a JSON decoder sees the last
// duplicate; all are replaced so that none survives), and returns it.
// Nested "model" keys (in messages, metadata, tools) are left alone and the
// other bytes are copied untouched. A body that is not a JSON object, or
// has no top-level "model", is appended unchanged.
func replaceModel(dst, body []byte, model string) []byte {
	quoted, err := json.Marshal(model)
	if err != nil {
		return append(dst, body...)
	}
	return replaceModelQuoted(dst, body, quoted)
}

// replaceModelQuoted is replaceModel with the model already encoded as a
// JSON string. It walks the object's members with the byte scanner of
// usage.go (no decoding, no allocation): keys are compared after their
// escapes are decoded, as a JSON decoder sees them. A body it cannot walk
// (unbalanced brackets or quotes, a missing colon or comma, trailing
// bytes) is appended unchanged; other breaks of JSON's rules are not looked
// for (the engine refuses such a body, mirrored or not).
func replaceModelQuoted(dst, body, quoted []byte) []byte {
	start := len(dst)
	last := 0 // body[:last] is in dst
	i := skipSpace(body, 0)
	if i >= len(body) || body[i] != '{' {
		return append(dst, body...)
	}
	i = skipSpace(body, i+1)
	if i < len(body) && body[i] == '}' {
		return append(dst, body...) // no members
	}
	for {
		key, j, ok := scanString(body, i)
		if !ok {
			return append(dst[:start], body...)
		}
		i = skipSpace(body, j)
		if i >= len(body) || body[i] != ':' {
			return append(dst[:start], body...)
		}
		i = skipSpace(body, i+1)
		v := i
		if i, ok = skipValue(body, i); !ok {
			return append(dst[:start], body...)
		}
		if keyIs(key, "model") {
			dst = append(dst, body[last:v]...)
			dst = append(dst, quoted...)
			last = i
		}
		i = skipSpace(body, i)
		if i >= len(body) {
			return append(dst[:start], body...)
		}
		if body[i] == '}' {
			break
		}
		if body[i] != ',' {
			return append(dst[:start], body...)
		}
		i = skipSpace(body, i+1)
	}
	if skipSpace(body, i+1) != len(body) {
		return append(dst[:start], body...)
	}
	return append(dst, body[last:]...)
}

// keyIs reports whether the raw contents of a JSON string (escapes not
// decoded) decode to want.
func keyIs(raw []byte, want string) bool {
	for len(raw) > 0 {
		if raw[0] != '\\' {
			if len(want) == 0 || raw[0] != want[0] {
				return false
			}
			raw, want = raw[1:], want[1:]
			continue
		}
		if len(raw) < 2 {
			return false
		}
		var r rune
		switch raw[1] {
		case '"', '\\', '/':
			r = rune(raw[1])
		case 'b':
			r = '\b'
		case 'f':
			r = '\f'
		case 'n':
			r = '\n'
		case 'r':
			r = '\r'
		case 't':
			r = '\t'
		case 'u':
			var ok bool
			if r, ok = hex4(raw[2:]); !ok {
				return false
			}
			raw = raw[4:]
			if utf16.IsSurrogate(r) {
				r2, ok := rune(0), false
				if len(raw) >= 8 && raw[2] == '\\' && raw[3] == 'u' {
					r2, ok = hex4(raw[4:])
				}
				if dec := utf16.DecodeRune(r, r2); ok && dec != utf8.RuneError {
					r = dec
					raw = raw[6:]
				} else {
					r = utf8.RuneError
				}
			}
		default:
			return false
		}
		raw = raw[2:]
		var b [utf8.UTFMax]byte
		n := utf8.EncodeRune(b[:], r)
		if len(want) < n || string(b[:n]) != want[:n] {
			return false
		}
		want = want[n:]
	}
	return len(want) == 0
}

func hex4(b []byte) (rune, bool) {
	if len(b) < 4 {
		return 0, false
	}
	var r rune
	for _, c := range b[:4] {
		switch {
		case c >= '0' && c <= '9':
			c -= '0'
		case c >= 'a' && c <= 'f':
			c -= 'a' - 10
		case c >= 'A' && c <= 'F':
			c -= 'A' - 10
		default:
			return 0, false
		}
		r = r<<4 | rune(c)
	}
	return r, true
}
