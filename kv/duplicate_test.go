//go:build cgo

package kv

import (
	"bytes"
	"log/slog"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/infera/infera/broker"
	"github.com/infera/infera/engine"
	"github.com/infera/infera/fleet"
	"github.com/infera/infera/internal/testsrv"
	"github.com/infera/infera/radix"
)

// dupRig is a router (manager fed by broker.SubscribeKVEvents) on a real
// nats-server, and any number of simulated engines, each behind its own
// relay (its own sidecar and NATS connection).
type dupRig struct {
	t   *testing.T
	url string
	m   *Manager
	fed atomic.Uint64
}

func newDupRig(t *testing.T, workerID string) (*dupRig, *fleet.Worker) {
	t.Helper()
	ns := testsrv.StartNATS(t)
	m, _ := newTestManager(t, "nats")
	w := &fleet.Worker{Load: new(fleet.Load), Idx: 0, ID: workerID, BlockSize: bs}
	if err := m.WorkerAdded(w); err != nil {
		t.Fatal(err)
	}
	r := &dupRig{t: t, url: ns.URL, m: m}
	nc := r.conn()
	if _, err := broker.SubscribeKVEvents(nc, func(id string, instance uint64, topic []byte, seq uint64, payload []byte) {
		m.Feed(id, instance, topic, seq, payload)
		r.fed.Add(1)
	}); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return r, w
}

func (r *dupRig) conn() *nats.Conn {
	r.t.Helper()
	nc, err := nats.Connect(r.url)
	if err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(nc.Close)
	return nc
}

// engine starts a simulated engine and its relay under workerID, and
// waits until the relay is subscribed (a probe block reached NATS).
func (r *dupRig) engine(workerID string, probeTag int) (*engine.Publisher, *broker.KVRelay) {
	r.t.Helper()
	p := newTestPublisher(r.t, false, engine.LayoutLegacy)
	relay, err := broker.StartKVRelay(broker.KVRelayConfig{Conn: r.conn(), WorkerID: workerID, Endpoint: p.Endpoint()})
	if err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(relay.Close)
	deadline := time.Now().Add(5 * time.Second)
	for relay.Published() == 0 { // ZMQ slow joiner
		if time.Now().After(deadline) {
			r.t.Fatal("relay never relayed a probe")
		}
		p.BlockStored(engineHashes(probeTag, 1), 0, false, tokensFor(probeTag, 1), bs)
		time.Sleep(20 * time.Millisecond)
	}
	return p, relay
}

// settle waits until every relayed frame was fed and handled.
func (r *dupRig) settle(workerID string, relays ...*broker.KVRelay) {
	r.t.Helper()
	waitFor(r.t, "frames relayed and fed", func() bool {
		var sent uint64
		for _, rl := range relays {
			sent += rl.Published()
		}
		return r.fed.Load() >= sent
	})
	r.m.mu.RLock()
	ws := r.m.byID[workerID]
	r.m.mu.RUnlock()
	waitFor(r.t, "feed queue drained", func() bool { return ws.queuedFrames() == 0 })
	time.Sleep(50 * time.Millisecond) // the last frame taken is handled
}

// storeChain stores tag's two-block chain in two events, the second
// continuing the first, as an engine does when a prompt grows.
func storeChain(p *engine.Publisher, tag int) {
	h, tok := engineHashes(tag, 2), tokensFor(tag, 2)
	p.BlockStored(h[:1], 0, false, tok[:bs], bs)
	p.BlockStored(h[1:], h[0], true, tok[bs:], bs)
}

