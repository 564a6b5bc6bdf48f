package govern

import (
	"context"
	"sync"
	"testing"
	"time"
)

func rlConfig(t testing.TB, js string) *Governor {
	t.Helper()
	return newGov(t, Options{}, parseConfig(t, `{"rate_limit":`+js+`}`))
}

var (
	w1 = Target{Instance: "w1", Service: "svc-a"}
	w2 = Target{Instance: "w2", Service: "svc-a"}
	w3 = Target{Instance: "w3", Service: "svc-b"}
)

func acquireOK(t testing.TB, g *Governor, ts []Target, ph Phase, wantIdx int) Seat {
	t.Helper()
	s, i, rej := g.TryAcquire(ts, ph)
	if rej != nil || i != wantIdx {
		t.Fatalf("acquire: index %d (want %d), %v", i, wantIdx, rej)
	}
	return s
}

func acquireRejected(t testing.TB, g *Governor, ts []Target, ph Phase, code Code) {
	t.Helper()
	s, _, rej := g.TryAcquire(ts, ph)
	if rej == nil {
		s.Done()
		t.Fatalf("acquired, want %s", code)
	}
	if rej.Code != code || rej.Status != 429 {
		t.Fatalf("rejected %s/%d, want %s", rej.Code, rej.Status, code)
	}
}

func TestNoLimitsGiveZeroSeats(t *testing.T) {
	g := rlConfig(t, `{}`)
	s, i, rej := g.Acquire(context.Background(), []Target{w1, w2}, PhaseMixed)
	if rej != nil || i != 0 || s.ss != nil {
		t.Fatalf("%v %d %v", s, i, rej)
	}
	s.FirstToken()
	s.Done()
}

func TestSeatsPerInstanceTakeTheFirstFreeCandidate(t *testing.T) {
	g := rlConfig(t, `{"scope":"instance","overall_concurrency":2}`)
	a := acquireOK(t, g, []Target{w1, w2}, PhaseMixed, 0)
	b := acquireOK(t, g, []Target{w1, w2}, PhaseMixed, 0)
	c := acquireOK(t, g, []Target{w1, w2}, PhaseMixed, 1) // w1 full
	acquireOK(t, g, []Target{w2}, PhaseMixed, 0).Done()
	d := acquireOK(t, g, []Target{w2}, PhaseMixed, 0)
	acquireRejected(t, g, []Target{w1, w2}, PhaseMixed, CodeConcurrencyOverall)
	a.Done()
	a.Done() // idempotent
	acquireOK(t, g, []Target{w2, w1}, PhaseMixed, 1).Done()
	b.Done()
	c.Done()
	d.Done()
}

func TestSeatScopesServiceAndGateway(t *testing.T) {
	g := rlConfig(t, `{"scope":"service","overall_concurrency":1}`)
	a := acquireOK(t, g, []Target{w1}, PhaseMixed, 0)
	acquireRejected(t, g, []Target{w2}, PhaseMixed, CodeConcurrencyOverall) // same service
	b := acquireOK(t, g, []Target{w2, w3}, PhaseMixed, 1)
	a.Done()
	b.Done()
	g = rlConfig(t, `{"scope":"gateway","overall_concurrency":1}`)
	a = acquireOK(t, g, []Target{w1}, PhaseMixed, 0)
	acquireRejected(t, g, []Target{w3}, PhaseMixed, CodeConcurrencyOverall)
	a.Done()
}

