package breaker

import (
	"math/rand"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

const sec = int64(time.Second)

func count(threshold int, cd, maxCD time.Duration) Settings {
	return Settings{Threshold: threshold, Cooldown: cd, MaxCooldown: maxCD}
}

func TestStateNames(t *testing.T) {
	f := func(s State, want string) {
		t.Helper()
		if s.String() != want {
			t.Fatalf("%d: %q, want %q", s, s, want)
		}
	}
	f(Closed, "closed")
	f(HalfOpen, "half-open")
	f(Open, "open")
	f(State(7), "closed")
}

func TestFailuresInARowOpenIt(t *testing.T) {
	f := func(threshold, failures int, wantOpen bool) {
		t.Helper()
		var b Breaker
		s := count(threshold, time.Second, 4*time.Second)
		opened := false
		for i := 0; i < failures; i++ {
			opened = b.Failure(s, 0, false) || opened
		}
		if open := b.State() == Open; open != wantOpen || opened != wantOpen {
			t.Fatalf("threshold %d, %d failures: state %s, Failure reported opened=%v", threshold, failures, b.State(), opened)
		}
		if b.Available(s, 0) == wantOpen {
			t.Fatalf("threshold %d, %d failures: Available %v in state %s", threshold, failures, !wantOpen, b.State())
		}
	}
	f(3, 2, false)
	f(3, 3, true)
	f(3, 7, true)
	f(1, 1, true)
	f(0, 100, false) // off

	// A success in between starts the count again.
	var b Breaker
	s := count(3, time.Second, 4*time.Second)
	b.Failure(s, 0, false)
	b.Failure(s, 0, false)
	b.Success(s, 0, false)
	b.Failure(s, 0, false)
	b.Failure(s, 0, false)
	if b.State() != Closed {
		t.Fatal("failures that were not in a row opened it")
	}
	if !b.Failure(s, 0, false) || b.Trips() != 1 {
		t.Fatalf("the third failure in a row: state %s, trips %d", b.State(), b.Trips())
	}
}

// The cycle: open for the cooldown, then one trial; a failed trial
// doubles the cooldown up to the cap, a good one closes the breaker and
// the next opening starts from the first cooldown again; an abandoned
// trial hands the slot to the next request.
func TestTheTrialDecidesAndFailedTrialsDoubleTheCooldown(t *testing.T) {
	var b Breaker
	s := count(1, time.Second, 4*time.Second)
	admit := func(now int64, wantOK, wantTrial, wantOnTrial bool) {
		t.Helper()
		ok, trial, onTrial := b.Admit(s, now)
		if ok != wantOK || trial != wantTrial || onTrial != wantOnTrial {
			t.Fatalf("Admit at %v: %v %v %v, want %v %v %v (state %s)", time.Duration(now), ok, trial, onTrial, wantOK, wantTrial, wantOnTrial, b.State())
		}
	}
	b.Failure(s, 0, false)
	if b.Available(s, sec/2) || b.OpenUntil(s) != sec {
		t.Fatalf("within the cooldown: available %v, open until %v", b.Available(s, sec/2), time.Duration(b.OpenUntil(s)))
	}
	admit(sec/2, false, false, false)
	if !b.Available(s, sec) || b.State() != Open {
		t.Fatal("Available after the cooldown: it must say yes and change nothing")
	}
	admit(sec, true, true, false)
	if b.State() != HalfOpen || b.Available(s, sec) {
		t.Fatalf("the trial runs: state %s", b.State())
	}
	admit(sec, false, false, true) // the slot is taken
	now := sec
	for _, want := range []int64{2 * sec, 4 * sec, 4 * sec} {
		if !b.Failure(s, now, true) {
			t.Fatalf("the trial's failure at %v did not reopen it", time.Duration(now))
		}
		if b.Cooldown(s) != time.Duration(want) || b.Available(s, now+want-1) || !b.Available(s, now+want) {
			t.Fatalf("after a failed trial at %v: cooldown %v, want %v", time.Duration(now), b.Cooldown(s), time.Duration(want))
		}
		now += want
		admit(now, true, true, false)
	}
	b.Success(s, now, true)
	if b.State() != Closed || !b.Available(s, now) || b.Cooldown(s) != time.Second {
		t.Fatalf("a good trial: state %s, cooldown %v", b.State(), b.Cooldown(s))
	}
	b.Failure(s, now, false)
	if !b.Available(s, now+sec) {
		t.Fatal("the cooldown did not start again from 1s after the breaker closed")
	}
	admit(now+sec, true, true, false)
	b.Abandon(true)
	if b.State() != Open {
		t.Fatalf("an abandoned trial left state %s", b.State())
	}
	admit(now+sec, true, true, false) // the next request is the trial at once
	b.Abandon(false)                  // not the trial's: nothing
	if b.State() != HalfOpen {
		t.Fatalf("a non-trial abandon moved the breaker to %s", b.State())
	}
	if b.Trips() != 5 {
		t.Fatalf("trips %d, want 5 (1 + 3 failed trials + 1)", b.Trips())
	}
}

// Only the trial settles a half-open breaker, and nothing but the trial
// closes an open one: a request admitted before the breaker opened (a long
// stream, a request forced while every candidate was open) may end at any
// time, and its outcome says nothing about the time since. A stale
// success used to close a tripped breaker; a straggler's failure used to
// reopen a half-open one and throw the trial's success away.
func TestStaleOutcomesDoNotOverrideTheTrial(t *testing.T) {
	s := count(1, time.Second, 8*time.Second)
	var b Breaker
	b.Failure(s, 0, false)
	b.Success(s, 1, false) // admitted before the trip
	if b.State() != Open {
		t.Fatalf("a stale success moved the open breaker to %s", b.State())
	}
	if b.Failure(s, 2, false) || b.Trips() != 1 || b.OpenUntil(s) != sec {
		t.Fatalf("a stale failure while open: trips %d, open until %v", b.Trips(), time.Duration(b.OpenUntil(s)))
	}
	if ok, trial, _ := b.Admit(s, 2*sec); !ok || !trial {
		t.Fatal("no trial after the cooldown")
	}
	b.Success(s, 2*sec, false)
	if b.Failure(s, 2*sec+1, false) || b.State() != HalfOpen {
		t.Fatalf("a straggler's outcome moved the half-open breaker to %s", b.State())
	}
	b.Success(s, 2*sec+2, true)
	if b.State() != Closed || b.Trips() != 1 {
		t.Fatalf("after the good trial: state %s, trips %d", b.State(), b.Trips())
	}

	// A trial's outcome after a Reset (the breaker was turned off and on
	// while it ran) is stale too.
	b.Failure(s, 3*sec, false)
	b.Admit(s, 5*sec)
	b.Reset()
	if b.Failure(s, 5*sec, true) || b.State() != Closed {
		t.Fatalf("a trial's failure after a reset: state %s", b.State())
	}
}

// Settings are read at every call: a reload of the cooldown applies to a
// breaker already open, and threshold 0 turns it off and closes it.
func TestReloadedSettingsApplyToAnOpenBreaker(t *testing.T) {
	var b Breaker
	long := count(2, 10*time.Minute, 10*time.Minute)
	b.Failure(long, 0, false)
	b.Failure(long, 0, false)
	if ok, _, _ := b.Admit(long, 2*sec); ok {
		t.Fatal("admitted within the 10-minute cooldown")
	}
	short := count(2, time.Second, 2*time.Second)
	if ok, trial, _ := b.Admit(short, 2*sec); !ok || !trial {
		t.Fatal("2 s after the cooldown was reloaded to 1 s: no trial")
	}
	b.Failure(short, 2*sec, true)
	if b.OpenUntil(short) != 4*sec {
		t.Fatalf("open until %v, want 4s (2s doubled)", time.Duration(b.OpenUntil(short)))
	}
	off := count(0, time.Second, 2*time.Second)
	if !b.Available(off, 2*sec) {
		t.Fatal("an open breaker whose threshold was reloaded to 0 is not available")
	}
	if ok, trial, _ := b.Admit(off, 2*sec); !ok || trial || b.State() != Closed {
		t.Fatalf("threshold 0: Admit %v trial %v, state %s", ok, trial, b.State())
	}
	for i := 0; i < 10; i++ {
		b.Failure(off, 3*sec, false)
	}
	if b.State() != Closed {
		t.Fatal("a breaker turned off opened")
	}
	// Turned on again: it starts from nothing.
	b.Failure(short, 3*sec, false)
	if b.State() != Closed {
		t.Fatal("failures counted while off opened it when turned on")
	}
}

// The Ratio rule: failures / outcomes over the last 10 seconds, judged
// from Threshold outcomes on.
func TestRatioOverTheWindowOpensIt(t *testing.T) {
	now := 50 * sec
	f := func(ratio float64, ok, failed int, wantOpen bool) {
		t.Helper()
		var b Breaker
		s := Settings{Threshold: 10, Ratio: ratio, Cooldown: time.Second, MaxCooldown: time.Second}
		for i := 0; i < ok; i++ {
			b.Success(s, now, false)
		}
		for i := 0; i < failed; i++ {
			b.Failure(s, now, false)
		}
		if open := b.State() == Open; open != wantOpen {
			t.Fatalf("ratio %.2f ok %d failed %d: open=%v", ratio, ok, failed, open)
		}
	}
	f(0.5, 10, 9, false) // 9/19 < 0.5
	f(0.5, 10, 10, true) // 10/20 = 0.5
	f(0.9, 10, 10, false)
	f(0.9, 1, 9, true) // 9/10
	f(1, 0, 10, true)
	f(0.1, 0, 9, false) // 9 outcomes: no judgment

	// Outcomes older than the window do not count.
	var b Breaker
	s := Settings{Threshold: 10, Ratio: 0.5, Cooldown: time.Second, MaxCooldown: time.Second}
	for i := 0; i < 9; i++ {
		b.Failure(s, 100*sec, false)
	}
	for i := 0; i < 9; i++ {
		b.Success(s, 111*sec, false)
	}
	b.Failure(s, 111*sec, false)
	if b.State() != Closed {
		t.Fatal("failures 11 s old counted")
	}
	// Within 10 s they do: 9 + 1 failures of 19 outcomes is 0.53.
	var c Breaker
	for i := 0; i < 9; i++ {
		c.Failure(s, 100*sec, false)
	}
	for i := 0; i < 9; i++ {
		c.Success(s, 109*sec, false)
	}
	if !c.Failure(s, 109*sec, false) {
		t.Fatal("failures 9 s old did not count")
	}
	// A fixed cooldown (MaxCooldown = Cooldown) is not doubled.
	c.Admit(s, 110*sec)
	c.Failure(s, 110*sec, true)
	if c.OpenUntil(s) != 111*sec {
		t.Fatalf("a failed trial's cooldown: open until %v, want 111s", time.Duration(c.OpenUntil(s)))
	}

	// A good trial empties the window: the next failure is judged on its
	// own (one outcome, no judgment), not with the 19 before the trip.
	var d Breaker
	for i := 0; i < 9; i++ {
		d.Success(s, 100*sec, false)
	}
	for i := 0; i < 10; i++ {
		d.Failure(s, 100*sec, false)
	}
	if d.State() != Open {
		t.Fatal("10 failures of 19 outcomes did not open it")
	}
	d.Admit(s, 101*sec)
	d.Success(s, 101*sec, true)
	if d.Failure(s, 101*sec, false) || d.State() != Closed {
		t.Fatal("the outcomes before the trial still counted after it closed the breaker")
	}
}

// However many requests race for it, one trial is admitted; the rest are
// told the trial slot is taken.
func TestOneTrialUnderConcurrentAdmits(t *testing.T) {
	s := count(1, time.Millisecond, time.Second)
	for round := 0; round < 1000; round++ {
		var b Breaker
		b.Failure(s, 0, false)
		var trials, refused atomic.Int32
		var wg sync.WaitGroup
		start := make(chan struct{})
		for g := 0; g < 8; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				for i := 0; i < 20; i++ {
					ok, trial, onTrial := b.Admit(s, sec)
					switch {
					case ok && trial:
						trials.Add(1)
					case !ok && onTrial:
						refused.Add(1)
					default:
						t.Errorf("Admit: %v %v %v", ok, trial, onTrial)
					}
				}
			}()
		}
		close(start)
		wg.Wait()
		if trials.Load() != 1 || refused.Load() != 159 {
			t.Fatalf("round %d: %d trials, %d refused", round, trials.Load(), refused.Load())
		}
	}
}

