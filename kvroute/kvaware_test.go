package kvroute

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/infera/infera/fleet"
	"github.com/infera/infera/radix"
	"github.com/infera/infera/sched"
)

const bs = 16

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
		f.ws = append(f.ws, &fleet.Worker{Load: new(fleet.Load), Idx: i, ID: fmt.Sprintf("w%d", i), Serial: uint32(i + 1)})
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

// junk gives worker i n unrelated cached blocks (a fuller cache).
func (f *kvFixture) junk(t testing.TB, i, n int) {
	t.Helper()
	if n == 0 {
		return
	}
	hs := make([]uint64, n)
	for j := range hs {
		hs[j] = uint64(i+1)<<40 | uint64(j+1)
	}
	if err := f.x.Store(i, 0, hs[0], 0, false, hs); err != nil {
		t.Fatal(err)
	}
}

// running gives worker i n requests in flight past their first token.
func running(w *fleet.Worker, n int) {
	for range n {
		w.Acquire(100, 0, 8)
		w.FirstToken(0)
	}
}

func (f *kvFixture) req(promptTokens int) *sched.Request {
	return &sched.Request{BlockHashes: f.hashes, PromptTokens: promptTokens}
}

func candidate(t testing.TB, e KVExplanation, id string) KVCandidate {
	t.Helper()
	for _, c := range e.Candidates {
		if c.Worker == id {
			return c
		}
	}
	t.Fatalf("no candidate %s in %+v", id, e)
	return KVCandidate{}
}

// A burst of requests sharing a prefix that one worker holds stays on that
// worker while its predicted TTFT (queued prefill + this request's uncached
// tokens) is at most an idle cold worker's full prefill of the prompt, and
// leaves at the first request for which it is not.
func TestKVAwareBurstStaysOnHolderUntilIdleIsFaster(t *testing.T) {
	f := func(name string, cached, promptTokens int) {
		t.Helper()
		fx := newKVFixture(t, 4)
		fx.cache(t, 0, 0, cached) // w0 holds the prefix; w1..w3 are cold
		for _, w := range fx.ws {
			running(w, 100) // equal decode load everywhere, the burst stays below the load bound
		}
		k := NewKVAware(KVAwareConfig{Index: fx.x, OverlapWeight: 1, BlockSize: bs})
		r := fx.req(promptTokens)
		uHolder := int64(promptTokens - min(cached, (promptTokens-1)/bs)*bs)
		var queued int64
		for j := 0; ; j++ {
			// Expected from the model alone: stay while q + u <= N.
			stay := queued+uHolder <= int64(promptTokens)
			e := k.Explain(fx.ws, r)
			got := k.PickKV(fx.ws, r)
			if got == nil {
				t.Fatalf("%s: request %d deferred", name, j)
			}
			h := candidate(t, e, "w0")
			if h.ActivePrefillTokens != queued || h.UncachedTokens != uHolder {
				t.Fatalf("%s: request %d: holder terms q=%d u=%d, want %d %d", name, j, h.ActivePrefillTokens, h.UncachedTokens, queued, uHolder)
			}
			if stay != (got == fx.ws[0]) {
				t.Fatalf("%s: request %d (holder queue %d + %d uncached vs %d): went to %s; explain %+v", name, j, queued, uHolder, promptTokens, got.ID, e)
			}
			if !stay {
				if c := candidate(t, e, got.ID); c.OverlapBlocks != 0 || c.PredictedTTFTMs >= h.PredictedTTFTMs {
					t.Fatalf("%s: left for %+v, holder %+v", name, c, h)
				}
				if j < 1 {
					t.Fatalf("%s: left the holder at the first request", name)
				}
				return
			}
			got.Acquire(int64(promptTokens)+16, uHolder, 9)
			queued += uHolder
		}
	}
	f("6 of 8 blocks cached: 3 stay", 6, 130)  // 34, 68, 102 <= 130; 136 > 130
	f("7 of 8 blocks cached: 7 stay", 7, 130)  // 18*7 = 126 <= 130; 144 > 130
	f("4 of 8 blocks cached: 1 stays", 4, 130) // 66 <= 130; 132 > 130
	f("5 of 8 blocks cached: 2 stay", 5, 130)  // 50, 100 <= 130; 150 > 130
}

