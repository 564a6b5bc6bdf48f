package sched

import (
	"testing"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/infera/infera/fleet"
)

// A lease on a standalone worker counts one request once sent (twice Sent
// is still one; a lease never sent counts none), follows its breaker
// (faults trip it, the cooldown admits one probe, a successful probe closes
// it) and ends like any lease.
func TestAcquireExternalFollowsTheWorkersBreaker(t *testing.T) {
	bc := fleet.BreakerConfig{Threshold: 2, Cooldown: time.Second, MaxCooldown: time.Minute}
	set := metrics.NewSet()
	reqs, fails := set.NewCounter("reqs"), set.NewCounter("fails")
	w := fleet.NewStandalone("split:ext", &bc, reqs, fails)
	now := int64(1000)
	clock := func() int64 { return now }
	var l Lease
	for i := 0; i < 2; i++ {
		if ok, _ := l.AcquireExternal(w, clock); !ok {
			t.Fatalf("attempt %d refused with a closed breaker", i)
		}
		if got := loadOf(w); got != [5]int64{1, 0, 0, 0, 1} {
			t.Fatalf("held: load %v", got)
		}
		if reqs.Get() != uint64(i) {
			t.Fatalf("attempt %d counted before it was sent: %d", i, reqs.Get())
		}
		l.Sent()
		l.Sent()
		l.Done(OutcomeFault)
		if got := loadOf(w); got != [5]int64{} {
			t.Fatalf("done: load %v", got)
		}
	}
	if w.Breaker.State() != fleet.BreakerOpen || reqs.Get() != 2 || fails.Get() != 2 || w.Idx != -1 {
		t.Fatalf("after two faults: state %d, requests %d, failures %d, idx %d", w.Breaker.State(), reqs.Get(), fails.Get(), w.Idx)
	}
	if ok, onTrial := l.AcquireExternal(w, clock); ok || onTrial || l.Held() {
		t.Fatalf("an open breaker admitted an attempt, or said its probe was taken (%v, %v)", ok, onTrial)
	}
	now += int64(time.Second)
	if ok, _ := l.AcquireExternal(w, clock); !ok || !l.Probe {
		t.Fatal("the cooldown passed: the attempt should be the probe")
	}
	var other Lease
	if ok, onTrial := other.AcquireExternal(w, clock); ok || !onTrial {
		t.Fatalf("a second attempt took the probe slot, or was not told it was taken (%v, %v)", ok, onTrial)
	}
	l.Sent()
	l.FirstToken()
	l.Done(OutcomeSuccess)
	if ok, _ := l.AcquireExternal(w, clock); !ok {
		t.Fatal("a closed breaker refused")
	}
	l.Done(OutcomeNeutral) // handed back unsent
	if reqs.Get() != 3 {
		t.Fatalf("requests %d, want 3 sent", reqs.Get())
	}
	if w.Breaker.State() != fleet.BreakerClosed {
		t.Fatalf("a successful probe left the breaker %d", w.Breaker.State())
	}
}
