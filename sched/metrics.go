package sched

import (
	"errors"
	"fmt"
	"io"

	"github.com/VictoriaMetrics/metrics"
)

// schedMetrics are the scheduler's series, resolved once in NewScheduler
// (one metrics.Set per scheduler, so tests may build many).
type schedMetrics struct {
	set *metrics.Set

	layers [numLayers]*metrics.Counter

	fbBreaker  *metrics.Counter
	timeouts   *metrics.Counter
	trips      *metrics.Counter
	probeOK    *metrics.Counter
	probeFail  *metrics.Counter
	directMiss *metrics.Counter

	affRebind, affOverload *metrics.Counter
	prefixOverload         *metrics.Counter
	canaryEmpty            *metrics.Counter

	errSession, errUnknown, errNoWorkers, errExhausted *metrics.Counter

	mPrompt *metrics.Counter
	mSeen   *metrics.Counter
}

func newSchedMetrics(s *Scheduler) *schedMetrics {
	set := metrics.NewSet()
	m := &schedMetrics{set: set}
	for l := LayerDirect; l < numLayers; l++ {
		m.layers[l] = set.NewCounter(`infera_route_decisions_total{layer="` + l.String() + `"}`)
	}
	m.fbBreaker = set.NewCounter(`infera_sched_fallback_total{reason="sched_breaker_open"}`)
	m.timeouts = set.NewCounter(`infera_sched_fallback_total{reason="sched_timeout"}`)
	m.trips = set.NewCounter(`infera_sched_breaker_trips_total`)
	m.probeOK = set.NewCounter(`infera_sched_breaker_probes_total{result="ok"}`)
	m.probeFail = set.NewCounter(`infera_sched_breaker_probes_total{result="timeout"}`)
	m.directMiss = set.NewCounter(`infera_sched_direct_fallback_total`)
	m.affRebind = set.NewCounter(`infera_sched_affinity_skipped_total{reason="rebind"}`)
	m.affOverload = set.NewCounter(`infera_sched_affinity_skipped_total{reason="overloaded"}`)
	m.prefixOverload = set.NewCounter(`infera_sched_prefix_skipped_total{reason="overloaded"}`)
	m.canaryEmpty = set.NewCounter(`infera_sched_canary_unavailable_total`)
	m.errSession = set.NewCounter(`infera_sched_errors_total{kind="session_required"}`)
	m.errUnknown = set.NewCounter(`infera_sched_errors_total{kind="unknown_model"}`)
	m.errNoWorkers = set.NewCounter(`infera_sched_errors_total{kind="no_workers"}`)
	m.errExhausted = set.NewCounter(`infera_sched_errors_total{kind="exhausted"}`)
	m.mPrompt = set.NewCounter(`infera_prefix_prompt_bytes_total`)
	m.mSeen = set.NewCounter(`infera_prefix_seen_bytes_total`)

	set.NewGauge(`infera_sched_breaker_state`, func() float64 { return float64(s.sb.br.State()) })
	set.NewGauge(`infera_prefix_hit_rate_ceiling`, func() float64 { return m.Ceiling() })
	set.NewGauge(`infera_prefix_index_blocks`, func() float64 {
		if p := s.pidx.Load(); p != nil {
			return float64(p.Len())
		}
		return 0
	})
	set.NewGauge(`infera_prefix_index_bytes`, func() float64 {
		if p := s.pidx.Load(); p != nil {
			return float64(p.Bytes())
		}
		return 0
	})
	set.NewGauge(`infera_prefix_index_budget_bytes`, func() float64 {
		if p := s.pidx.Load(); p != nil {
			if b := p.budget.Load(); b >= 0 && b < 1<<62 {
				return float64(b)
			}
		}
		return -1
	})
	set.NewGauge(`infera_session_affinity_entries`, func() float64 {
		if t := s.aff.Load(); t != nil {
			return float64(t.count.Load())
		}
		return 0
	})
	// Counters kept by the index and the table, exposed as counters (a
	// gauge's TYPE line made them gauges); a replaced index's evictions
	// carry over (pidxEvicted).
	set.RegisterMetricsWriter(func(w io.Writer) {
		ttl, mem := s.pidxEvicted[0].Load(), s.pidxEvicted[1].Load()
		if p := s.pidx.Load(); p != nil {
			ttl, mem = ttl+p.evictTTL.Load(), mem+p.evictMem.Load()
		}
		metrics.WriteMetadataIfNeeded(w, "infera_prefix_index_evictions_total", "counter")
		fmt.Fprintf(w, "infera_prefix_index_evictions_total{reason=\"ttl\"} %d\n", ttl)
		fmt.Fprintf(w, "infera_prefix_index_evictions_total{reason=\"memory\"} %d\n", mem)
		var aff uint64
		if t := s.aff.Load(); t != nil {
			aff = t.evictions.Load()
		}
		metrics.WriteCounterUint64(w, "infera_session_affinity_evictions_total", aff)
	})
	metrics.RegisterSet(set)
	return m
}

func (m *schedMetrics) close() { metrics.UnregisterSet(m.set, true) }

func (m *schedMetrics) countLayer(l Layer) {
	if l < LayerDirect || l >= numLayers {
		l = LayerFallback
	}
	m.layers[l].Inc()
}

func (m *schedMetrics) countErr(err error) {
	switch {
	case errors.Is(err, ErrUnknownModel):
		m.errUnknown.Inc()
	case errors.Is(err, ErrNoWorkers):
		m.errNoWorkers.Inc()
	}
}

// observeCeiling accounts one prompt for the theoretical hit-rate ceiling:
// seen bytes any worker had already been sent, out of the prompt's bytes.
func (m *schedMetrics) observeCeiling(seen, total int) {
	seen = min(seen, total)
	m.mPrompt.Add(total)
	m.mSeen.Add(seen)
}

// Ceiling returns the share of prompt bytes seen so far that some worker had
// already been sent (the theoretical prefix cache hit-rate ceiling).
func (m *schedMetrics) Ceiling() float64 {
	t := m.mPrompt.Get()
	if t == 0 {
		return 0
	}
	return float64(m.mSeen.Get()) / float64(t)
}
