package upstream

import (
	"testing"
	"time"
)

// A Backoff puts its upstream out at the first failure, lets one request
// try it once the backoff is over, doubles the backoff after a failed
// trial up to its cap, and puts it back in after a successful trial;
// requests sent before it went out say nothing; base 0 turns it off.
func TestABackoffKeepsAFailingUpstreamOutAndTriesItWithOneRequest(t *testing.T) {
	const base, max = time.Second, 3 * time.Second
	var b Backoff
	at := func(d time.Duration) int64 { return int64(d) }
	admit := func(now time.Duration, wantOK, wantTrial bool) {
		t.Helper()
		if ok, trial := b.Admit(at(now), base, max); ok != wantOK || trial != wantTrial {
			t.Fatalf("Admit at %v = %v, %v; want %v, %v", now, ok, trial, wantOK, wantTrial)
		}
		if ready := b.Ready(at(now), base, max); wantOK && !wantTrial && !ready {
			t.Fatalf("Ready at %v = false while in", now)
		}
	}
	admit(0, true, false)
	if !b.Failed(at(10*time.Millisecond), false, base) || b.State() != BackoffOut {
		t.Fatal("the first failure did not put it out")
	}
	if b.Failed(at(20*time.Millisecond), false, base) {
		t.Fatal("a request sent before it went out restarted its backoff")
	}
	if b.Ready(at(900*time.Millisecond), base, max) {
		t.Fatal("ready within its backoff")
	}
	admit(900*time.Millisecond, false, false)
	if !b.Ready(at(1010*time.Millisecond), base, max) {
		t.Fatal("not ready once its backoff is over")
	}
	admit(1010*time.Millisecond, true, true)
	admit(1020*time.Millisecond, false, false) // the trial is in flight
	b.Abandon(true)
	admit(1030*time.Millisecond, true, true) // the next request tries it
	b.Failed(at(2*time.Second), true, base)  // out for 2 s
	admit(3900*time.Millisecond, false, false)
	admit(4*time.Second, true, true)
	b.Failed(at(5*time.Second), true, base) // 4 s, capped at 3 s
	admit(7900*time.Millisecond, false, false)
	admit(8*time.Second, true, true)
	b.Succeeded(false) // a request sent before: the trial decides
	if b.State() != BackoffTrial {
		t.Fatal("a non-trial success ended the trial")
	}
	b.Succeeded(true)
	if b.State() != BackoffIn {
		t.Fatal("a successful trial did not put it back in")
	}
	b.Failed(at(9*time.Second), false, base) // back to the base backoff
	admit(9900*time.Millisecond, false, false)
	admit(10*time.Second, true, true)
	// Turned off: whatever its state, it is in.
	if ok, trial := b.Admit(at(10*time.Second), 0, 0); !ok || trial || b.State() != BackoffIn {
		t.Fatalf("with base 0: %v %v state %d", ok, trial, b.State())
	}
	if b.Failed(at(11*time.Second), false, 0) || !b.Ready(at(11*time.Second), 0, 0) {
		t.Fatal("with base 0 a failure put it out")
	}
}