func TestPrefillSeatIsReturnedAtTheFirstToken(t *testing.T) {
	g := rlConfig(t, `{"prefill_concurrency":1,"overall_concurrency":2,"decode_concurrency":1}`)
	a := acquireOK(t, g, []Target{w1}, PhaseMixed, 0)
	acquireRejected(t, g, []Target{w1}, PhaseMixed, CodeConcurrencyPrefill)
	a.FirstToken()
	a.FirstToken()
	b := acquireOK(t, g, []Target{w1}, PhaseMixed, 0) // prefill free, overall 2/2
	b.FirstToken()
	acquireRejected(t, g, []Target{w1}, PhaseMixed, CodeConcurrencyOverall)
	// PD-disaggregated: prefill and decode instances count their own phase.
	p := acquireOK(t, g, []Target{w3}, PhasePrefill, 0)
	acquireRejected(t, g, []Target{w3}, PhasePrefill, CodeConcurrencyPrefill)
	p.Done()
	d := acquireOK(t, g, []Target{w2}, PhaseDecode, 0)
	acquireRejected(t, g, []Target{w2}, PhaseDecode, CodeConcurrencyDecode)
	d.FirstToken() // decode seats last until Done
	acquireRejected(t, g, []Target{w2}, PhaseDecode, CodeConcurrencyDecode)
	d.Done()
	a.Done()
	b.Done()
	g.seats.mu.Lock()
	defer g.seats.mu.Unlock()
	for _, c := range g.seats.inst {
		if c.n != [3]int{} {
			t.Fatalf("counters left %v", c.n)
		}
	}
}

func TestSeatFirstTokenAndDoneRaceSafely(t *testing.T) {
	g := rlConfig(t, `{"prefill_concurrency":1000,"overall_concurrency":1000}`)
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 500 {
				s := acquireOK(t, g, []Target{w1}, PhaseMixed, 0)
				var inner sync.WaitGroup
				inner.Add(3)
				go func() { defer inner.Done(); s.FirstToken() }()
				go func() { defer inner.Done(); s.Done() }()
				go func() { defer inner.Done(); s.FirstToken(); s.Done() }()
				inner.Wait()
			}
		}()
	}
	wg.Wait()
	g.seats.mu.Lock()
	defer g.seats.mu.Unlock()
	if n := g.seats.inst["w1"].n; n != [3]int{} {
		t.Fatalf("counters left %v", n)
	}
}

func TestSeatQueueServesInArrivalOrderAndDropsLeavers(t *testing.T) {
	g := rlConfig(t, `{"overall_concurrency":1,"overlimit":"queue","queue_size":3,"queue_timeout_ms":5000}`)
	holder := acquireOK(t, g, []Target{w1}, PhaseMixed, 0)
	type res struct {
		i    int
		seat Seat
		rej  *Rejection
	}
	out := make(chan res, 4)
	cancels := make([]context.CancelFunc, 3)
	for i := range 3 {
		ctx, cancel := context.WithCancel(context.Background())
		cancels[i] = cancel
		go func() {
			s, _, rej := g.Acquire(ctx, []Target{w1}, PhaseMixed)
			out <- res{i, s, rej}
		}()
		waitFor(t, func() bool { g.seats.mu.Lock(); defer g.seats.mu.Unlock(); return g.seats.q.n == i+1 })
	}
	if _, _, rej := g.Acquire(context.Background(), []Target{w1}, PhaseMixed); rej == nil || rej.Code != CodeConcurrencyOverall {
		t.Fatalf("a full queue must refuse: %v", rej)
	}
	// A request for another instance is not held up by w1's queue.
	acquireOK(t, g, []Target{w2}, PhaseMixed, 0).Done()
	if got := seatQueued.Load(); got != 3 {
		t.Fatalf("queue length metric %d", got)
	}
	cancels[0]()
	if r := <-out; r.i != 0 || r.rej == nil {
		t.Fatalf("%+v", r)
	}
	waitFor(t, func() bool { g.seats.mu.Lock(); defer g.seats.mu.Unlock(); return g.seats.q.n == 2 })
	// No overtaking: a new TryAcquire for w1 is refused while requests wait.
	acquireRejected(t, g, []Target{w1}, PhaseMixed, CodeConcurrencyOverall)
	holder.Done()
	r := <-out
	if r.i != 1 || r.rej != nil {
		t.Fatalf("%+v", r)
	}
	r.seat.Done()
	r = <-out
	if r.i != 2 || r.rej != nil {
		t.Fatalf("%+v", r)
	}
	r.seat.Done()
	for _, c := range cancels {
		c()
	}
}

