package tokenizer

import (
	"testing"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// FuzzEncode checks that Encode never panics and that valid UTF-8 round
// trips through Decode (up to NFC normalization, which Qwen3 applies).
func FuzzEncode(f *testing.F) {
	for _, s := range []string{"Hello world", "<|im_start|>user\nhi<|im_end|>", "e\u0301<think>x</think>", "  \t\n\r\n", "12345 don't", "😀👨‍👩‍👧", "\xff\xfe<|im_end", strings4K()} {
		f.Add(s)
	}
	h := loadQwen3(f)
	f.Fuzz(func(t *testing.T, s string) {
		ids := h.Encode(nil, []byte(s))
		got := h.Decode(ids)
		if !utf8.ValidString(s) {
			if got != s && got != norm.NFC.String(s) {
				// Invalid bytes must still survive byte-level BPE unless the
				// normalizer rewrote them.
				t.Logf("invalid UTF-8 %q decoded to %q", s, got)
			}
			return
		}
		if want := norm.NFC.String(s); got != want && got != s {
			t.Fatalf("Decode(Encode(%q)) = %q, want %q", s, got, want)
		}
		for _, id := range ids {
			if int(id) >= h.VocabSize() {
				t.Fatalf("id %d out of range", id)
			}
		}
	})
}

func strings4K() string { return string(prompt4K()) }

func TestEncodeRoundTrip(t *testing.T) {
	h := loadQwen3(t)
	f := func(s string) {
		t.Helper()
		if got := h.Decode(h.Encode(nil, []byte(s))); got != norm.NFC.String(s) {
			t.Errorf("round trip of %q = %q", s, got)
		}
	}
	f("")
	f("plain ascii")
	f(strings4K())
	f("cafe\u0301 → café")
	f("<|im_start|><|im_start|><|endoftext|>")
	f("\x00\x01\x7f")
	// Long words take the heap merge path.
	f(string(make([]byte, 300)))
	f("supercalifragilisticexpialidocious" + "ab" + "xyzzy" + "supercalifragilisticexpialidocious")
}

// TestLongWordMergePaths checks that the linear and the heap merge give the
// same ids on words of every length around the switch-over.
func TestLongWordMergePaths(t *testing.T) {
	h := loadQwen3(t)
	sc := &scratch{}
	word := []byte("Pneumonoultramicroscopicsilicovolcanoconiosis_antidisestablishmentarianism_floccinaucinihilipilification")
	for n := 2; n <= len(word); n++ {
		a := h.model.mergeSmall(nil, word[:n], sc)
		b := h.model.mergeHeap(nil, word[:n], sc)
		if string(h.AppendDecode(nil, a)) != string(word[:n]) || len(a) != len(b) {
			t.Fatalf("n=%d: small %v heap %v", n, a, b)
		}
		for i := range a {
			if a[i] != b[i] {
				t.Fatalf("n=%d: small %v heap %v", n, a, b)
			}
		}
	}
}
