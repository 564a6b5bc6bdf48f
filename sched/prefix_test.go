package sched

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/infera/infera/config"
	"github.com/infera/infera/fleet"
)

func prefixCfg(t *testing.T, f func(c *config.Config)) *config.Config {
	return cfgWith(t, func(c *config.Config) {
		c.PrefixCache.Enabled = true
		if f != nil {
			f(c)
		}
	})
}

func prompt(seed string, n int) []byte {
	b := bytes.Repeat([]byte(seed), n/len(seed)+1)
	return b[:n]
}

func TestPrefixIndexBasics(t *testing.T) {
	p := newPrefixIndex(128, 0)
	f := func(promptLen, wantBlocks int) {
		t.Helper()
		r := &Request{Prompt: prompt("abc", promptLen)}
		p.hashAndMatch(r, 0, 0, nil)
		if len(r.phash) != wantBlocks {
			t.Fatalf("len %d: %d blocks, want %d", promptLen, len(r.phash), wantBlocks)
		}
	}
	f(0, 0)
	f(127, 0) // shorter than a block: not indexed
	f(128, 1)
	f(300, 2)
	f(1024, 8)

	w := &fleet.Worker{Load: new(fleet.Load), Idx: 3, Serial: 7}
	r := &Request{Prompt: prompt("xyz", 1024)}
	if d, _ := p.hashAndMatch(r, 0, 0, nil); d != 0 {
		t.Fatalf("empty index matched %d", d)
	}
	p.record(r.phash, nil, w, 0)
	if p.Len() != 8 {
		t.Fatalf("len %d", p.Len())
	}
	// Same prefix, different tail: 4 blocks match.
	r2 := &Request{Prompt: append(prompt("xyz", 512), prompt("different", 512)...)}
	if d, _ := p.hashAndMatch(r2, 0, 0, nil); d != 4 {
		t.Fatalf("shared half matched %d, want 4", d)
	}
	var idx, ser [prefixSlots]uint16
	if n := p.slots(r.phash, 7, &idx, &ser); n != 1 || idx[0] != 3 || ser[0] != 7 {
		t.Fatalf("slots %d %v %v", n, idx, ser)
	}
	// Recording again adds no blocks; other workers share the entries.
	p.record(r.phash, nil, w, 0)
	for i := 0; i < prefixSlots+2; i++ {
		p.record(r.phash, nil, &fleet.Worker{Load: new(fleet.Load), Idx: 10 + i, Serial: uint32(10 + i)}, 0)
	}
	if p.Len() != 8 {
		t.Fatalf("len %d after re-record", p.Len())
	}
	if n := p.slots(r.phash, 0, &idx, &ser); n != prefixSlots || idx[prefixSlots-1] != uint16(10+prefixSlots+1) {
		t.Fatalf("slot overflow keeps the newest: %d %v", n, idx)
	}
}

