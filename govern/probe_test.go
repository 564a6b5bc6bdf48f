package govern

import (
	"context"
	"testing"
	"time"
)

func TestFullTellsWhichCandidatesHaveNoFreeSeat(t *testing.T) {
	g := rlConfig(t, `{"scope":"instance","prefill_concurrency":1,"overlimit":"queue","queue_size":1,"queue_timeout_ms":5000}`)
	if g.Full(w1, PhaseMixed) || !g.Limited() || !g.Queues() || !g.CanQueue() {
		t.Fatal("an unused instance is full, or the config was not applied")
	}
	a := acquireOK(t, g, []Target{w1}, PhaseMixed, 0)
	if !g.Full(w1, PhaseMixed) || !g.Full(w1, PhasePrefill) || g.Full(w2, PhaseMixed) || g.Full(w1, PhaseDecode) {
		t.Fatal("Full does not follow the prefill counter of w1")
	}
	a.FirstToken() // the prefill seat is back
	if g.Full(w1, PhaseMixed) {
		t.Fatal("full after the first token gave the prefill seat back")
	}
	b := acquireOK(t, g, []Target{w1}, PhaseMixed, 0)
	// A queued request makes its scope full for newcomers (no overtaking),
	// and fills the one-place queue.
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan *Rejection, 1)
	go func() {
		s, _, rej := g.Acquire(ctx, []Target{w1}, PhaseMixed)
		s.Done()
		done <- rej
	}()
	waitFor(t, func() bool { return g.QueueLength() == 1 })
	if g.CanQueue() {
		t.Fatal("CanQueue with the queue full")
	}
	b.Done() // the queued request takes the seat
	if rej := <-done; rej != nil {
		t.Fatal(rej)
	}
	cancel()
	if g.QueueLength() != 0 || !g.CanQueue() || g.Full(w1, PhaseMixed) {
		t.Fatal("queue not empty after the grant, or the seat not back")
	}
	a.Done()

	// Dry run and no limits: nothing is ever full.
	g = rlConfig(t, `{"prefill_concurrency":1,"dry_run":true}`)
	s := acquireOK(t, g, []Target{w1}, PhaseMixed, 0)
	if g.Full(w1, PhaseMixed) || !g.CanQueue() || g.Queues() {
		t.Fatal("dry run reports a full instance")
	}
	s.Done()
	g = rlConfig(t, `{}`)
	if g.Full(w1, PhaseMixed) || g.Limited() || g.CanQueue() {
		t.Fatal("no limits, yet full or queueing")
	}
}

func TestFullAllocatesNothing(t *testing.T) {
	g := rlConfig(t, `{"scope":"service","overall_concurrency":4}`)
	acquireOK(t, g, []Target{w1}, PhaseMixed, 0)
	if n := testing.AllocsPerRun(1000, func() { g.Full(w1, PhaseMixed); g.CanQueue() }); n != 0 {
		t.Fatalf("%.1f allocs", n)
	}
}

// A request that waits is counted once as queued, and as rejected only when
// it is refused in the end (queue full, or timed out): not when it is
// served, and not when its client leaves.
func TestSeatHitsCountQueuedRequestsOnce(t *testing.T) {
	g := rlConfig(t, `{"overall_concurrency":1,"overlimit":"queue","queue_size":1,"queue_timeout_ms":100}`)
	hits := func() (rejected, queued uint64) {
		c := &hitCounters[CodeConcurrencyOverall]
		return c[resRejected].Get(), c[resQueued].Get()
	}
	r0, q0 := hits()
	a := acquireOK(t, g, []Target{w1}, PhaseMixed, 0)
	// TryAcquire in queue mode: the caller queues next; not counted.
	acquireRejected(t, g, []Target{w1}, PhaseMixed, CodeConcurrencyOverall)
	if r, q := hits(); r != r0 || q != q0 {
		t.Fatalf("TryAcquire counted: rejected +%d queued +%d", r-r0, q-q0)
	}
	// Timed out in the queue: queued, then rejected.
	if _, _, rej := g.Acquire(context.Background(), []Target{w1}, PhaseMixed); rej == nil {
		t.Fatal("acquired a full seat")
	}
	if r, q := hits(); r != r0+1 || q != q0+1 {
		t.Fatalf("timed out: rejected +%d queued +%d, want +1 +1", r-r0, q-q0)
	}
	// The client leaves while queued: queued only.
	ctx, cancel := context.WithCancel(context.Background())
	go func() { time.Sleep(20 * time.Millisecond); cancel() }()
	g.Acquire(ctx, []Target{w1}, PhaseMixed)
	if r, q := hits(); r != r0+1 || q != q0+2 {
		t.Fatalf("client left: rejected +%d queued +%d, want +1 +2", r-r0, q-q0)
	}
	// Served after waiting: queued only.
	go func() { time.Sleep(20 * time.Millisecond); a.Done() }()
	s, _, rej := g.Acquire(context.Background(), []Target{w1}, PhaseMixed)
	if rej != nil {
		t.Fatal(rej)
	}
	if r, q := hits(); r != r0+1 || q != q0+3 {
		t.Fatalf("served: rejected +%d queued +%d, want +1 +3", r-r0, q-q0)
	}
	s.Done()
	// Reject mode: rejected at once, TryAcquire included.
	g = rlConfig(t, `{"overall_concurrency":1}`)
	a = acquireOK(t, g, []Target{w1}, PhaseMixed, 0)
	acquireRejected(t, g, []Target{w1}, PhaseMixed, CodeConcurrencyOverall)
	if r, q := hits(); r != r0+2 || q != q0+3 {
		t.Fatalf("reject mode: rejected +%d queued +%d, want +2 +3", r-r0, q-q0)
	}
	a.Done()
}

func TestUserHitsCountQueuedRequestsOnce(t *testing.T) {
	key, hash := mintKey(t)
	g := newGov(t, Options{}, userConfig(t, hash, `{"name":"t","concurrency":{"enabled":true,"limit":1,"overlimit":"queue","queue_size":5,"queue_timeout_ms":100}}`, ""))
	u := identify(t, g, key)
	hits := func() (rejected, queued uint64) {
		c := &hitCounters[CodeConcurrencyUser]
		return c[resRejected].Get(), c[resQueued].Get()
	}
	r0, q0 := hits()
	tk, rej := g.Admit(context.Background(), u, Request{})
	if rej != nil {
		t.Fatal(rej)
	}
	if _, rej := g.Admit(context.Background(), u, Request{}); rej == nil {
		t.Fatal("admitted over the concurrency limit")
	}
	if r, q := hits(); r != r0+1 || q != q0+1 {
		t.Fatalf("timed out: rejected +%d queued +%d, want +1 +1", r-r0, q-q0)
	}
	go func() { time.Sleep(20 * time.Millisecond); tk.Done(Usage{}) }()
	tk2, rej := g.Admit(context.Background(), u, Request{})
	if rej != nil {
		t.Fatal(rej)
	}
	if r, q := hits(); r != r0+1 || q != q0+2 {
		t.Fatalf("served: rejected +%d queued +%d, want +1 +2", r-r0, q-q0)
	}
	tk2.Done(Usage{})
}
