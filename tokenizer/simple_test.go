package tokenizer

import (
	"slices"
	"strings"
	"testing"
)

// FuzzSimpleEncodeIsFourBytesAToken: Simple's Encode, appended to any ids,
// gives what reading the text 4 bytes at a time little-endian gives.
func FuzzSimpleEncodeIsFourBytesAToken(f *testing.F) {
	for _, s := range []string{"", "a", "ab", "abc", "abcd", "abcde", "héllo wörld", "\x00\x00\x00\x01\xff"} {
		f.Add([]byte(s), uint8(0))
		f.Add([]byte(s), uint8(3))
	}
	f.Fuzz(func(t *testing.T, text []byte, prefix uint8) {
		dst := make([]uint32, int(prefix)%8, int(prefix)%8+int(prefix)/8)
		for i := range dst {
			dst[i] = 0xdeadbeef // stale ids: must stay
		}
		want := encodeWords(slices.Clone(dst), text)
		if got := (Simple{}).Encode(dst, text); !slices.Equal(got, want) {
			t.Fatalf("Encode(%q) = %x, want %x", text, got, want)
		}
	})
}

// TestSimpleEncodeOverwritesAReusedBuffersPadding: ids reused from an
// earlier, longer prompt leave nothing in a short tail's zero padding.
func TestSimpleEncodeOverwritesAReusedBuffersPadding(t *testing.T) {
	buf := (Simple{}).Encode(nil, []byte(strings.Repeat("\xff", 64)))
	got := (Simple{}).Encode(buf[:0], []byte("abcde"))
	if want := []uint32{0x64636261, 0x65}; !slices.Equal(got, want) {
		t.Fatalf("Encode = %x, want %x", got, want)
	}
}

func BenchmarkSimpleEncode1K(b *testing.B) {
	text := []byte(strings.Repeat("Summarise the following notes. ", 33))
	dst := make([]uint32, 0, len(text))
	b.ReportAllocs()
	b.SetBytes(int64(len(text)))
	for b.Loop() {
		dst = (Simple{}).Encode(dst[:0], text)
	}
}