func TestPrefixLayerHitAndThreshold(t *testing.T) {
	s, _ := newTestSched(t, workers(4, "m")...)
	cfg := prefixCfg(t, nil)
	base := prompt("system prompt. ", 1024)
	first := pick(t, s, cfg, &Request{Model: []byte("m"), Prompt: base})
	if first.Layer != LayerLB || first.Reason != ReasonPrefixMiss {
		t.Fatalf("first: %s %s", first.Layer, first.Reason)
	}
	home := first.Worker
	home.Acquire(1, 1, 1) // least-requests would avoid it
	d := pick(t, s, cfg, &Request{Model: []byte("m"), Prompt: base})
	if d.Worker != home || d.Layer != LayerPrefix || d.Ratio != 1 {
		t.Fatalf("repeat: %s by %s ratio %.2f", d.Worker.ID, d.Layer, d.Ratio)
	}
	calls := 0
	f := func(c *config.Config, shared, total int, wantHit bool, wantReason Reason) {
		t.Helper()
		calls++
		p := append(append([]byte{}, base[:shared]...), prompt(fmt.Sprintf("tail %d %d %d ", calls, shared, total), total-shared)...)
		d := pick(t, s, c, &Request{Model: []byte("m"), Prompt: p})
		if hit := d.Layer == LayerPrefix; hit != wantHit || d.Reason != wantReason {
			t.Fatalf("shared %d/%d: hit=%v (%s %s ratio %.2f), want hit=%v %s", shared, total, hit, d.Layer, d.Reason, d.Ratio, wantHit, wantReason)
		}
	}
	// Default threshold 0.50.
	f(cfg, 640, 1024, true, ReasonPrefixHit)    // 5 blocks = 0.625
	f(cfg, 512, 1024, true, ReasonPrefixHit)    // 4 blocks = 0.50
	f(cfg, 384, 1024, false, ReasonPrefixBelow) // 3 blocks = 0.375
	f(cfg, 100, 1024, false, ReasonPrefixMiss)  // less than a block
	high := prefixCfg(t, func(c *config.Config) { c.PrefixCache.HitRateThreshold = 0.7 })
	f(high, 640, 1024, false, ReasonPrefixBelow) // changed threshold
	low := prefixCfg(t, func(c *config.Config) { c.PrefixCache.HitRateThreshold = 0.2 })
	f(low, 384, 1024, true, ReasonPrefixHit)
	// Disabled layer (the default config): load balancing, index still fed.
	if d := pick(t, s, config.Default(), &Request{Model: []byte("m"), Prompt: base}); d.Layer != LayerLB || d.Reason != ReasonNone {
		t.Fatalf("disabled: %s %s", d.Layer, d.Reason)
	}
}

func TestPrefixGuards(t *testing.T) {
	setup := func(t *testing.T) (*Scheduler, *fleet.Worker, []byte) {
		s, _ := newTestSched(t, workers(4, "m")...)
		p := prompt("guarded prompt ", 2048)
		home := pick(t, s, prefixCfg(t, nil), &Request{Model: []byte("m"), Prompt: p}).Worker
		return s, home, p
	}
	f := func(name string, cfg *config.Config, load func(home *fleet.Worker, all []*fleet.Worker), wantHit bool) {
		t.Run(name, func(t *testing.T) {
			s, home, p := setup(t)
			load(home, s.Fleet.View().Routable)
			d := pick(t, s, cfg, &Request{Model: []byte("m"), Prompt: p})
			if hit := d.Worker == home && d.Layer == LayerPrefix; hit != wantHit {
				t.Fatalf("hit=%v (%s %s %s) want %v", hit, d.Worker.ID, d.Layer, d.Reason, wantHit)
			}
			if !wantHit && d.Reason != ReasonPrefixOverload {
				t.Fatalf("reason %s", d.Reason)
			}
		})
	}
	// Others carry 3 active requests past their first token, so the load
	// tolerance guard passes and only pending decides.
	pending := func(n int) func(*fleet.Worker, []*fleet.Worker) {
		return func(h *fleet.Worker, all []*fleet.Worker) {
			for i := 0; i < n; i++ {
				h.Acquire(1, 1, 1) // dispatched, no first token yet: pending
			}
			for _, w := range all {
				if w != h {
					for i := 0; i < 3; i++ {
						w.Acquire(1, 1, 1)
						w.FirstToken(1)
					}
				}
			}
		}
	}
	// Pending request threshold: default 2.
	f("pending-2", prefixCfg(t, nil), pending(2), true)
	f("pending-3", prefixCfg(t, nil), pending(3), false)
	f("pending-3-threshold-5", prefixCfg(t, func(c *config.Config) { c.PrefixCache.PendingRequestThreshold = 5 }), pending(3), true)
	// Load tolerance: home 6 active (first tokens seen), others 2 each:
	// avg (6+6)/4 = 3; default 3*1.3 = 3.9 < 6 -> skipped; factor 1.5: 7.5 -> hit.
	skew := func(h *fleet.Worker, all []*fleet.Worker) {
		for i := 0; i < 6; i++ {
			h.Acquire(1, 1, 1)
			h.FirstToken(1)
		}
		for _, w := range all {
			if w != h {
				w.Acquire(1, 1, 1)
				w.Acquire(1, 1, 1)
				w.FirstToken(1)
				w.FirstToken(1)
			}
		}
	}
	f("tolerance-default", prefixCfg(t, nil), skew, false)
	f("tolerance-1.5", prefixCfg(t, func(c *config.Config) { c.PrefixCache.LoadToleranceFactor = 1.5 }), skew, true)
}

