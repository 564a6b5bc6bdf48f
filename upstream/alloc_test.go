//go:build !race

package upstream

import (
	"testing"

	"github.com/infera/infera/config"
)

// The split plan and the member pick run on the request path: no
// allocation.
func TestPlanAndPickAllocateNothing(t *testing.T) {
	sp := benchSplit(config.SplitPrefix)
	dst := make([]int, 0, 8)
	model := []byte("Qwen2.5-72B-Instruct")
	var s Splitter
	if n := testing.AllocsPerRun(1000, func() {
		dst = Plan(dst[:0], sp, model, s.Next())
		sp.Strategy = config.SplitWeight
		dst = Plan(dst[:0], sp, model, s.Next())
		sp.Strategy = config.SplitPrefix
	}); n != 0 {
		t.Fatalf("Plan: %v allocs/op, want 0", n)
	}
	p := NewPoller()
	defer p.Close()
	p.cfg.Store(&config.GlobalScheduling{Enabled: true, StaleAfterMS: 60000, MinFree: 1})
	ms := benchMembers(4)
	p.members.Store(&ms)
	if n := testing.AllocsPerRun(1000, func() {
		if p.Pick(model) == nil {
			t.Fatal("no pick")
		}
	}); n != 0 {
		t.Fatalf("Pick: %v allocs/op, want 0", n)
	}
}
