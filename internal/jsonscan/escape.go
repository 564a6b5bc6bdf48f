package jsonscan

import (
	"bytes"
	"unicode/utf16"
	"unicode/utf8"
)

// HasEscape reports whether the raw string contents hold an escape.
func HasEscape(raw []byte) bool { return bytes.IndexByte(raw, '\\') >= 0 }

// Key returns the decoded form of a raw key: raw itself when it holds no
// escape (no copy), else a new slice. Real clients do not escape key
// names, so the allocation is for hostile input only; comparing keys
// decoded is what keeps "mod\u0065l" from slipping past a check of "model".
func Key(raw []byte) []byte {
	for _, c := range raw {
		if c == '\\' {
			return Unescape(nil, raw)
		}
	}
	return raw
}

// Unescape appends the decoded form of validated raw string contents (as
// ScanString returns them) to dst. A surrogate pair decodes to its rune; a
// lone surrogate to U+FFFD, as encoding/json and Python (which keeps it but
// cannot encode it to UTF-8) would have it.
func Unescape(dst, raw []byte) []byte {
	for i := 0; i < len(raw); {
		c := raw[i]
		if c != '\\' {
			j := bytes.IndexByte(raw[i+1:], '\\')
			if j < 0 {
				return append(dst, raw[i:]...)
			}
			j += i + 1
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

// AppendString appends s as a JSON string literal; invalid UTF-8 becomes
// U+FFFD.
func AppendString(dst []byte, s string) []byte {
	dst = append(dst, '"')
	dst = AppendStringBody(dst, s)
	return append(dst, '"')
}

// AppendStringBody appends the escaped contents of s (no quotes).
func AppendStringBody(dst []byte, s string) []byte {
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
