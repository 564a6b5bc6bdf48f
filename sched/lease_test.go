package sched

import (
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/infera/infera/config"
	"github.com/infera/infera/fleet"
)

func loadOf(w *fleet.Worker) [5]int64 {
	l := w.Load
	return [5]int64{l.Requests.Load(), l.Tokens.Load(), l.PrefillTokens.Load(), l.Blocks.Load(), l.Pending.Load()}
}

func TestLeaseAccountsLoadUntilDone(t *testing.T) {
	s, _ := newTestSched(t, workers(1, "m")...)
	s.BlockSize = 16
	var l Lease
	r := &Request{Model: []byte("m"), PromptTokens: 100, MaxTokens: 28}
	if err := s.Acquire(config.Default(), r, nil, &l); err != nil {
		t.Fatal(err)
	}
	w := l.Worker
	if got, want := loadOf(w), [5]int64{1, 128, 100, 8, 1}; got != want {
		t.Fatalf("held: load %v, want %v", got, want)
	}
	l.FirstToken()
	l.FirstToken()
	if got, want := loadOf(w), [5]int64{1, 128, 0, 8, 0}; got != want {
		t.Fatalf("after first token: load %v, want %v", got, want)
	}
	l.Done(OutcomeSuccess)
	l.Done(OutcomeFault) // ignored: already done
	if got := loadOf(w); got != [5]int64{} {
		t.Fatalf("after Done: load %v, want zero", got)
	}
	if w.Breaker.State() != fleet.BreakerClosed {
		t.Fatal("a second Done after the first must not count a fault")
	}
	// Done without a first token releases the prefill share too.
	if err := s.Acquire(config.Default(), r, nil, &l); err != nil {
		t.Fatal(err)
	}
	l.Done(OutcomeNeutral)
	if got := loadOf(w); got != [5]int64{} {
		t.Fatalf("Done before first token: load %v, want zero", got)
	}
}

func TestLeaseMissingMaxTokensUsesDefaultEstimate(t *testing.T) {
	s, _ := newTestSched(t, workers(1, "m")...)
	s.DefaultMaxTokens = 50
	var l Lease
	if err := s.Acquire(config.Default(), &Request{Model: []byte("m"), PromptTokens: 10, MaxTokens: -1}, nil, &l); err != nil {
		t.Fatal(err)
	}
	if got := l.Worker.Load.Tokens.Load(); got != 60 {
		t.Fatalf("tokens %d, want prompt 10 + default estimate 50", got)
	}
	l.Done(OutcomeSuccess)
}

func TestLeaseOutcomesDriveTheBreaker(t *testing.T) {
	s, c := newTestSched(t, workers(1, "m")...) // threshold 3, cooldown 1s
	cfg := config.Default()
	r := &Request{Model: []byte("m")}
	var l Lease
	acquire := func() {
		t.Helper()
		r.Tried = r.Tried[:0]
		if err := s.Acquire(cfg, r, nil, &l); err != nil {
			t.Fatal(err)
		}
	}
	w := s.Fleet.View().All[0]
	before := w.Breaker.Trips()
	// Neutral outcomes (4xx, 429, client gone) never trip it.
	for range 10 {
		acquire()
		l.Done(OutcomeNeutral)
	}
	if w.Breaker.State() != fleet.BreakerClosed {
		t.Fatal("neutral outcomes tripped the breaker")
	}
	for range 3 {
		acquire()
		l.Done(OutcomeFault)
	}
	if w.Breaker.State() != fleet.BreakerOpen || w.Breaker.Trips() != before+1 {
		t.Fatalf("3 faults: state %d trips %d", w.Breaker.State(), w.Breaker.Trips())
	}
	c.add(2 * time.Second)
	acquire() // every candidate open or cooling: this is the probe
	if !l.Probe {
		t.Fatal("first dispatch after the cooldown is not the probe")
	}
	l.Done(OutcomeNeutral) // probe handed back: the next request probes
	acquire()
	if !l.Probe {
		t.Fatal("probe slot not handed back by a neutral outcome")
	}
	l.Done(OutcomeSuccess)
	if w.Breaker.State() != fleet.BreakerClosed {
		t.Fatal("successful probe did not close the breaker")
	}
}

type countSeat struct{ first, done atomic.Int32 }

func (s *countSeat) FirstToken()    { s.first.Add(1) }
func (s *countSeat) Done(o Outcome) { s.done.Add(1) }