func TestPrefixBlockSizeChange(t *testing.T) {
	s, _ := newTestSched(t, workers(4, "m")...)
	p := prompt("block size ", 1024)
	cfg := prefixCfg(t, nil)
	pick(t, s, cfg, &Request{Model: []byte("m"), Prompt: p})
	if d := pick(t, s, cfg, &Request{Model: []byte("m"), Prompt: p}); d.Layer != LayerPrefix {
		t.Fatalf("not a hit: %s", d.Layer)
	}
	bs64 := prefixCfg(t, func(c *config.Config) { c.PrefixIndex.BlockSize = 64 })
	d := pick(t, s, bs64, &Request{Model: []byte("m"), Prompt: p})
	if d.Layer != LayerLB || d.Reason != ReasonPrefixMiss {
		t.Fatalf("new block size must start a fresh index: %s %s", d.Layer, d.Reason)
	}
	if n := s.Stats().PrefixBlocks; n != 16 {
		t.Fatalf("fresh index holds %d blocks, want 16", n)
	}
	// A request still holding the old config (e.g. a failover retry after
	// the reload) does not throw the new index away.
	if d := pick(t, s, cfg, &Request{Model: []byte("m"), Prompt: p}); d.Layer == LayerPrefix {
		t.Fatalf("stale config used the new index")
	}
	if got := s.pidx.Load().blockSize; got != 64 {
		t.Fatalf("stale config replaced the index: block size %d", got)
	}
	// 1 block of 64 out of 100 bytes = 0.64: a hit at block size 64.
	if d := pick(t, s, bs64, &Request{Model: []byte("m"), Prompt: p[:100]}); d.Layer != LayerPrefix || d.Ratio != 0.64 {
		t.Fatalf("short prompt: %s %s %.2f", d.Layer, d.Reason, d.Ratio)
	}
}

func TestPrefixTTL(t *testing.T) {
	f := func(ttl float64, idle time.Duration, wantBlocks int64) {
		t.Helper()
		s, c := newTestSched(t, workers(2, "m")...)
		cfg := prefixCfg(t, func(cf *config.Config) { cf.PrefixIndex.TTLSeconds = ttl })
		pick(t, s, cfg, &Request{Model: []byte("m"), Prompt: prompt("ttl ", 512)})
		c.add(idle)
		s.Maintain(cfg)
		if n := s.Stats().PrefixBlocks; n != wantBlocks {
			t.Fatalf("ttl %v idle %v: %d blocks, want %d", ttl, idle, n, wantBlocks)
		}
	}
	f(259200, 259000*time.Second, 4) // default: 3 days
	f(259200, 259300*time.Second, 0)
	f(3600, 3500*time.Second, 4) // changed
	f(3600, 3700*time.Second, 0)

	// A touched block survives; an untouched one is swept.
	s, c := newTestSched(t, workers(2, "m")...)
	cfg := prefixCfg(t, func(cf *config.Config) { cf.PrefixIndex.TTLSeconds = 100 })
	pick(t, s, cfg, &Request{Model: []byte("m"), Prompt: prompt("keep ", 256)})
	pick(t, s, cfg, &Request{Model: []byte("m"), Prompt: prompt("drop ", 256)})
	c.add(60 * time.Second)
	pick(t, s, cfg, &Request{Model: []byte("m"), Prompt: prompt("keep ", 256)})
	c.add(60 * time.Second)
	s.Maintain(cfg)
	if n := s.Stats().PrefixBlocks; n != 2 {
		t.Fatalf("%d blocks left, want the 2 touched", n)
	}
}

