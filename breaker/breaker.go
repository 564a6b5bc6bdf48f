package breaker

import (
	"sync"
	"sync/atomic"
	"time"
)

// State is a breaker's state; its values are the ones the state gauges
// export (infera_router_worker_breaker_state, infera_sched_breaker_state,
// infera_classifier_breaker_state).
type State int32

// States.
const (
	Closed   State = 0 // requests pass; the trip rule watches their outcomes
	HalfOpen State = 1 // the trial request is in flight; the others are refused
	Open     State = 2 // requests are refused until the cooldown ends
)

// String returns "closed", "half-open" or "open".
func (s State) String() string {
	switch s {
	case HalfOpen:
		return "half-open"
	case Open:
		return "open"
	}
	return "closed"
}

// Settings are a breaker's tunables. They are passed to every call, not
// kept: the settings in force apply, an open breaker's cooldown included.
type Settings struct {
	// Threshold is the number of failures in a row that open a closed
	// breaker, or, when Ratio is set, the number of outcomes the window
	// must hold before its ratio is judged. 0 turns the breaker off: it
	// admits everything, ignores outcomes, and the next Admit closes it
	// if it was not closed.
	Threshold int
	// Ratio, when above 0, replaces the failures-in-a-row rule: a closed
	// breaker opens when, over the last WindowSeconds, failures /
	// outcomes is at or above Ratio with at least Threshold outcomes.
	Ratio float64
	// Cooldown is how long the breaker stays open after it opened from
	// closed; each failed trial since doubles it, up to MaxCooldown
	// (0: no cap, and no doubling).
	Cooldown time.Duration
	// MaxCooldown caps the doubled cooldown. Setting it to Cooldown keeps
	// the cooldown fixed.
	MaxCooldown time.Duration
}

// off reports whether the settings turn the breaker off.
func (s *Settings) off() bool { return s.Threshold <= 0 }

// maxBackoff caps the count of doublings (a cap of MaxCooldown is reached
// long before; the count must not overflow).
const maxBackoff = 30

// Breaker is one circuit breaker (see the package documentation). The zero
// value is closed and ready.
type Breaker struct {
	state atomic.Int32
	// fails counts the failures in a row while closed (the Threshold rule).
	fails atomic.Int32
	// backoff is how many failed trials in a row doubled the cooldown
	// since the breaker last opened from closed.
	backoff atomic.Int32
	// openedAt is when the breaker last opened (unix ns): it stays open
	// until the cooldown of the settings in force has passed since.
	openedAt atomic.Int64
	trips    atomic.Uint64

	mu sync.Mutex // serializes opening, closing and handing a trial back

	win window // the Ratio rule's outcomes
}

// State returns the current state.
func (b *Breaker) State() State { return State(b.state.Load()) }

// Trips returns how many times the breaker opened, failed trials
// included.
func (b *Breaker) Trips() uint64 { return b.trips.Load() }

// Cooldown returns the cooldown of the breaker's current opening under s:
// s.Cooldown doubled once per failed trial since it opened from closed,
// capped at s.MaxCooldown.
func (b *Breaker) Cooldown(s Settings) time.Duration {
	return cooldown(&s, b.backoff.Load())
}

func cooldown(s *Settings, n int32) time.Duration {
	cd, max := s.Cooldown, s.MaxCooldown
	for i := int32(0); i < n && cd < max; i++ {
		cd *= 2
	}
	if max > 0 && cd > max {
		cd = max
	}
	return cd
}

// OpenUntil returns when (unix ns) the cooldown of the breaker's last
// opening ends under s: while open, it refuses requests until then.
func (b *Breaker) OpenUntil(s Settings) int64 {
	return b.openedAt.Load() + int64(cooldown(&s, b.backoff.Load()))
}

// Available reports whether a request at now (unix ns) would be admitted:
// the breaker is closed (or off), or open with its cooldown over (the next
// request is the trial). Half-open, the trial is in flight: false. It
// changes nothing.
func (b *Breaker) Available(s Settings, now int64) bool {
	if s.off() {
		return true
	}
	switch State(b.state.Load()) {
	case Closed:
		return true
	case Open:
		return now >= b.OpenUntil(s)
	}
	return false
}