// When the other workers' caches are full, moving duplicates the prefix
// there and evicts something: the burst stays on the holder until its
// predicted TTFT exceeds the idle worker's by DuplicateCost x weight x the
// duplicated tokens.
func TestKVAwareDuplicateCostOnFullCaches(t *testing.T) {
	for _, weight := range []float64{1, 0.5, 0} {
		fx := newKVFixture(t, 2)
		fx.cache(t, 0, 0, 6)
		fx.junk(t, 0, 200)
		fx.junk(t, 1, 206) // w1 is as full as w0: pressure 1
		for _, w := range fx.ws {
			running(w, 1000) // keep the load bound out of the way
		}
		k := NewKVAware(KVAwareConfig{Index: fx.x, OverlapWeight: weight, BlockSize: bs})
		const N = 130
		r := fx.req(N)
		const u = N - 6*bs
		dup := DuplicateCost * weight * 6 * bs
		var queued int64
		for j := 0; j < 200; j++ {
			stay := float64(queued+u) <= N+dup
			e := k.Explain(fx.ws, r)
			if c := candidate(t, e, "w1"); math.Abs(c.CachePressure-1) > 1e-9 || c.DuplicateTokens != 6*bs {
				t.Fatalf("weight %v: cold-side terms %+v", weight, c)
			}
			got := k.PickKV(fx.ws, r)
			if stay != (got == fx.ws[0]) {
				t.Fatalf("weight %v: request %d with holder queue %d: went to %s; explain %+v", weight, j, queued, got.ID, e)
			}
			if !stay {
				break
			}
			got.Acquire(N, u, 9)
			queued += u
		}
	}
}

// A worker over the load bound pays a full prefill per request over it, so
// requests stop piling onto a holder that is far busier than the fleet.
func TestKVAwareBoundedLoad(t *testing.T) {
	fx := newKVFixture(t, 4)
	fx.cache(t, 0, 0, 8)
	for i := 1; i < 4; i++ {
		fx.cache(t, i, 0, 2)
		fx.junk(t, i, 6) // as full as w0
	}
	running(fx.ws[0], 10)
	k := NewKVAware(KVAwareConfig{Index: fx.x, OverlapWeight: 1, BlockSize: bs})
	r := fx.req(128)
	// w0: u 16 + decode 245 = 261 tokens, but mean in flight (10+1)/4,
	// bound 1.2*2.75 + 2 = 5.3, w0 would carry 11: 5.7 requests over, 5.7 x
	// 128 tokens. Others: u 96 + duplicate 7 x 80 = 656.
	e := k.Explain(fx.ws, r)
	h := candidate(t, e, "w0")
	if math.Abs(e.LoadBound-5.3) > 1e-9 || math.Abs(h.LoadExcess-5.7) > 1e-9 {
		t.Fatalf("bound %v, holder %+v", e.LoadBound, h)
	}
	if got := k.PickKV(fx.ws, r); got == fx.ws[0] {
		t.Fatalf("the overloaded holder was chosen: %+v", e)
	}
	// Disabled, the holder wins on predicted TTFT.
	k2 := NewKVAware(KVAwareConfig{Index: fx.x, OverlapWeight: 1, BlockSize: bs, LoadBound: -1})
	if got := k2.PickKV(fx.ws, r); got != fx.ws[0] {
		t.Fatalf("without the bound: picked %s, want w0", got.ID)
	}
	// Within the bound the holder wins too: 3 in flight.
	fx2 := newKVFixture(t, 4)
	fx2.cache(t, 0, 0, 8)
	for _, w := range fx2.ws {
		running(w, 3)
	}
	k3 := NewKVAware(KVAwareConfig{Index: fx2.x, OverlapWeight: 1, BlockSize: bs})
	if got := k3.PickKV(fx2.ws, fx2.req(128)); got != fx2.ws[0] {
		t.Fatalf("holder within the bound: picked %s", got.ID)
	}
}

