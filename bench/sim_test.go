package bench

import (
	"testing"
	"time"
)

func TestSimulateBasics(t *testing.T) {
	gc := DefaultGenConfig(WorkloadShared)
	gc.Requests, gc.Rate, gc.SystemPrompts, gc.SystemTokens, gc.Users, gc.OutputTokens = 200, 40, 8, 1024, 64, 16
	reqs, err := Generate(gc)
	if err != nil {
		t.Fatal(err)
	}
	lc := DefaultLoadConfig()
	core := testCore(1)
	core.CapacityBlocks = 4096 // no eviction: policies differ by cold misses only
	run := func(policy string, engines int, lc LoadConfig) Summary {
		t.Helper()
		r, err := Simulate(reqs, SimConfig{Engines: engines, Core: core, Policy: policy, Load: lc})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: layers %v, index blocks %d", policy, r.Layers, r.IndexBlocks)
		if r.Virtual <= 0 || r.Real <= 0 {
			t.Fatalf("bad times %+v", r)
		}
		return Summarize(policy, r.Run.Results, r.Run.ITLs, r.Run.Wall, SLO{}, engines)
	}
	a, b := run("round-robin", 4, lc), run("round-robin", 4, lc)
	if a.TTFT != b.TTFT || a.HitRate != b.HitRate {
		t.Fatalf("simulation is not deterministic: %+v vs %+v", a.TTFT, b.TTFT)
	}
	if a.OK != len(reqs) || a.Imbalance != 1 {
		t.Fatalf("round-robin: ok %d imbalance %v", a.OK, a.Imbalance)
	}
	// 4 system prompts over 4 engines: the router's prefix index keeps
	// each prompt on few engines, so it must clearly beat round-robin.
	p := run("prefix", 4, lc)
	t.Logf("hit rate round-robin %.3f prefix %.3f; TTFT p50 %.1f vs %.1f", a.HitRate, p.HitRate, a.TTFT.P50, p.TTFT.P50)
	if p.HitRate < a.HitRate+0.03 {
		t.Fatalf("prefix routing hit rate %.3f below round-robin %.3f", p.HitRate, a.HitRate)
	}
	// kv-aware: the router's KVAware scorer over the index fed by the
	// simulated engines' KV events. Its cost also weighs decode load, so it
	// spreads cold misses more than the prefix layer; it must not lose to
	// round-robin and must actually route by KV.
	kr, err := Simulate(reqs, SimConfig{Engines: 4, Core: core, Policy: "kv-aware", Load: lc})
	if err != nil {
		t.Fatal(err)
	}
	if kr.Layers["kv"] == 0 || kr.IndexBlocks == 0 {
		t.Fatalf("kv-aware did not use the KV index: layers %v, index blocks %d", kr.Layers, kr.IndexBlocks)
	}
	kva := run("kv-aware", 4, lc)
	t.Logf("kv-aware hit rate %.3f TTFT p50 %.1f", kva.HitRate, kva.TTFT.P50)
	if kva.HitRate < a.HitRate || kva.HitRate == 0 {
		t.Fatalf("kv-aware hit rate %.3f not above round-robin %.3f", kva.HitRate, a.HitRate)
	}
	// Many engines: every request still served, fast.
	big := run("least-requests", 256, lc)
	if big.OK != len(reqs) {
		t.Fatalf("256 engines: %d ok", big.OK)
	}
	// Closed loop at concurrency 1 never overlaps requests.
	cl := lc
	cl.Arrival, cl.Concurrency = ArrivalClosed, 1
	r, err := Simulate(reqs[:20], SimConfig{Engines: 2, Core: core, Policy: "round-robin", Load: cl})
	if err != nil {
		t.Fatal(err)
	}
	res := r.Run.Results
	for i := 1; i < len(res); i++ {
		if res[i].Start < res[i-1].Start+res[i-1].E2E {
			t.Fatalf("closed loop overlapped: %d starts at %v before %d ends at %v", i, res[i].Start, i-1, res[i-1].Start+res[i-1].E2E)
		}
	}
	// Duration cap.
	dl := lc
	dl.Duration = 500 * time.Millisecond
	r, err = Simulate(reqs, SimConfig{Engines: 2, Core: core, Policy: "round-robin", Load: dl})
	if err != nil {
		t.Fatal(err)
	}
	for _, x := range r.Run.Results {
		if x.Start > dl.Duration {
			t.Fatalf("request at %v past the duration cap", x.Start)
		}
	}
	if _, err := Simulate(reqs, SimConfig{Engines: 2, Core: core, Policy: "nope", Load: lc}); err == nil {
		t.Fatal("unknown policy accepted")
	}
	if _, err := Simulate(reqs, SimConfig{Engines: 0, Core: core, Policy: "round-robin", Load: lc}); err == nil {
		t.Fatal("zero engines accepted")
	}
}

func TestSimulateTooLong(t *testing.T) {
	core := testCore(1)
	core.CapacityBlocks = 8
	reqs := []TraceRequest{{Timestamp: 0, InputLength: 4096, OutputLength: 4, HashIDs: []int64{1}}}
	r, err := Simulate(reqs, SimConfig{Engines: 1, Core: core, Policy: "round-robin", Load: DefaultLoadConfig()})
	if err != nil {
		t.Fatal(err)
	}
	if r.Run.Results[0].OK() || r.Run.Results[0].Status != 400 {
		t.Fatalf("oversized request should fail with 400: %+v", r.Run.Results[0])
	}
}
