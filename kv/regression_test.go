//go:build cgo

package kv

import (
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/infera/infera/engine"
	"github.com/infera/infera/fleet"
	"github.com/infera/infera/radix"
)

// TestPublisherRestartWithoutSeqZeroIsDetected: a publisher restart whose first batches
// (0..2) were lost (ZMQ slow joiner / relay reconnect) is treated as "stale"
// forever: the new engine's blocks are ignored until its sequence passes the
// old one, and the old engine's blocks stay in the index.
func TestPublisherRestartWithoutSeqZeroIsDetected(t *testing.T) {
	m, x := newTestManager(t, "nats")
	w := &fleet.Worker{Load: new(fleet.Load), Idx: 0, ID: "w", BlockSize: bs}
	if err := m.WorkerAdded(w); err != nil {
		t.Fatal(err)
	}
	batch := func(tag int) []byte {
		b := appendBatchHeader(nil, false, 1, 1)
		b = appendStored(b, false, engineHashes(tag, 1), 0, false, tokensFor(tag, 1), bs)
		return appendBatchTrailer(b, false, 0)
	}
	for s := uint64(0); s < 50; s++ {
		m.Feed(w.ID, 0, nil, s, batch(100+int(s)))
	}
	waitFor(t, "old cache", func() bool { return overlap(x, 0, tokensFor(149, 1)) == 1 })
	// Engine restarts; batches 0..2 of the new publisher are lost.
	m.Feed(w.ID, 0, nil, 3, batch(7))
	m.Feed(w.ID, 0, nil, 4, batch(8))
	// Each batch ends as applied, stale or dropped; a resync is counted
	// besides the batch that caused it, so it must not count here.
	waitFor(t, "processed", func() bool { st := m.Stats(w.ID); return st.Stale+st.Applied+st.Dropped >= 52 })
	if overlap(x, 0, tokensFor(8, 1)) != 1 {
		t.Errorf("blocks stored by the restarted engine are not indexed (stats %+v)", m.Stats(w.ID))
	}
	if overlap(x, 0, tokensFor(100, 1)) != 0 {
		t.Errorf("blocks of the dead engine instance are still indexed")
	}
}

// TestReplayBeyondSendHWMDeliversEveryBatch: a replay of more batches than the ROUTER's
// default send HWM (1000) must deliver every batch and the end marker.
func TestReplayBeyondSendHWMDeliversEveryBatch(t *testing.T) {
	// One event per batch: each event is sent as soon as it is queued.
	p, err := engine.NewPublisher(engine.PublisherConfig{Endpoint: "tcp://127.0.0.1:*", ReplayEndpoint: "tcp://127.0.0.1:*",
		FlushInterval: time.Millisecond, MaxBatchEvents: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	const n = 3000
	for i := 0; i < n; i++ {
		p.BlockStored(engineHashes(i, 1), 0, false, tokensFor(i, 1), bs)
		for p.Sent() < uint64(i+1) {
			time.Sleep(50 * time.Microsecond)
		}
	}
	got := 0
	err = Replay(p.ReplayEndpoint(), 0, 3*time.Second, func(seq uint64, payload []byte) { got++ })
	t.Logf("replayed %d of %d, err=%v", got, n, err)
	if err != nil || got != n {
		t.Fatalf("replay delivered %d of %d batches (err %v)", got, n, err)
	}
}

// TestClearedEngineMapReleasesItsPeakSize: after AllBlocksCleared the per-rank engine
// hash map must not keep its peak size (clear() keeps a Go map's buckets).
func TestClearedEngineMapReleasesItsPeakSize(t *testing.T) {
	x := radix.New()
	m, err := NewManager(ManagerConfig{Index: x})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	w := &fleet.Worker{Load: new(fleet.Load), Idx: 0, ID: "w", BlockSize: bs}
	ws := m.newWorkerState(w)
	const n = 200000
	b := appendBatchHeader(nil, false, 1, 1)
	b = appendStored(b, false, engineHashes(1, n), 0, false, tokensFor(1, n), bs)
	ws.handle(0, appendBatchTrailer(b, false, 0))
	x.RemoveWorker(0)
	heap := func() uint64 {
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapAlloc
	}
	before := heap()
	c := appendBatchHeader(nil, false, 2, 1)
	c = appendCleared(c, false)
	ws.handle(1, appendBatchTrailer(c, false, 0))
	after := heap()
	t.Logf("heap before AllBlocksCleared %d KiB, after %d KiB (map entries %d)", before>>10, after>>10, len(ws.ranks[0].blocks))
	// ~6.5 MiB are decoder/index leftovers freed either way; the map is ~7 MiB more.
	if before-min(before, after) < 10<<20 {
		t.Fatalf("AllBlocksCleared freed only %d KiB of the engine-hash map", (before-min(before, after))>>10)
	}
	runtime.KeepAlive(ws)
}

// TestEveryWorkerOfALargeFleetIsFollowedOverZMQ: following a worker takes
// three ZMQ sockets, and ZMQ's default limit (1023 sockets) stopped the
// router at 341 workers: 59 of 400 never had their KV events read (their
// subscribers retried "too many open files" forever).
func TestEveryWorkerOfALargeFleetIsFollowedOverZMQ(t *testing.T) {
	m, x := newTestManager(t, "zmq")
	p := newTestPublisher(t, false, engine.LayoutLegacy)
	const n = 400
	for i := 0; i < n; i++ {
		w := &fleet.Worker{Load: new(fleet.Load), Idx: i, ID: "w" + strconv.Itoa(i), KVEventsEndpoint: p.Endpoint(), BlockSize: bs}
		if err := m.WorkerAdded(w); err != nil {
			t.Fatal(err)
		}
	}
	probe := tokensFor(999, 1)
	following := func() int {
		got := 0
		for _, o := range x.Match(nil, HashBlocks(nil, probe, bs, "")) {
			if o.Blocks > 0 {
				got++
			}
		}
		return got
	}
	deadline := time.Now().Add(10 * time.Second)
	for following() < n && time.Now().Before(deadline) {
		p.BlockStored(engineHashes(999, 1), 0, false, probe, bs)
		time.Sleep(50 * time.Millisecond)
	}
	if got := following(); got != n {
		t.Fatalf("%d of %d workers indexed the probe", got, n)
	}
}