func TestPrefixMemoryBound(t *testing.T) {
	const gb = 1 << 30
	s, c := newTestSched(t, workers(4, "m")...)
	limit := uint64(4 * gb) // thr = min(4*0.7, 4-1.5) = 2.5 GB (reserved first)
	headroom := uint64(2 << 20)
	base := uint64(2.5*gb) - headroom
	s.Memory = func() (uint64, uint64, error) {
		return base + uint64(s.Stats().PrefixBytes), limit, nil
	}
	cfg := prefixCfg(t, nil)
	rng := rand.New(rand.NewPCG(1, 2))
	buf := make([]byte, 1024)
	var r Request
	maxBytes := int64(0)
	n := 30000
	if testing.Short() {
		n = 10000
	}
	for i := 0; i < n; i++ {
		for j := range buf {
			buf[j] = byte(rng.Uint32())
		}
		r.Reset()
		r.Model, r.Prompt = []byte("m"), buf
		if _, err := s.Pick(cfg, &r, nil); err != nil {
			t.Fatal(err)
		}
		if i%100 == 0 {
			c.add(time.Second / 10)
		}
		maxBytes = max(maxBytes, s.Stats().PrefixBytes)
	}
	st := s.Stats()
	// One check may let memCheckEvery blocks in before it evicts.
	slack := int64(memCheckEvery) * prefixEntryBytes
	if maxBytes > int64(headroom)+slack {
		t.Fatalf("index grew to %d bytes, bound %d (+%d slack)", maxBytes, headroom, slack)
	}
	if st.PrefixEvictions == 0 || st.PrefixBlocks == 0 {
		t.Fatalf("no eviction or empty index: %+v", st)
	}
	if want := int64(8 * n); st.PrefixBlocks >= want {
		t.Fatalf("flood not bounded: %d blocks", st.PrefixBlocks)
	}
	// Thresholds: the smaller of ratio and reserved wins, and reloads apply.
	p := s.pidx.Load()
	g := func(ratio, reservedGB float64, limit uint64, want int64) {
		t.Helper()
		s.Memory = func() (uint64, uint64, error) { return 0, limit, nil }
		s.checkMemory(prefixCfg(t, func(c *config.Config) {
			c.PrefixIndex.MemoryThresholdRatio = ratio
			c.PrefixIndex.ReservedMemoryGB = reservedGB
		}), p, s.Now())
		if got := p.lastLimit.Load(); got != want {
			t.Fatalf("ratio %.2f reserved %.1f limit %d: threshold %d want %d", ratio, reservedGB, limit, got, want)
		}
	}
	g(0.70, 1.5, 10*gb, 7*gb)   // ratio first
	g(0.90, 1.5, 10*gb, 8.5*gb) // reserved first
	g(0.70, 1.5, 4*gb, 2.5*gb)  // reserved first
	g(0.50, 0.5, 4*gb, 2*gb)    // ratio first
	g(0.70, 1.5, 1*gb, 0)       // tiny container: clamp at 0
}

func TestHitRateCeiling(t *testing.T) {
	s, _ := newTestSched(t, workers(2, "m")...)
	p := prompt("ceiling ", 1024)
	pick(t, s, config.Default(), &Request{Model: []byte("m"), Prompt: p}) // unseen
	pick(t, s, config.Default(), &Request{Model: []byte("m"), Prompt: p}) // all seen
	if c := s.Stats().HitRateCeiling; c != 0.5 {
		t.Fatalf("ceiling %.3f want 0.5", c)
	}
	// A half-shared prompt adds 512 seen bytes of 1024.
	q := append(append([]byte{}, p[:512]...), prompt("other ", 512)...)
	pick(t, s, config.Default(), &Request{Model: []byte("m"), Prompt: q})
	if c := s.Stats().HitRateCeiling; c != 1536.0/3072 {
		t.Fatalf("ceiling %.3f want 0.5", c)
	}
}

type fakeKV struct {
	pick  string
	ratio float64
	saw   []string
}

func (f *fakeKV) PickKV(cands []*fleet.Worker, r *Request) *fleet.Worker {
	w, _ := f.PickKVRatio(cands, r)
	return w
}

func (f *fakeKV) PickKVRatio(cands []*fleet.Worker, r *Request) (*fleet.Worker, float64) {
	f.saw = f.saw[:0]
	var got *fleet.Worker
	for _, w := range cands {
		f.saw = append(f.saw, w.ID)
		if w.ID == f.pick {
			got = w
		}
	}
	return got, f.ratio
}

