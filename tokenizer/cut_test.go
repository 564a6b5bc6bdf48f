package tokenizer

import (
	"bytes"
	"slices"
	"testing"
)

// FuzzCutEncodesAPrefix: the tokens of text[:Cut(text, limit)] are the
// leading tokens of text's, for the Qwen3 tokenizer (when the cut found a
// word boundary) and for Simple.
func FuzzCutEncodesAPrefix(f *testing.F) {
	h := loadQwen3(f)
	for _, s := range []string{
		string(prompt4K()),
		"hello world, it's a test\u3000 of cuts\u00a0 near spaces",
		"<|im_start|>user\nWhat's 12345 + 678?<|im_end|>\n<|im_start|>assistant\n",
		"e\u0301 cafe\u0301 naïve résumé 我们 还需要 支持",
		"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx",
		"a  b   c\t d \n e\r\n f",
	} {
		f.Add([]byte(s), uint16(len(s)/2))
	}
	f.Fuzz(func(t *testing.T, text []byte, lim uint16) {
		limit := int(lim)
		if limit == 0 || limit >= len(text) {
			return
		}
		full := h.Encode(nil, text)
		n := Cut(h, text, limit)
		if n > limit || n < 0 {
			t.Fatalf("Cut = %d, limit %d", n, limit)
		}
		if spacedAt(text, max(limit-cutSearch, 1), limit) == n {
			// A word boundary was found: the prefix encodes exactly.
			part := h.Encode(nil, text[:n])
			if !slices.Equal(part, full[:min(len(part), len(full))]) || len(part) > len(full) {
				t.Fatalf("text %q cut at %d of %d:\nprefix %v\nfull   %v", text, n, len(text), part, full)
			}
		}
		s := Simple{}
		ns := Cut(s, text, limit)
		part, all := s.Encode(nil, text[:ns]), s.Encode(nil, text)
		if ns > limit || !slices.Equal(part, all[:len(part)]) {
			t.Fatalf("Simple: cut %d of %q", ns, text)
		}
	})
}

func TestCutKeepsShortTextsWhole(t *testing.T) {
	h := loadQwen3(t)
	text := []byte("short text")
	for _, limit := range []int{0, -1, len(text), 1 << 20} {
		if n := Cut(h, text, limit); n != len(text) {
			t.Fatalf("Cut(limit %d) = %d, want %d", limit, n, len(text))
		}
	}
	// A long word with no space to cut before: a character boundary.
	word := bytes.Repeat([]byte("é"), 100)
	if n := Cut(h, word, 51); n != 50 {
		t.Fatalf("Cut inside a 2-byte character = %d, want 50", n)
	}
}
