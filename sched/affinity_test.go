package sched

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/infera/infera/config"
	"github.com/infera/infera/fleet"
)

func affCfg(t *testing.T, f func(sa *config.SessionAffinity)) *config.Config {
	return cfgWith(t, func(c *config.Config) {
		c.SessionAffinity.Enabled = true
		if f != nil {
			f(&c.SessionAffinity)
		}
	})
}

func sess(id string) *Request { return &Request{Model: []byte("m"), SessionID: []byte(id)} }

func TestAffinityBindsAndHits(t *testing.T) {
	s, _ := newTestSched(t, workers(4, "m")...)
	cfg := affCfg(t, nil)
	d := pick(t, s, cfg, sess("a"))
	if d.Layer != LayerLB || d.Reason != ReasonAffinityNew {
		t.Fatalf("first request: %s %s", d.Layer, d.Reason)
	}
	home := d.Worker
	// One in-flight request: least-requests would move the session, soft
	// affinity (default) keeps it (at most one request is never overloaded).
	home.Acquire(1, 1, 1)
	for i := 0; i < 10; i++ {
		d := pick(t, s, cfg, sess("a"))
		if d.Worker != home || d.Layer != LayerAffinity || d.Reason != ReasonAffinityHit {
			t.Fatalf("request %d: %s by %s/%s, want %s by affinity", i, d.Worker.ID, d.Layer, d.Reason, home.ID)
		}
	}
	// Affinity disabled by a reload: the same session is load balanced.
	off := config.Default()
	if d := pick(t, s, off, sess("a")); d.Layer != LayerLB || d.Worker == home {
		t.Fatalf("disabled affinity: %s by %s", d.Worker.ID, d.Layer)
	}
	// No session header: normal scheduling.
	if d := pick(t, s, cfg, &Request{Model: []byte("m")}); d.Reason != ReasonNoSession {
		t.Fatalf("no session: %s", d.Reason)
	}
}

func TestAffinityStrongVsSoftSkewedLoad(t *testing.T) {
	f := func(mode string, ratio float64, load int, wantSticky bool) {
		t.Helper()
		s, _ := newTestSched(t, workers(4, "m")...)
		cfg := affCfg(t, func(sa *config.SessionAffinity) {
			sa.Mode = mode
			sa.SoftMaxLoadRatio = ratio
		})
		home := pick(t, s, cfg, sess("x")).Worker
		for i := 0; i < load; i++ {
			home.Acquire(1, 1, 1)
		}
		// Other workers carry one request each.
		for _, w := range s.Fleet.View().Routable {
			if w != home {
				w.Acquire(1, 1, 1)
			}
		}
		d := pick(t, s, cfg, sess("x"))
		if sticky := d.Worker == home; sticky != wantSticky {
			t.Fatalf("%s ratio %.1f load %d: sticky=%v (%s %s)", mode, ratio, load, sticky, d.Layer, d.Reason)
		}
		if !wantSticky && d.Reason != ReasonAffinityOverload {
			t.Fatalf("reason %s", d.Reason)
		}
		if wantSticky {
			return
		}
		// Soft skip does not rebind: with load gone the session returns home.
		for i := 0; i < load; i++ {
			home.Release(1, 1, 1, false)
		}
		if d := pick(t, s, cfg, sess("x")); d.Worker != home {
			t.Fatalf("soft skip rebound the session")
		}
	}
	// avg over 4 workers with home at 10, others at 1: (10+3)/4 = 3.25.
	f("strong", 1.5, 10, true)
	f("soft", 1.5, 10, false) // 10 > 3.25*1.5
	f("soft", 4, 10, true)    // 10 <= 3.25*4 = 13 (changed ratio)
	f("soft", 1.5, 2, false)  // avg (2+3)/4 = 1.25; 2 > 1.875
}

func TestAffinityRebind(t *testing.T) {
	s, _ := newTestSched(t, workers(3, "m")...)
	cfg := affCfg(t, func(sa *config.SessionAffinity) { sa.Mode = "strong" })
	home := pick(t, s, cfg, sess("x")).Worker
	// Breaker open: re-bound, not failed.
	for i := 0; i < 3; i++ {
		home.Breaker.Failure(s.Now(), false)
	}
	d := pick(t, s, cfg, sess("x"))
	if d.Worker == home || d.Reason != ReasonAffinityRebind {
		t.Fatalf("open breaker: %s %s", d.Worker.ID, d.Reason)
	}
	newHome := d.Worker
	if d := pick(t, s, cfg, sess("x")); d.Worker != newHome || d.Layer != LayerAffinity {
		t.Fatalf("not rebound to %s: %s %s", newHome.ID, d.Worker.ID, d.Layer)
	}
	// Worker leaves the fleet: re-bound.
	s.Fleet.Remove(newHome.ID)
	d = pick(t, s, cfg, sess("x"))
	if d.Worker == newHome || d.Reason != ReasonAffinityRebind {
		t.Fatalf("removed worker: %s %s", d.Worker.ID, d.Reason)
	}
	// Same ID re-registered is a new Worker: the old pointer is stale.
	if err := s.Fleet.Upsert(rec(newHome.ID, "", "m")); err != nil {
		t.Fatal(err)
	}
	if d := pick(t, s, cfg, sess("x")); d.Layer != LayerAffinity {
		t.Fatalf("binding lost: %s %s", d.Layer, d.Reason)
	}
}