func TestSeatQueueTimesOutAndReloadRaisingTheLimitServesIt(t *testing.T) {
	g := rlConfig(t, `{"overall_concurrency":1,"overlimit":"queue","queue_size":10,"queue_timeout_ms":40}`)
	holder := acquireOK(t, g, []Target{w1}, PhaseMixed, 0)
	start := time.Now()
	if _, _, rej := g.Acquire(context.Background(), []Target{w1}, PhaseMixed); rej == nil || time.Since(start) < 40*time.Millisecond {
		t.Fatalf("%v after %v", rej, time.Since(start))
	}
	c := parseConfig(t, `{"rate_limit":{"overall_concurrency":1,"overlimit":"queue","queue_size":10,"queue_timeout_ms":5000}}`)
	if err := g.Apply(c); err != nil {
		t.Fatal(err)
	}
	done := make(chan Seat)
	go func() {
		s, _, rej := g.Acquire(context.Background(), []Target{w1}, PhaseMixed)
		if rej != nil {
			t.Error(rej)
		}
		done <- s
	}()
	waitFor(t, func() bool { g.seats.mu.Lock(); defer g.seats.mu.Unlock(); return g.seats.q.n == 1 })
	c.RateLimit.OverallConcurrency = 2
	if err := g.Apply(c); err != nil {
		t.Fatal(err)
	}
	s := <-done
	// Lowering the limit below what is held: seats still return correctly.
	c.RateLimit.OverallConcurrency = 1
	if err := g.Apply(c); err != nil {
		t.Fatal(err)
	}
	acquireRejected(t, g, []Target{w1}, PhaseMixed, CodeConcurrencyOverall)
	s.Done()
	acquireRejected(t, g, []Target{w1}, PhaseMixed, CodeConcurrencyOverall)
	holder.Done()
	acquireOK(t, g, []Target{w1}, PhaseMixed, 0).Done()
}

func TestSeatDryRunCountsButAdmits(t *testing.T) {
	g := rlConfig(t, `{"overall_concurrency":1,"dry_run":true}`)
	before := hitCounters[CodeConcurrencyOverall][resDryRun].Get()
	a := acquireOK(t, g, []Target{w1}, PhaseMixed, 0)
	b := acquireOK(t, g, []Target{w1}, PhaseMixed, 0)
	if d := hitCounters[CodeConcurrencyOverall][resDryRun].Get() - before; d != 1 {
		t.Fatalf("dry-run hits %d", d)
	}
	a.Done()
	b.Done()
}

// Removing a waiter that is no longer queued does nothing: the queues'
// counts never go negative and the waiters still queued stay linked.
func TestWaitListsIgnoreAWaiterRemovedTwice(t *testing.T) {
	var sl seatWaitList
	a, b, c := &seatWaiter{}, &seatWaiter{}, &seatWaiter{}
	sl.push(a)
	sl.push(b)
	sl.push(c)
	if !sl.remove(b) || sl.remove(b) || sl.n != 2 || sl.head != a || a.next != c || sl.tail != c || c.prev != a {
		t.Fatalf("seat queue after removing the middle twice: n=%d", sl.n)
	}
	if !sl.remove(a) || sl.remove(a) || !sl.remove(c) || sl.remove(c) || sl.n != 0 || sl.head != nil || sl.tail != nil {
		t.Fatalf("seat queue after removing all twice: n=%d", sl.n)
	}
	var ul waitList
	x, y := &waiter{}, &waiter{}
	ul.push(x)
	ul.push(y)
	if !ul.remove(x) || ul.remove(x) || ul.n != 1 || ul.head != y || ul.tail != y {
		t.Fatalf("user queue after removing the head twice: n=%d", ul.n)
	}
	if !ul.remove(y) || ul.remove(y) || ul.n != 0 || ul.head != nil || ul.tail != nil {
		t.Fatalf("user queue after removing all twice: n=%d", ul.n)
	}
}

// A reload that changes rate_limit.scope counts the seats in flight on the
// new scope's counters (every seat counts at every scope), and they free
// it when they end.
func TestAScopeReloadCountsTheSeatsInFlight(t *testing.T) {
	scopeReloadCountsTheSeatsInFlight(t, func(js string) (*Governor, *Governor) {
		g := rlConfig(t, js)
		return g, g
	})
}

