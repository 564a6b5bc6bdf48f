package fleet

import (
	"sync"
	"sync/atomic"
	"time"
)

// Breaker states, as exported by infera_router_worker_breaker_state.
const (
	BreakerClosed   int32 = 0
	BreakerHalfOpen int32 = 1
	BreakerOpen     int32 = 2
)

// BreakerConfig is the process-wide breaker configuration (flags).
type BreakerConfig struct {
	// Threshold is the number of consecutive faults before the worker is
	// removed from the candidate list; 0 disables the breaker.
	Threshold int
	// Cooldown is the first exclusion window before a probe.
	Cooldown time.Duration
	// MaxCooldown caps the doubling backoff.
	MaxCooldown time.Duration
}

// Breaker is the router's private opinion of one worker's health:
// after Threshold consecutive faults the worker is excluded for a cooldown,
// then one probe is admitted; success restores it, failure doubles the
// cooldown up to MaxCooldown. 4xx and 429 must never be reported as faults.
type Breaker struct {
	cfg       *BreakerConfig
	state     atomic.Int32
	fails     atomic.Int32
	openUntil atomic.Int64 // unix nanoseconds

	mu       sync.Mutex // serializes state transitions
	cooldown time.Duration
	trips    atomic.Uint64
}

func (b *Breaker) init(cfg *BreakerConfig) {
	b.cfg = cfg
	b.cooldown = cfg.Cooldown
}

// State returns the current state (closed, half-open, open).
func (b *Breaker) State() int32 { return b.state.Load() }

// Trips returns how many times the breaker opened.
func (b *Breaker) Trips() uint64 { return b.trips.Load() }

// OpenUntil returns when (unix ns) the cooldown of the breaker's last
// opening ends: the worker is excluded until then while it is open.
func (b *Breaker) OpenUntil() int64 { return b.openUntil.Load() }

// Available reports whether the worker may be a candidate at now (unix ns):
// closed, or open with the cooldown elapsed (the next dispatch is the probe).
func (b *Breaker) Available(now int64) bool {
	switch b.state.Load() {
	case BreakerClosed:
		return true
	case BreakerOpen:
		return now >= b.openUntil.Load()
	}
	return false // half-open: the probe is in flight
}

// Admit is called for the chosen worker just before dispatch. It returns
// ok=false when the worker cannot take the request now (another request holds
// the probe, or the cooldown has not elapsed), and probe=true when this
// request is the half-open probe.
func (b *Breaker) Admit(now int64) (ok, probe bool) {
	ok, probe, _ = b.AdmitWhy(now)
	return ok, probe
}

// AdmitWhy is Admit that also tells a refusal's cause: onTrial is true
// when the breaker is half-open and another request holds its one probe
// slot (taken even between this call's look at the state and its attempt
// to take it), false when it is open within its cooldown.
func (b *Breaker) AdmitWhy(now int64) (ok, probe, onTrial bool) {
	switch b.state.Load() {
	case BreakerClosed:
		return true, false, false
	case BreakerOpen:
		if now < b.openUntil.Load() {
			return false, false, false
		}
		if b.state.CompareAndSwap(BreakerOpen, BreakerHalfOpen) {
			return true, true, false
		}
	}
	return false, false, true
}

// Success records a successful request: it resets the fault count; when
// probe is true (the half-open probe succeeded) it closes the breaker. A
// non-probe success (a request dispatched before the trip, or a forced
// dispatch) never closes a tripped breaker: only the probe restores it.
func (b *Breaker) Success(probe bool) {
	if b.state.Load() == BreakerClosed {
		if b.fails.Load() != 0 {
			b.fails.Store(0)
		}
		return
	}
	if !probe {
		return
	}
	b.mu.Lock()
	if b.state.Load() == BreakerHalfOpen {
		b.fails.Store(0)
		b.cooldown = b.cfg.Cooldown
		b.state.Store(BreakerClosed)
	}
	b.mu.Unlock()
}

// Failure records a fault (connect error, 5xx, timeout) at now (unix ns).
// probe tells whether the failed request was the half-open probe: only the
// probe's fault re-opens a half-open breaker (and doubles the cooldown). A
// non-probe fault in half-open (a request dispatched before the trip, or a
// forced dispatch, ending while the probe is in flight) says nothing about
// the worker since the cooldown and is ignored, as Success ignores a
// non-probe success: the probe decides.
func (b *Breaker) Failure(now int64, probe bool) {
	if b.cfg == nil || b.cfg.Threshold <= 0 {
		return
	}
	switch b.state.Load() {
	case BreakerHalfOpen:
		if !probe {
			return
		}
		b.mu.Lock()
		if b.state.Load() == BreakerHalfOpen {
			cd := b.cooldown * 2
			if cd > b.cfg.MaxCooldown {
				cd = b.cfg.MaxCooldown
			}
			b.cooldown = cd
			b.open(now)
		}
		b.mu.Unlock()
	case BreakerClosed:
		if int(b.fails.Add(1)) >= b.cfg.Threshold {
			b.mu.Lock()
			if b.state.Load() == BreakerClosed {
				b.cooldown = b.cfg.Cooldown
				b.open(now)
			}
			b.mu.Unlock()
		}
	}
	// Open: a forced dispatch (all candidates open) failed; stay open.
}

// Abandon is called when a probe ended with neither success nor fault
// (client went away, 4xx): the next request may probe again.
func (b *Breaker) Abandon(probe bool) {
	if !probe {
		return
	}
	b.mu.Lock()
	if b.state.Load() == BreakerHalfOpen {
		b.state.Store(BreakerOpen) // openUntil is in the past: probe-eligible
	}
	b.mu.Unlock()
}

// open must be called with b.mu held.
func (b *Breaker) open(now int64) {
	b.openUntil.Store(now + int64(b.cooldown))
	b.state.Store(BreakerOpen)
	b.fails.Store(0)
	b.trips.Add(1)
}

// BreakerStateName names a breaker state: closed, half-open or open.
func BreakerStateName(s int32) string {
	switch s {
	case BreakerHalfOpen:
		return "half-open"
	case BreakerOpen:
		return "open"
	}
	return "closed"
}
