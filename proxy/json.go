package proxy

import (
	"errors"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"
)

// A minimal validating JSON scanner: it walks the request body once, never
// allocates, and extracts the few fields routing needs. Everything else is
// skipped (and validated) without being decoded.

var errJSON = errors.New("malformed JSON")

const maxDepth = 256

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

func skipSpace(d []byte, i int) int {
	for i < len(d) && isSpace(d[i]) {
		i++
	}
	return i
}

// skipValue validates the value starting at d[i] and returns the index after it.
func skipValue(d []byte, i, depth int) (int, error) {
	i = skipSpace(d, i)
	if i >= len(d) {
		return i, errJSON
	}
	switch c := d[i]; {
	case c == '"':
		_, j, err := scanString(d, i)
		return j, err
	case c == '{':
		if depth >= maxDepth {
			return i, errJSON
		}
		return walkObject(d, i, depth, nil)
	case c == '[':
		if depth >= maxDepth {
			return i, errJSON
		}
		return walkArray(d, i, depth, nil)
	case c == 't':
		return lit(d, i, "true")
	case c == 'f':
		return lit(d, i, "false")
	case c == 'n':
		return lit(d, i, "null")
	case c == '-' || (c >= '0' && c <= '9'):
		return scanNumber(d, i)
	}
	return i, errJSON
}

func lit(d []byte, i int, s string) (int, error) {
	if len(d)-i < len(s) || string(d[i:i+len(s)]) != s {
		return i, errJSON
	}
	return i + len(s), nil
}

func scanNumber(d []byte, i int) (int, error) {
	start := i
	if d[i] == '-' {
		i++
	}
	if i >= len(d) {
		return i, errJSON
	}
	if d[i] == '0' {
		i++
	} else if d[i] >= '1' && d[i] <= '9' {
		for i < len(d) && d[i] >= '0' && d[i] <= '9' {
			i++
		}
	} else {
		return i, errJSON
	}
	if i < len(d) && d[i] == '.' {
		i++
		j := i
		for i < len(d) && d[i] >= '0' && d[i] <= '9' {
			i++
		}
		if i == j {
			return i, errJSON
		}
	}
	if i < len(d) && (d[i] == 'e' || d[i] == 'E') {
		i++
		if i < len(d) && (d[i] == '+' || d[i] == '-') {
			i++
		}
		j := i
		for i < len(d) && d[i] >= '0' && d[i] <= '9' {
			i++
		}
		if i == j {
			return i, errJSON
		}
	}
	if i == start {
		return i, errJSON
	}
	return i, nil
}

// scanString validates the string starting at d[i] (a quote) and returns the
// raw contents (escapes not decoded), the index after the closing quote.
func scanString(d []byte, i int) (raw []byte, next int, err error) {
	i++
	start := i
	for i < len(d) {
		c := d[i]
		switch {
		case c == '"':
			return d[start:i], i + 1, nil
		case c == '\\':
			i++
			if i >= len(d) {
				return nil, i, errJSON
			}
			switch d[i] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i++
			case 'u':
				if len(d)-i < 5 || !isHex4(d[i+1:i+5]) {
					return nil, i, errJSON
				}
				i += 5
			default:
				return nil, i, errJSON
			}
		case c < 0x20:
			return nil, i, errJSON
		case c < utf8.RuneSelf:
			i++
		default:
			r, n := utf8.DecodeRune(d[i:])
			if r == utf8.RuneError && n == 1 {
				return nil, i, errJSON
			}
			i += n
		}
	}
	return nil, i, errJSON
}

