//go:build cgo

package kv

import (
	"strings"
	"testing"
	"time"

	"github.com/infera/infera/engine"
	"github.com/infera/infera/fleet"
	"github.com/infera/infera/radix"
)

// TestBlocksCachedBeforeTheRouterListenedAreLearnedFromTheReplayBuffer:
// vLLM announces a block once, when it is computed. A chain cached before
// the router subscribed (a shared system prompt) is filled in from the
// engine's replay buffer on first contact, so a block stored on it later
// is indexed instead of dropped for its unknown parent.
func TestBlocksCachedBeforeTheRouterListenedAreLearnedFromTheReplayBuffer(t *testing.T) {
	m, x := newTestManager(t, "zmq")
	p := newTestPublisher(t, true, engine.LayoutMap)
	sys := tokensFor(1, 3)
	hs := engineHashes(1, 4)
	p.BlockStored(hs[:3], 0, false, sys, bs) // nobody subscribed: buffered only
	waitFor(t, "the batch before the router", func() bool { return p.Sent() >= 1 })
	time.Sleep(5 * time.Millisecond) // in a batch of its own, before the probes
	w := &fleet.Worker{Load: new(fleet.Load), Idx: 2, ID: "w", KVEventsEndpoint: p.Endpoint(), KVReplayEndpoint: p.ReplayEndpoint(), BlockSize: bs}
	if err := m.WorkerAdded(w); err != nil {
		t.Fatal(err)
	}
	connect(t, p, x, w.Idx)
	user := append(append([]uint32(nil), sys...), tokensFor(2, 1)...)
	p.BlockStored(hs[3:], hs[2], true, user[3*bs:], bs)
	waitFor(t, "the user turn on the system prompt", func() bool { return overlap(x, w.Idx, user) == 4 })
	if st := m.Stats(w.ID); st.CatchUps != 1 || st.Dropped != 0 || st.Resyncs != 0 {
		t.Fatalf("stats %+v, want one catch-up and nothing dropped", st)
	}
}

// TestAnUndecodableBatchIsSkippedWithoutClearingTheWorker: one batch the
// decoder refuses is counted and skipped; the next one is in sequence, not
// a gap that clears every entry of the worker.
func TestAnUndecodableBatchIsSkippedWithoutClearingTheWorker(t *testing.T) {
	m, x, w := newFedWorker(t)
	batch := func(tag, n int) []byte {
		b := appendBatchHeader(nil, false, 1, 1)
		b = appendStored(b, false, engineHashes(tag, n), 0, false, tokensFor(tag, n), bs)
		return appendBatchTrailer(b, false, 0)
	}
	m.Feed(w.ID, 0, nil, 5, batch(1, 2))
	m.Feed(w.ID, 0, nil, 6, []byte{0xc1})
	m.Feed(w.ID, 0, nil, 7, batch(2, 2))
	waitFor(t, "the batch after the bad one", func() bool { return overlap(x, w.Idx, tokensFor(2, 2)) == 2 })
	if got := overlap(x, w.Idx, tokensFor(1, 2)); got != 2 {
		t.Fatalf("the chain before the bad batch holds %d blocks, want 2", got)
	}
	if st := m.Stats(w.ID); st.Malformed != 1 || st.Gaps != 0 || st.Resyncs != 0 {
		t.Fatalf("stats %+v, want one malformed batch and no gap", st)
	}
}

// TestAClearPutOffIsDoneWithoutAnotherBatch: clears are at most every
// minClearEvery; one put off must still happen when the engine goes quiet
// after it, or the index keeps blocks the engine dropped.
func TestAClearPutOffIsDoneWithoutAnotherBatch(t *testing.T) {
	m, x, w := newFedWorker(t)
	stored := func(tag int) []byte {
		b := appendBatchHeader(nil, false, 1, 1)
		b = appendStored(b, false, engineHashes(tag, 2), 0, false, tokensFor(tag, 2), bs)
		return appendBatchTrailer(b, false, 0)
	}
	clear := appendBatchTrailer(appendCleared(appendBatchHeader(nil, false, 1, 1), false), false, 0)
	m.Feed(w.ID, 0, nil, 1, stored(1))
	m.Feed(w.ID, 0, nil, 2, clear)
	m.Feed(w.ID, 0, nil, 3, stored(2))
	m.Feed(w.ID, 0, nil, 4, clear) // within minClearEvery of the first
	waitFor(t, "both clears", func() bool {
		return overlap(x, w.Idx, tokensFor(1, 2)) == 0 && overlap(x, w.Idx, tokensFor(2, 2)) == 0
	})
	time.Sleep(2 * minClearEvery) // nothing comes back
	if n := x.WorkerBlocks(w.Idx); n != 0 {
		t.Fatalf("worker holds %d blocks after the engine cleared them", n)
	}
}