func TestLeaseEndsAttachedSeatsOnce(t *testing.T) {
	s, _ := newTestSched(t, workers(1, "m")...)
	var l Lease
	var a, b countSeat
	if l.Attach(&a) {
		t.Fatal("attached to a lease that holds nothing")
	}
	if err := s.Acquire(config.Default(), &Request{Model: []byte("m")}, nil, &l); err != nil {
		t.Fatal(err)
	}
	if !l.Attach(&a) {
		t.Fatal("attach failed")
	}
	l.FirstToken()
	if !l.Attach(&b) { // attached after the first token: told at once
		t.Fatal("attach failed")
	}
	if a.first.Load() != 1 || b.first.Load() != 1 {
		t.Fatalf("first token: a=%d b=%d", a.first.Load(), b.first.Load())
	}
	l.Done(OutcomeSuccess)
	l.Done(OutcomeSuccess)
	if a.done.Load() != 1 || b.done.Load() != 1 {
		t.Fatalf("done: a=%d b=%d", a.done.Load(), b.done.Load())
	}
}

func TestLeaseConcurrentDoneEndsOnce(t *testing.T) {
	s, _ := newTestSched(t, workers(1, "m")...)
	w := s.Fleet.View().All[0]
	for range 200 {
		var l Lease
		var seat countSeat
		if err := s.Acquire(config.Default(), &Request{Model: []byte("m"), PromptTokens: 7, MaxTokens: 3}, nil, &l); err != nil {
			t.Fatal(err)
		}
		l.Attach(&seat)
		var wg sync.WaitGroup
		for g := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if g%2 == 0 {
					l.FirstToken()
				}
				l.Done(Outcome(1 + g%3))
			}()
		}
		wg.Wait()
		if seat.done.Load() != 1 || seat.first.Load() != 1 {
			t.Fatalf("seat ended %d times, told first token %d times", seat.done.Load(), seat.first.Load())
		}
	}
	if got := loadOf(w); got != [5]int64{} {
		t.Fatalf("load after concurrent Done: %v", got)
	}
}

// Random faults, cancels and timeouts from many goroutines: every counter
// returns to zero and no breaker is left half-open without a probe in flight.
func TestLeaseStressCountersReturnToZero(t *testing.T) {
	s, _ := newTestSched(t, workers(4, "m")...)
	cfg := config.Default()
	var wg sync.WaitGroup
	deadline := time.Now().Add(2 * time.Second)
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 7))
			var l Lease
			r := &Request{Model: []byte("m")}
			scratch := make([]*fleet.Worker, 0, 8)
			for i := 0; i < 5000 && time.Now().Before(deadline); i++ {
				r.Reset()
				r.Model = []byte("m")
				r.PromptTokens, r.MaxTokens = rng.IntN(4000), rng.IntN(500)-1
				if err := s.Acquire(cfg, r, scratch, &l); err != nil {
					t.Error(err)
					return
				}
				switch rng.IntN(5) {
				case 0: // cancelled before the first byte
					l.Done(OutcomeNeutral)
				case 1: // fault before the first byte
					l.Done(OutcomeFault)
				case 2: // stream, then timeout mid-way: done from another goroutine
					l.FirstToken()
					done := make(chan struct{})
					go func() { l.Done(OutcomeFault); close(done) }()
					l.Done(OutcomeNeutral)
					<-done
				default:
					l.FirstToken()
					l.Done(OutcomeSuccess)
				}
			}
		}()
	}
	wg.Wait()
	for _, w := range s.Fleet.View().All {
		if got := loadOf(w); got != [5]int64{} {
			t.Fatalf("worker %s: load %v after the stress, want zero", w.ID, got)
		}
		if w.Breaker.State() == fleet.BreakerHalfOpen {
			t.Fatalf("worker %s left half-open with no probe in flight", w.ID)
		}
	}
}

func TestLeaseVerdictSettlesTheProbeBeforeDone(t *testing.T) {
	s, c := newTestSched(t, workers(1, "m")...)
	cfg := config.Default()
	var l Lease
	for range 3 {
		if err := s.Acquire(cfg, &Request{Model: []byte("m")}, nil, &l); err != nil {
			t.Fatal(err)
		}
		l.Done(OutcomeFault)
	}
	c.add(2 * time.Second)
	if err := s.Acquire(cfg, &Request{Model: []byte("m")}, nil, &l); err != nil || !l.Probe {
		t.Fatalf("no probe: %v", err)
	}
	w := l.Worker
	l.Verdict(OutcomeNeutral) // a 4xx head: the probe slot is free again
	if w.Breaker.State() != fleet.BreakerOpen {
		t.Fatalf("after a neutral verdict: state %d, want open (probe-eligible)", w.Breaker.State())
	}
	var l2 Lease
	if err := s.Acquire(cfg, &Request{Model: []byte("m")}, nil, &l2); err != nil || !l2.Probe {
		t.Fatalf("second probe not admitted: %v", err)
	}
	l.Done(OutcomeSuccess) // the first stream ends: must not touch the breaker again
	if w.Breaker.State() != fleet.BreakerHalfOpen {
		t.Fatalf("first probe's Done changed the breaker while probe 2 is in flight: state %d", w.Breaker.State())
	}
	if w.Load.Requests.Load() != 1 {
		t.Fatalf("load %d, want 1 (probe 2)", w.Load.Requests.Load())
	}
	l2.Done(OutcomeSuccess)
	if w.Breaker.State() != fleet.BreakerClosed {
		t.Fatal("probe 2 success did not close the breaker")
	}
}

