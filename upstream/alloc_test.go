//go:build !race

package upstream

import (
	"testing"

	"github.com/infera/infera/config"
	"github.com/valyala/fasthttp"
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
		dst = PlanDrawn(dst[:0], sp, s.Next(), 1<<1)
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

func TestAppendHeadersAllocatesNothing(t *testing.T) {
	var in fasthttp.RequestHeader
	in.Set("Content-Type", "application/json")
	in.Set("Authorization", "Bearer client")
	in.Set("X-Session-Id", "s")
	dst := make([]byte, 0, 1024)
	key := config.NewSecret("sk-upstream-key-0123456789")
	if n := testing.AllocsPerRun(1000, func() {
		dst = AppendHeaders(dst[:0], &in, key, true, false, "X-Session-Id", []byte("0123456789abcdef0123456789abcdef"))
	}); n != 0 {
		t.Fatalf("AppendHeaders: %v allocs/op, want 0", n)
	}
}
