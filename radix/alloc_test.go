//go:build !race

package radix

import "testing"

func TestMatchAllocs(t *testing.T) {
	x := New()
	q := fill(x, 8, 2048) // 32k tokens at block size 16
	dst := make([]Overlap, 0, 16)
	dst = x.Match(dst[:0], q)
	if len(dst) != 8 {
		t.Fatalf("got %d overlaps, want 8", len(dst))
	}
	if n := testing.AllocsPerRun(100, func() { dst = x.Match(dst[:0], q) }); n != 0 {
		t.Fatalf("Match allocates %.1f times per call, want 0", n)
	}
}
