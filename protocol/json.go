package protocol

import (
	"bytes"
	"strconv"

	"github.com/infera/infera/internal/jsonscan"
)

// A validating JSON walker that never allocates (internal/jsonscan):
// request and response bodies are walked once per level, values are
// located by [start, end) spans, and strings are copied to the output in
// their escaped form (a validated JSON string body stays valid wherever it
// is pasted). Keys and the few values that steer conversion are compared
// decoded, so "t\u0065xt" is "text", as the engine's decoder would read it.
// The functions below fix the package's depth bound; they inline to the
// jsonscan calls. fields and elems re-walk values already validated
// without validating them again.

// maxDepth bounds nesting: deeper documents are refused, so work and stack
// stay bounded whatever the input.
const maxDepth = 128

var errMalformed = jsonscan.ErrSyntax

func isSpace(c byte) bool { return jsonscan.IsSpace(c) }

func skipSpace(d []byte, i int) int { return jsonscan.SkipSpace(d, i) }

// skipValue validates the value starting at or after d[i], nested depth
// deep, and returns the index after it.
func skipValue(d []byte, i, depth int) (int, error) {
	return jsonscan.SkipValue(d, i, maxDepth-depth)
}

// unescape appends the decoded form of a validated raw string to dst.
// Lone surrogates decode to U+FFFD, as Python's decoder keeps them but
// cannot encode them to UTF-8.
func unescape(dst, raw []byte) []byte { return jsonscan.Unescape(dst, raw) }

// walkObject validates the object at d[i] (nested depth deep), calling f,
// when non-nil, for each member with its decoded key and the value's span.
// It returns the index after the object. Keys with escapes are decoded into
// a fresh slice (rare: no real client escapes key names).
func walkObject(d []byte, i, depth int, f func(key []byte, vs, ve int) error) (int, error) {
	return jsonscan.WalkObject(d, i, maxDepth-depth, f)
}

// fields walks the object value v, which must lie inside a document
// already validated (by walkObject or skipValue), calling f for
// each member. It skips values without validating them again, so nested
// walks cost little.
func fields(v []byte, f func(key []byte, vs, ve int) error) error {
	_, err := fieldsAt(v, 0, f)
	return err
}

// fieldsAt is fields for the object at or after v[i]; it returns the
// index after the object.
func fieldsAt(v []byte, i int, f func(key []byte, vs, ve int) error) (int, error) {
	i = skipSpace(v, i)
	if i >= len(v) || v[i] != '{' {
		return 0, errMalformed
	}
	i = skipSpace(v, i+1)
	if i < len(v) && v[i] == '}' {
		return i + 1, nil
	}
	for i < len(v) {
		if v[i] != '"' {
			return 0, errMalformed
		}
		ke := fastString(v, i)
		if ke < 0 {
			return 0, errMalformed
		}
		key := v[i+1 : ke-1]
		i = skipSpace(v, ke)
		if i >= len(v) || v[i] != ':' {
			return 0, errMalformed
		}
		vs := skipSpace(v, i+1)
		ve := fastValue(v, vs, 0)
		if ve < 0 {
			return 0, errMalformed
		}
		if err := f(jsonscan.Key(key), vs, ve); err != nil {
			return 0, err
		}
		i = skipSpace(v, ve)
		if i >= len(v) {
			return 0, errMalformed
		}
		if v[i] == '}' {
			return i + 1, nil
		}
		if v[i] != ',' {
			return 0, errMalformed
		}
		i = skipSpace(v, i+1)
	}
	return 0, errMalformed
}

// elems walks the validated array value v calling f for each element.
func elems(v []byte, f func(vs, ve int) error) error {
	i := skipSpace(v, 0)
	if i >= len(v) || v[i] != '[' {
		return errMalformed
	}
	i = skipSpace(v, i+1)
	if i < len(v) && v[i] == ']' {
		return nil
	}
	for i < len(v) {
		ve := fastValue(v, i, 0)
		if ve < 0 {
			return errMalformed
		}
		if err := f(i, ve); err != nil {
			return err
		}
		i = skipSpace(v, ve)
		if i >= len(v) {
			return errMalformed
		}
		if v[i] == ']' {
			return nil
		}
		if v[i] != ',' {
			return errMalformed
		}
		i = skipSpace(v, i+1)
	}
	return errMalformed
}

// fastString returns the index after the string whose quote is d[i] in a
// validated document, -1 if there is none.
func fastString(d []byte, i int) int {
	i++
	for {
		j := bytes.IndexByte(d[i:], '"')
		if j < 0 {
			return -1
		}
		i += j
		// an escaped quote has an odd run of backslashes before it
		n := 0
		for k := i - 1; k >= 0 && d[k] == '\\'; k-- {
			n++
		}
		i++
		if n%2 == 0 {
			return i
		}
	}
}

