//go:build cgo

package kv

import (
	"encoding/binary"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/infera/infera/engine"
	"github.com/infera/infera/fleet"
	"github.com/infera/infera/radix"
	zmq "github.com/pebbe/zmq4"
)

// A block size so large that len(hashes)*block_size overflows to 0 (a
// record's, before fleet validation bounded it) passes the token count
// check with no tokens: the subscriber must count the batch malformed,
// not panic (which would kill the router).
func TestABlockSizeThatOverflowsTheTokenCheckDoesNotPanic(t *testing.T) {
	x := radix.New()
	m, err := NewManager(ManagerConfig{Index: x})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	rec := fleet.Record{ID: "evil", URL: "http://127.0.0.1:1", BlockSize: 1 << 62}
	if err := rec.Validate(); err == nil {
		t.Fatal("fleet validation accepts block_size 2^62")
	}
	ws := m.newWorkerState(&fleet.Worker{Load: new(fleet.Load), Idx: 1, ID: "evil", BlockSize: rec.BlockSize})
	defer ws.unregisterMetrics()
	// Legacy BlockStored with 4 hashes, no parent, no tokens, block_size omitted
	// (trailing defaults dropped): ["BlockStored", [h1..h4], nil, []]
	b := mpAppendArray(nil, 2)
	b = mpAppendFloat(b, 1)
	b = mpAppendArray(b, 1)
	b = mpAppendArray(b, 4)
	b = mpAppendStr(b, "BlockStored")
	b = appendHashes(b, []uint64{1, 2, 3, 4})
	b = mpAppendNil(b)
	b = mpAppendArray(b, 0)
	defer func() {
		if r := recover(); r != nil {
			t.Fatalf("handle panicked: %v", r)
		}
	}()
	ws.handle(0, b)
}

// A worker that caches nothing and sends a batch of 2,000 AllBlocksCleared
// events must not walk the whole index (another worker's 200k entries,
// under each shard's write lock) once per event.
func TestAClearFloodFromAWorkerWithNothingCachedCostsNoIndexWalks(t *testing.T) {
	x := radix.New()
	m, err := NewManager(ManagerConfig{Index: x})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	// Another worker (idx 0) with 200k blocks in 20k chains.
	for c := 0; c < 20000; c++ {
		hs := HashBlocks(nil, tokensFor(c, 10), bs, "")
		if err := x.Store(0, 0, 0, 0, false, hs); err != nil {
			t.Fatal(err)
		}
	}
	ws := m.newWorkerState(&fleet.Worker{Load: new(fleet.Load), Idx: 7, ID: "evil", BlockSize: bs})
	defer ws.unregisterMetrics()
	const n = 2000
	b := mpAppendArray(nil, 2)
	b = mpAppendFloat(b, 1)
	b = mpAppendArray(b, n)
	for i := 0; i < n; i++ {
		b = appendCleared(b, false)
	}
	t.Logf("payload %d bytes, %d AllBlocksCleared events", len(b), n)
	start := time.Now()
	ws.handle(0, b)
	el := time.Since(start)
	t.Logf("one batch took %v (index of another worker: %+v)", el, x.Stats().Entries)
	if el > 500*time.Millisecond {
		t.Fatalf("a %d-byte batch from a worker that caches nothing cost %v of full-index purges", len(b), el)
	}
}