// TestTwoPublishersUnderOneWorkerIDAreNotMixed: two sidecars relay two
// engines' KV events under one worker id (one engine up for a while, the
// other just started), so their sequence numbers interleave on one NATS
// subject. The router follows the newer publisher, drops the other's
// batches, says so in a metric, and clears the worker's index once; the
// index never holds a mix of the two caches.
func TestTwoPublishersUnderOneWorkerIDAreNotMixed(t *testing.T) {
	r, w := newDupRig(t, "dup")
	x := r.m.cfg.Index
	a, ra := r.engine(w.ID, 901)
	for i := 0; i < 20; i++ { // engine A has been serving for a while
		storeChain(a, 100+i)
		time.Sleep(2 * time.Millisecond)
	}
	r.settle(w.ID, ra)
	before := r.m.Stats(w.ID)
	aBefore := ra.Published()
	b, rb := r.engine(w.ID, 902)
	const rounds = 40
	for i := 0; i < rounds; i++ {
		storeChain(a, 200+i)
		storeChain(b, 300+i)
		time.Sleep(3 * time.Millisecond)
	}
	r.settle(w.ID, ra, rb)
	count := func(from int) (full, part int) {
		for i := 0; i < rounds; i++ {
			switch overlap(x, w.Idx, tokensFor(from+i, 2)) {
			case 2:
				full++
			case 1:
				part++
			}
		}
		return full, part
	}
	aFull, aPart := count(200)
	bFull, bPart := count(300)
	st := r.m.Stats(w.ID)
	t.Logf("after %d interleaved rounds: A chains indexed %d whole + %d cut, B chains %d whole + %d cut; stats before B %+v, after %+v",
		rounds, aFull, aPart, bFull, bPart, before, st)
	// B's relay started later (its instance id is the larger): it is
	// followed, A's entries go once, and every batch of A's from then on
	// is dropped.
	if rb.Instance() <= ra.Instance() {
		t.Fatalf("relay B (started later) has instance %x, not above A's %x", rb.Instance(), ra.Instance())
	}
	if aFull+aPart != 0 || bFull != rounds || bPart != 0 {
		t.Errorf("the index mixes both engines' caches: A %d whole + %d cut, B %d whole + %d cut of %d chains each (want B's only)",
			aFull, aPart, bFull, bPart, rounds)
	}
	if warm, _ := count(100); warm != 0 {
		t.Errorf("%d chains A stored before B came are still indexed", warm)
	}
	if resyncs := st.Resyncs - before.Resyncs; resyncs > 1 {
		t.Errorf("the worker's index was cleared %d times, want at most once", resyncs)
	}
	// The relays may carry several events in one frame when they fall
	// behind, so the frames are counted, not the rounds: every frame A
	// relayed after B appeared is dropped as a duplicate, except the
	// few that may reach the router before B's first frame (two NATS
	// connections are not ordered with each other); those are applied
	// and then cleared by the one resync, as the index check shows.
	aSent := ra.Published() - aBefore
	dups := st.Duplicates - before.Duplicates
	if st.PublisherChanges != 1 || dups == 0 || dups > aSent || aSent-dups > 2 {
		t.Errorf("stats %+v: A relayed %d frames after B came and %d were dropped as duplicates; want all but at most 2 dropped and one change of publisher",
			st, aSent, dups)
	}
	var buf bytes.Buffer
	r.m.ms.WritePrometheus(&buf)
	if want := `infera_kv_duplicate_publisher{worker="dup"} 1`; !strings.Contains(buf.String(), want) {
		t.Errorf("metrics lack %s", want)
	}
}

// feeder hands one worker's frames to its state by hand: no goroutine, no
// sockets, so the publisher logic is tested step by step.
type feeder struct {
	t   *testing.T
	ws  *workerState
	x   *radix.Index
	seq map[uint64]uint64
}

func newFeeder(t *testing.T, takeover time.Duration) *feeder {
	t.Helper()
	x := radix.New()
	m, err := NewManager(ManagerConfig{Index: x, Transport: "nats", PublisherTakeover: takeover})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	ws := m.newWorkerState(&fleet.Worker{Load: new(fleet.Load), Idx: 0, ID: "dup", BlockSize: bs})
	t.Cleanup(ws.unregisterMetrics)
	return &feeder{t: t, ws: ws, x: x, seq: map[uint64]uint64{}}
}

// store hands over publisher inst's next batch (its own sequence), which
// stores tag's one-block chain.
func (f *feeder) store(inst uint64, tag int) {
	b := appendBatchHeader(nil, false, 1, 1)
	b = appendStored(b, false, engineHashes(tag, 1), 0, false, tokensFor(tag, 1), bs)
	f.ws.handleFrame(&frame{instance: inst, seq: f.seq[inst], payload: appendBatchTrailer(b, false, 0)})
	f.seq[inst]++
}

// indexed returns which of tags are indexed.
func (f *feeder) indexed(tags ...int) []int {
	var in []int
	for _, tag := range tags {
		if overlap(f.x, 0, tokensFor(tag, 1)) == 1 {
			in = append(in, tag)
		}
	}
	return in
}

func (f *feeder) stats() WorkerStats {
	ws := f.ws
	return WorkerStats{Applied: ws.mApplied.Get(), Gaps: ws.mGaps.Get(), Resyncs: ws.mResyncs.Get(), Stale: ws.mStale.Get(),
		Duplicates: ws.mDuplicate.Get(), PublisherChanges: ws.mChanges.Get()}
}