func TestAffinityTTL(t *testing.T) {
	f := func(ttl float64, idle time.Duration, wantHit bool) {
		t.Helper()
		s, c := newTestSched(t, workers(4, "m")...)
		cfg := affCfg(t, func(sa *config.SessionAffinity) { sa.TTLSeconds = ttl })
		pick(t, s, cfg, sess("x"))
		c.add(idle)
		d := pick(t, s, cfg, sess("x"))
		if hit := d.Layer == LayerAffinity; hit != wantHit {
			t.Fatalf("ttl %v idle %v: hit=%v", ttl, idle, hit)
		}
	}
	f(1800, 1799*time.Second, true) // default
	f(1800, 1801*time.Second, false)
	f(10, 9*time.Second, true) // changed
	f(10, 11*time.Second, false)

	// The sweep removes idle bindings.
	s, c := newTestSched(t, workers(2, "m")...)
	cfg := affCfg(t, func(sa *config.SessionAffinity) { sa.TTLSeconds = 10 })
	for i := 0; i < 5; i++ {
		pick(t, s, cfg, sess(fmt.Sprint(i)))
	}
	if n := s.Stats().AffinityEntries; n != 5 {
		t.Fatalf("entries %d", n)
	}
	c.add(5 * time.Second)
	pick(t, s, cfg, sess("0")) // refreshed
	c.add(6 * time.Second)
	s.Maintain(cfg)
	if n := s.Stats().AffinityEntries; n != 1 {
		t.Fatalf("after sweep %d entries, want 1", n)
	}
}

func TestAffinityMaxEntries(t *testing.T) {
	s, c := newTestSched(t, workers(4, "m")...)
	cfg := affCfg(t, func(sa *config.SessionAffinity) { sa.MaxEntries = 3 })
	for _, id := range []string{"a", "b", "c"} {
		pick(t, s, cfg, sess(id))
		c.add(time.Second)
	}
	pick(t, s, cfg, sess("a")) // a is now the most recent
	pick(t, s, cfg, sess("d")) // evicts b, the oldest
	if n := s.Stats().AffinityEntries; n != 3 {
		t.Fatalf("entries %d want 3", n)
	}
	hit := func(id string) bool { return pick(t, s, cfg, sess(id)).Layer == LayerAffinity }
	if !hit("a") || !hit("c") || !hit("d") {
		t.Fatalf("recent sessions evicted")
	}
	if hit("b") {
		t.Fatalf("oldest session b was not evicted")
	}
	// Default max entries: 100000 held exactly.
	s2, _ := newTestSched(t, workers(2, "m")...)
	def := affCfg(t, nil)
	tab := s2.affinity(s2.compiled(def))
	w := s2.Fleet.View().Routable[0]
	for i := 0; i < 150000; i++ {
		tab.bind(uint64(i)*0x9E3779B97F4A7C15, w, int64(i+1))
	}
	if n, ev := tab.count.Load(), tab.evictions.Load(); n != 100000 || ev != 50000 || tab.entries() != 100000 {
		t.Fatalf("default max entries: %d bindings (%d in the shards), %d evictions", n, tab.entries(), ev)
	}
	// A reload with a larger limit keeps the table and raises the cap.
	big := affCfg(t, func(sa *config.SessionAffinity) { sa.MaxEntries = 200000 })
	if s2.affinity(s2.compiled(big)) != tab {
		t.Fatalf("a new limit must keep the bindings")
	}
}

// entries counts the bindings in the shards (tests).
func (t *affinityTable) entries() int {
	n := 0
	for si := range t.shards {
		sh := &t.shards[si]
		sh.mu.Lock()
		n += len(sh.m)
		sh.mu.Unlock()
	}
	return n
}

