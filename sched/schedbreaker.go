package sched

import (
	"sync/atomic"
	"time"

	"github.com/infera/infera/config"
)

// Scheduling breaker states (infera_sched_breaker_state).
const (
	sbClosed   int32 = 0
	sbHalfOpen int32 = 1
	sbOpen     int32 = 2
)

// sbMode is what one decision does under the scheduling breaker.
type sbMode uint8

const (
	sbNormal sbMode = iota // run the layers under the wait timeout
	sbProbe                // the half-open probe: layers under the probe wait limit
	sbSkip                 // open: straight to local round-robin
)

const (
	sbWindowSeconds = 10
	sbMinSamples    = 10
)

// schedBreaker is the scheduling circuit breaker: decisions that exceed the
// wait timeout count as failures over a 10-second rolling window of
// one-second buckets; at or above trip_failure_ratio (with at least 10
// samples) it opens and every decision goes straight to local round-robin
// for cooldown_s; then one decision probes under probe_wait_ms: in time
// closes the breaker, late reopens it. Disabled, only the timeout applies.
type schedBreaker struct {
	state atomic.Int32
	// openedAt is when it last opened (unix ns): it stays open until
	// cooldown_s of the config in force has passed since, so a reload of
	// cooldown_s applies to an open breaker too.
	openedAt atomic.Int64
	buckets  [sbWindowSeconds]sbBucket
	trips    atomic.Uint64
}

type sbBucket struct {
	sec      atomic.Int64
	attempts atomic.Int64
	fails    atomic.Int64
}

// enter decides how this decision runs.
func (b *schedBreaker) enter(st *config.SchedTimeout, now int64) sbMode {
	if !st.BreakerEnabled {
		if b.state.Load() != sbClosed {
			b.reset()
		}
		return sbNormal
	}
	switch b.state.Load() {
	case sbClosed:
		return sbNormal
	case sbOpen:
		if now >= b.openedAt.Load()+int64(st.CooldownSeconds*float64(time.Second)) && b.state.CompareAndSwap(sbOpen, sbHalfOpen) {
			return sbProbe
		}
	}
	return sbSkip
}

// done records the outcome of a decision made in mode normal or probe.
func (b *schedBreaker) done(st *config.SchedTimeout, now int64, failed, probe bool, m *schedMetrics) {
	if !st.BreakerEnabled {
		return
	}
	if probe {
		if failed {
			m.probeFail.Inc()
			b.openedAt.Store(now)
			b.state.Store(sbOpen)
		} else {
			m.probeOK.Inc()
			b.reset()
		}
		return
	}
	if b.state.Load() != sbClosed {
		return
	}
	sec := now / int64(time.Second)
	bk := &b.buckets[uint64(sec)%sbWindowSeconds]
	if old := bk.sec.Load(); old != sec && bk.sec.CompareAndSwap(old, sec) {
		bk.attempts.Store(0)
		bk.fails.Store(0)
	}
	bk.attempts.Add(1)
	if !failed {
		return
	}
	bk.fails.Add(1)
	attempts, fails := b.window(sec)
	if attempts >= sbMinSamples && float64(fails) >= st.TripFailureRatio*float64(attempts) {
		if b.state.CompareAndSwap(sbClosed, sbOpen) {
			b.openedAt.Store(now)
			b.trips.Add(1)
			m.trips.Inc()
		}
	}
}

// window sums the buckets of the last 10 seconds ending at sec.
func (b *schedBreaker) window(sec int64) (attempts, fails int64) {
	for i := range b.buckets {
		bk := &b.buckets[i]
		if s := bk.sec.Load(); s > sec-sbWindowSeconds && s <= sec {
			attempts += bk.attempts.Load()
			fails += bk.fails.Load()
		}
	}
	return attempts, fails
}

func (b *schedBreaker) reset() {
	for i := range b.buckets {
		b.buckets[i].sec.Store(0)
		b.buckets[i].attempts.Store(0)
		b.buckets[i].fails.Store(0)
	}
	b.state.Store(sbClosed)
}

// SchedBreakerState returns the scheduling breaker's state: 0 closed,
// 1 half-open (probe in flight), 2 open.
func (s *Scheduler) SchedBreakerState() int32 { return s.sb.state.Load() }
