package kvroute

import (
	"encoding/json"
	"fmt"
	"math"
	"testing"

	"github.com/infera/infera/fleet"
	"github.com/infera/infera/radix"
	"github.com/infera/infera/sched"
)

// kvFixture builds an index and workers; hashes is an 8-block prompt.
type kvFixture struct {
	x      *radix.Index
	ws     []*fleet.Worker
	hashes []uint64
}

func newKVFixture(t testing.TB, n int) *kvFixture {
	t.Helper()
	f := &kvFixture{x: radix.New()}
	for i := range n {
		f.ws = append(f.ws, &fleet.Worker{Idx: i, ID: fmt.Sprintf("w%d", i)})
	}
	for i := range 8 {
		f.hashes = append(f.hashes, uint64(i+1)*0x9e3779b97f4a7c15)
	}
	return f
}

// cache makes worker i (dp rank r) hold the first o prompt blocks.
func (f *kvFixture) cache(t testing.TB, i, r, o int) {
	t.Helper()
	if o == 0 {
		return
	}
	if err := f.x.Store(i, r, 0, 0, false, f.hashes[:o]); err != nil {
		t.Fatal(err)
	}
}

// junk gives worker i n unrelated cached blocks (a bigger cache).
func (f *kvFixture) junk(t testing.TB, i, n int) {
	t.Helper()
	hs := make([]uint64, n)
	for j := range hs {
		hs[j] = uint64(i+1)<<40 | uint64(j+1)
	}
	if err := f.x.Store(i, 0, 0, 0, false, hs); err != nil {
		t.Fatal(err)
	}
}

func TestKVAwareCost(t *testing.T) {
	type load struct{ prefill, blocks int64 }
	f := func(name string, weight float64, overlaps []int, loads []load, want int) {
		t.Helper()
		fx := newKVFixture(t, len(overlaps))
		for i, o := range overlaps {
			fx.cache(t, i, 0, o)
			if loads != nil {
				fx.ws[i].Load.PrefillTokens.Store(loads[i].prefill)
				fx.ws[i].Load.Blocks.Store(loads[i].blocks)
			}
		}
		k := NewKVAware(KVAwareConfig{Index: fx.x, OverlapWeight: weight, BlockSize: 16})
		got := k.PickKV(fx.ws, &sched.Request{BlockHashes: fx.hashes})
		if got == nil || got.Idx != want {
			e := k.Explain(fx.ws, &sched.Request{BlockHashes: fx.hashes})
			t.Fatalf("%s: picked %v, want w%d; explain %+v", name, got, want, e)
		}
	}
	f("overlap wins when load is equal", 1, []int{0, 5, 2}, nil, 1)
	f("full overlap wins", 1, []int{8, 5, 2}, nil, 0)
	f("load wins when overlap is equal", 1, []int{3, 3, 3}, []load{{0, 10}, {0, 2}, {0, 5}}, 1)
	f("prefill load counts", 1, []int{3, 3}, []load{{160, 0}, {16, 0}}, 1)
	// A holds everything but is busy (20 blocks); B is idle and cold.
	// weight 1: A = 0 + 20 = 20, B = 8 + 8 = 16 -> B.
	f("weight 1: idle cold worker", 1, []int{8, 0}, []load{{0, 20}, {0, 0}}, 1)
	// weight 3: A = 20, B = 24 + 8 = 32 -> A.
	f("weight 3: busy warm worker", 3, []int{8, 0}, []load{{0, 20}, {0, 0}}, 0)
	// weight 0: only decode load: A = 20, B = 8 -> B.
	f("weight 0: decode load only", 0, []int{8, 0}, []load{{0, 20}, {0, 0}}, 1)
	// Active prefill on A: 160 tokens = 10 blocks; A = 10 + 0, B = 8 + 8.
	f("queued prefill", 1, []int{8, 0}, []load{{160, 0}, {0, 0}}, 0)
	f("queued prefill, heavy", 1, []int{8, 0}, []load{{400, 0}, {0, 0}}, 1)
}

func TestKVAwareTies(t *testing.T) {
	fx := newKVFixture(t, 3)
	fx.cache(t, 0, 0, 4)
	fx.cache(t, 1, 0, 4)
	fx.cache(t, 2, 0, 4)
	fx.junk(t, 0, 10)
	fx.junk(t, 2, 3)
	k := NewKVAware(KVAwareConfig{Index: fx.x, OverlapWeight: 1, BlockSize: 16, Seed: 1})
	r := &sched.Request{BlockHashes: fx.hashes}
	for range 20 {
		if got := k.PickKV(fx.ws, r); got != fx.ws[1] {
			t.Fatalf("tie: picked %s, want w1 (smallest cache)", got.ID)
		}
	}
	if e := k.Explain(fx.ws, r); e.Reason != ReasonTieCache {
		t.Fatalf("reason %q, want %q", e.Reason, ReasonTieCache)
	}
	// Equal caches too: random, both chosen.
	fx2 := newKVFixture(t, 2)
	fx2.cache(t, 0, 0, 3)
	fx2.cache(t, 1, 0, 3)
	k2 := NewKVAware(KVAwareConfig{Index: fx2.x, OverlapWeight: 1, Seed: 2})
	seen := map[int]int{}
	for range 400 {
		seen[k2.PickKV(fx2.ws, r).Idx]++
	}
	if seen[0] < 120 || seen[1] < 120 {
		t.Fatalf("random tie break is lopsided: %v", seen)
	}
}