// A publisher that restarts after one batch sends batch 0 again: a
// restart (resync), not a stale repeat, so the new instance's first batch
// is indexed and the dead instance's blocks go.
func TestAPublisherRestartAfterOneBatchResyncs(t *testing.T) {
	x := radix.New()
	m, err := NewManager(ManagerConfig{Index: x})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	ws := m.newWorkerState(&fleet.Worker{Load: new(fleet.Load), Idx: 2, ID: "w", BlockSize: bs})
	defer ws.unregisterMetrics()
	batch := func(tag int) []byte {
		b := appendBatchHeader(nil, false, 1, 1)
		b = appendStored(b, false, engineHashes(tag, 1), 0, false, tokensFor(tag, 1), bs)
		return appendBatchTrailer(b, false, 0)
	}
	ws.handle(0, batch(1)) // old instance, then it crashes
	ws.handle(0, batch(2)) // new instance's seq 0
	ws.handle(1, batch(3)) // new instance's seq 1
	if overlap(x, 2, tokensFor(2, 1)) != 1 {
		t.Errorf("new instance's first batch dropped as stale (stale=%d)", ws.mStale.Get())
	}
	if overlap(x, 2, tokensFor(1, 1)) != 0 {
		t.Errorf("dead instance's block still indexed")
	}
}

// A publisher whose sequence keeps jumping (each jump a resync, each a
// walk over the whole index) gets at most one index clear per
// minClearEvery: a clear that comes sooner is put off to the first batch
// after it, which then drops the rank's stale entries.
func TestResyncClearsOfARankAreSpacedOut(t *testing.T) {
	x := radix.New()
	m, err := NewManager(ManagerConfig{Index: x})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	ws := m.newWorkerState(&fleet.Worker{Load: new(fleet.Load), Idx: 3, ID: "flappy", BlockSize: bs})
	defer ws.unregisterMetrics()
	batch := func(tag int) []byte {
		b := appendBatchHeader(nil, false, 1, 1)
		b = appendStored(b, false, engineHashes(tag, 1), 0, false, tokensFor(tag, 1), bs)
		return appendBatchTrailer(b, false, 0)
	}
	ws.handle(0, batch(1))
	ws.handle(10, batch(2)) // a gap without replay: resync, cleared at once
	if overlap(x, 3, tokensFor(1, 1)) != 0 || overlap(x, 3, tokensFor(2, 1)) != 1 {
		t.Fatal("the first resync did not clear the rank")
	}
	ws.handle(0, batch(3)) // a restart right after: its clear is put off
	if overlap(x, 3, tokensFor(2, 1)) != 1 {
		t.Fatal("a second clear within minClearEvery walked the index")
	}
	time.Sleep(minClearEvery + 20*time.Millisecond)
	ws.handle(1, batch(4)) // the next batch after: the put-off clear runs first
	if overlap(x, 3, tokensFor(2, 1)) != 0 || overlap(x, 3, tokensFor(4, 1)) != 1 {
		t.Fatalf("after minClearEvery: stale %d, new %d; want the stale entry gone and the new one indexed",
			overlap(x, 3, tokensFor(2, 1)), overlap(x, 3, tokensFor(4, 1)))
	}
	// The block the new instance stored while its clear was put off is
	// its: it stays (the put-off clear used to take it too).
	if overlap(x, 3, tokensFor(3, 1)) != 1 {
		t.Fatal("a block stored after the put-off clear was cleared with the stale ones")
	}
}