// A prompt whose only cached part is a prefix every worker holds is a new
// prefix: idle workers tie, and the rendezvous hash of its first uncached
// block decides, the same on every router, spreading prefixes evenly.
func TestKVAwareNewPrefixRendezvous(t *testing.T) {
	x := radix.New()
	var ws []*fleet.Worker
	for i := range 4 {
		ws = append(ws, &fleet.Worker{Load: new(fleet.Load), Idx: i, ID: fmt.Sprintf("engine-%d", i)})
	}
	common := []uint64{11, 22}
	for i := range ws {
		if err := x.Store(i, 0, common[0], 0, false, common); err != nil {
			t.Fatal(err)
		}
	}
	a := NewKVAware(KVAwareConfig{Index: x, Seed: 1})
	b := NewKVAware(KVAwareConfig{Index: x, Seed: 99})
	count := map[string]int{}
	const prefixes = 2000
	for p := range prefixes {
		r := &sched.Request{BlockHashes: []uint64{11, 22, uint64(p)*0x9e3779b97f4a7c15 + 1, uint64(p) + 7}}
		wa, wb := a.PickKV(ws, r), b.PickKV(ws, r)
		if wa != wb {
			t.Fatalf("prefix %d: routers disagree: %s vs %s", p, wa.ID, wb.ID)
		}
		if again := a.PickKV(ws, r); again != wa {
			t.Fatalf("prefix %d: not deterministic", p)
		}
		count[wa.ID]++
	}
	for _, w := range ws {
		if n := count[w.ID]; n < prefixes/4*8/10 || n > prefixes/4*12/10 {
			t.Fatalf("rendezvous spreads unevenly: %v", count)
		}
	}
	e := a.Explain(ws, &sched.Request{BlockHashes: []uint64{11, 22, 33}})
	if e.Reason != ReasonTieHash || e.Key != hex64(33) {
		t.Fatalf("explanation %+v", e)
	}
}