// scopeReloadCountsTheSeatsInFlight runs the scope reload checks on the
// routers routers returns, configured with the rate_limit js: the seats
// are taken on the first, the others asked for on the second.
func scopeReloadCountsTheSeatsInFlight(t *testing.T, routers func(js string) (*Governor, *Governor)) {
	var g, h *Governor
	apply := func(js string) {
		t.Helper()
		for _, x := range []*Governor{g, h} {
			if err := x.Apply(parseConfig(t, `{"rate_limit":`+js+`}`)); err != nil {
				t.Fatal(err)
			}
			syncEnds(t, x) // with Redis the seats' copy is an end (sent within EndDelay)
		}
	}
	// instance -> gateway: 2 in flight on two instances, a gateway limit of 1.
	g, h = routers(`{"scope":"instance","overall_concurrency":1}`)
	a := acquireOK(t, g, []Target{w1}, PhaseMixed, 0)
	b := acquireOK(t, g, []Target{w3}, PhaseMixed, 0)
	apply(`{"scope":"gateway","overall_concurrency":1}`)
	acquireRejected(t, h, []Target{w2}, PhaseMixed, CodeConcurrencyOverall)
	a.Done()
	syncEnds(t, g)
	acquireRejected(t, h, []Target{w2}, PhaseMixed, CodeConcurrencyOverall)
	b.Done()
	syncEnds(t, g)
	acquireOK(t, h, []Target{w2}, PhaseMixed, 0).Done()
	syncEnds(t, h)

	// instance -> service: w1 and w2 are both in svc-a, w3 in svc-b.
	g, h = routers(`{"scope":"instance","overall_concurrency":1}`)
	a = acquireOK(t, g, []Target{w1}, PhaseMixed, 0)
	apply(`{"scope":"service","overall_concurrency":1}`)
	acquireRejected(t, h, []Target{w2}, PhaseMixed, CodeConcurrencyOverall)
	acquireOK(t, h, []Target{w2, w3}, PhaseMixed, 1).Done()
	syncEnds(t, h)
	a.Done()
	syncEnds(t, g)
	acquireOK(t, h, []Target{w2}, PhaseMixed, 0).Done()
	syncEnds(t, h)

	// gateway -> instance: the prefill seat returned at the first token is
	// returned on every scope.
	g, h = routers(`{"scope":"gateway","prefill_concurrency":2}`)
	a = acquireOK(t, g, []Target{w1}, PhaseMixed, 0)
	b = acquireOK(t, g, []Target{w1}, PhaseMixed, 0)
	apply(`{"scope":"instance","prefill_concurrency":1}`)
	acquireRejected(t, h, []Target{w1}, PhaseMixed, CodeConcurrencyPrefill)
	acquireOK(t, h, []Target{w1, w3}, PhaseMixed, 1).Done()
	syncEnds(t, h)
	a.FirstToken()
	syncEnds(t, g)
	acquireRejected(t, h, []Target{w1}, PhaseMixed, CodeConcurrencyPrefill)
	b.FirstToken()
	syncEnds(t, g)
	acquireOK(t, h, []Target{w1}, PhaseMixed, 0).Done()
	syncEnds(t, h)
	a.Done()
	b.Done()
	syncEnds(t, g)
	// Every set of every scope is empty again: at the old scope too.
	apply(`{"scope":"gateway","prefill_concurrency":1}`)
	acquireOK(t, h, []Target{w3}, PhaseMixed, 0).Done()
}

// syncEnds returns once the seat returns g queued have reached Redis
// (nothing to wait for in process).
func syncEnds(t *testing.T, g *Governor) {
	t.Helper()
	if g.rds != nil {
		syncState(t, g)
	}
}