// The engine clears its cache twice in a row with stores between (two
// /admin/clear-cache, or a catch-up replaying such a history within a few
// ms): the second clear is put off, and when it runs, by the next batch or
// its timer, what the engine stored after it stays indexed and what it
// stored before it goes; a block stored and then removed after it stays
// gone.
func TestABlockStoredAfterAPutOffClearStaysIndexed(t *testing.T) {
	for _, via := range []string{"next batch", "timer", "bound"} {
		t.Run(via, func(t *testing.T) {
			x := radix.New()
			m, err := NewManager(ManagerConfig{Index: x})
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			ws := m.newWorkerState(&fleet.Worker{Load: new(fleet.Load), Idx: 4, ID: "clearer", BlockSize: bs})
			defer ws.unregisterMetrics()
			stored := func(tag, n int) []byte {
				b := appendBatchHeader(nil, false, 1, 1)
				b = appendStored(b, false, engineHashes(tag, n), 0, false, tokensFor(tag, n), bs)
				return appendBatchTrailer(b, false, 0)
			}
			cleared := func() []byte {
				b := appendBatchHeader(nil, false, 1, 1)
				b = appendCleared(b, false)
				return appendBatchTrailer(b, false, 0)
			}
			removed := func(tag, n int) []byte {
				b := appendBatchHeader(nil, false, 1, 1)
				b = appendRemoved(b, false, engineHashes(tag, n))
				return appendBatchTrailer(b, false, 0)
			}
			seq := uint64(0)
			feed := func(b []byte) { ws.handle(seq, b); seq++ }
			feed(stored(1, 3))
			feed(cleared()) // cleared at once
			feed(stored(2, 3))
			feed(cleared())     // within minClearEvery: put off
			if via == "bound" { // past maxSinceBlocks kept, the clear is done at once
				defer func(n int) { maxSinceBlocks = n }(maxSinceBlocks)
				maxSinceBlocks = 6
			}
			feed(stored(3, 3))
			feed(stored(5, 2))
			feed(removed(5, 2))
			if overlap(x, 4, tokensFor(3, 3)) != 3 {
				t.Fatal("a block stored after the put-off clear is not indexed")
			}
			if via == "bound" {
				ws.mu.Lock()
				if ws.ranks[0].dirty || overlap(x, 4, tokensFor(2, 3)) != 0 {
					t.Error("past maxSinceBlocks the clear is still put off")
				}
				ws.mu.Unlock()
			}
			time.Sleep(minClearEvery + 20*time.Millisecond)
			if via == "next batch" {
				feed(stored(4, 1))
			} else {
				time.Sleep(50 * time.Millisecond) // the timer runs the clear
			}
			ws.mu.Lock()
			defer ws.mu.Unlock()
			for _, c := range []struct{ tag, n, want int }{{1, 3, 0}, {2, 3, 0}, {3, 3, 3}, {5, 2, 0}} {
				if got := overlap(x, 4, tokensFor(c.tag, c.n)); got != c.want {
					t.Errorf("blocks of batch %d: overlap %d, want %d", c.tag, got, c.want)
				}
			}
			if ws.ranks[0].dirty || len(ws.ranks[0].since) != 0 {
				t.Error("the put-off clear did not run")
			}
		})
	}
}

// A publisher's message larger than maxMessageBytes must never reach the
// router (ZMQ reads a message whole before handing it over: one 512 MiB
// frame took 1 GiB of the router's memory): the SUB socket drops the
// publisher and reconnects, the message is lost like any other, and the
// batches after it are followed again.
func TestAKVEventMessageOverTheSizeLimitIsNotReceived(t *testing.T) {
	old := maxMessageBytes
	maxMessageBytes = 64 << 10
	t.Cleanup(func() { maxMessageBytes = old }) // after the manager's Close
	m, x := newTestManager(t, "zmq")
	p := newTestPublisher(t, false, engine.LayoutLegacy)
	w := &fleet.Worker{Load: new(fleet.Load), Idx: 1, ID: "w", KVEventsEndpoint: p.Endpoint(), BlockSize: bs}
	if err := m.WorkerAdded(w); err != nil {
		t.Fatal(err)
	}
	connect(t, p, x, w.Idx)
	quiesce(p)
	const n = 8192 // about 170 KB of msgpack
	big := tokensFor(1, n)
	p.BlockStored(engineHashes(1, n), 0, false, big, bs)
	waitFor(t, "the big batch sent", func() bool { return p.Pending() == 0 })
	small := tokensFor(2, 1)
	deadline := time.Now().Add(5 * time.Second)
	for overlap(x, w.Idx, small) == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("batches after the oversized one are not followed (stats %+v)", m.Stats(w.ID))
		}
		p.BlockStored(engineHashes(2, 1), 0, false, small, bs)
		time.Sleep(20 * time.Millisecond)
	}
	if got := overlap(x, w.Idx, big); got != 0 {
		t.Fatalf("a %d-block batch over the %d-byte message limit was received and indexed (%d blocks)", n, maxMessageBytes, got)
	}
}