// model is the breaker written plainly, single-threaded, from the package
// documentation, for TestBreakerMatchesItsModel.
type model struct {
	state           State
	fails, backoff  int
	openedAt, trips int64
}

func (m *model) cooldown(s Settings) int64 {
	cd := s.Cooldown
	for i := 0; i < m.backoff; i++ {
		if cd >= s.MaxCooldown {
			break
		}
		cd *= 2
	}
	if s.MaxCooldown > 0 && cd > s.MaxCooldown {
		cd = s.MaxCooldown
	}
	return int64(cd)
}

func (m *model) admit(s Settings, now int64) (ok, trial bool) {
	if s.Threshold <= 0 {
		m.state, m.fails, m.backoff = Closed, 0, 0
		return true, false
	}
	switch m.state {
	case Closed:
		return true, false
	case Open:
		if now >= m.openedAt+m.cooldown(s) {
			m.state = HalfOpen
			return true, true
		}
	}
	return false, false
}

func (m *model) open(now int64) {
	m.state, m.openedAt, m.fails = Open, now, 0
	m.trips++
}

func (m *model) outcome(s Settings, now int64, trial bool, o int) {
	if s.Threshold <= 0 {
		return
	}
	switch {
	case o == 2: // abandon
		if trial && m.state == HalfOpen {
			m.state = Open
		}
	case trial && m.state != HalfOpen:
	case trial && o == 0:
		m.state, m.fails, m.backoff = Closed, 0, 0
	case trial:
		m.backoff++
		m.open(now)
	case m.state != Closed:
	case o == 0:
		m.fails = 0
	default:
		if m.fails++; m.fails >= s.Threshold {
			m.backoff = 0
			m.open(now)
		}
	}
}

