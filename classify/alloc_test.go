//go:build !race

package classify

import "testing"

// Building the request, parsing the answer and matching the models run on
// the request path: no allocation.
func TestRequestPathPartsAllocateNothing(t *testing.T) {
	ans := []byte(`{"tier":"L3","score":1}`)
	text := []byte("a text of some length, with \"quotes\" and\nnewlines")
	dst := make([]byte, 0, 512)
	cfg := smartCfg("http://x")
	cfg.MatchModels = []string{"auto", "smart-*"}
	if n := testing.AllocsPerRun(1000, func() {
		dst = AppendRequest(dst[:0], []byte("auto"), text, 30)
		if !Applies(cfg, []byte("smart-x")) {
			t.Fatal("no match")
		}
	}); n != 0 {
		t.Fatalf("AppendRequest+Applies: %v allocs/op, want 0", n)
	}
	if n := testing.AllocsPerRun(1000, func() {
		if tier, err := ParseAnswer(ans); err != nil || tier != TierL3 {
			t.Fatal(tier, err)
		}
	}); n != 0 {
		t.Fatalf("ParseAnswer: %v allocs/op, want 0", n)
	}
}