// rankPub is a raw PUB socket standing for one data-parallel rank's
// publisher: single-block BlockStored batches, numbered from 0.
type rankPub struct {
	sock *zmq.Socket
	seq  uint64
}

// bindRankPub binds a PUB socket on port (0: any free one), nil when the
// port cannot be had.
func bindRankPub(port int) *rankPub {
	sock, err := zmq.NewSocket(zmq.PUB)
	if err != nil {
		return nil
	}
	_ = sock.SetLinger(0)
	ep := "tcp://127.0.0.1:*"
	if port > 0 {
		ep = "tcp://127.0.0.1:" + strconv.Itoa(port)
	}
	if err := sock.Bind(ep); err != nil {
		_ = sock.Close()
		return nil
	}
	return &rankPub{sock: sock}
}

func (p *rankPub) port() int {
	ep, _ := p.sock.GetLastEndpoint()
	n, _ := strconv.Atoi(ep[strings.LastIndexByte(ep, ':')+1:])
	return n
}

func (p *rankPub) store(t *testing.T, tag, rank int) {
	t.Helper()
	b := appendBatchHeader(nil, false, float64(p.seq+1), 1)
	b = appendStored(b, false, engineHashes(tag, 1), 0, false, tokensFor(tag, 1), bs)
	var s [8]byte
	binary.BigEndian.PutUint64(s[:], p.seq)
	p.seq++
	if _, err := p.sock.SendMessage([]byte{}, s[:], appendBatchTrailer(b, false, rank)); err != nil {
		t.Fatal(err)
	}
}