func TestKVAwareDefersAndRanks(t *testing.T) {
	fx := newKVFixture(t, 2)
	k := NewKVAware(KVAwareConfig{Index: fx.x})
	if w := k.PickKV(fx.ws, &sched.Request{}); w != nil {
		t.Fatalf("no hashes: picked %s, want nil", w.ID)
	}
	if e := k.Explain(fx.ws, &sched.Request{}); e.Choice != "" || e.Reason != ReasonNoHashes {
		t.Fatalf("no hashes: explain %+v", e)
	}
	// Nobody caches the prompt: defer.
	if w := k.PickKV(fx.ws, &sched.Request{BlockHashes: fx.hashes}); w != nil {
		t.Fatalf("no overlap: picked %s, want nil", w.ID)
	}
	// Worker 1 caches 2 blocks on rank 0 and 6 on rank 3: overlap is 6.
	fx.cache(t, 0, 0, 5)
	fx.cache(t, 1, 0, 2)
	fx.cache(t, 1, 3, 6)
	w, ratio := k.PickKVRatio(fx.ws, &sched.Request{BlockHashes: fx.hashes})
	if w != fx.ws[1] || ratio != 6.0/8 {
		t.Fatalf("dp ranks: picked %v ratio %v, want w1 0.75", w, ratio)
	}
}

func TestKVAwareTemperature(t *testing.T) {
	fx := newKVFixture(t, 3)
	// Equal overlaps; decode loads 0, 5, 10 make costs c, c+5, c+10.
	for i := range 3 {
		fx.cache(t, i, 0, 2)
	}
	fx.ws[1].Load.Blocks.Store(5)
	fx.ws[2].Load.Blocks.Store(10)
	k := NewKVAware(KVAwareConfig{Index: fx.x, OverlapWeight: 1, Temperature: 0.5, Seed: 42})
	r := &sched.Request{BlockHashes: fx.hashes}
	// Normalised costs 0, 0.5, 1 at T=0.5: weights e^0, e^-1, e^-2.
	z := 1 + math.Exp(-1) + math.Exp(-2)
	want := []float64{1 / z, math.Exp(-1) / z, math.Exp(-2) / z}
	const n = 20000
	var got [3]float64
	for range n {
		got[k.PickKV(fx.ws, r).Idx]++
	}
	for i := range got {
		if p := got[i] / n; math.Abs(p-want[i]) > 0.02 {
			t.Fatalf("worker %d sampled with p=%.3f, want %.3f (all %v)", i, p, want[i], got)
		}
	}
	e := k.Explain(fx.ws, r)
	for i, c := range e.Candidates {
		if math.Abs(c.Probability-want[i]) > 1e-9 {
			t.Fatalf("explain probability %d = %f, want %f", i, c.Probability, want[i])
		}
	}
}

func TestKVAwareExplain(t *testing.T) {
	fx := newKVFixture(t, 2)
	fx.cache(t, 0, 0, 6)
	fx.ws[0].Load.PrefillTokens.Store(32)
	fx.ws[0].Load.Blocks.Store(3)
	k := NewKVAware(KVAwareConfig{Index: fx.x, OverlapWeight: 2, BlockSize: 16})
	r := &sched.Request{BlockHashes: fx.hashes}
	e := k.Explain(fx.ws, r)
	c0, c1 := e.Candidates[0], e.Candidates[1]
	// w0: p = 32/16 + 2 = 4, d = 3 + 2 = 5, cost = 2*4 + 5 = 13.
	// w1: p = 8, d = 8, cost = 24.
	if c0.OverlapBlocks != 6 || c0.PrefillBlocks != 4 || c0.DecodeBlocks != 5 || c0.Cost != 13 || c0.CachedBlocks != 6 {
		t.Fatalf("candidate 0: %+v", c0)
	}
	if c1.OverlapBlocks != 0 || c1.Cost != 24 {
		t.Fatalf("candidate 1: %+v", c1)
	}
	if e.Choice != "w0" || e.Reason != ReasonLowest || e.Blocks != 8 {
		t.Fatalf("explanation %+v", e)
	}
	if w := k.PickKV(fx.ws, r); w.ID != e.Choice {
		t.Fatalf("PickKV chose %s, Explain %s", w.ID, e.Choice)
	}
	if _, err := json.Marshal(e); err != nil {
		t.Fatalf("explanation does not marshal: %s", err)
	}
}
