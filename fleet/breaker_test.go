package fleet

import (
	"testing"
	"time"
)

func newBreaker(threshold int, cd, maxCD time.Duration) *Breaker {
	b := &Breaker{}
	b.init(&BreakerConfig{Threshold: threshold, Cooldown: cd, MaxCooldown: maxCD})
	return b
}

func TestBreakerTripsAfterThreshold(t *testing.T) {
	f := func(threshold, faults int, wantOpen bool) {
		t.Helper()
		b := newBreaker(threshold, time.Second, 4*time.Second)
		for i := 0; i < faults; i++ {
			b.Failure(0, false)
		}
		if open := b.State() == BreakerOpen; open != wantOpen {
			t.Fatalf("threshold %d faults %d: open=%v", threshold, faults, open)
		}
		if b.Available(0) == wantOpen {
			t.Fatalf("available while open")
		}
	}
	f(3, 2, false)
	f(3, 3, true)
	f(1, 1, true)
	f(0, 100, false) // disabled
	// A success in between resets the consecutive count.
	b := newBreaker(3, time.Second, 4*time.Second)
	b.Failure(0, false)
	b.Failure(0, false)
	b.Success(false)
	b.Failure(0, false)
	b.Failure(0, false)
	if b.State() != BreakerClosed {
		t.Fatalf("non-consecutive faults opened the breaker")
	}
}

func TestBreakerProbeCycle(t *testing.T) {
	s := int64(time.Second)
	b := newBreaker(1, time.Second, 4*time.Second)
	b.Failure(0, false)
	if b.Available(s / 2) {
		t.Fatalf("available within cooldown")
	}
	if ok, _ := b.Admit(s / 2); ok {
		t.Fatalf("admitted within cooldown")
	}
	// After the cooldown one probe is admitted, a second request is not.
	if !b.Available(s) {
		t.Fatalf("not probe-eligible after cooldown")
	}
	ok, probe := b.Admit(s)
	if !ok || !probe || b.State() != BreakerHalfOpen {
		t.Fatalf("probe: ok=%v probe=%v state=%d", ok, probe, b.State())
	}
	if ok, _ := b.Admit(s); ok || b.Available(s) {
		t.Fatalf("second request admitted during the probe")
	}
	// Failed probe doubles the cooldown: 2s, then 4s, capped at 4s.
	now := s
	for _, want := range []int64{2 * s, 4 * s, 4 * s} {
		b.Failure(now, true) // the probe's fault
		if b.Available(now+want-1) || !b.Available(now+want) {
			t.Fatalf("cooldown after failed probe at %d: want %d", now, want)
		}
		now += want
		if ok, probe := b.Admit(now); !ok || !probe {
			t.Fatalf("no probe at %d", now)
		}
	}
	// Success restores the worker and resets the cooldown.
	b.Success(true)
	if b.State() != BreakerClosed || !b.Available(now) {
		t.Fatalf("not restored")
	}
	b.Failure(now, false)
	if !b.Available(now + s) {
		t.Fatalf("cooldown not reset to 1s after success")
	}
	// An abandoned probe lets the next request probe again.
	b.Admit(now + s)
	b.Abandon(true)
	if ok, probe := b.Admit(now + s); !ok || !probe {
		t.Fatalf("abandoned probe not re-admitted")
	}
	if b.Trips() != 5 {
		t.Fatalf("trips %d", b.Trips())
	}
}

// docs/router.md: "then one probe request is admitted: success closes the
// breaker, a fault doubles the cooldown". A fault of a request dispatched
// before the trip (a long stream, a request forced while every candidate
// was open) that ends while the probe is in flight is not the probe's
// outcome: it must not re-open the breaker and discard the probe's success.
// It used to: Failure in half-open re-opened the breaker whoever failed,
// doubling the cooldown, and the probe's Success(true) then found the
// breaker open and was ignored.
func TestAStragglersFaultDoesNotOverrideTheProbe(t *testing.T) {
	b := newBreaker(1, time.Second, 8*time.Second)
	t0 := int64(0)
	b.Failure(t0, false) // trips
	now := t0 + int64(2*time.Second)
	ok, probe := b.Admit(now)
	if !ok || !probe {
		t.Fatalf("Admit after the cooldown = %v, %v; want the probe", ok, probe)
	}
	b.Failure(now+1, false) // a request dispatched before the trip fails now
	if s := b.State(); s != BreakerHalfOpen {
		t.Fatalf("a straggler's fault moved the half-open breaker to %s (trips %d)", BreakerStateName(s), b.Trips())
	}
	b.Success(true) // the probe succeeds
	if s := b.State(); s != BreakerClosed {
		t.Fatalf("after a successful probe the breaker is %s (trips %d)", BreakerStateName(s), b.Trips())
	}
	if b.Trips() != 1 {
		t.Fatalf("trips %d, want 1", b.Trips())
	}
}