// A data-parallel worker's ranks share one SUB socket. When one rank's
// publisher goes (an engine restart, or a message over the size limit)
// only that rank is connected again: the subscriber started over with a
// new socket, so what the other ranks published meanwhile was lost, a gap
// that, without a replay endpoint, resynced them and dropped every block
// they had indexed.
func TestARankWhosePublisherGoesLeavesTheOtherRanksFollowed(t *testing.T) {
	x := radix.New()
	m, err := NewManager(ManagerConfig{Index: x, Transport: "zmq", PollInterval: 20 * time.Millisecond,
		ReplayTimeout: time.Second, ReconnectDelay: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	var p0, p1 *rankPub
	for i := 0; i < 20 && p1 == nil; i++ { // rank 1 publishes on rank 0's port + 1
		if p0 = bindRankPub(0); p0 == nil {
			t.Fatal("cannot bind a PUB socket")
		}
		if p1 = bindRankPub(p0.port() + 1); p1 == nil {
			_ = p0.sock.Close()
		}
	}
	if p1 == nil {
		t.Skip("no two adjacent free ports")
	}
	defer func() { _ = p0.sock.Close(); _ = p1.sock.Close() }()
	w := &fleet.Worker{Load: new(fleet.Load), Idx: 1, ID: "dp", KVEventsEndpoint: fmt.Sprintf("tcp://127.0.0.1:%d", p0.port()), BlockSize: bs, DPSize: 2}
	if err := m.WorkerAdded(w); err != nil {
		t.Fatal(err)
	}
	follow := func(p *rankPub, tag, rank int) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for overlap(x, w.Idx, tokensFor(tag, 1)) == 0 {
			if time.Now().After(deadline) {
				t.Fatalf("rank %d is not followed (stats %+v)", rank, m.Stats(w.ID))
			}
			p.store(t, tag, rank)
			time.Sleep(20 * time.Millisecond)
		}
	}
	follow(p0, 1, 0)
	follow(p1, 2, 1)
	// Rank 1's engine restarts while rank 0 keeps publishing.
	port1 := p1.port()
	_ = p1.sock.Close()
	p1 = nil
	for i := 0; i < 150; i++ {
		if p1 == nil && i >= 10 {
			p1 = bindRankPub(port1) // the port comes free as ZMQ closes
		}
		p0.store(t, 100+i, 0)
		time.Sleep(10 * time.Millisecond)
	}
	if p1 == nil {
		t.Skip("rank 1's port was taken meanwhile")
	}
	follow(p0, 3, 0)
	if st := m.Stats(w.ID); st.Gaps != 0 || st.Resyncs != 0 || overlap(x, w.Idx, tokensFor(1, 1)) == 0 {
		t.Fatalf("rank 0 lost batches as rank 1's publisher went (stats %+v); its blocks indexed before: %d", st, overlap(x, w.Idx, tokensFor(1, 1)))
	}
	follow(p1, 4, 1) // the restarted rank is followed again
}

// A publisher that stores blocks and never removes any (or numbers its
// batches with ever new data-parallel ranks) must not grow the router
// without bound: one rank holds at most maxRankBlocks, a worker follows
// at most dp_size ranks, and what is past that is dropped and counted.
// A flood of 16-chain batches grew a router by 4.9 GB in 28 s.
func TestAWorkerFloodingStoredBlocksIsBoundedInMemory(t *testing.T) {
	old := maxRankBlocks
	maxRankBlocks = 1000
	t.Cleanup(func() { maxRankBlocks = old })
	x := radix.New()
	m, err := NewManager(ManagerConfig{Index: x})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	w := &fleet.Worker{Load: new(fleet.Load), Idx: 2, ID: "flood", BlockSize: bs}
	ws := m.newWorkerState(w)
	defer ws.unregisterMetrics()
	const chains, n = 50, 100
	seq := uint64(0)
	for rank := 0; rank < 3; rank++ {
		for c := 0; c < chains; c++ {
			tag := rank*chains + c
			b := appendBatchHeader(nil, false, 1, 1)
			b = appendStored(b, false, engineHashes(tag, n), 0, false, tokensFor(tag, n), bs)
			ws.handle(seq, appendBatchTrailer(b, false, rank))
			seq++
		}
	}
	held := 0
	for _, rs := range ws.ranks {
		held += len(rs.blocks)
	}
	t.Logf("index holds %d blocks of the worker, its maps %d, in %d ranks; dropped %d", x.WorkerBlocks(w.Idx), held, len(ws.ranks), ws.mDropped.Get())
	if got := x.WorkerBlocks(w.Idx); got > int64(maxRankBlocks) || held > maxRankBlocks {
		t.Fatalf("a worker of one rank holds %d blocks in the index and %d in its maps, over the %d one rank may hold", got, held, maxRankBlocks)
	}
	if overlap(x, w.Idx, tokensFor(0, n)) != n {
		t.Fatalf("the blocks stored before the bound are not indexed")
	}
}

// TestAnEngineHashNamedTwiceInOneEventLeavesNothingAfterItsRemoval: a
// BlockStored naming one engine hash for two blocks (a publisher that lies)
// released the first block before it was indexed, then indexed it: no
// engine hash named it any more, so removing every hash the engine stored
// left the worker credited with it until a clear.
func TestAnEngineHashNamedTwiceInOneEventLeavesNothingAfterItsRemoval(t *testing.T) {
	x := radix.New()
	m, err := NewManager(ManagerConfig{Index: x, Transport: "nats"})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	ws := m.newWorkerState(&fleet.Worker{Load: new(fleet.Load), Idx: 0, ID: "twice", BlockSize: bs})
	defer ws.unregisterMetrics()
	a := tokensFor(1, 3)
	h := uint64(7)
	b := appendBatchHeader(nil, false, 1, 1)
	b = appendStored(b, false, []uint64{h, h, h}, 0, false, a, bs)
	ws.handle(0, appendBatchTrailer(b, false, 0))
	b = appendBatchHeader(nil, false, 2, 1)
	b = appendRemoved(b, false, []uint64{h})
	ws.handle(1, appendBatchTrailer(b, false, 0))
	if n, o := x.WorkerBlocks(0), overlap(x, 0, a); n != 0 || o != 0 {
		t.Fatalf("after removing the only engine hash stored, the worker holds %d blocks, matches %d", n, o)
	}
}