// max_entries was enforced per shard (ceil(max/64) each, by hash), so a
// shard that filled first evicted its oldest binding while the table was
// well below the limit: 1001 sessions under max_entries 1024 evicted 12.
// The spec: "when the limit is reached, the oldest records are evicted".
func TestAffinityEvictsOnlyAtTheLimitAndTheOldestFirst(t *testing.T) {
	tab := newAffinityTable(1024)
	w := &fleet.Worker{Load: new(fleet.Load)}
	key := func(i int) uint64 { return uint64(i+1) * 0x9E3779B97F4A7C15 }
	for i := 0; i < 1001; i++ {
		tab.bind(key(i), w, int64(i+1))
	}
	if ev := tab.evictions.Load(); ev != 0 || tab.count.Load() != 1001 {
		t.Fatalf("1001 sessions under max_entries 1024: %d evictions, %d entries", ev, tab.count.Load())
	}
	for i := 1001; i < 1101; i++ {
		tab.bind(key(i), w, int64(i+1))
	}
	if ev, n := tab.evictions.Load(), tab.count.Load(); ev != 77 || n != 1024 || tab.entries() != 1024 {
		t.Fatalf("1101 sessions under max_entries 1024: %d evictions, %d entries (%d in the shards)", ev, n, tab.entries())
	}
	for i := 0; i < 1101; i++ {
		got := tab.get(key(i), 2000, int64(time.Hour)) != nil
		if want := i >= 77; got != want {
			t.Fatalf("session %d held: %v, want %v (the 77 oldest go)", i, got, want)
		}
	}
}

// A reload from 100000 to 1000 changed the shard layout, which replaced the
// table: every session lost its binding. The newest 1000 are kept now.
func TestAffinityReloadOfMaxEntriesKeepsTheNewestBindings(t *testing.T) {
	s, _ := newTestSched(t, workers(2, "m")...)
	tab := s.affinity(s.compiled(affCfg(t, nil)))
	w := s.Fleet.View().Routable[0]
	key := func(i int) uint64 { return uint64(i+1) * 0x9E3779B97F4A7C15 }
	for i := 0; i < 5000; i++ {
		tab.bind(key(i), w, int64(i+1))
	}
	small := affCfg(t, func(sa *config.SessionAffinity) { sa.MaxEntries = 1000 })
	if s.affinity(s.compiled(small)) != tab {
		t.Fatal("the reload replaced the table")
	}
	if n := tab.count.Load(); n != 1000 || tab.entries() != 1000 {
		t.Fatalf("%d bindings (%d in the shards) after lowering max_entries to 1000", n, tab.entries())
	}
	for i := 0; i < 5000; i++ {
		if got, want := tab.get(key(i), 6000, int64(time.Hour)) != nil, i >= 4000; got != want {
			t.Fatalf("session %d held: %v, want %v", i, got, want)
		}
	}
}

// Concurrent binds past the limit leave the table at the limit exactly.
func TestAffinityConcurrentBindsStayAtTheLimit(t *testing.T) {
	tab := newAffinityTable(1000)
	w := &fleet.Worker{Load: new(fleet.Load)}
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 3000; i++ {
				k := uint64(g*3000+i+1) * 0x9E3779B97F4A7C15
				tab.bind(k, w, int64(i+1))
				if i%3 == 0 {
					tab.get(k, int64(i+2), int64(time.Hour))
				}
			}
		}()
	}
	wg.Wait()
	if n := tab.count.Load(); n != 1000 || tab.entries() != 1000 || tab.evictions.Load() != 23000 {
		t.Fatalf("%d bindings counted, %d in the shards, %d evictions; want 1000, 1000, 23000", n, tab.entries(), tab.evictions.Load())
	}
}

// Lowering session_affinity.max_entries by reload (same shard layout, so
// the bindings are kept) left every shard over its new cap until its
// entries expired: the memory an operator lowered the cap to reclaim stayed
// held for the TTL. The oldest bindings beyond the new cap go at once.
func TestLoweringMaxEntriesEvictsTheOldestAtOnce(t *testing.T) {
	s, _ := newTestSched(t, workers(2, "m")...)
	tab := s.affinity(s.compiled(affCfg(t, func(sa *config.SessionAffinity) { sa.MaxEntries = 1000 })))
	w := s.Fleet.View().Routable[0]
	for i := 0; i < 1000; i++ {
		tab.bind(uint64(i)*0x9E3779B97F4A7C15, w, int64(i+1))
	}
	lower := affCfg(t, func(sa *config.SessionAffinity) { sa.MaxEntries = 600 })
	if s.affinity(s.compiled(lower)) != tab {
		t.Fatal("the reload replaced the table")
	}
	if n := tab.count.Load(); n > 600 {
		t.Fatalf("%d bindings held after lowering max_entries to 600", n)
	}
	// The newest survive, the oldest went.
	newest := uint64(999)
	if tab.get(newest*0x9E3779B97F4A7C15, 1001, int64(time.Hour)) == nil {
		t.Fatal("the newest binding was evicted")
	}
	if tab.get(0, 1001, int64(time.Hour)) != nil {
		t.Fatal("the oldest binding was kept")
	}
}