func TestKVLayer(t *testing.T) {
	s, _ := newTestSched(t, workers(3, "m")...)
	kv := &fakeKV{pick: "w001", ratio: 0.9}
	s.KV, s.Policy = kv, PolicyKVAware
	cfg := config.Default() // kv-aware works without prefix_cache.enabled
	d := pick(t, s, cfg, &Request{Model: []byte("m"), Prompt: prompt("kv ", 256)})
	if d.Layer != LayerKV || d.Worker.ID != "w001" {
		t.Fatalf("kv: %s by %s", d.Worker.ID, d.Layer)
	}
	// Plain kv-aware: the cost function decides even for a low overlap.
	kv.ratio = 0.3
	if d := pick(t, s, cfg, &Request{Model: []byte("m")}); d.Layer != LayerKV {
		t.Fatalf("plain kv-aware, low ratio: %s", d.Layer)
	}
	// With the prefix-caching layer enabled, KV is its match basis and its
	// guards apply: below the hit rate threshold falls through.
	cfg = config.Default()
	cfg.PrefixCache.Enabled = true
	if d := pick(t, s, cfg, &Request{Model: []byte("m")}); d.Layer != LayerLB {
		t.Fatalf("low ratio: %s", d.Layer)
	}
	// Guards: an overloaded worker is not offered to the scorer.
	kv.ratio = 0.9
	for i := 0; i < 3; i++ {
		s.Fleet.View().Routable[1].Acquire(1, 1, 1)
	}
	d = pick(t, s, cfg, &Request{Model: []byte("m")})
	if d.Layer == LayerKV || len(kv.saw) != 2 {
		t.Fatalf("guarded candidates %v, layer %s", kv.saw, d.Layer)
	}
}

// The prefill load a decision accounts is the prompt's uncached part.
func TestDecisionPrefillTokens(t *testing.T) {
	f := func(ratio float64, prompt int, want int64) {
		t.Helper()
		d := Decision{Ratio: ratio}
		if got := d.PrefillTokens(&Request{PromptTokens: prompt}); got != want {
			t.Fatalf("ratio %v prompt %d: %d, want %d", ratio, prompt, got, want)
		}
	}
	f(0, 1000, 1000)
	f(0.75, 1000, 250)
	f(1, 1000, 0)
	f(1.5, 1000, 1000) // out of range: ignored
	// Plain kv-aware reports the chosen worker's overlap ratio.
	s, _ := newTestSched(t, workers(2, "m")...)
	s.KV, s.Policy = &fakeKV{pick: "w001", ratio: 0.4}, PolicyKVAware
	d := pick(t, s, config.Default(), &Request{Model: []byte("m")})
	if d.Layer != LayerKV || d.Ratio != 0.4 {
		t.Fatalf("kv decision %s ratio %v", d.Layer, d.Ratio)
	}
}

// record trusts the match's snapshot of each block's workers: a worker the
// snapshot lists is not recorded again; one it does not list is added, to
// every block, beside the others.
func TestRecordUsesTheMatchSnapshotOfEachBlock(t *testing.T) {
	p := newPrefixIndex(128, 0)
	w1, w2 := &fleet.Worker{Load: new(fleet.Load), Idx: 1, Serial: 1}, &fleet.Worker{Load: new(fleet.Load), Idx: 2, Serial: 2}
	r := &Request{Prompt: prompt("shared system prompt", 1024)}
	p.hashAndMatch(r, 0, 0, nil)
	if len(r.psnap) != 0 {
		t.Fatalf("empty index: %d snapshots", len(r.psnap))
	}
	p.record(r.phash, r.psnap, w1, 0)

	r.Reset()
	r.Prompt = prompt("shared system prompt", 1024)
	if d, _ := p.hashAndMatch(r, 0, 0, nil); d != 8 || len(r.psnap) != 8 || !r.psnap[7].has(1, 1) || r.psnap[7].has(2, 2) {
		t.Fatalf("depth %d, snapshots %+v", d, r.psnap)
	}
	p.record(r.phash, r.psnap, w2, 0)
	var idx, ser [prefixSlots]uint16
	for k := range r.phash {
		if n := p.slots(r.phash, k, &idx, &ser); n != 2 || idx[0] != 1 || idx[1] != 2 {
			t.Fatalf("block %d: %d workers %v, want 1 and 2", k, n, idx[:n])
		}
	}
	// A snapshot that lists the worker: nothing to record.
	r.Reset()
	r.Prompt = prompt("shared system prompt", 1024)
	p.hashAndMatch(r, 0, 0, nil)
	if !r.psnap[0].has(2, 2) {
		t.Fatalf("snapshot %+v misses worker 2", r.psnap[0])
	}
	before := p.Len()
	p.record(r.phash, r.psnap, w2, 0)
	if p.Len() != before {
		t.Fatalf("len %d -> %d", before, p.Len())
	}
}