// TestBlocksOfAnotherBlockSizeAreDropped: events in blocks of another size
// than the worker's could never match a prompt hashed in the worker's: they
// are dropped and counted, not indexed in silence.
func TestBlocksOfAnotherBlockSizeAreDropped(t *testing.T) {
	m, x, w := newFedWorker(t)
	b := appendBatchHeader(nil, false, 1, 1)
	b = appendStored(b, false, engineHashes(1, 1), 0, false, tokensFor(1, 2), 2*bs)
	m.Feed(w.ID, 0, nil, 1, appendBatchTrailer(b, false, 0))
	waitFor(t, "the drop", func() bool { return m.Stats(w.ID).Dropped == 1 })
	if n := x.WorkerBlocks(w.Idx); n != 0 {
		t.Fatalf("worker holds %d blocks", n)
	}
}

// TestLoRAAdapterNamesFromEventsAreKnownToTheRequestPath: an adapter named
// in BlockStored (vLLM's lora_name) is known by IsLora, so the router hashes
// a request for it with the adapter's seed: it matches the adapter's blocks
// and not the base model's.
func TestLoRAAdapterNamesFromEventsAreKnownToTheRequestPath(t *testing.T) {
	m, x, w := newFedWorker(t)
	ev := appendStored(nil, true, engineHashes(1, 2), 0, false, tokensFor(1, 2), bs)
	ev = mpAppendStr(ev[:len(ev)-1], "sql-lora") // lora_name, not nil
	b := appendBatchTrailer(append(appendBatchHeader(nil, false, 1, 1), ev...), false, 0)
	m.Feed(w.ID, 0, nil, 1, b)
	waitFor(t, "the adapter's blocks", func() bool { return m.IsLora([]byte("sql-lora")) == "sql-lora" })
	if got := m.IsLora([]byte("sim-model")); got != "" {
		t.Fatalf("IsLora(sim-model) = %q", got)
	}
	matches := func(lora string) int {
		for _, o := range x.Match(nil, HashBlocks(nil, tokensFor(1, 2), bs, lora)) {
			if o.Worker == w.Idx {
				return o.Blocks
			}
		}
		return 0
	}
	if a, base := matches("sql-lora"), matches(""); a != 2 || base != 0 {
		t.Fatalf("the adapter's prompt matches %d blocks, the base model's %d; want 2 and 0", a, base)
	}
}

// TestADecoderDoesNotKeepTheBuffersOfAHugeBatch: one huge batch (a buggy
// or hostile publisher's) must not pin its memory for the worker's
// lifetime; the next batch starts with fresh buffers.
func TestADecoderDoesNotKeepTheBuffersOfAHugeBatch(t *testing.T) {
	const n = 2 * maxKeptTokens / bs
	huge := appendBatchTrailer(appendStored(appendBatchHeader(nil, false, 1, 1), false, engineHashes(1, n), 0, false, tokensFor(1, n), bs), false, 0)
	small := appendBatchTrailer(appendStored(appendBatchHeader(nil, false, 1, 1), false, engineHashes(2, 1), 0, false, tokensFor(2, 1), bs), false, 0)
	var d Decoder
	if _, err := d.Decode(huge); err != nil {
		t.Fatal(err)
	}
	b, err := d.Decode(small)
	if err != nil || len(b.Events) != 1 || len(b.Events[0].Tokens) != bs {
		t.Fatalf("small batch after the huge one: %v %+v", err, b)
	}
	if cap(d.tokens) > maxKeptTokens || cap(d.hashes) > maxKeptTokens/16 {
		t.Fatalf("kept %d tokens and %d hashes of capacity", cap(d.tokens), cap(d.hashes))
	}
}