// A request queued before a reload that changes rate_limit.scope is
// served under the new scope: it waits while its target's new scope is
// full, and gets the seat freed there.
func TestAScopeReloadServesTheQueueUnderTheNewScope(t *testing.T) {
	g := rlConfig(t, `{"scope":"instance","overall_concurrency":1,"overlimit":"queue","queue_size":5,"queue_timeout_ms":5000}`)
	a := acquireOK(t, g, []Target{w1}, PhaseMixed, 0)
	b := acquireOK(t, g, []Target{w3}, PhaseMixed, 0)
	got := make(chan Seat, 1)
	go func() {
		s, _, rej := g.Acquire(context.Background(), []Target{w1}, PhaseMixed)
		if rej != nil {
			t.Errorf("queued request: %s", rej.Code)
		}
		got <- s
	}()
	waitFor(t, func() bool { g.seats.mu.Lock(); defer g.seats.mu.Unlock(); return g.seats.q.n == 1 })
	// Gateway scope, limit 2, with 2 in flight: the queued request waits.
	if err := g.Apply(parseConfig(t, `{"rate_limit":{"scope":"gateway","overall_concurrency":2,"overlimit":"queue","queue_size":5,"queue_timeout_ms":5000}}`)); err != nil {
		t.Fatal(err)
	}
	select {
	case s := <-got:
		s.Done()
		t.Fatal("the queued request got a seat over the gateway limit of 2")
	case <-time.After(100 * time.Millisecond):
	}
	acquireRejected(t, g, []Target{w2}, PhaseMixed, CodeConcurrencyOverall)
	b.Done() // a gateway seat frees (on w3, not the queued request's instance)
	var s Seat
	select {
	case s = <-got:
	case <-time.After(2 * time.Second):
		t.Fatal("the queued request was not served by the gateway seat that freed")
	}
	acquireRejected(t, g, []Target{w3}, PhaseMixed, CodeConcurrencyOverall)
	a.Done()
	s.Done()
	acquireOK(t, g, []Target{w3}, PhaseMixed, 0).Done()
}

// With rate_limit.scope service, a worker a reload moves to another
// service takes its seats in flight along: the new service counts them
// (and refuses past its limit), the old one no longer does, and their ends
// return them where they count, so every counter is back to zero once idle.
// Before, the moved seats stayed on the old service until they ended: with
// overall_concurrency 2 and w1's 2 streams moved from svc-a to svc-b,
// svc-b admitted 2 more (4 running on it) and svc-a refused its own.
func TestAMovedInstancesSeatsCountOnItsNewService(t *testing.T) {
	for _, how := range []string{"a request for it", "the fleet's hook"} {
		t.Run(how, func(t *testing.T) {
			g := rlConfig(t, `{"scope":"service","overall_concurrency":2}`)
			a := acquireOK(t, g, []Target{w1}, PhaseMixed, 0)
			b := acquireOK(t, g, []Target{w1}, PhaseMixed, 0)
			moved := Target{Instance: w1.Instance, Service: w3.Service}
			if how == "the fleet's hook" {
				g.MoveInstance(moved)
				if !g.Full(w3, PhaseMixed) {
					t.Fatal("svc-b has a free seat with w1's 2 moved there")
				}
				acquireRejected(t, g, []Target{w3}, PhaseMixed, CodeConcurrencyOverall)
			} else {
				acquireRejected(t, g, []Target{moved}, PhaseMixed, CodeConcurrencyOverall)
				acquireRejected(t, g, []Target{w3}, PhaseMixed, CodeConcurrencyOverall)
			}
			c := acquireOK(t, g, []Target{w2}, PhaseMixed, 0) // svc-a is free now
			d := acquireOK(t, g, []Target{w2}, PhaseMixed, 0)
			a.Done()
			e := acquireOK(t, g, []Target{w3}, PhaseMixed, 0)
			acquireRejected(t, g, []Target{w3}, PhaseMixed, CodeConcurrencyOverall)
			acquireRejected(t, g, []Target{w2}, PhaseMixed, CodeConcurrencyOverall)
			for _, s := range []Seat{b, c, d, e} {
				s.Done()
			}
			l := &g.seats
			l.mu.Lock()
			defer l.mu.Unlock()
			for _, m := range []map[string]*counters{l.inst, l.svc} {
				for k, c := range m {
					if c.n != [3]int{} {
						t.Errorf("%s: %v seats held once idle", k, c.n)
					}
				}
			}
		})
	}
}