// A match cut short by the decision deadline leaves no hashes and no
// snapshots behind for record.
func TestLateMatchLeavesNoSnapshots(t *testing.T) {
	p := newPrefixIndex(128, 0)
	r := &Request{Prompt: prompt("long", 128*200)}
	p.hashAndMatch(r, 0, 0, nil)
	p.record(r.phash, r.psnap, &fleet.Worker{Load: new(fleet.Load), Idx: 1, Serial: 1}, 0)
	r.Reset()
	r.Prompt = prompt("long", 128*200)
	clock := func() int64 { return 2 }
	if _, late := p.hashAndMatch(r, 0, 1, clock); !late || len(r.phash) != 0 || len(r.psnap) != 0 {
		t.Fatalf("late %v, %d hashes, %d snapshots", late, len(r.phash), len(r.psnap))
	}
}

// A reset request keeps small prefix buffers for reuse and drops the ones a
// huge prompt grew.
func TestResetDropsHugePrefixBuffers(t *testing.T) {
	p := newPrefixIndex(128, 0)
	for _, blocks := range []int{8, 4 * keepBlocks} {
		r := &Request{Prompt: prompt("p", 128*blocks)}
		p.hashAndMatch(r, 0, 0, nil)
		p.record(r.phash, r.psnap, &fleet.Worker{Load: new(fleet.Load), Idx: 1, Serial: 1}, 0)
		p.hashAndMatch(r, 0, 0, nil) // every block matches: blocks snapshots
		if len(r.phash) != blocks || len(r.psnap) != blocks {
			t.Fatalf("%d blocks: %d hashes, %d snapshots", blocks, len(r.phash), len(r.psnap))
		}
		r.Reset()
		kept := cap(r.phash) > 0 && cap(r.psnap) > 0
		if huge := blocks > keepBlocks; kept == huge {
			t.Fatalf("%d blocks: kept %v (caps %d, %d)", blocks, kept, cap(r.phash), cap(r.psnap))
		}
	}
}

func TestPromptsSharingPartOfAGroupMatchAndRecordEachBlockOnce(t *testing.T) {
	const bs = 16
	p := newPrefixIndex(bs, 0)
	w1 := &fleet.Worker{Load: new(fleet.Load), Idx: 1, Serial: 1}
	w2 := &fleet.Worker{Load: new(fleet.Load), Idx: 2, Serial: 2}
	shared := prompt("the same system prompt, ", 12*bs) // one group and a half
	a := &Request{Prompt: append(append([]byte{}, shared...), prompt("first question ", 8*bs)...)}
	b := &Request{Prompt: append(append([]byte{}, shared...), prompt("second question", 8*bs)...)}
	if d, _ := p.hashAndMatch(a, 0, 0, nil); d != 0 {
		t.Fatalf("empty index matched %d blocks", d)
	}
	p.record(a.phash, a.psnap, w1, 0)
	if d, _ := p.hashAndMatch(b, 0, 0, nil); d != 12 || len(b.psnap) != 12 {
		t.Fatalf("matched %d blocks (%d snapshots), want the 12 shared ones", d, len(b.psnap))
	}
	p.record(b.phash, b.psnap, w2, 0)
	if p.Len() != 20+8 {
		t.Fatalf("%d blocks indexed, want 28: the shared ones once", p.Len())
	}
	var idx, ser [prefixSlots]uint16
	if n := p.slots(b.phash, 11, &idx, &ser); n != 2 || idx[0] != 1 || idx[1] != 2 {
		t.Fatalf("last shared block lists %v, want workers 1 and 2", idx[:n])
	}
	if n := p.slots(b.phash, 12, &idx, &ser); n != 1 || idx[0] != 2 {
		t.Fatalf("first own block of b lists %v, want worker 2", idx[:n])
	}
	for k, h := range b.phash {
		sh := p.blockShard(b.phash, k)
		if _, ok := sh.m[h]; !ok {
			t.Fatalf("block %d is not in the shard of its group's first block", k)
		}
	}
}

