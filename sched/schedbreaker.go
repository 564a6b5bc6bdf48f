package sched

import (
	"sync/atomic"
	"time"

	"github.com/infera/infera/breaker"
	"github.com/infera/infera/config"
)

// Scheduling breaker states (infera_sched_breaker_state).
const (
	sbClosed   = breaker.Closed
	sbHalfOpen = breaker.HalfOpen
	sbOpen     = breaker.Open
)

// sbMode is what one decision does under the scheduling breaker.
type sbMode uint8

const (
	sbNormal sbMode = iota // run the layers under the wait timeout
	sbProbe                // the half-open probe: layers under the probe wait limit
	sbSkip                 // open: straight to local round-robin
)

// sbMinSamples is the number of decisions the window must hold before its
// failure ratio is judged.
const sbMinSamples = 10

// schedBreaker is the scheduling circuit breaker, a breaker.Breaker with
// the ratio rule: decisions that exceed the wait timeout count as failures
// over a 10-second rolling window of one-second buckets; at or above
// trip_failure_ratio (with at least 10 samples) it opens and every
// decision goes straight to local round-robin for cooldown_s (not
// doubled); then one decision probes under probe_wait_ms: in time closes
// the breaker, late reopens it. The settings of the config in force apply,
// to an open breaker's cooldown too. Disabled, only the timeout applies.
type schedBreaker struct {
	br breaker.Breaker
	// trips counts openings from closed (infera_sched_breaker_trips_total);
	// a late probe's reopening is counted by probes_total{result="timeout"}.
	trips atomic.Uint64
}

// sbSettings are the breaker settings of st: off when the breaker is
// disabled.
func sbSettings(st *config.SchedTimeout) breaker.Settings {
	if !st.BreakerEnabled {
		return breaker.Settings{}
	}
	cd := time.Duration(st.CooldownSeconds * float64(time.Second))
	return breaker.Settings{Threshold: sbMinSamples, Ratio: st.TripFailureRatio, Cooldown: cd, MaxCooldown: cd}
}

// enter decides how this decision runs.
func (b *schedBreaker) enter(st *config.SchedTimeout, now int64) sbMode {
	ok, probe, _ := b.br.Admit(sbSettings(st), now)
	switch {
	case !ok:
		return sbSkip
	case probe:
		return sbProbe
	}
	return sbNormal
}

// done records the outcome of a decision made in mode normal or probe.
func (b *schedBreaker) done(st *config.SchedTimeout, now int64, failed, probe bool, m *schedMetrics) {
	if !st.BreakerEnabled {
		return
	}
	s := sbSettings(st)
	switch {
	case probe && failed:
		m.probeFail.Inc()
		b.br.Failure(s, now, true)
	case probe:
		m.probeOK.Inc()
		b.br.Success(s, now, true)
	case failed:
		if b.br.Failure(s, now, false) {
			b.trips.Add(1)
			m.trips.Inc()
		}
	default:
		b.br.Success(s, now, false)
	}
}

func (b *schedBreaker) reset() { b.br.Reset() }

// SchedBreakerState returns the scheduling breaker's state: closed,
// half-open (probe in flight) or open.
func (s *Scheduler) SchedBreakerState() breaker.State { return s.sb.br.State() }