// Random admissions and outcomes (trials ending out of order with other
// requests, stale outcomes, reloads of every setting, threshold 0
// included) leave the breaker where its plain model is.
func TestBreakerMatchesItsModel(t *testing.T) {
	rnd := rand.New(rand.NewSource(1))
	settings := []Settings{
		count(3, 100*time.Millisecond, 800*time.Millisecond),
		count(1, 50*time.Millisecond, 50*time.Millisecond),
		count(2, 200*time.Millisecond, time.Second),
		count(0, time.Second, time.Second),
	}
	for run := 0; run < 200; run++ {
		var b Breaker
		var m model
		var inflight []bool // admitted requests; true: the trial
		now := int64(0)
		for step := 0; step < 300; step++ {
			s := settings[0]
			if run%2 == 1 {
				s = settings[rnd.Intn(len(settings))]
			}
			now += rnd.Int63n(int64(150 * time.Millisecond))
			if rnd.Intn(2) == 0 || len(inflight) == 0 {
				ok, trial, _ := b.Admit(s, now)
				mok, mtrial := m.admit(s, now)
				if ok != mok || trial != mtrial {
					t.Fatalf("run %d step %d: Admit %v %v, model %v %v", run, step, ok, trial, mok, mtrial)
				}
				if ok {
					inflight = append(inflight, trial)
				}
			} else {
				i := rnd.Intn(len(inflight))
				trial := inflight[i]
				inflight = append(inflight[:i], inflight[i+1:]...)
				o := rnd.Intn(3)
				switch o {
				case 0:
					b.Success(s, now, trial)
				case 1:
					b.Failure(s, now, trial)
				default:
					b.Abandon(trial)
				}
				if o == 2 && s.Threshold <= 0 && trial && m.state == HalfOpen {
					m.state = Open // Abandon reads no settings
				} else {
					m.outcome(s, now, trial, o)
				}
			}
			if b.State() != m.state || b.Trips() != uint64(m.trips) || b.Available(s, now) != (s.Threshold <= 0 || m.state == Closed || m.state == Open && now >= m.openedAt+m.cooldown(s)) {
				t.Fatalf("run %d step %d: state %s trips %d, model %s trips %d", run, step, b.State(), b.Trips(), m.state, m.trips)
			}
		}
	}
}