// TestABatchNumberedAsTheLastButMadeLaterIsARestart: the last batch's
// number again is a repeat when it is the same batch (same timestamp),
// and a publisher restart whose earlier batches were lost when it is not:
// the worker's old entries go.
func TestABatchNumberedAsTheLastButMadeLaterIsARestart(t *testing.T) {
	m, x, w := newFedWorker(t)
	batch := func(ts float64, tag int) []byte {
		b := appendBatchHeader(nil, false, ts, 1)
		b = appendStored(b, false, engineHashes(tag, 1), 0, false, tokensFor(tag, 1), bs)
		return appendBatchTrailer(b, false, 0)
	}
	m.Feed(w.ID, 0, nil, 3, batch(100, 1))
	m.Feed(w.ID, 0, nil, 4, batch(101, 2))
	m.Feed(w.ID, 0, nil, 4, batch(101, 2)) // a repeat: stale
	waitFor(t, "the repeat", func() bool { return m.Stats(w.ID).Stale == 1 })
	m.Feed(w.ID, 0, nil, 4, batch(205, 3)) // restarted: 0-3 lost
	waitFor(t, "the restart", func() bool { return overlap(x, w.Idx, tokensFor(3, 1)) == 1 })
	if a, b := overlap(x, w.Idx, tokensFor(1, 1)), overlap(x, w.Idx, tokensFor(2, 1)); a != 0 || b != 0 {
		t.Fatalf("entries of the publisher before its restart: %d %d", a, b)
	}
	if st := m.Stats(w.ID); st.Resyncs != 1 || st.Stale != 1 {
		t.Fatalf("stats %+v", st)
	}
}

