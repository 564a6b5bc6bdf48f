package classify

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/infera/infera/config"
)

// Classifier breaker states, as infera_classifier_breaker_state exports
// them (the values of fleet.Breaker's and the scheduling breaker's).
const (
	BreakerClosed   int32 = 0
	BreakerHalfOpen int32 = 1
	BreakerOpen     int32 = 2
)

// maxBackoff caps the cooldown's doublings (the cap of
// breaker_max_cooldown_ms is reached long before).
const maxBackoff = 30

// breaker is the classifier's circuit breaker, fleet.Breaker's state
// machine with the scheduling breaker's hot-reloadable settings (each call
// reads smart_model_selection of the request's snapshot): after
// breaker_failure_threshold failed calls in a row it opens, and requests
// take the fallback tier without asking for breaker_cooldown_ms; then one
// request probes the classifier while the others still skip it: its
// success closes the breaker, its failure reopens it with the cooldown
// doubled, up to breaker_max_cooldown_ms. The cooldown of the config in
// force applies to an open breaker (a reload that shortens it lets the
// probe come sooner). A threshold of 0 closes it and leaves it closed.
type breaker struct {
	state atomic.Int32
	fails atomic.Int32
	// openedAt is when it last opened (unix ns); backoff how many failed
	// probes in a row doubled the cooldown since.
	openedAt atomic.Int64
	backoff  atomic.Int32

	mu sync.Mutex // serializes opening and closing
}

func ms(v float64) time.Duration { return time.Duration(v * float64(time.Millisecond)) }

// cooldown is the time the breaker stays open after n failed probes.
func cooldown(cfg *config.SmartModelSelection, n int32) time.Duration {
	cd, max := ms(cfg.BreakerCooldownMS), ms(cfg.BreakerMaxCooldownMS)
	for i := int32(0); i < n && cd < max; i++ {
		cd *= 2
	}
	if max > 0 && cd > max {
		cd = max
	}
	return cd
}

// admit reports whether a request at now (unix ns) may ask the
// classifier, and whether it is the half-open probe.
func (b *breaker) admit(cfg *config.SmartModelSelection, now int64) (ok, probe bool) {
	if cfg.BreakerFailureThreshold <= 0 {
		if b.state.Load() != BreakerClosed || b.fails.Load() != 0 {
			b.reset()
		}
		return true, false
	}
	switch b.state.Load() {
	case BreakerClosed:
		return true, false
	case BreakerOpen:
		if now >= b.openedAt.Load()+int64(cooldown(cfg, b.backoff.Load())) && b.state.CompareAndSwap(BreakerOpen, BreakerHalfOpen) {
			return true, true
		}
	}
	return false, false // open within its cooldown, or another request probes it
}

// done records the outcome of a call admit let through, at now (unix ns).
// It reports whether the call opened the breaker (a trip, or a failed
// probe).
func (b *breaker) done(cfg *config.SmartModelSelection, now int64, ok, probe bool) (opened bool) {
	if cfg.BreakerFailureThreshold <= 0 {
		return false
	}
	if probe {
		b.mu.Lock()
		defer b.mu.Unlock()
		if b.state.Load() != BreakerHalfOpen {
			return false
		}
		if ok {
			b.fails.Store(0)
			b.backoff.Store(0)
			b.state.Store(BreakerClosed)
			return false
		}
		if b.backoff.Load() < maxBackoff {
			b.backoff.Add(1)
		}
		b.openedAt.Store(now)
		b.state.Store(BreakerOpen)
		return true
	}
	if b.state.Load() != BreakerClosed {
		// A call admitted before the breaker opened: the probe decides.
		return false
	}
	if ok {
		if b.fails.Load() != 0 {
			b.fails.Store(0)
		}
		return false
	}
	if int(b.fails.Add(1)) < cfg.BreakerFailureThreshold {
		return false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.state.Load() != BreakerClosed {
		return false
	}
	b.fails.Store(0)
	b.backoff.Store(0)
	b.openedAt.Store(now)
	b.state.Store(BreakerOpen)
	return true
}

func (b *breaker) reset() {
	b.mu.Lock()
	b.fails.Store(0)
	b.backoff.Store(0)
	b.state.Store(BreakerClosed)
	b.mu.Unlock()
}

// BreakerStatus is what the breaker of one classifier URL says.
type BreakerStatus struct {
	// State is BreakerClosed, BreakerHalfOpen or BreakerOpen.
	State int32
	// ProbeIn is, while open, the time left before a request probes the
	// classifier (0: the next one does).
	ProbeIn time.Duration
}

// Breaker returns the state of the breaker of the classifier cfg names,
// at now; closed when no request asked it yet.
func (c *Client) Breaker(cfg *config.SmartModelSelection, now time.Time) BreakerStatus {
	t := c.cur.Load().find(cfg.ClassifierURL)
	if t == nil || cfg.BreakerFailureThreshold <= 0 {
		return BreakerStatus{}
	}
	st := BreakerStatus{State: t.br.state.Load()}
	if st.State == BreakerOpen {
		end := t.br.openedAt.Load() + int64(cooldown(cfg, t.br.backoff.Load()))
		st.ProbeIn = max(0, time.Duration(end-now.UnixNano()))
	}
	return st
}
