package bench

import (
	"testing"

	"github.com/infera/infera/fleet"
	"github.com/infera/infera/radix"
	"github.com/infera/infera/sched"
)

// The dynamo policy scores weight x potential prefill blocks + potential
// active blocks, as Dynamo's documented cost function does: a worker that
// caches half the prompt but holds many active blocks loses to an idle cold
// one at weight 1 and wins at a higher weight.
func TestDynamoEmulationWeighsPrefillBlocksAgainstActiveBlocks(t *testing.T) {
	const bs = 16
	ix := radix.New()
	ws := []*fleet.Worker{{Idx: 0, ID: "w0"}, {Idx: 1, ID: "w1"}}
	prompt := make([]uint64, 8) // 128 tokens
	for i := range prompt {
		prompt[i] = uint64(i+1) * 0x9e3779b97f4a7c15
	}
	if err := ix.Store(0, 0, 0, 0, false, prompt[:4]); err != nil { // w0 caches 4 of 8 blocks
		t.Fatal(err)
	}
	other := &sched.Request{PromptTokens: 160, BlockHashes: make([]uint64, 10)}
	for i := range other.BlockHashes {
		other.BlockHashes[i] = uint64(1000 + i)
	}
	r := &sched.Request{PromptTokens: 128, BlockHashes: prompt}

	// w0 also runs a request of 10 distinct blocks past its first token:
	// w0's logit = W x (128-64)/16 + (10+8) = 4W + 18, w1's = 8W + 8.
	for _, c := range []struct {
		weight float64
		want   string
	}{{1, "w1"}, {2, "w1"}, {3, "w0"}, {4, "w0"}} {
		d := newDynamoScorer(ix, bs, c.weight)
		d.PickKV(ws[:1], other)
		d.dispatched(0, ws[0], other)
		d.firstToken(0)
		if got := d.PickKV(ws, r); got.ID != c.want {
			t.Errorf("weight %v: picked %s, want %s (logits %v)", c.weight, got.ID, c.want, d.logits)
		}
		// Once the other request ends, w0 (4W + 8) beats w1 (8W + 8).
		d.finished(0)
		if got := d.PickKV(ws, r); got.ID != "w0" {
			t.Errorf("weight %v, w0 idle: picked %s (logits %v)", c.weight, got.ID, d.logits)
		}
	}
}

// Prefill tokens count until the first token, active blocks until the end,
// a block shared by two active requests once, and all of it returns to
// zero; in a simulation the kv layer routes every request.
func TestDynamoEmulationAccountsActiveRequests(t *testing.T) {
	ix := radix.New()
	w := &fleet.Worker{Load: new(fleet.Load), Idx: 0, ID: "w0"}
	d := newDynamoScorer(ix, 16, 1)
	a := &sched.Request{PromptTokens: 48, BlockHashes: []uint64{1, 2, 3}}
	b := &sched.Request{PromptTokens: 64, BlockHashes: []uint64{1, 2, 3, 4}}
	d.PickKV([]*fleet.Worker{w}, a)
	d.dispatched(0, w, a)
	d.PickKV([]*fleet.Worker{w}, b)
	d.dispatched(1, w, b)
	if got := d.workers[0]; got.prefill != 48+64 || len(got.blocks) != 4 {
		t.Fatalf("after two dispatches: prefill %d, distinct blocks %d; want 112, 4", got.prefill, len(got.blocks))
	}
	d.firstToken(0)
	d.firstToken(0) // a second first token changes nothing
	if got := d.workers[0]; got.prefill != 64 || len(got.blocks) != 4 {
		t.Fatalf("after a's first token: prefill %d, blocks %d; want 64, 4", got.prefill, len(got.blocks))
	}
	d.finished(0)
	if got := d.workers[0]; got.prefill != 64 || len(got.blocks) != 4 {
		t.Fatalf("after a ends: prefill %d, blocks %d; want 64, 4 (b still holds 1-3)", got.prefill, len(got.blocks))
	}
	d.finished(1) // without a first token (an error ends it)
	if got := d.workers[0]; got.prefill != 0 || len(got.blocks) != 0 || len(d.reqs) != 0 {
		t.Fatalf("after both end: prefill %d, blocks %d, requests %d; want all 0", got.prefill, len(got.blocks), len(d.reqs))
	}

	gc := DefaultGenConfig(WorkloadChat)
	gc.Requests, gc.Rate = 300, 10
	reqs, err := Generate(gc)
	if err != nil {
		t.Fatal(err)
	}
	core := testCore(1)
	core.CapacityBlocks, core.MaxBatch = 1024, 64
	res, err := Simulate(reqs, SimConfig{Engines: 4, Core: core, Policy: PolicyDynamo, Load: DefaultLoadConfig()})
	if err != nil {
		t.Fatal(err)
	}
	s := Summarize(PolicyDynamo, res.Run.Results, res.Run.ITLs, res.Run.Wall, SLO{}, 4)
	if s.OK != len(reqs) || res.Layers["kv"] != len(reqs) {
		t.Fatalf("dynamo: %d/%d ok, layers %v: want every request routed by the kv layer", s.OK, len(reqs), res.Layers)
	}
}