// TestARestartedEngineIsCaughtUpFromItsReplayBuffer: an engine restarts
// at the same endpoint (the worker record is unchanged, so the manager
// keeps its sequence state). Its first batch, holding the shared system
// prompt, is lost to the SUB's reconnect (slow joiner); the next one (seq 1,
// below the old instance's next) is taken for a restart and resyncs. The
// restarted engine keeps batch 0 in its replay buffer, as on first contact,
// so the system prompt must be learned from it and the user turn stored on
// it indexed. A restart used to resync without the catch-up first contact
// does, so the user turn was dropped for its unknown parent.
func TestARestartedEngineIsCaughtUpFromItsReplayBuffer(t *testing.T) {
	x := radix.New()
	m, err := NewManager(ManagerConfig{Index: x, Transport: "zmq", ReplayTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	// The restarted engine: batch 0 = the system prompt, sent before the
	// router's SUB reconnected (nobody subscribed: only its replay buffer
	// holds it).
	p := newTestPublisher(t, true, engine.LayoutLegacy)
	sys := tokensFor(1, 3)
	hs := engineHashes(1, 4)
	p.BlockStored(hs[:3], 0, false, sys, bs)
	waitFor(t, "batch 0 of the restarted engine", func() bool { return p.Sent() >= 1 })
	w := &fleet.Worker{Load: new(fleet.Load), Idx: 3, ID: "w", KVEventsEndpoint: p.Endpoint(), KVReplayEndpoint: p.ReplayEndpoint(), BlockSize: bs}
	ws := m.newWorkerState(w)
	defer ws.unregisterMetrics()
	if ws.replayFn == nil {
		t.Fatal("no replay function")
	}
	old := func(s uint64, tag int) []byte {
		b := appendBatchHeader(nil, false, float64(s), 1)
		b = appendStored(b, false, engineHashes(tag, 1), 0, false, tokensFor(tag, 1), bs)
		return appendBatchTrailer(b, false, 0)
	}
	// The old engine instance: batches 0..9, as received live.
	for s := uint64(0); s < 10; s++ {
		ws.handle(s, old(s, 100+int(s)))
	}
	// The restarted engine's batch 1, received live: the user turn on the
	// system prompt.
	user := append(append([]uint32(nil), sys...), tokensFor(2, 1)...)
	b := appendBatchHeader(nil, false, 1000, 1)
	b = appendStored(b, false, hs[3:], hs[2], true, user[3*bs:], bs)
	ws.handle(1, appendBatchTrailer(b, false, 0))
	if got := overlap(x, 3, user); got != 4 {
		t.Fatalf("restarted engine caches 4 blocks of the prompt, index says %d (dropped %d, resyncs %d, catch-ups %d)",
			got, ws.mDropped.Get(), ws.mResyncs.Get(), ws.mCatchUps.Get())
	}
	// Each batch once: the system prompt from the replay, the user turn live.
	if st := ws.mApplied.Get(); st != 10+2 || ws.mCatchUps.Get() != 1 {
		t.Fatalf("applied %d events (want 12), catch-ups %d (want 1)", st, ws.mCatchUps.Get())
	}
}

// newFedWorker is a manager with one worker whose batches the test feeds
// (Feed, as over NATS).
func newFedWorker(t *testing.T) (*Manager, *radix.Index, *fleet.Worker) {
	t.Helper()
	m, x := newTestManager(t, "nats")
	w := &fleet.Worker{Load: new(fleet.Load), Idx: 0, ID: "w", BlockSize: bs}
	if err := m.WorkerAdded(w); err != nil {
		t.Fatal(err)
	}
	return m, x, w
}

// TestAReplayEndpointAdvertisedAsABindAddressIsReached: a record may give
// its endpoints as the engine binds them (vLLM's kv-events-config,
// tcp://*:5558). The events endpoint was connected to on the worker's host,
// the replay endpoint as it was: ZMQ refused tcp://* ("invalid argument"),
// so every catch-up and gap replay failed, and the blocks stored on chains
// cached before the router listened were dropped for their unknown parents.
func TestAReplayEndpointAdvertisedAsABindAddressIsReached(t *testing.T) {
	m, x := newTestManager(t, "zmq")
	p := newTestPublisher(t, true, engine.LayoutMap)
	sys := tokensFor(1, 3)
	hs := engineHashes(1, 4)
	p.BlockStored(hs[:3], 0, false, sys, bs) // nobody subscribed: buffered only
	waitFor(t, "the batch before the router", func() bool { return p.Sent() >= 1 })
	time.Sleep(5 * time.Millisecond) // in a batch of its own, before the probes
	bind := func(ep string) string { return strings.Replace(ep, "tcp://127.0.0.1:", "tcp://*:", 1) }
	w := &fleet.Worker{Load: new(fleet.Load), Idx: 2, ID: "w", Addr: "127.0.0.1:8000", KVEventsEndpoint: bind(p.Endpoint()),
		KVReplayEndpoint: bind(p.ReplayEndpoint()), BlockSize: bs}
	if err := m.WorkerAdded(w); err != nil {
		t.Fatal(err)
	}
	connect(t, p, x, w.Idx)
	user := append(append([]uint32(nil), sys...), tokensFor(2, 1)...)
	p.BlockStored(hs[3:], hs[2], true, user[3*bs:], bs)
	waitFor(t, "the user turn on the system prompt", func() bool { return overlap(x, w.Idx, user) == 4 })
	if st := m.Stats(w.ID); st.CatchUps != 1 || st.Dropped != 0 {
		t.Fatalf("stats %+v, want one catch-up and nothing dropped", st)
	}
}

// TestALoRANameLongerThanAModelNameIsNotKept: adapter names from events
// are kept for the router's lifetime; a name longer than any model name a
// worker may serve (512 bytes) is no model a request can ask for, and a
// publisher naming 256 adapters of 1 MiB held 516 MiB after it left.
func TestALoRANameLongerThanAModelNameIsNotKept(t *testing.T) {
	m, _, w := newFedWorker(t)
	for i, name := range []string{strings.Repeat("a", 512), strings.Repeat("b", 513)} {
		ev := appendStored(nil, true, engineHashes(i+1, 1), 0, false, tokensFor(i+1, 1), bs)
		ev = mpAppendStr(ev[:len(ev)-1], name) // lora_name, not nil
		m.Feed(w.ID, 0, nil, uint64(i), appendBatchTrailer(append(appendBatchHeader(nil, false, 1, 1), ev...), false, 0))
	}
	waitFor(t, "both batches", func() bool { return m.Stats(w.ID).Applied == 2 })
	long := strings.Repeat("a", 512)
	if got := m.IsLora([]byte(long)); got != long {
		t.Fatalf("a 512-byte adapter name is not known")
	}
	if got := m.IsLora([]byte(strings.Repeat("b", 513))); got != "" {
		t.Fatalf("a 513-byte adapter name is kept")
	}
}