// A lease taken before the breaker tripped (a long stream) that ends in a
// fault while the probe is in flight is not the probe: only the probe's
// outcome settles a half-open breaker. It used to re-open it (doubling the
// cooldown), and the probe's success then found it open and was ignored.
func TestAStragglersLeaseFaultDoesNotOverrideTheProbe(t *testing.T) {
	s, c := newTestSched(t, workers(1, "m")...) // threshold 3, cooldown 1s
	cfg := config.Default()
	var straggler, l Lease
	if err := s.Acquire(cfg, &Request{Model: []byte("m")}, nil, &straggler); err != nil || straggler.Probe {
		t.Fatalf("straggler: %v, probe %v", err, straggler.Probe)
	}
	w := straggler.Worker
	for range 3 {
		if err := s.Acquire(cfg, &Request{Model: []byte("m")}, nil, &l); err != nil {
			t.Fatal(err)
		}
		l.Done(OutcomeFault)
	}
	c.add(2 * time.Second)
	if err := s.Acquire(cfg, &Request{Model: []byte("m")}, nil, &l); err != nil || !l.Probe {
		t.Fatalf("no probe: %v", err)
	}
	straggler.Done(OutcomeFault)
	if w.Breaker.State() != fleet.BreakerHalfOpen {
		t.Fatalf("the straggler's fault settled the probe: state %s", fleet.BreakerStateName(w.Breaker.State()))
	}
	l.Done(OutcomeSuccess)
	if w.Breaker.State() != fleet.BreakerClosed || w.Breaker.Trips() != 1 {
		t.Fatalf("after the probe's success: state %s, trips %d; want closed, 1",
			fleet.BreakerStateName(w.Breaker.State()), w.Breaker.Trips())
	}
	if _, failures := w.Counts(); failures != 4 {
		t.Fatalf("failures_total %d, want 4 (the straggler's fault is still counted)", failures)
	}
	// The probe's own fault still re-opens the breaker.
	for range 3 {
		if err := s.Acquire(cfg, &Request{Model: []byte("m")}, nil, &l); err != nil {
			t.Fatal(err)
		}
		l.Done(OutcomeFault)
	}
	c.add(2 * time.Second)
	if err := s.Acquire(cfg, &Request{Model: []byte("m")}, nil, &l); err != nil || !l.Probe {
		t.Fatalf("no second probe: %v", err)
	}
	l.Done(OutcomeFault)
	if w.Breaker.State() != fleet.BreakerOpen || w.Breaker.Trips() != 3 {
		t.Fatalf("after the probe's fault: state %s, trips %d; want open, 3",
			fleet.BreakerStateName(w.Breaker.State()), w.Breaker.Trips())
	}
}

// A request's retries are not decisions of their own in
// infera_route_decisions_total: one per request (each retry's lease
// counted one, inflating the dashboard's decisions by layer).
func TestARequestIsOneRouteDecisionWhateverItsRetries(t *testing.T) {
	s, _ := newTestSched(t, workers(2, "m")...)
	total := func() uint64 {
		var n uint64
		for _, c := range s.m.layers {
			if c != nil {
				n += c.Get()
			}
		}
		return n
	}
	before := total()
	r := &Request{Model: []byte("m"), PromptTokens: 10, MaxTokens: 4}
	var l Lease
	for attempt := 0; attempt < 2; attempt++ {
		if err := s.Acquire(config.Default(), r, nil, &l); err != nil {
			t.Fatal(err)
		}
		r.Tried = append(r.Tried, l.Worker.Idx)
		l.Done(OutcomeFault)
	}
	if d := total() - before; d != 1 {
		t.Fatalf("decisions +%d for one request tried twice, want +1", d)
	}
	r.Reset() // the next request counts again
	r.Model, r.PromptTokens, r.MaxTokens = []byte("m"), 10, 4
	if err := s.Acquire(config.Default(), r, nil, &l); err != nil {
		t.Fatal(err)
	}
	l.Done(OutcomeSuccess)
	if d := total() - before; d != 2 {
		t.Fatalf("decisions +%d after a second request, want +2", d)
	}
}
