package h1

import (
	"math/rand/v2"
	"testing"
)

// The byte-by-byte forms of the word-at-a-time checks: the references
// they must agree with.

func eqFoldBytewise(b []byte, s string) bool {
	if len(b) != len(s) {
		return false
	}
	for i := range b {
		if b[i]|0x20 != s[i]|0x20 {
			return false
		}
	}
	return true
}

func validValueBytewise(v []byte) bool {
	for _, ch := range v {
		if (ch < ' ' && ch != '\t') || ch == 0x7f {
			return false
		}
	}
	return true
}

func plainNameBytewise(k []byte) bool {
	for _, ch := range k {
		if ch <= ' ' || ch >= 0x7f {
			return false
		}
	}
	return true
}

func validNameBytewise(k []byte) bool {
	for _, c := range k {
		if !tokenChar[c] {
			return false
		}
	}
	return len(k) > 0
}

func nameEndBytewise(b []byte) int {
	for i, c := range b {
		if c <= ' ' || c >= 0x7f || c == ':' {
			return i
		}
	}
	return len(b)
}

// TestTheWordChecksAgreeWithTheByteChecks: EqFold, ValidValue, plainName,
// nameEnd (HeaderLine's name checks) and ValidName give what a
// byte-by-byte loop gives,
// for every byte value at every position of lengths 0 to 40, and for
// random strings.
func TestTheWordChecksAgreeWithTheByteChecks(t *testing.T) {
	check := func(b []byte, s string) {
		t.Helper()
		if got, want := EqFold(b, s), eqFoldBytewise(b, s); got != want {
			t.Fatalf("EqFold(%q, %q) = %v, want %v", b, s, got, want)
		}
		if got, want := ValidValue(b), validValueBytewise(b); got != want {
			t.Fatalf("ValidValue(%q) = %v, want %v", b, got, want)
		}
		if got, want := plainName(b), plainNameBytewise(b); got != want {
			t.Fatalf("plainName(%q) = %v, want %v", b, got, want)
		}
		if got, want := ValidName(b), validNameBytewise(b); got != want {
			t.Fatalf("ValidName(%q) = %v, want %v", b, got, want)
		}
		if got, want := nameEnd(b), nameEndBytewise(b); got != want {
			t.Fatalf("nameEnd(%q) = %v, want %v", b, got, want)
		}
	}
	const name = "Proxy-Authorization-And-Some-More-Bytes-X"
	for n := 0; n <= 40; n++ {
		s := name[:n]
		b := []byte(s)
		check(b, s)
		for i := 0; i < n; i++ {
			orig := b[i]
			for c := 0; c < 256; c++ {
				b[i] = byte(c)
				check(b, s)
			}
			b[i] = orig
		}
	}
	r := rand.New(rand.NewPCG(1, 2))
	alphabet := []byte("aA-zZ \t\x00\x1f\x7f\x80\xff:@`^~\r\n0")
	for range 200000 {
		n := r.IntN(30)
		b := make([]byte, n)
		s := make([]byte, n)
		for i := range b {
			b[i] = alphabet[r.IntN(len(alphabet))]
			s[i] = b[i]
			if r.IntN(8) == 0 {
				s[i] = alphabet[r.IntN(len(alphabet))]
			} else if r.IntN(2) == 0 {
				s[i] ^= 0x20
			}
		}
		check(b, string(s))
	}
}

// TestHeaderLineRefusesWhatItRefusedByteByByte: a header line with a
// space, control byte, DEL or high byte in its name, or a control byte in
// its value, is malformed wherever that byte is.
func TestHeaderLineRefusesWhatItRefusedByteByByte(t *testing.T) {
	base := "X-Some-Long-Header-Name: some value that is long enough\t ok"
	colon := 23
	for i := 0; i < len(base); i++ {
		if i == colon {
			continue
		}
		for c := 0; c < 256; c++ {
			line := []byte(base)
			line[i] = byte(c)
			name, val, err := HeaderLine(line)
			var want bool
			if i < colon {
				want = c != ':' && plainNameBytewise(line[i:i+1]) && (i > 0 || (c != ' ' && c != '\t'))
			} else {
				want = validValueBytewise(line[i : i+1])
			}
			if c == ':' && i < colon {
				continue // a shorter name: judged as such
			}
			if (err == nil) != want {
				t.Fatalf("HeaderLine(%q) = %q, %q, %v; want ok %v", line, name, val, err, want)
			}
		}
	}
}

func TestAStatusLineWithAControlByteInItsReasonIsMalformed(t *testing.T) {
	for _, tc := range []struct {
		line string
		code int
		ok   bool
	}{
		{"HTTP/1.1 200 OK\r\n", 200, true},
		{"HTTP/1.1 200\r\n", 200, true},
		{"HTTP/1.1 200 \r\n", 200, true},
		{"HTTP/1.1 200\n", 200, true},
		{"HTTP/1.0 404 Not\tFound \xff\r\n", 404, true}, // HTAB and obs-text
		{"HTTP/1.1 200 O\rK\r\n", 0, false},
		{"HTTP/1.1 200 OK\r\r\n", 0, false},
		{"HTTP/1.1 200\rX\r\n", 0, false},
		{"HTTP/1.1 200 O\x00K\r\n", 0, false},
		{"HTTP/1.1 200 O\x7fK\r\n", 0, false},
		{"HTTP/1.1 200 O\nK\r\n", 0, false},
		{"HTTP/1.1 600 OK\r\n", 0, false},
	} {
		code, _, ok := ParseStatusLine([]byte(tc.line))
		if ok != tc.ok || code != tc.code {
			t.Errorf("%q: %d %v, want %d %v", tc.line, code, ok, tc.code, tc.ok)
		}
	}
}