// A request that loaded its config before many reloads (a failover retry,
// a request that waited in a queue) and picks again with it: its older
// max_entries applies to nothing shared. It had become the newest once
// more than eight reloads retired it, trimming the table to its old limit
// and leaving the current config stale until the next reload.
func TestAnOldConfigAfterManyReloadsNeverReshapesTheSessionTable(t *testing.T) {
	s, _ := newTestSched(t, workers(2, "m")...)
	var cur atomic.Pointer[config.Config]
	s.Latest = cur.Load
	old := affCfg(t, func(sa *config.SessionAffinity) { sa.MaxEntries = 3 })
	cur.Store(old)
	tab := s.affinity(s.compiled(old))
	var latest *config.Config
	for i := range 10 {
		latest = affCfg(t, func(sa *config.SessionAffinity) { sa.MaxEntries = 100000; sa.TTLSeconds = float64(1000 + i) })
		cur.Store(latest)
		if s.affinity(s.compiled(latest)) != tab {
			t.Fatal("a reload of max_entries replaced the table")
		}
	}
	w := s.Fleet.View().Routable[0]
	for i := range 10 {
		tab.bind(uint64(i+1)*0x9E3779B97F4A7C15, w, int64(i+1))
	}
	if c := s.compiled(old); !c.stale.Load() {
		t.Fatal("the old config was taken as the newest")
	}
	s.affinity(s.compiled(old))
	if c := s.compiled(latest); c.stale.Load() || s.comp.Load() != c {
		t.Fatal("the current config is no longer current")
	}
	if n := tab.count.Load(); n != 10 {
		t.Fatalf("%d bindings after a pick with the old config, want 10", n)
	}
}

// A reload that lowers max_entries evicts the oldest bindings beyond it
// within a second, though no request with affinity comes (here affinity
// is switched off in the same reload): the table kept them until the next
// affinity decision, or for their TTL.
func TestAReloadLoweringMaxEntriesEvictsWithoutARequest(t *testing.T) {
	s, _ := newTestSched(t, workers(2, "m")...)
	var cur atomic.Pointer[config.Config]
	s.Latest = cur.Load
	cur.Store(affCfg(t, func(sa *config.SessionAffinity) { sa.MaxEntries = 100 }))
	tab := s.affinity(s.compiled(cur.Load()))
	w := s.Fleet.View().Routable[0]
	for i := range 10 {
		tab.bind(uint64(i+1)*0x9E3779B97F4A7C15, w, int64(i+1))
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go s.Run(ctx, cur.Load)
	cur.Store(cfgWith(t, func(c *config.Config) { c.SessionAffinity.MaxEntries = 3 }))
	deadline := time.Now().Add(3 * time.Second)
	for tab.count.Load() != 3 {
		if time.Now().After(deadline) {
			t.Fatalf("%d bindings 3 s after max_entries was lowered to 3", tab.count.Load())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// One session, two models served by different workers (Claude Code, the
// client the spec names for the session header, sends its main model and
// a small model in the same session; a RAG client interleaves embeddings
// and chat). The chat turns keep their worker (and its KV cache): a
// session is bound per model. One binding per session was re-bound to the
// other model's worker, and the next chat turn was load balanced afresh.
func TestASessionUsingTwoModelsKeepsAWorkerForEach(t *testing.T) {
	recs := append(workers(3, "chat"), rec("e0", "", "embed"), rec("e1", "", "embed"))
	s, _ := newTestSched(t, recs...)
	for _, mode := range []string{"strong", "soft"} {
		cfg := affCfg(t, func(sa *config.SessionAffinity) { sa.Mode = mode })
		id := "sess-" + mode
		home := pick(t, s, cfg, &Request{Model: []byte("chat"), SessionID: []byte(id)}).Worker
		for turn := 0; turn < 3; turn++ {
			pick(t, s, cfg, &Request{Model: []byte("embed"), SessionID: []byte(id), LoadOnly: true})
			d := pick(t, s, cfg, &Request{Model: []byte("chat"), SessionID: []byte(id)})
			if d.Layer != LayerAffinity || d.Worker != home {
				t.Fatalf("%s: chat turn %d after an embed request of the session: %s by %s/%s, session was bound to %s", mode, turn, d.Worker.ID, d.Layer, d.Reason, home.ID)
			}
		}
	}
}