// A decoding worker delays a new request by its current step.
func TestKVAwareDecodeInterference(t *testing.T) {
	fx := newKVFixture(t, 2)
	fx.cache(t, 0, 0, 8)
	fx.cache(t, 1, 0, 8)
	running(fx.ws[0], 3)
	k := NewKVAware(KVAwareConfig{Index: fx.x, BlockSize: bs})
	e := k.Explain(fx.ws, fx.req(128))
	c0, c1 := candidate(t, e, "w0"), candidate(t, e, "w1")
	if c0.RunningRequests != 3 || c0.DecodeTokens != BusyStepTokens+3*RunningSeqTokens || c1.DecodeTokens != 0 {
		t.Fatalf("decode terms %+v %+v", c0, c1)
	}
	if e.Choice != "w1" {
		t.Fatalf("chose the busy worker: %+v", e)
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
	if w := k.PickKV(fx.ws, fx.req(0)); w != nil {
		t.Fatalf("no overlap: picked %s, want nil", w.ID)
	}
	if e := k.Explain(fx.ws, fx.req(0)); e.Choice != "" || e.Reason != ReasonNoOverlap {
		t.Fatalf("no overlap: explain %+v", e)
	}
	// Worker 1 caches 2 blocks on rank 0 and 6 on rank 3: overlap is 6.
	fx.cache(t, 0, 0, 5)
	fx.cache(t, 1, 0, 2)
	fx.cache(t, 1, 3, 6)
	w, ratio := k.PickKVRatio(fx.ws, fx.req(0))
	if w != fx.ws[1] || ratio != 6.0/8 {
		t.Fatalf("dp ranks: picked %v ratio %v, want w1 0.75", w, ratio)
	}
	if w := k.PickKV(nil, fx.req(0)); w != nil {
		t.Fatalf("no candidates: picked %s", w.ID)
	}
}

func TestKVAwareTemperature(t *testing.T) {
	fx := newKVFixture(t, 3)
	// Equal overlaps; queued prefill 0, 50, 100 tokens: normalised costs
	// 0, 0.5, 1.
	for i := range 3 {
		fx.cache(t, i, 0, 2)
	}
	fx.ws[1].Acquire(100, 50, 1)
	fx.ws[2].Acquire(100, 100, 1)
	k := NewKVAware(KVAwareConfig{Index: fx.x, OverlapWeight: 1, Temperature: 0.5, Seed: 42, LoadBound: -1})
	r := fx.req(0)
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
	fx := newKVFixture(t, 3)
	fx.cache(t, 0, 0, 6)
	fx.cache(t, 1, 0, 2)
	fx.junk(t, 2, 12) // w2: cold for this prompt, fullest cache
	fx.ws[0].Acquire(300, 32, 3)
	running(fx.ws[1], 2)
	k := NewKVAware(KVAwareConfig{Index: fx.x, OverlapWeight: 0.5, BlockSize: bs})
	r := fx.req(130)
	e := k.Explain(fx.ws, r)
	if e.Blocks != 8 || e.PromptTokens != 130 || e.DuplicateCost != DuplicateCost*0.5 || e.BlockSize != bs {
		t.Fatalf("explanation header %+v", e)
	}
	s := DefaultPrefillSecondsPerToken * 1e3 // ms per token
	// w0: q 32, u 130-96 = 34, no decode, nothing duplicated.
	// w1: q 0, u 98, decoding 2, duplicates 4 blocks at pressure 2/12.
	// w2: u 130, duplicates 6 blocks at pressure 1.
	type want struct {
		q, u, x  int64
		d, p, ms float64
	}
	for i, w := range []want{
		{32, 34, 0, 0, 6.0 / 12, (32 + 34) * s},
		{0, 98, 64, BusyStepTokens + 2*RunningSeqTokens, 2.0 / 12, (98 + BusyStepTokens + 4) * s},
		{0, 130, 96, 0, 1, 130 * s},
	} {
		c := e.Candidates[i]
		dupMs := DuplicateCost * 0.5 * w.p * float64(w.x) * s
		loadMs := c.LoadExcess * 130 * s
		if c.ActivePrefillTokens != w.q || c.UncachedTokens != w.u || c.DuplicateTokens != w.x || c.DecodeTokens != w.d ||
			math.Abs(c.CachePressure-w.p) > 1e-9 || math.Abs(c.PredictedTTFTMs-w.ms) > 1e-9 ||
			math.Abs(c.DuplicateCostMs-dupMs) > 1e-9 || math.Abs(c.LoadCostMs-loadMs) > 1e-9 ||
			math.Abs(c.CostMs-(w.ms+dupMs+loadMs)) > 1e-9 || c.PrefillUsPerToken != 80 {
			t.Fatalf("candidate %d: %+v, want %+v (dup %.3f ms)", i, c, w, dupMs)
		}
	}
	if e.Choice != "w0" || e.Reason != ReasonLowest {
		t.Fatalf("explanation %+v", e)
	}
	if w := k.PickKV(fx.ws, r); w.ID != e.Choice {
		t.Fatalf("PickKV chose %s, Explain %s", w.ID, e.Choice)
	}
	if _, err := json.Marshal(e); err != nil {
		t.Fatalf("explanation does not marshal: %s", err)
	}
}

// naiveCost evaluates the documented cost model from scratch (equal speeds).
func naiveCost(ws []*fleet.Worker, overlaps []int, cached []int64, n, promptTokens int, weight float64) []float64 {
	N := max(promptTokens, n*bs)
	maxHit := (N - 1) / bs
	omax, hwm, sumR := 0, int64(0), int64(0)
	for i, w := range ws {
		omax = max(omax, overlaps[i])
		hwm = max(hwm, cached[i])
		sumR += w.Load.Requests.Load()
	}
	bound := 1.2*float64(sumR+1)/float64(len(ws)) + 2
	out := make([]float64, len(ws))
	for i, w := range ws {
		hit := min(overlaps[i], maxHit)
		u := N - hit*bs
		run := w.Load.Requests.Load() - w.Load.Pending.Load()
		d := 0.0
		if run > 0 {
			d = BusyStepTokens + RunningSeqTokens*float64(run)
		}
		p := 0.0
		if hwm > 0 {
			p = float64(cached[i]) / float64(hwm)
		}
		x := (min(omax, maxHit) - hit) * bs
		ex := max(0, float64(w.Load.Requests.Load()+1)-bound)
		out[i] = float64(w.Load.PrefillTokens.Load()) + float64(u) + d + DuplicateCost*weight*p*float64(x) + float64(N)*ex
	}
	return out
}

// PickKV agrees with the documented formula on random fleets.
func TestKVAwareMatchesModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for iter := range 300 {
		n := 1 + rng.IntN(6)
		fx := newKVFixture(t, n)
		overlaps := make([]int, n)
		for i := range n {
			overlaps[i] = rng.IntN(9)
			fx.cache(t, i, 0, overlaps[i])
			fx.junk(t, i, rng.IntN(50))
			for range rng.IntN(6) {
				fx.ws[i].Acquire(100, int64(rng.IntN(400)), 5)
			}
			running(fx.ws[i], rng.IntN(6))
		}
		cached := make([]int64, n)
		for i := range n {
			cached[i] = fx.x.WorkerBlocks(i)
		}
		weight := []float64{0, 0.5, 1, 2}[rng.IntN(4)]
		pt := rng.IntN(200)
		k := NewKVAware(KVAwareConfig{Index: fx.x, OverlapWeight: weight, BlockSize: bs})
		r := fx.req(pt)
		e := k.Explain(fx.ws, r)
		got := k.PickKV(fx.ws, r)
		want := naiveCost(fx.ws, overlaps, cached, 8, pt, weight)
		if slicesMax(overlaps) == 0 {
			if got != nil {
				t.Fatalf("iter %d: no overlap but picked %s", iter, got.ID)
			}
			continue
		}
		best := math.Inf(1)
		for i, c := range want {
			if math.Abs(e.Candidates[i].CostMs-c*DefaultPrefillSecondsPerToken*1e3) > 1e-6*max(1, c) {
				t.Fatalf("iter %d: candidate %d cost %.6f ms, model %.6f ms: %+v", iter, i, e.Candidates[i].CostMs, c*0.08, e.Candidates[i])
			}
			best = min(best, c)
		}
		if want[got.Idx] > best+1e-9 {
			t.Fatalf("iter %d: picked %s at %.3f, best %.3f (%v)", iter, got.ID, want[got.Idx], best, want)
		}
	}
}