// TestPrefixMatchAgreesWithAPlainSetOfRecordedPrefixes records prompts that
// share prefixes of every length (inside a group of blocks, at its edge,
// across several) and checks each match against a plain set of the prefixes
// recorded so far: the longest recorded prefix of the prompt, and for every
// matched block, the workers recorded for it.
func TestPrefixMatchAgreesWithAPlainSetOfRecordedPrefixes(t *testing.T) {
	const bs = 16
	rng := rand.New(rand.NewPCG(1, 2))
	p := newPrefixIndex(bs, 0)
	recorded := map[string][]int{} // prompt prefix (whole blocks) -> workers, oldest first
	workers := make([]*fleet.Worker, 4)
	for i := range workers {
		workers[i] = &fleet.Worker{Load: new(fleet.Load), Idx: i, Serial: uint32(i + 1)}
	}
	bases := make([][]byte, 3)
	for i := range bases {
		bases[i] = make([]byte, 40*bs)
		for j := range bases[i] {
			bases[i][j] = byte('a' + rng.IntN(26))
		}
	}
	for round := 0; round < 400; round++ {
		// A prompt: a base's first k blocks, then its own tail.
		base := bases[rng.IntN(len(bases))]
		k := rng.IntN(35)
		prompt := append([]byte{}, base[:k*bs]...)
		for j := 0; j < (1+rng.IntN(12))*bs+rng.IntN(bs); j++ {
			prompt = append(prompt, byte('A'+rng.IntN(26)))
		}
		r := &Request{Prompt: prompt}
		depth, _ := p.hashAndMatch(r, 0, 0, nil)
		want := 0
		for d := len(prompt) / bs; d > 0; d-- {
			if _, ok := recorded[string(prompt[:d*bs])]; ok {
				want = d
				break
			}
		}
		if depth != want {
			t.Fatalf("round %d: matched %d blocks, the recorded prefixes say %d", round, depth, want)
		}
		for d := 1; d <= depth; d++ {
			ws := recorded[string(prompt[:d*bs])]
			var idx, ser [prefixSlots]uint16
			n := p.slots(r.phash, d-1, &idx, &ser)
			if n != len(ws) {
				t.Fatalf("round %d, block %d: %d workers indexed, %d recorded", round, d-1, n, len(ws))
			}
			for i, w := range ws {
				if int(idx[i]) != w {
					t.Fatalf("round %d, block %d: workers %v, recorded %v", round, d-1, idx[:n], ws)
				}
			}
		}
		w := workers[rng.IntN(len(workers))]
		p.record(r.phash, r.psnap, w, 0)
		for d := 1; d <= len(prompt)/bs; d++ {
			kk := string(prompt[:d*bs])
			ws := recorded[kk]
			has := false
			for _, x := range ws {
				has = has || x == w.Idx
			}
			if !has {
				recorded[kk] = append(ws, w.Idx)
			}
		}
	}
	if p.Len() != int64(len(recorded)) {
		t.Fatalf("index holds %d blocks, %d prefixes were recorded", p.Len(), len(recorded))
	}
}

