//go:build cgo

package kv

import (
	"bytes"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/infera/infera/engine"
	"github.com/infera/infera/fleet"
	"github.com/infera/infera/kvroute"
	"github.com/infera/infera/radix"
	"github.com/infera/infera/sched"
)

const bs = 4

// tokensFor returns n blocks of tokens unique to tag.
func tokensFor(tag, n int) []uint32 {
	ts := make([]uint32, n*bs)
	for i := range ts {
		ts[i] = uint32(tag*1000 + i)
	}
	return ts
}

// engineHashes returns fake engine hashes (opaque to the router).
func engineHashes(tag, n int) []uint64 {
	hs := make([]uint64, n)
	for i := range hs {
		hs[i] = uint64(tag)<<32 | uint64(i) | 1<<63 // "negative" when seen as int64
	}
	return hs
}

func newTestManager(t *testing.T, transport string) (*Manager, *radix.Index) {
	t.Helper()
	x := radix.New()
	m, err := NewManager(ManagerConfig{Index: x, Transport: transport, PollInterval: 20 * time.Millisecond,
		ReplayTimeout: time.Second, ReconnectDelay: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	return m, x
}

// newTestPublisher starts the simulated engine's real publisher on an
// ephemeral loopback port.
func newTestPublisher(t *testing.T, replay bool, layout engine.EventLayout) *engine.Publisher {
	t.Helper()
	cfg := engine.PublisherConfig{Endpoint: "tcp://127.0.0.1:*", Layout: layout, FlushInterval: time.Millisecond}
	if replay {
		cfg.ReplayEndpoint = "tcp://127.0.0.1:*"
	}
	p, err := engine.NewPublisher(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// overlap returns how many leading blocks of tokens worker idx caches.
func overlap(x *radix.Index, idx int, tokens []uint32) int {
	for _, o := range x.Match(nil, HashBlocks(nil, tokens, bs, "")) {
		if o.Worker == idx {
			return o.Blocks
		}
	}
	return 0
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// connect publishes a probe chain until the subscriber has seen it (ZMQ
// drops messages sent before the SUB connection is up).
func connect(t *testing.T, p *engine.Publisher, x *radix.Index, idx int) {
	t.Helper()
	probe := tokensFor(999, 1)
	deadline := time.Now().Add(5 * time.Second)
	for overlap(x, idx, probe) == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("subscriber never received the probe")
		}
		p.BlockStored(engineHashes(999, 1), 0, false, probe, bs)
		time.Sleep(20 * time.Millisecond)
	}
}

// quiesce waits until the publisher has sent everything queued so far.
func quiesce(p *engine.Publisher) {
	time.Sleep(10 * time.Millisecond)
}

func TestSubscribeLayouts(t *testing.T) {
	for i, layout := range []engine.EventLayout{engine.LayoutLegacy, engine.LayoutMap} {
		t.Run(string(layout), func(t *testing.T) {
			m, x := newTestManager(t, "zmq")
			p := newTestPublisher(t, false, layout)
			w := &fleet.Worker{Load: new(fleet.Load), Idx: i, ID: "w" + string(layout), KVEventsEndpoint: p.Endpoint(), BlockSize: bs}
			if err := m.WorkerAdded(w); err != nil {
				t.Fatal(err)
			}
			connect(t, p, x, w.Idx)
			a := tokensFor(1, 3)
			ha := engineHashes(1, 3)
			// Stored in two events: the second continues the first's chain.
			p.BlockStored(ha[:1], 0, false, a[:bs], bs)
			p.BlockStored(ha[1:], ha[0], true, a[bs:], bs)
			waitFor(t, "3 blocks", func() bool { return overlap(x, w.Idx, a) == 3 })
			p.BlockRemoved(ha[2:])
			waitFor(t, "removal", func() bool { return overlap(x, w.Idx, a) == 2 })
			p.AllCleared()
			waitFor(t, "clear", func() bool { return overlap(x, w.Idx, a) == 0 && x.WorkerBlocks(w.Idx) == 0 })
			if st := m.Stats(w.ID); st.Applied < 4 || st.Malformed != 0 || st.Gaps != 0 {
				t.Fatalf("stats %+v", st)
			}
			var buf bytes.Buffer
			m.ms.WritePrometheus(&buf)
			for _, want := range []string{`infera_kv_events_applied_total{worker="` + w.ID + `"}`, "infera_kv_seq_gaps_total", "infera_kv_index_blocks", "infera_kv_index_bytes"} {
				if !strings.Contains(buf.String(), want) {
					t.Fatalf("metrics lack %s:\n%s", want, buf.String())
				}
			}
		})
	}
}

func TestGapRecoveredByReplay(t *testing.T) {
	m, x := newTestManager(t, "zmq")
	p := newTestPublisher(t, true, engine.LayoutLegacy)
	w := &fleet.Worker{Load: new(fleet.Load), Idx: 3, ID: "w", KVEventsEndpoint: p.Endpoint(), KVReplayEndpoint: p.ReplayEndpoint(), BlockSize: bs}
	if err := m.WorkerAdded(w); err != nil {
		t.Fatal(err)
	}
	connect(t, p, x, w.Idx)
	quiesce(p)
	a, b := tokensFor(1, 2), tokensFor(2, 2)
	p.DropNext(1) // the next batch is buffered for replay but never sent
	p.BlockStored(engineHashes(1, 2), 0, false, a, bs)
	waitFor(t, "skipped batch", func() bool { return p.Pending() == 0 })
	p.BlockStored(engineHashes(2, 2), 0, false, b, bs)
	waitFor(t, "both chains", func() bool { return overlap(x, w.Idx, a) == 2 && overlap(x, w.Idx, b) == 2 })
	st := m.Stats(w.ID)
	if st.Gaps != 1 || st.Recoveries != 1 || st.Resyncs != 0 {
		t.Fatalf("stats %+v, want one gap recovered", st)
	}
}

func TestGapWithoutReplay(t *testing.T) {
	m, x := newTestManager(t, "zmq")
	p := newTestPublisher(t, false, engine.LayoutLegacy)
	w := &fleet.Worker{Load: new(fleet.Load), Idx: 1, ID: "w", KVEventsEndpoint: p.Endpoint(), BlockSize: bs}
	if err := m.WorkerAdded(w); err != nil {
		t.Fatal(err)
	}
	connect(t, p, x, w.Idx)
	quiesce(p)
	a, b := tokensFor(1, 2), tokensFor(2, 2)
	p.BlockStored(engineHashes(1, 2), 0, false, a, bs)
	waitFor(t, "chain a", func() bool { return overlap(x, w.Idx, a) == 2 })
	p.DropNext(1) // lost: a removal the router never sees
	p.BlockRemoved(engineHashes(1, 2))
	waitFor(t, "skipped batch", func() bool { return p.Pending() == 0 })
	p.BlockStored(engineHashes(2, 2), 0, false, b, bs)
	waitFor(t, "chain b", func() bool { return overlap(x, w.Idx, b) == 2 })
	// The gap forced a resync: chain a (and the probe) are gone.
	if got := overlap(x, w.Idx, a); got != 0 {
		t.Fatalf("chain a still indexed (%d blocks) after a gap without replay", got)
	}
	if got := x.WorkerBlocks(w.Idx); got != 2 {
		t.Fatalf("worker holds %d blocks, want 2", got)
	}
	if st := m.Stats(w.ID); st.Gaps != 1 || st.Resyncs != 1 || st.Recoveries != 0 {
		t.Fatalf("stats %+v", st)
	}
}

func TestWorkerRemovalPurges(t *testing.T) {
	m, x := newTestManager(t, "zmq")
	p := newTestPublisher(t, false, engine.LayoutMap)
	w := &fleet.Worker{Load: new(fleet.Load), Idx: 2, ID: "w", KVEventsEndpoint: p.Endpoint(), BlockSize: bs}
	other := &fleet.Worker{Load: new(fleet.Load), Idx: 5, ID: "other", BlockSize: bs}
	for _, x := range []*fleet.Worker{w, other} {
		if err := m.WorkerAdded(x); err != nil {
			t.Fatal(err)
		}
	}
	connect(t, p, x, w.Idx)
	a := tokensFor(1, 4)
	p.BlockStored(engineHashes(1, 4), 0, false, a, bs)
	waitFor(t, "chain", func() bool { return overlap(x, w.Idx, a) == 4 })
	// The other worker gets the same chain through Feed.
	payload := appendBatchHeader(nil, false, 1, 1)
	payload = appendStored(payload, false, engineHashes(1, 4), 0, false, a, bs)
	payload = appendBatchTrailer(payload, false, 0)
	m.Feed(other.ID, 0, nil, 0, payload)
	waitFor(t, "fed chain", func() bool { return overlap(x, other.Idx, a) == 4 })

	m.WorkerRemoved(w)
	if got := overlap(x, w.Idx, a); got != 0 || x.WorkerBlocks(w.Idx) != 0 {
		t.Fatalf("removed worker still indexed: %d blocks", got)
	}
	// Events published after removal never reach the index.
	p.BlockStored(engineHashes(3, 1), 0, false, tokensFor(3, 1), bs)
	time.Sleep(50 * time.Millisecond)
	if got := x.WorkerBlocks(w.Idx); got != 0 {
		t.Fatalf("removed worker got %d blocks after removal", got)
	}
	if got := overlap(x, other.Idx, a); got != 4 {
		t.Fatalf("other worker lost its blocks: %d", got)
	}
}

func TestFeedSequencing(t *testing.T) {
	m, x := newTestManager(t, "nats")
	w := &fleet.Worker{Load: new(fleet.Load), Idx: 0, ID: "w", BlockSize: bs, DPSize: 2}
	if err := m.WorkerAdded(w); err != nil {
		t.Fatal(err)
	}
	batch := func(rank int, evs ...func([]byte) []byte) []byte {
		b := appendBatchHeader(nil, false, 1, len(evs))
		for _, e := range evs {
			b = e(b)
		}
		return appendBatchTrailer(b, false, rank)
	}
	stored := func(tag, n int) func([]byte) []byte {
		return func(b []byte) []byte {
			return appendStored(b, false, engineHashes(tag, n), 0, false, tokensFor(tag, n), bs)
		}
	}
	var seq atomic.Uint64
	feed := func(s uint64, p []byte) {
		t.Helper()
		if !m.Feed(w.ID, 0, nil, s, p) {
			t.Fatalf("Feed(%d) refused", s)
		}
		seq.Store(s)
	}
	feed(10, batch(0, stored(1, 2))) // first batch: accepted at any seq
	feed(11, batch(1, stored(2, 1))) // rank 1 has its own sequence
	feed(10, batch(0, stored(3, 1))) // stale: dropped
	feed(11, []byte{0x93, 0x01})     // malformed: counted, skipped
	feed(11, batch(0, stored(4, 1))) // in order
	feed(0, batch(0, stored(5, 1)))  // publisher restart: resync
	waitFor(t, "restart batch", func() bool { return overlap(x, w.Idx, tokensFor(5, 1)) == 1 })
	want := map[int]int{1: 0, 2: 1, 3: 0, 4: 0, 5: 1}
	for tag, n := range want {
		if got := overlap(x, w.Idx, tokensFor(tag, max(n, 1))); got != n {
			t.Fatalf("chain %d: overlap %d, want %d", tag, got, n)
		}
	}
	st := m.Stats(w.ID)
	if st.Stale != 1 || st.Malformed != 1 || st.Resyncs != 1 {
		t.Fatalf("stats %+v", st)
	}
	if m.Feed("nobody", 0, nil, 0, nil) {
		t.Fatalf("Feed to an unknown worker succeeded")
	}
}

func TestReplayProtocol(t *testing.T) {
	p := newTestPublisher(t, true, engine.LayoutLegacy)
	for i := range 5 {
		p.BlockStored([]uint64{uint64(i)}, 0, false, tokensFor(i, 1), bs)
		waitFor(t, fmt.Sprintf("batch %d", i), func() bool { return p.Sent() == uint64(i+1) })
	}
	var got []uint64
	var d Decoder
	err := Replay(p.ReplayEndpoint(), 2, time.Second, func(seq uint64, payload []byte) {
		got = append(got, seq)
		if _, err := d.Decode(payload); err != nil {
			t.Errorf("replayed payload %d: %s", seq, err)
		}
	})
	if err != nil || !slices.Equal(got, []uint64{2, 3, 4}) {
		t.Fatalf("Replay = %v, %v; want [2 3 4]", got, err)
	}
	got = nil
	if err := Replay(p.ReplayEndpoint(), 100, time.Second, func(seq uint64, _ []byte) { got = append(got, seq) }); err != nil || len(got) != 0 {
		t.Fatalf("Replay past the end = %v, %v; want only the end marker", got, err)
	}
}

// TestRoutesToCachingEngine: two publishing engines; the one that reported
// the prompt's prefix wins the kv-aware pick for a prompt extending it.
func TestRoutesToCachingEngine(t *testing.T) {
	m, x := newTestManager(t, "zmq")
	var ws []*fleet.Worker
	var pubs []*engine.Publisher
	for i := range 2 {
		p := newTestPublisher(t, true, []engine.EventLayout{engine.LayoutLegacy, engine.LayoutMap}[i])
		w := &fleet.Worker{Load: new(fleet.Load), Idx: i, ID: fmt.Sprintf("engine%d", i), KVEventsEndpoint: p.Endpoint(), KVReplayEndpoint: p.ReplayEndpoint(), BlockSize: bs}
		if err := m.WorkerAdded(w); err != nil {
			t.Fatal(err)
		}
		connect(t, p, x, i)
		ws, pubs = append(ws, w), append(pubs, p)
	}
	conv := tokensFor(7, 6)
	pubs[1].BlockStored(engineHashes(7, 6), 0, false, conv, bs)
	waitFor(t, "conversation cached on engine1", func() bool { return overlap(x, 1, conv) == 6 })
	// Follow-up turn: the cached conversation plus 3 new blocks.
	prompt := append(append([]uint32(nil), conv...), tokensFor(8, 3)...)
	k := kvroute.NewKVAware(kvroute.KVAwareConfig{Index: x, OverlapWeight: 1, BlockSize: bs})
	r := &sched.Request{BlockHashes: HashBlocks(nil, prompt, bs, "")}
	if w, ratio := k.PickKVRatio(ws, r); w != ws[1] || ratio != 6.0/9 {
		t.Fatalf("picked %v with ratio %v, want engine1 with 6/9", w, ratio)
	}
	// Engine1 evicts the conversation: the prompt no longer has a home.
	pubs[1].BlockRemoved(engineHashes(7, 6))
	waitFor(t, "eviction", func() bool { return overlap(x, 1, conv) == 0 })
	if w := k.PickKV(ws, r); w != nil {
		t.Fatalf("picked %s after eviction, want nil (defer)", w.ID)
	}
}

// A data-parallel engine publishes rank r on the base port + r; one worker
// with dp_size 2 follows both ranks.
func TestDataParallelRanks(t *testing.T) {
	m, x := newTestManager(t, "zmq")
	var pubs [2]*engine.Publisher
	for try := 0; pubs[1] == nil; try++ {
		if try > 20 {
			t.Fatal("no two consecutive free ports")
		}
		base := 20000 + int(time.Now().UnixNano()%30000)
		var err error
		for r := 0; r < 2; r++ {
			pubs[r], err = engine.NewPublisher(engine.PublisherConfig{Endpoint: fmt.Sprintf("tcp://127.0.0.1:%d", base+r), DPRank: r, FlushInterval: time.Millisecond})
			if err != nil {
				if r == 1 {
					pubs[0].Close()
				}
				pubs[0], pubs[1] = nil, nil
				break
			}
		}
	}
	for _, p := range pubs {
		p := p
		t.Cleanup(func() { _ = p.Close() })
	}
	if got := rankEndpoint(pubs[0].Endpoint(), 1); got != pubs[1].Endpoint() {
		t.Fatalf("rank 1 endpoint %q, want %q", got, pubs[1].Endpoint())
	}
	w := &fleet.Worker{Load: new(fleet.Load), Idx: 3, ID: "dp", KVEventsEndpoint: pubs[0].Endpoint(), BlockSize: bs, DPSize: 2}
	if err := m.WorkerAdded(w); err != nil {
		t.Fatal(err)
	}
	for r, p := range pubs {
		a := tokensFor(10+r, 2)
		deadline := time.Now().Add(5 * time.Second)
		for overlap(x, w.Idx, a) != 2 {
			if time.Now().After(deadline) {
				t.Fatalf("rank %d's events never reached the index", r)
			}
			p.BlockStored(engineHashes(10+r, 2), 0, false, a, bs)
			time.Sleep(20 * time.Millisecond)
		}
	}
	if st := m.Stats(w.ID); st.Gaps != 0 || st.Malformed != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// TestRemovingOneOfTwoEngineBlocksWithTheSameTokensKeepsTheOther: two
// engine blocks with the same tokens but different engine hashes (vLLM
// keys cache_salt, multimodal extra_keys and lora_id into its hash; the
// router ignores them) map to one router hash. The engine evicting one of
// them must not drop the router hash while the other is still cached, and
// blocks stored below the remaining chain later must be indexed. Each
// engine hash used to map to its router hash with no count of the others:
// the first removal took the router block out of the index, and the next
// block stored below it was dropped for its unknown parent.
func TestRemovingOneOfTwoEngineBlocksWithTheSameTokensKeepsTheOther(t *testing.T) {
	m, x, w := newFedWorker(t)
	sys := tokensFor(1, 2)
	salted1 := []uint64{0x1001, 0x1002} // tenant A's salt
	salted2 := []uint64{0x2001, 0x2002} // tenant B's salt: same tokens
	seq := uint64(0)
	feed := func(b []byte) {
		m.Feed(w.ID, 0, nil, seq, appendBatchTrailer(b, false, 0))
		seq++
	}
	b := appendBatchHeader(nil, false, 1, 2)
	b = appendStored(b, false, salted1, 0, false, sys, bs)
	b = appendStored(b, false, salted2, 0, false, sys, bs)
	feed(b)
	waitFor(t, "the prefix", func() bool { return overlap(x, w.Idx, sys) == 2 })
	// Tenant A's copy is evicted; tenant B's stays in the engine.
	b = appendBatchHeader(nil, false, 2, 1)
	b = appendRemoved(b, false, salted1)
	feed(b)
	// Tenant B's next turn is stored below its cached prefix.
	user := append(append([]uint32(nil), sys...), tokensFor(2, 1)...)
	b = appendBatchHeader(nil, false, 3, 1)
	b = appendStored(b, false, []uint64{0x2003}, salted2[1], true, user[2*bs:], bs)
	feed(b)
	waitFor(t, "three batches", func() bool { st := m.Stats(w.ID); return st.Applied+st.Dropped >= 4 })
	time.Sleep(20 * time.Millisecond)
	if got := overlap(x, w.Idx, user); got != 3 {
		t.Fatalf("engine caches 3 blocks of the prompt (tenant B's chain), index says %d (stats %+v)", got, m.Stats(w.ID))
	}
	// Tenant B's copy goes too: now nothing of the prefix is cached.
	b = appendBatchHeader(nil, false, 4, 1)
	b = appendRemoved(b, false, append(append([]uint64(nil), salted2...), 0x2003))
	feed(b)
	waitFor(t, "the last copy removed", func() bool { return overlap(x, w.Idx, user) == 0 })
}

// TestAnEngineHashStoredTwiceSurvivesOneRemoval: vLLM can hold two
// physical blocks under one block hash (the same prefix computed twice),
// announcing each (BlockStored) and each eviction (BlockRemoved): after one
// eviction the engine still has the block. The first BlockRemoved used to
// take it out of the index.
func TestAnEngineHashStoredTwiceSurvivesOneRemoval(t *testing.T) {
	m, x, w := newFedWorker(t)
	sys := tokensFor(1, 2)
	hs := []uint64{0x1001, 0x1002}
	b := appendBatchHeader(nil, false, 1, 1)
	b = appendStored(b, false, hs, 0, false, sys, bs)
	m.Feed(w.ID, 0, nil, 0, appendBatchTrailer(b, false, 0))
	b = appendBatchHeader(nil, false, 2, 1)
	b = appendStored(b, false, hs, 0, false, sys, bs)
	m.Feed(w.ID, 0, nil, 1, appendBatchTrailer(b, false, 0))
	b = appendBatchHeader(nil, false, 3, 1)
	b = appendRemoved(b, false, hs)
	m.Feed(w.ID, 0, nil, 2, appendBatchTrailer(b, false, 0))
	waitFor(t, "three batches", func() bool { return m.Stats(w.ID).Applied >= 3 })
	if got := overlap(x, w.Idx, sys); got != 2 {
		t.Fatalf("engine still holds one copy of both blocks, index says %d", got)
	}
	// The second removal takes the last copy.
	m.Feed(w.ID, 0, nil, 3, appendBatchTrailer(b, false, 0))
	waitFor(t, "the last copy removed", func() bool { return overlap(x, w.Idx, sys) == 0 })
}

// TestAClearResetsTheCountsOfStoredBlocks: AllBlocksCleared forgets how
// many times each block was stored: a block stored twice, cleared, then
// stored once more leaves the index with its next removal.
func TestAClearResetsTheCountsOfStoredBlocks(t *testing.T) {
	x := radix.New()
	m, err := NewManager(ManagerConfig{Index: x})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	ws := m.newWorkerState(&fleet.Worker{Load: new(fleet.Load), Idx: 1, ID: "w", BlockSize: bs})
	defer ws.unregisterMetrics()
	sys := tokensFor(1, 2)
	hs := []uint64{0x1001, 0x1002}
	batch := func(ts float64, ev func([]byte) []byte) []byte {
		return appendBatchTrailer(ev(appendBatchHeader(nil, false, ts, 1)), false, 0)
	}
	stored := func(b []byte) []byte { return appendStored(b, false, hs, 0, false, sys, bs) }
	ws.handle(0, batch(1, stored))
	ws.handle(1, batch(2, stored))
	ws.handle(2, batch(3, func(b []byte) []byte { return appendCleared(b, false) }))
	ws.handle(3, batch(4, stored))
	if got := overlap(x, 1, sys); got != 2 {
		t.Fatalf("stored after the clear: index says %d blocks, want 2", got)
	}
	ws.handle(4, batch(5, func(b []byte) []byte { return appendRemoved(b, false, hs) }))
	waitFor(t, "the put-off clear", func() bool {
		ws.mu.Lock()
		defer ws.mu.Unlock()
		return !ws.ranks[0].dirty
	})
	if got := overlap(x, 1, sys); got != 0 {
		t.Fatalf("removed once after the clear: index says %d blocks, want 0", got)
	}
	if rs := ws.ranks[0]; len(rs.blocks) != 0 || len(rs.refs) != 0 {
		t.Fatalf("counts left: %d engine hashes, %d router hashes", len(rs.blocks), len(rs.refs))
	}
}

// A worker id may hold runes %q escapes (a no-break space, a quote): the
// KV series name it in a label value Prometheus's text format reads back
// as the id (\u00a0 is no escape of that format: the scrape was refused).
func TestAWorkerIDOfAnyRunesIsALabelPrometheusReadsBack(t *testing.T) {
	m, _ := newTestManager(t, "nats")
	w := &fleet.Worker{Load: new(fleet.Load), Idx: 1, ID: "w\u00a0\"x"}
	if err := m.WorkerAdded(w); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	m.ms.WritePrometheus(&buf)
	if want := "infera_kv_events_applied_total{worker=\"w\u00a0\\\"x\"} 0"; !strings.Contains(buf.String(), want) {
		t.Fatalf("metrics lack %s:\n%s", want, buf.String())
	}
}