func isHex4(b []byte) bool {
	for _, c := range b[:4] {
		if !((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F')) {
			return false
		}
	}
	return true
}

func hex4(b []byte) rune {
	var r rune
	for _, c := range b[:4] {
		r <<= 4
		switch {
		case c >= '0' && c <= '9':
			r |= rune(c - '0')
		case c >= 'a' && c <= 'f':
			r |= rune(c - 'a' + 10)
		default:
			r |= rune(c - 'A' + 10)
		}
	}
	return r
}

// unescape appends the decoded form of a validated raw string to dst.
func unescape(dst, raw []byte) []byte {
	for i := 0; i < len(raw); {
		c := raw[i]
		if c != '\\' {
			j := i + 1
			for j < len(raw) && raw[j] != '\\' {
				j++
			}
			dst = append(dst, raw[i:j]...)
			i = j
			continue
		}
		i++
		switch raw[i] {
		case 'b':
			dst = append(dst, '\b')
		case 'f':
			dst = append(dst, '\f')
		case 'n':
			dst = append(dst, '\n')
		case 'r':
			dst = append(dst, '\r')
		case 't':
			dst = append(dst, '\t')
		case 'u':
			r := hex4(raw[i+1:])
			i += 4
			if utf16.IsSurrogate(r) && i+6 < len(raw)+0 && raw[i+1] == '\\' && raw[i+2] == 'u' {
				if r2 := hex4(raw[i+3:]); utf16.DecodeRune(r, r2) != utf8.RuneError {
					r = utf16.DecodeRune(r, r2)
					i += 6
				}
			}
			dst = utf8.AppendRune(dst, r)
		default: // " \ /
			dst = append(dst, raw[i])
		}
		i++
	}
	return dst
}

// forEachField calls f for each member of the object at d[i]; f gets the
// decoded key and the value's [start, end) span. It validates the whole
// object.
func forEachField(d []byte, i int, f func(key []byte, vs, ve int) error) (int, error) {
	return walkObject(d, i, 0, f)
}

// forEachElem calls f for each element span of the array at d[i].
func forEachElem(d []byte, i int, f func(vs, ve int) error) (int, error) {
	return walkArray(d, i, 0, f)
}

// walkObject validates the object at d[i] (nested depth deep), calling f, when
// non-nil, for each member. It returns the index after the object.
func walkObject(d []byte, i, depth int, f func(key []byte, vs, ve int) error) (int, error) {
	return walkMembers(d, i, depth, func(key []byte, vs int) (int, error) {
		ve, err := skipValue(d, vs, depth+1)
		if err != nil || f == nil {
			return ve, err
		}
		return ve, f(key, vs, ve)
	}, f != nil)
}

// walkObjectInline is walkObject for callers that parse some values
// themselves, so that a large value is scanned once, not validated first
// and parsed again: f gets the decoded key and the value's start; it returns
// the value's end, or -1 to let the walker skip (and validate) the value.
func walkObjectInline(d []byte, i int, f func(key []byte, vs int) (int, error)) (int, error) {
	return walkMembers(d, i, 0, func(key []byte, vs int) (int, error) {
		ve, err := f(key, vs)
		if err == nil && ve < 0 {
			return skipValue(d, vs, 1)
		}
		return ve, err
	}, true)
}

// walkMembers walks the object at d[i]: for each member, value(key, vs)
// consumes the value at vs and returns its end. Keys are decoded (escapes
// resolved) only when decodeKeys is set.
func walkMembers(d []byte, i, depth int, value func(key []byte, vs int) (int, error), decodeKeys bool) (int, error) {
	i = skipSpace(d, i)
	if i >= len(d) || d[i] != '{' {
		return i, errJSON
	}
	i = skipSpace(d, i+1)
	if i < len(d) && d[i] == '}' {
		return i + 1, nil
	}
	for {
		i = skipSpace(d, i)
		if i >= len(d) || d[i] != '"' {
			return i, errJSON
		}
		key, j, err := scanString(d, i)
		if err != nil {
			return j, err
		}
		if decodeKeys && hasEscape(key) {
			// Compare keys as the engine's JSON decoder sees them:
			// "mod\u0065l" is "model". Rare (hostile) input: allocate.
			key = unescape(nil, key)
		}
		i = skipSpace(d, j)
		if i >= len(d) || d[i] != ':' {
			return i, errJSON
		}
		vs := skipSpace(d, i+1)
		if vs >= len(d) {
			return vs, errJSON
		}
		ve, err := value(key, vs)
		if err != nil {
			return ve, err
		}
		i = skipSpace(d, ve)
		if i >= len(d) {
			return i, errJSON
		}
		if d[i] == '}' {
			return i + 1, nil
		}
		if d[i] != ',' {
			return i, errJSON
		}
		i++
	}
}

// walkArray is walkObject for arrays.
func walkArray(d []byte, i, depth int, f func(vs, ve int) error) (int, error) {
	i = skipSpace(d, i)
	if i >= len(d) || d[i] != '[' {
		return i, errJSON
	}
	i = skipSpace(d, i+1)
	if i < len(d) && d[i] == ']' {
		return i + 1, nil
	}
	for {
		vs := skipSpace(d, i)
		ve, err := skipValue(d, vs, depth+1)
		if err != nil {
			return ve, err
		}
		if f != nil {
			if err := f(vs, ve); err != nil {
				return ve, err
			}
		}
		i = skipSpace(d, ve)
		if i >= len(d) {
			return i, errJSON
		}
		if d[i] == ']' {
			return i + 1, nil
		}
		if d[i] != ',' {
			return i, errJSON
		}
		i++
	}
}

func parseInt(v []byte) (int, bool) {
	n, err := strconv.ParseInt(string(v), 10, 64) // no alloc: compiler optimises string(v)
	if err != nil || n < 0 || n > 1<<31 {
		return 0, false
	}
	return int(n), true
}

// appendJSONString appends s as a JSON string literal (invalid UTF-8 is
// replaced by U+FFFD).
func appendJSONString(dst []byte, s string) []byte {
	const hex = "0123456789abcdef"
	dst = append(dst, '"')
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			switch {
			case c == '"' || c == '\\':
				dst = append(dst, '\\', c)
			case c == '\n':
				dst = append(dst, '\\', 'n')
			case c == '\r':
				dst = append(dst, '\\', 'r')
			case c == '\t':
				dst = append(dst, '\\', 't')
			case c < 0x20:
				dst = append(dst, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
			default:
				dst = append(dst, c)
			}
			i++
			continue
		}
		r, n := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && n == 1 {
			dst = append(dst, "\ufffd"...)
		} else {
			dst = append(dst, s[i:i+n]...)
		}
		i += n
	}
	return append(dst, '"')
}
