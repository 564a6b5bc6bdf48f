//go:build !race

package tokenizer

import "testing"

// TestEncodeAllocs proves steady-state Encode allocates nothing.
func TestEncodeAllocs(t *testing.T) {
	h := loadQwen3(t)
	text := prompt4K()
	dst := h.Encode(nil, text)
	if n := testing.AllocsPerRun(50, func() { dst = h.Encode(dst[:0], text) }); n != 0 {
		t.Fatalf("Encode allocates %.1f times per call", n)
	}
}