func slicesMax(v []int) int {
	m := 0
	for _, x := range v {
		m = max(m, x)
	}
	return m
}

// Speed learning: a worker that takes twice as long per token is seen as
// twice as slow, and its predicted TTFT doubles.
func TestKVAwareLearnsSpeed(t *testing.T) {
	fx := newKVFixture(t, 2)
	fx.cache(t, 0, 0, 8)
	fx.cache(t, 1, 0, 8)
	var now int64 = 1e18
	k := NewKVAware(KVAwareConfig{Index: fx.x, BlockSize: bs, LearnSpeed: true, Clock: func() int64 { return now }})
	// Back-to-back requests of 1000 uncached tokens: w0 serves each in
	// 88 ms (80 µs/token + 8 ms), w1 in 176 ms.
	for range 100 {
		now += int64(88 * time.Millisecond)
		k.ObserveFirstToken(fx.ws[0], 1000, 5*time.Second)
		now += int64(88 * time.Millisecond)
		k.ObserveFirstToken(fx.ws[1], 1000, 5*time.Second)
	}
	// w1's observations interleave with w0's: each w1 request was served
	// in the 176 ms since its previous one, each w0 one in 176 ms too, so
	// make w0 faster by observing it more often.
	for range 300 {
		now += int64(88 * time.Millisecond)
		k.ObserveFirstToken(fx.ws[0], 1000, 50*time.Millisecond)
	}
	s0, s1 := k.speedOf(fx.ws[0]), k.speedOf(fx.ws[1])
	if s0 <= 0 || s1 <= 0 || s1/s0 < 1.5 {
		t.Fatalf("learned speeds %.1f and %.1f µs/token, want w1 about twice w0", s0*1e6, s1*1e6)
	}
	e := k.Explain(fx.ws, fx.req(0))
	c0, c1 := candidate(t, e, "w0"), candidate(t, e, "w1")
	if math.Abs(c0.PrefillUsPerToken-s0*1e6) > 1e-6 || c1.PredictedTTFTMs <= c0.PredictedTTFTMs || e.Choice != "w0" {
		t.Fatalf("explain with speeds: %+v", e)
	}
	// A new worker on w1's Idx starts over (at the fleet's mean speed).
	fresh := &fleet.Worker{Load: new(fleet.Load), Idx: 1, ID: "w1-new", Serial: 77}
	if v := k.speedOf(fresh); v != 0 {
		t.Fatalf("a new worker inherited a speed: %v", v)
	}
	k.ObserveFirstToken(fresh, 10, time.Millisecond)
	if v := k.speedOf(fx.ws[1]); v != 0 {
		t.Fatalf("the old worker's speed survived its Idx being reused: %v", v)
	}
	// Off, ObserveFirstToken does nothing.
	off := NewKVAware(KVAwareConfig{Index: fx.x})
	off.ObserveFirstToken(fx.ws[0], 1000, time.Second)
	if v := off.speedOf(fx.ws[0]); v != 0 {
		t.Fatalf("speed learned while off: %v", v)
	}
}