func TestLoadOnlyRequestNeitherMatchesNorRecordsThePrefixIndex(t *testing.T) {
	s, _ := newTestSched(t, workers(4, "m")...)
	cfg := prefixCfg(t, nil)
	p := prompt("load only ", 1024)
	d := pick(t, s, cfg, &Request{Model: []byte("m"), Prompt: p, LoadOnly: true})
	if d.Layer != LayerLB {
		t.Fatalf("load-only request decided by %s", d.Layer)
	}
	if n := s.Stats().PrefixBlocks; n != 0 {
		t.Fatalf("load-only request recorded %d blocks", n)
	}
	pick(t, s, cfg, &Request{Model: []byte("m"), Prompt: p}) // recorded now
	if d := pick(t, s, cfg, &Request{Model: []byte("m"), Prompt: p, LoadOnly: true}); d.Layer != LayerLB {
		t.Fatalf("load-only request matched the prefix index: %s", d.Layer)
	}
}

// A retry after the first attempt's worker failed keeps the prefix layer:
// another worker holding the prompt's prefix is a hit (the retry skipped
// the layer, prefix-miss, and load balancing sent it to a cold worker).
func TestARetryStillFindsAnotherWorkerHoldingThePrefix(t *testing.T) {
	s, _ := newTestSched(t, workers(4, "m")...)
	cfg := prefixCfg(t, nil)
	base := prompt("system prompt. ", 1024)
	v := s.Fleet.View()
	// w001 and w002 hold the prefix.
	for _, keep := range []int{1, 2} {
		var tried []int
		for i, w := range v.Routable {
			if i != keep {
				tried = append(tried, w.Idx)
			}
		}
		if d := pick(t, s, cfg, &Request{Model: []byte("m"), Prompt: base, Tried: tried}); d.Worker != v.Routable[keep] {
			t.Fatalf("seeding: chose %s", d.Worker.ID)
		}
	}
	r := &Request{Model: []byte("m"), Prompt: base}
	first := pick(t, s, cfg, r)
	if first.Layer != LayerPrefix || (first.Worker != v.Routable[1] && first.Worker != v.Routable[2]) {
		t.Fatalf("first attempt: %s by %s", first.Worker.ID, first.Layer)
	}
	r.Tried = append(r.Tried, first.Worker.Idx) // it failed
	retry := pick(t, s, cfg, r)
	if retry.Layer != LayerPrefix || retry.Reason != ReasonPrefixHit || retry.Worker == first.Worker ||
		(retry.Worker != v.Routable[1] && retry.Worker != v.Routable[2]) {
		t.Fatalf("retry: %s by %s (%s), want the other worker holding the prefix", retry.Worker.ID, retry.Layer, retry.Reason)
	}
}

// A worker whose attempt failed is taken off the blocks the attempt
// recorded it on, at the retry: it did not cache the prompt (the prefix
// layer kept sending the prompt's next requests to the worker that failed).
func TestAFailedAttemptsWorkerIsNotLeftHoldingThePrefix(t *testing.T) {
	s, _ := newTestSched(t, workers(4, "m")...)
	cfg := prefixCfg(t, nil)
	base := prompt("system prompt. ", 1024)
	v := s.Fleet.View()
	w0, w1 := v.Routable[0], v.Routable[1]
	if d := pick(t, s, cfg, &Request{Model: []byte("m"), Prompt: base, Tried: []int{w0.Idx, v.Routable[2].Idx, v.Routable[3].Idx}}); d.Worker != w1 {
		t.Fatalf("seeding: %s", d.Worker.ID)
	}
	r := &Request{Model: []byte("m"), Prompt: base, Tried: []int{w0.Idx, w1.Idx}}
	failed := pick(t, s, cfg, r) // w002 or w003: records the prompt there
	r.Tried = append(r.Tried, failed.Worker.Idx)
	served := pick(t, s, cfg, r) // the retry: the other one
	if served.Worker == failed.Worker {
		t.Fatal("the retry went to the worker that failed")
	}
	// Without w001 and the retry's worker, nothing holds the prefix.
	d := pick(t, s, cfg, &Request{Model: []byte("m"), Prompt: base, Tried: []int{w1.Idx, served.Worker.Idx}})
	if d.Layer == LayerPrefix {
		t.Fatalf("a later request went to %s as a prefix hit: the worker that failed still holds the prompt", d.Worker.ID)
	}
}
