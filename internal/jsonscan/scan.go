package jsonscan

import (
	"encoding/binary"
	"errors"
	"math/bits"
	"unicode/utf8"
)

// ErrSyntax is the error of every malformed document (it carries no
// position or input bytes, so it can be returned without allocating and
// never echoes client data).
var ErrSyntax = errors.New("malformed JSON")

// IsSpace reports whether c is JSON white space.
func IsSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

// SkipSpace returns the index of the first byte at or after d[i] that is not
// white space (len(d) when there is none).
func SkipSpace(d []byte, i int) int {
	for i < len(d) && d[i] <= ' ' && IsSpace(d[i]) { // most bytes are past ' ': one test
		i++
	}
	return i
}

// SkipValue validates the value starting at or after d[i] (leading white
// space skipped) and returns the index after it. A container needs
// levels > 0 (see the package doc).
func SkipValue(d []byte, i, levels int) (int, error) {
	i = SkipSpace(d, i)
	if i >= len(d) {
		return i, ErrSyntax
	}
	switch c := d[i]; {
	case c == '"':
		_, j, _, err := scanString(d, i)
		return j, err
	case c == '{':
		if levels <= 0 {
			return i, ErrSyntax
		}
		return WalkObject(d, i, levels, nil)
	case c == '[':
		if levels <= 0 {
			return i, ErrSyntax
		}
		return WalkArray(d, i, levels, nil)
	case c == 't':
		return lit(d, i, "true")
	case c == 'f':
		return lit(d, i, "false")
	case c == 'n':
		return lit(d, i, "null")
	case c == '-' || (c >= '0' && c <= '9'):
		return ScanNumber(d, i)
	}
	return i, ErrSyntax
}

func lit(d []byte, i int, s string) (int, error) {
	if len(d)-i < len(s) || string(d[i:i+len(s)]) != s {
		return i, ErrSyntax
	}
	return i + len(s), nil
}

// ScanNumber validates the number starting at d[i] (a '-' or a digit) and
// returns the index after it.
func ScanNumber(d []byte, i int) (int, error) {
	if d[i] == '-' {
		i++
	}
	if i >= len(d) {
		return i, ErrSyntax
	}
	switch {
	case d[i] == '0':
		i++
	case d[i] >= '1' && d[i] <= '9':
		for i < len(d) && d[i] >= '0' && d[i] <= '9' {
			i++
		}
	default:
		return i, ErrSyntax
	}
	if i < len(d) && d[i] == '.' {
		i++
		j := i
		for i < len(d) && d[i] >= '0' && d[i] <= '9' {
			i++
		}
		if i == j {
			return i, ErrSyntax
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
			return i, ErrSyntax
		}
	}
	return i, nil
}

// ScanString validates the string whose opening quote is d[i] and returns
// its raw contents (escapes kept) and the index after the closing quote.
// Invalid UTF-8 and raw control characters are refused, so raw contents can
// be pasted into any JSON output.
func ScanString(d []byte, i int) (raw []byte, next int, err error) {
	raw, next, _, err = scanString(d, i)
	return raw, next, err
}

// scanString is ScanString that also tells whether the string holds an
// escape (so that a key is decoded without a second look at its bytes).
func scanString(d []byte, i int) (raw []byte, next int, escaped bool, err error) {
	i++
	start := i
	for {
		// To the next byte that needs a look: runs of plain ASCII eight
		// bytes at a time, and in the word that holds such a byte,
		// straight to it (the lowest bit of specialBytes' mask); the last
		// bytes of d, fewer than eight, one by one.
		if len(d)-i >= 8 {
			m := specialBytes(binary.LittleEndian.Uint64(d[i:]))
			if m == 0 {
				i += 8
				continue
			}
			i += bits.TrailingZeros64(m) >> 3
		} else {
			for i < len(d) && plainASCII[d[i]] {
				i++
			}
			if i >= len(d) {
				return nil, i, false, ErrSyntax
			}
		}
		c := d[i]
		switch {
		case c == '"':
			return d[start:i], i + 1, escaped, nil
		case c == '\\':
			escaped = true
			i++
			if i >= len(d) {
				return nil, i, false, ErrSyntax
			}
			switch d[i] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i++
			case 'u':
				if len(d)-i < 5 || !isHex4(d[i+1:i+5]) {
					return nil, i, false, ErrSyntax
				}
				i += 5
			default:
				return nil, i, false, ErrSyntax
			}
		case c < 0x20:
			return nil, i, false, ErrSyntax
		default:
			r, n := utf8.DecodeRune(d[i:])
			if r == utf8.RuneError && n == 1 {
				return nil, i, false, ErrSyntax
			}
			i += n
		}
	}
}

// plainWord reports whether the eight bytes of x are all plain ASCII (see
// plainASCII): none is a control character (< 0x20), a quote, a
// backslash, or has its high bit set. It uses the classic SWAR test "some
// byte is zero": (v - 0x01..) & ^v & 0x80.. is non-zero iff a byte of v is
// 0, applied to x ^ '"'.., x ^ '\\'.. and (for bytes < 0x20) x - 0x20..;
// high-bit bytes are excluded first, so no byte borrows across.
func plainWord(x uint64) bool {
	const (
		ones  = 0x0101010101010101
		highs = 0x8080808080808080
	)
	if x&highs != 0 {
		return false
	}
	q := x ^ ('"' * ones)
	b := x ^ ('\\' * ones)
	return ((x-0x20*ones)|(q-ones)|(b-ones))&highs == 0
}

// specialBytes is a mask whose lowest set bit is the high bit of the
// first byte of x (in memory order) that is not plain ASCII (see
// plainASCII); 0 when all eight are. Exact for the first: below it no
// byte borrows (each is at least 0x20 and differs from '"' and '\\'),
// and that byte sets its own high bit (a control byte minus 0x20, a quote
// or backslash xored to 0 minus 1, or a high-bit byte itself); bits above
// it may be set by a borrow and are not used.
func specialBytes(x uint64) uint64 {
	const (
		ones  = 0x0101010101010101
		highs = 0x8080808080808080
	)
	q := x ^ ('"' * ones)
	b := x ^ ('\\' * ones)
	return (x | (x - 0x20*ones) | (q - ones) | (b - ones)) & highs
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