// Admit is called just before a request is sent. ok tells whether the
// request may go; trial that it is the half-open trial (the breaker was
// open with its cooldown over: it is half-open now, and the request's
// outcome must be reported with trial true). When ok is false, onTrial
// tells why: true when another request holds the trial slot (half-open,
// taken even between this call's look at the state and its attempt to
// take it), false when the breaker is open within its cooldown.
func (b *Breaker) Admit(s Settings, now int64) (ok, trial, onTrial bool) {
	if s.off() {
		if b.state.Load() != int32(Closed) || b.fails.Load() != 0 {
			b.Reset()
		}
		return true, false, false
	}
	switch State(b.state.Load()) {
	case Closed:
		return true, false, false
	case Open:
		if now < b.OpenUntil(s) {
			return false, false, false
		}
		if b.state.CompareAndSwap(int32(Open), int32(HalfOpen)) {
			return true, true, false
		}
	}
	return false, false, true
}

// Success records a request's success at now (unix ns; the Ratio rule's
// window needs it). A trial's success closes the breaker. Closed, a
// success resets the failures in a row (or counts in the window). A
// non-trial success while the breaker is not closed (a request admitted
// before it opened) is stale: ignored, only the trial restores it.
func (b *Breaker) Success(s Settings, now int64, trial bool) {
	if s.off() {
		return
	}
	if trial {
		b.mu.Lock()
		if b.state.Load() == int32(HalfOpen) {
			b.close()
		}
		b.mu.Unlock()
		return
	}
	if b.state.Load() != int32(Closed) {
		return
	}
	if s.Ratio > 0 {
		b.win.record(now, false)
		return
	}
	if b.fails.Load() != 0 {
		b.fails.Store(0)
	}
}

// Failure records a request's failure at now (unix ns) and reports
// whether it opened the breaker. A trial's failure opens the half-open
// breaker again with the cooldown doubled. Closed, the trip rule counts
// it. A non-trial failure while the breaker is not closed (a request
// admitted before it opened, ending while it is open or the trial runs)
// says nothing about what happened since it opened: ignored, the trial
// decides.
func (b *Breaker) Failure(s Settings, now int64, trial bool) (opened bool) {
	if s.off() {
		return false
	}
	if trial {
		b.mu.Lock()
		defer b.mu.Unlock()
		if b.state.Load() != int32(HalfOpen) {
			return false
		}
		if b.backoff.Load() < maxBackoff {
			b.backoff.Add(1)
		}
		b.open(now)
		return true
	}
	if b.state.Load() != int32(Closed) {
		return false
	}
	if s.Ratio > 0 {
		attempts, fails := b.win.record(now, true)
		if attempts < int64(s.Threshold) || float64(fails) < s.Ratio*float64(attempts) {
			return false
		}
	} else if int(b.fails.Add(1)) < s.Threshold {
		return false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.state.Load() != int32(Closed) {
		return false
	}
	b.backoff.Store(0)
	b.open(now)
	return true
}

// Abandon is called when a request ended with neither success nor
// failure (the client left, the worker answered 4xx). A trial's abandon
// hands the trial slot back: the breaker is open again with its cooldown
// over, and the next request is the trial. Anything else is ignored.
func (b *Breaker) Abandon(trial bool) {
	if !trial {
		return
	}
	b.mu.Lock()
	if b.state.Load() == int32(HalfOpen) {
		b.state.Store(int32(Open)) // openedAt unchanged: trial-eligible
	}
	b.mu.Unlock()
}

// Reset closes the breaker and forgets its history but its trips (a
// disabled breaker). The outcome of a trial admitted before is then stale.
func (b *Breaker) Reset() {
	b.mu.Lock()
	b.close()
	b.mu.Unlock()
}

// open must be called with b.mu held; backoff is already set.
func (b *Breaker) open(now int64) {
	b.openedAt.Store(now)
	b.fails.Store(0)
	b.trips.Add(1)
	b.state.Store(int32(Open)) // last: who sees Open sees its openedAt
}

// close must be called with b.mu held.
func (b *Breaker) close() {
	b.fails.Store(0)
	b.backoff.Store(0)
	b.win.reset()
	b.state.Store(int32(Closed))
}
