package protocol

import (
	"bytes"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"
)

// A validating JSON walker that never allocates: request and response
// bodies are walked once per level, values are located by [start, end)
// spans, and strings are copied to the output in their escaped form (a
// validated JSON string body stays valid wherever it is pasted). Keys and
// the few values that steer conversion are compared decoded, so "t\u0065xt"
// is "text", as the engine's decoder would read it.

// maxDepth bounds nesting: deeper documents are refused, so work and stack
// stay bounded whatever the input.
const maxDepth = 128

type errJSON struct{}

func (errJSON) Error() string { return "malformed JSON" }

var errMalformed error = errJSON{}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

func skipSpace(d []byte, i int) int {
	for i < len(d) && isSpace(d[i]) {
		i++
	}
	return i
}

// skipValue validates the value starting at or after d[i] and returns the
// index after it.
func skipValue(d []byte, i, depth int) (int, error) {
	i = skipSpace(d, i)
	if i >= len(d) {
		return i, errMalformed
	}
	switch c := d[i]; {
	case c == '"':
		_, j, err := scanString(d, i)
		return j, err
	case c == '{':
		if depth >= maxDepth {
			return i, errMalformed
		}
		return walkObject(d, i, depth, nil)
	case c == '[':
		if depth >= maxDepth {
			return i, errMalformed
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
	return i, errMalformed
}

func lit(d []byte, i int, s string) (int, error) {
	if len(d)-i < len(s) || string(d[i:i+len(s)]) != s {
		return i, errMalformed
	}
	return i + len(s), nil
}

func scanNumber(d []byte, i int) (int, error) {
	if d[i] == '-' {
		i++
	}
	if i >= len(d) {
		return i, errMalformed
	}
	switch {
	case d[i] == '0':
		i++
	case d[i] >= '1' && d[i] <= '9':
		for i < len(d) && d[i] >= '0' && d[i] <= '9' {
			i++
		}
	default:
		return i, errMalformed
	}
	if i < len(d) && d[i] == '.' {
		i++
		j := i
		for i < len(d) && d[i] >= '0' && d[i] <= '9' {
			i++
		}
		if i == j {
			return i, errMalformed
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
			return i, errMalformed
		}
	}
	return i, nil
}

// scanString validates the string whose opening quote is d[i] and returns
// its raw contents (escapes kept) and the index after the closing quote.
// Invalid UTF-8 and raw control characters are refused, so raw contents can
// be pasted into any JSON output.
func scanString(d []byte, i int) (raw []byte, next int, err error) {
	i++
	start := i
	for i < len(d) {
		// fast path: runs of plain ASCII
		for i < len(d) && plainASCII[d[i]] {
			i++
		}
		if i >= len(d) {
			break
		}
		c := d[i]
		switch {
		case c == '"':
			return d[start:i], i + 1, nil
		case c == '\\':
			i++
			if i >= len(d) {
				return nil, i, errMalformed
			}
			switch d[i] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i++
			case 'u':
				if len(d)-i < 5 || !isHex4(d[i+1:i+5]) {
					return nil, i, errMalformed
				}
				i += 5
			default:
				return nil, i, errMalformed
			}
		case c < 0x20:
			return nil, i, errMalformed
		case c < utf8.RuneSelf:
			i++
		default:
			r, n := utf8.DecodeRune(d[i:])
			if r == utf8.RuneError && n == 1 {
				return nil, i, errMalformed
			}
			i += n
		}
	}
	return nil, i, errMalformed
}

// plainASCII marks the bytes a string can hold as themselves.
var plainASCII = func() (t [256]bool) {
	for c := 0x20; c < 0x80; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return
}()

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

func hasEscape(raw []byte) bool {
	for _, c := range raw {
		if c == '\\' {
			return true
		}
	}
	return false
}

// unescape appends the decoded form of a validated raw string to dst.
// Lone surrogates decode to U+FFFD, as Python's decoder keeps them but
// cannot encode them to UTF-8.
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
			if utf16.IsSurrogate(r) && i+6 < len(raw) && raw[i+1] == '\\' && raw[i+2] == 'u' {
				if r2 := utf16.DecodeRune(r, hex4(raw[i+3:])); r2 != utf8.RuneError {
					r = r2
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

// walkObject validates the object at d[i] (nested depth deep), calling f,
// when non-nil, for each member with its decoded key and the value's span.
// It returns the index after the object. Keys with escapes are decoded into
// a fresh slice (rare: no real client escapes key names).
func walkObject(d []byte, i, depth int, f func(key []byte, vs, ve int) error) (int, error) {
	i = skipSpace(d, i)
	if i >= len(d) || d[i] != '{' {
		return i, errMalformed
	}
	i = skipSpace(d, i+1)
	if i < len(d) && d[i] == '}' {
		return i + 1, nil
	}
	for {
		i = skipSpace(d, i)
		if i >= len(d) || d[i] != '"' {
			return i, errMalformed
		}
		key, j, err := scanString(d, i)
		if err != nil {
			return j, err
		}
		i = skipSpace(d, j)
		if i >= len(d) || d[i] != ':' {
			return i, errMalformed
		}
		vs := skipSpace(d, i+1)
		ve, err := skipValue(d, vs, depth+1)
		if err != nil {
			return ve, err
		}
		if f != nil {
			if hasEscape(key) {
				key = unescape(nil, key)
			}
			if err := f(key, vs, ve); err != nil {
				return ve, err
			}
		}
		i = skipSpace(d, ve)
		if i >= len(d) {
			return i, errMalformed
		}
		if d[i] == '}' {
			return i + 1, nil
		}
		if d[i] != ',' {
			return i, errMalformed
		}
		i++
	}
}

// walkArray is walkObject for arrays.
func walkArray(d []byte, i, depth int, f func(vs, ve int) error) (int, error) {
	i = skipSpace(d, i)
	if i >= len(d) || d[i] != '[' {
		return i, errMalformed
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
			return i, errMalformed
		}
		if d[i] == ']' {
			return i + 1, nil
		}
		if d[i] != ',' {
			return i, errMalformed
		}
		i++
	}
}

// fields walks the object value v, which must lie inside a document
// already validated (by walkObject, walkArray or skipValue), calling f for
// each member. It skips values without validating them again, so nested
// walks cost little.
func fields(v []byte, f func(key []byte, vs, ve int) error) error {
	i := skipSpace(v, 0)
	if i >= len(v) || v[i] != '{' {
		return errMalformed
	}
	i = skipSpace(v, i+1)
	if i < len(v) && v[i] == '}' {
		return nil
	}
	for i < len(v) {
		if v[i] != '"' {
			return errMalformed
		}
		ke := fastString(v, i)
		if ke < 0 {
			return errMalformed
		}
		key := v[i+1 : ke-1]
		i = skipSpace(v, ke)
		if i >= len(v) || v[i] != ':' {
			return errMalformed
		}
		vs := skipSpace(v, i+1)
		ve := fastValue(v, vs, 0)
		if ve < 0 {
			return errMalformed
		}
		if hasEscape(key) {
			key = unescape(nil, key)
		}
		if err := f(key, vs, ve); err != nil {
			return err
		}
		i = skipSpace(v, ve)
		if i >= len(v) {
			return errMalformed
		}
		if v[i] == '}' {
			return nil
		}
		if v[i] != ',' {
			return errMalformed
		}
		i = skipSpace(v, i+1)
	}
	return errMalformed
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
	if !hasEscape(raw) {
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
func appendStr(dst []byte, s string) []byte {
	dst = append(dst, '"')
	dst = appendStrBody(dst, s)
	return append(dst, '"')
}

// appendStrBody appends the escaped body of s (no quotes).
func appendStrBody(dst []byte, s string) []byte {
	const hex = "0123456789abcdef"
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
	return dst
}

// appendBytesStr is appendStr for a byte slice.
func appendBytesStr(dst, b []byte) []byte {
	dst = append(dst, '"')
	dst = appendStrBody(dst, bytesString(b))
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
		_, j, err := scanString(v, i)
		if err != nil {
			return append(dst, v[i:]...)
		}
		dst = append(dst, v[i:j]...)
		i = j - 1
	}
	return dst
}