// fastValue returns the index after the value at d[i] in a validated
// document (-1 when the bytes are not what validation left).
func fastValue(d []byte, i, depth int) int {
	if i >= len(d) || depth > maxDepth {
		return -1
	}
	switch c := d[i]; c {
	case '"':
		return fastString(d, i)
	case '{', '[':
		close := byte('}')
		if c == '[' {
			close = ']'
		}
		i = skipSpace(d, i+1)
		if i < len(d) && d[i] == close {
			return i + 1
		}
		for i < len(d) {
			if c == '{' {
				if d[i] != '"' {
					return -1
				}
				if i = fastString(d, i); i < 0 {
					return -1
				}
				i = skipSpace(d, i)
				if i >= len(d) || d[i] != ':' {
					return -1
				}
				i = skipSpace(d, i+1)
			}
			if i = fastValue(d, i, depth+1); i < 0 {
				return -1
			}
			i = skipSpace(d, i)
			if i >= len(d) {
				return -1
			}
			if d[i] == close {
				return i + 1
			}
			if d[i] != ',' {
				return -1
			}
			i = skipSpace(d, i+1)
		}
		return -1
	}
	// number or literal: up to the next delimiter
	j := i
	for j < len(d) {
		c := d[j]
		if c == ',' || c == '}' || c == ']' || isSpace(c) {
			break
		}
		j++
	}
	if j == i {
		return -1
	}
	return j
}

// rawStr returns the raw contents of a JSON string value (quotes stripped)
// and whether v is a string.
func rawStr(v []byte) ([]byte, bool) {
	if len(v) < 2 || v[0] != '"' {
		return nil, false
	}
	return v[1 : len(v)-1], true
}

// strIs reports whether the JSON value v is the string s (decoded).
func strIs(v []byte, s string) bool {
	raw, ok := rawStr(v)
	if !ok {
		return false
	}
	if !jsonscan.HasEscape(raw) {
		return string(raw) == s
	}
	if len(raw) > 256 {
		return false
	}
	var buf [256]byte
	return string(unescape(buf[:0], raw)) == s
}

// decodeStr appends the decoded string value v to dst (nothing when v is
// not a string).
func decodeStr(dst, v []byte) []byte {
	raw, ok := rawStr(v)
	if !ok {
		return dst
	}
	return unescape(dst, raw)
}

func isNull(v []byte) bool { return len(v) == 4 && v[0] == 'n' }

func isNumber(v []byte) bool { return len(v) > 0 && (v[0] == '-' || (v[0] >= '0' && v[0] <= '9')) }

// intVal parses a JSON number that must be a non-negative integer (2.0 is
// accepted, as Python and pydantic accept it).
func intVal(v []byte) (int64, bool) {
	if !isNumber(v) {
		return 0, false
	}
	if n, err := strconv.ParseInt(string(v), 10, 64); err == nil {
		return n, n >= 0
	}
	f, err := strconv.ParseFloat(string(v), 64)
	if err != nil || f != float64(int64(f)) || f < 0 || f > 1<<53 {
		return 0, false
	}
	return int64(f), true
}

// appendStr appends s as a JSON string literal; invalid UTF-8 becomes U+FFFD.
func appendStr(dst []byte, s string) []byte { return jsonscan.AppendString(dst, s) }

// appendBytesStr is appendStr for a byte slice.
func appendBytesStr(dst, b []byte) []byte {
	dst = append(dst, '"')
	dst = jsonscan.AppendStringBody(dst, bytesString(b))
	return append(dst, '"')
}

// appendInt appends n in decimal.
func appendInt(dst []byte, n int64) []byte { return strconv.AppendInt(dst, n, 10) }

// compactJSON appends the validated JSON value v without insignificant
// whitespace (so it fits on one SSE data line).
func compactJSON(dst, v []byte) []byte {
	for i := 0; i < len(v); i++ {
		c := v[i]
		if isSpace(c) {
			continue
		}
		if c != '"' {
			dst = append(dst, c)
			continue
		}
		_, j, err := jsonscan.ScanString(v, i)
		if err != nil {
			return append(dst, v[i:]...)
		}
		dst = append(dst, v[i:j]...)
		i = j - 1
	}
	return dst
}

// hasDecodedPrefix reports whether the JSON string body raw decodes to a
// string that starts with p, printable ASCII.
func hasDecodedPrefix(raw []byte, p string) bool {
	i := 0
	for j := 0; j < len(p); j++ {
		if i >= len(raw) {
			return false
		}
		c := raw[i]
		i++
		if c == '\\' {
			if i >= len(raw) {
				return false
			}
			e := raw[i]
			i++
			switch e {
			case '"', '\\', '/':
				c = e
			case 'u':
				if i+4 > len(raw) {
					return false
				}
				r := 0
				for _, h := range raw[i : i+4] {
					switch {
					case h >= '0' && h <= '9':
						r = r<<4 | int(h-'0')
					case h >= 'a' && h <= 'f':
						r = r<<4 | int(h-'a'+10)
					case h >= 'A' && h <= 'F':
						r = r<<4 | int(h-'A'+10)
					default:
						return false
					}
				}
				i += 4
				if r >= 0x80 {
					return false // p is ASCII
				}
				c = byte(r)
			default:
				return false // a control character, which p does not hold
			}
		}
		if c != p[j] {
			return false
		}
	}
	return true
}