// The load bound stays 0 with a negative setting, and junk config is
// sanitised.
func TestKVAwareConfigDefaults(t *testing.T) {
	k := NewKVAware(KVAwareConfig{Index: radix.New(), OverlapWeight: math.NaN(), Temperature: -1, LoadBound: math.Inf(1), LoadSlack: -3})
	if k.weight != 0 || k.dup != 0 || k.temp != 0 || k.eps >= 0 || k.slack != 0 || k.bs != 16 {
		t.Fatalf("sanitised config: %+v", k)
	}
	d := NewKVAware(KVAwareConfig{Index: radix.New(), OverlapWeight: 1})
	if d.eps != DefaultLoadBound || d.slack != DefaultLoadSlack || d.dup != DuplicateCost {
		t.Fatalf("defaults: %+v", d)
	}
	z := NewKVAware(KVAwareConfig{Index: radix.New(), LoadBound: LoadBoundFromFlag(0)})
	if z.eps <= 0 || z.eps > 1e-300 || LoadBoundFromFlag(0.3) != 0.3 || LoadBoundFromFlag(-1) != -1 {
		t.Fatalf("flag 0 maps to %v", z.eps)
	}
}

// Decisions, explanations and first-token observations run concurrently
// with index updates (run under -race).
func TestKVAwareConcurrent(t *testing.T) {
	fx := newKVFixture(t, 4)
	k := NewKVAware(KVAwareConfig{Index: fx.x, BlockSize: bs, LearnSpeed: true})
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := fx.req(128)
			for i := range 500 {
				w := fx.ws[(g+i)%4]
				if g == 0 && i%50 == 0 {
					// Only this goroutine writes the index (one writer per worker).
					if err := fx.x.Store(i/50%4, 0, 0, 0, false, fx.hashes[:1+i/50%8]); err != nil {
						t.Error(err)
						return
					}
				}
				if got := k.PickKV(fx.ws, r); got != nil {
					got.Acquire(128, 16, 9)
					k.ObserveFirstToken(got, 16, time.Duration(i+1)*time.Millisecond)
					got.Release(128, 16, 9, false)
				}
				k.ObserveFirstToken(w, int64(i), time.Millisecond)
				if i%100 == 0 {
					_ = k.Explain(fx.ws, r)
				}
			}
		}()
	}
	wg.Wait()
	for _, w := range fx.ws {
		if w.Load.Requests.Load() != 0 || w.Load.PrefillTokens.Load() != 0 {
			t.Fatalf("load counters leaked: %+v", w.Load)
		}
	}
}

// Cache pressure is a worker's indexed cache over the largest any candidate
// was seen to hold: a worker that evicted or was cleared has room again, and
// a new worker on a reused Idx starts over.
func TestKVAwareCachePressure(t *testing.T) {
	fx := newKVFixture(t, 2)
	fx.cache(t, 0, 0, 1)
	fx.cache(t, 1, 0, 1)
	fx.junk(t, 0, 9) // w0: 10 blocks
	fx.junk(t, 1, 4) // w1: 5 blocks
	k := NewKVAware(KVAwareConfig{Index: fx.x, BlockSize: bs})
	pressures := func(ws []*fleet.Worker) []float64 {
		t.Helper()
		e := k.Explain(ws, fx.req(0))
		var out []float64
		for _, c := range e.Candidates {
			out = append(out, c.CachePressure)
		}
		return out
	}
	f := func(name string, ws []*fleet.Worker, want ...float64) {
		t.Helper()
		got := pressures(ws)
		for i := range want {
			if math.Abs(got[i]-want[i]) > 1e-9 {
				t.Fatalf("%s: pressures %v, want %v", name, got, want)
			}
		}
	}
	f("initial", fx.ws, 1, 0.5)
	hs := make([]uint64, 9)
	for j := range hs {
		hs[j] = uint64(1)<<40 | uint64(j+1)
	}
	fx.x.Remove(0, 0, hs[0], hs[3:]) // w0 evicts 6 of its 10
	f("after eviction", fx.ws, 0.4, 0.5)
	fresh := &fleet.Worker{Load: new(fleet.Load), Idx: 0, ID: "w0-new", Serial: 99}
	f("new worker on a reused Idx", []*fleet.Worker{fresh, fx.ws[1]}, 0.8, 1)
}
