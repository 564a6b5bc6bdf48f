package upstream

import (
	"testing"
	"time"
)

const ms1 = int64(time.Millisecond)

// A member with a forward waiting past the bound, none answered since,
// is stalled; an answer, or no forward waiting any more, ends it.
func TestAMemberIsStalledOnceAForwardWaitsPastTheBoundUnanswered(t *testing.T) {
	bound := 300 * time.Millisecond
	var c stallClock
	f := func(now int64, want bool) {
		t.Helper()
		if got := c.stalled(now*ms1, bound); got != want {
			t.Fatalf("at %d ms: stalled %v, want %v", now, got, want)
		}
	}
	f(0, false) // nothing waits
	c.sending(1000 * ms1)
	f(1300, false)
	f(1301, true)
	c.sending(1400 * ms1) // a second forward changes nothing
	f(1500, true)
	c.sent(1500*ms1, true) // the first is answered: the clock restarts
	f(1800, false)
	f(1801, true) // the second waits on, unanswered
	c.sent(1900*ms1, false)
	f(5000, false) // none waits: a timeout's backoff is not this clock's
	c.sending(6000 * ms1)
	f(6200, false) // the clock starts at the new forward, not an old answer
	f(6301, true)
	if c.stalled(6301*ms1, 0) {
		t.Fatal("a bound of 0 turns it off")
	}
}

// A member slow under load, each forward waiting twice the bound but one
// answered every 100 ms, is never stalled after the first answer.
func TestAMemberSlowUnderLoadIsNotStalled(t *testing.T) {
	bound := 300 * time.Millisecond
	var c stallClock
	const each, every = 600, 100 // ms per forward, ms between forwards
	var ends []int64
	for now := int64(0); now <= 5000; now += 10 {
		for len(ends) > 0 && ends[0] <= now {
			c.sent(now*ms1, true)
			ends = ends[1:]
		}
		if now%every == 0 {
			c.sending(now * ms1)
			ends = append(ends, now+each)
		}
		if now >= each && c.stalled(now*ms1, bound) {
			t.Fatalf("stalled at %d ms with an answer every %d ms", now, every)
		}
	}
}