// TestRestartedRelayIsFollowedAtOnce: a sidecar restarted beside a running
// engine relays under a new instance id, from the engine's current
// sequence. The router follows it with its first batch, clears what the
// old instance reported once (events were missed in between), counts no
// gap and no duplicate.
func TestRestartedRelayIsFollowedAtOnce(t *testing.T) {
	f := newFeeder(t, time.Hour)
	for tag := 1; tag <= 5; tag++ {
		f.store(0xa, tag)
	}
	f.seq[0xb] = 40
	for tag := 6; tag <= 8; tag++ {
		f.store(0xb, tag)
	}
	if got := f.indexed(1, 2, 3, 4, 5, 6, 7, 8); !slices.Equal(got, []int{6, 7, 8}) {
		t.Errorf("indexed chains %v, want the new relay's [6 7 8]", got)
	}
	if st := f.stats(); st.PublisherChanges != 1 || st.Resyncs != 1 || st.Gaps != 0 || st.Duplicates != 0 {
		t.Errorf("stats %+v: want one change and one resync, no gap, no duplicate", st)
	}
	if g := f.ws.duplicatePublisher(); g != 0 {
		t.Errorf("duplicate gauge %v after a plain restart, want 0", g)
	}
}

// TestOlderPublisherIsFollowedOnlyOnceTheNewerOneFallsSilent: two live
// publishers under one id; the newer one is followed and the older one's
// batches are dropped while the newer one speaks; the older one is
// followed once the newer one has been silent for PublisherTakeover (it
// died; the other engine lives on).
func TestOlderPublisherIsFollowedOnlyOnceTheNewerOneFallsSilent(t *testing.T) {
	const takeover = 500 * time.Millisecond // far above a scheduling stall between two stores
	f := newFeeder(t, takeover)
	f.store(1, 1)
	f.store(2, 2) // newer: followed at once
	f.store(1, 3) // older, and 2 just spoke: dropped
	f.store(2, 4)
	f.store(1, 5) // dropped
	if got := f.indexed(1, 2, 3, 4, 5); !slices.Equal(got, []int{2, 4}) {
		t.Fatalf("indexed chains %v, want instance 2's [2 4]", got)
	}
	if st := f.stats(); st.Duplicates != 2 || st.PublisherChanges != 1 {
		t.Fatalf("stats %+v: want 2 duplicates, 1 change", st)
	}
	if g := f.ws.duplicatePublisher(); g != 1 {
		t.Fatalf("duplicate gauge %v, want 1", g)
	}
	time.Sleep(takeover + 100*time.Millisecond) // instance 2 falls silent
	f.store(1, 6)                               // followed again
	f.store(2, 7)                               // newer, but the worker just changed: dropped
	if got := f.indexed(1, 2, 3, 4, 5, 6, 7); !slices.Equal(got, []int{6}) {
		t.Fatalf("indexed chains %v, want instance 1's [6]", got)
	}
	if st := f.stats(); st.Duplicates != 3 || st.PublisherChanges != 2 || st.Resyncs != 2 {
		t.Fatalf("stats %+v: want 3 duplicates, 2 changes, 2 resyncs", st)
	}
}

// TestManyPublishersUnderOneIDChangeAtMostOncePerTakeover: five publishers
// (one an old relay without instance ids) interleave under one id, in an
// order that is not their age. The worker follows the first heard, changes
// once, to the first newer one, and then holds: one resync, every other
// batch dropped and counted, one warning naming the worker and instances.
func TestManyPublishersUnderOneIDChangeAtMostOncePerTakeover(t *testing.T) {
	var logs bytes.Buffer
	old := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&logs, nil)))
	t.Cleanup(func() { slog.SetDefault(old) })
	f := newFeeder(t, time.Hour)
	insts := []uint64{0x22, 0x11, 0, 0x44, 0x33} // 0x44, fourth heard, is the first newer than 0x22
	const rounds = 20
	var followed []int
	for r := 0; r < rounds; r++ {
		for i, inst := range insts {
			tag := 100*(i+1) + r
			f.store(inst, tag)
			if inst == 0x44 {
				followed = append(followed, tag)
			}
		}
	}
	var all []int
	for i := range insts {
		for r := 0; r < rounds; r++ {
			all = append(all, 100*(i+1)+r)
		}
	}
	if got := f.indexed(all...); !slices.Equal(got, followed) {
		t.Errorf("indexed chains %v, want instance 0x44's %v", got, followed)
	}
	want := uint64(len(insts)*rounds - 1 - rounds) // all but 0x22's first batch and 0x44's
	if st := f.stats(); st.PublisherChanges != 1 || st.Resyncs != 1 || st.Duplicates != want || st.Gaps != 0 || st.Stale != 0 {
		t.Errorf("stats %+v: want 1 change, 1 resync, %d duplicates, no gap, nothing stale", st, want)
	}
	out := logs.String()
	if n := strings.Count(out, "two KV event publishers share one worker id"); n != 1 {
		t.Errorf("%d duplicate warnings, want 1 (rate-limited):\n%s", n, out)
	}
	if !strings.Contains(out, "worker=dup following=0000000000000022 dropping=0000000000000011") {
		t.Errorf("the warning does not name the worker and the followed instance:\n%s", out)
	}
}
