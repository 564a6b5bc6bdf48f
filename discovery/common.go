package discovery

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/infera/infera/fleet"
	"github.com/infera/infera/internal/logx"
)

// Sink receives the worker list. *fleet.Fleet implements it.
type Sink interface {
	// Sync replaces the whole list (after a (re)list).
	Sync(rs []fleet.Record) []error
	// Upsert adds or updates one worker (watch event).
	Upsert(r fleet.Record) error
	// Remove drops one worker (watch event).
	Remove(id string)
}

var _ Sink = (*fleet.Fleet)(nil)

// Backend names used in metric labels.
const (
	BackendEtcd       = "etcd"
	BackendKubernetes = "kubernetes"
)

// backendStats holds the process-wide metric state of one backend kind.
// With one watcher per process (the server) the gauges describe it; tests
// that run several watchers see the last writer.
type backendStats struct {
	name    string
	bad     *metrics.Counter
	relists *metrics.Counter
	healthy atomic.Int64
	// degraded is 1 while the backend answers but serves only part of
	// its function (Kubernetes: watch forbidden, fleet refreshed by
	// relists alone).
	degraded atomic.Int64
	workers  atomic.Int64
	leftOut  atomic.Int64
	log      logx.Throttle
}

var (
	statsMu sync.Mutex
	stats   = map[string]*backendStats{}
)

func statsFor(backend string) *backendStats {
	statsMu.Lock()
	defer statsMu.Unlock()
	if s := stats[backend]; s != nil {
		return s
	}
	s := &backendStats{name: backend, log: logx.Throttle{Every: 5 * time.Second}}
	lbl := fmt.Sprintf(`{backend=%q}`, backend)
	s.bad = metrics.GetOrCreateCounter(`infera_discovery_bad_records_total` + lbl)
	s.relists = metrics.GetOrCreateCounter(`infera_discovery_relists_total` + lbl)
	metrics.GetOrCreateGauge(`infera_discovery_healthy`+lbl, func() float64 { return float64(s.healthy.Load()) })
	metrics.GetOrCreateGauge(`infera_discovery_degraded`+lbl, func() float64 { return float64(s.degraded.Load()) })
	metrics.GetOrCreateGauge(`infera_discovery_workers`+lbl, func() float64 { return float64(s.workers.Load()) })
	metrics.GetOrCreateGauge(`infera_discovery_left_out_workers`+lbl, func() float64 { return float64(s.leftOut.Load()) })
	stats[backend] = s
	return s
}

// leftOutSink is a Sink that may hold a record without routing it
// (*fleet.Fleet with OneWorkerPerEngine: one engine named by two ids).
type leftOutSink interface{ LeftOut(id string) bool }

var _ leftOutSink = (*fleet.Fleet)(nil)

// workerCount is what a watcher's health line and gauges report: the
// distinct worker ids its sink routes, and those it holds left out.
type workerCount struct{ routed, leftOut atomic.Int64 }

// set counts ids (each once) against sink and publishes the counts to st.
func (c *workerCount) set(sink Sink, ids map[string]bool, st *backendStats) {
	lo, _ := sink.(leftOutSink)
	var routed, left int64
	for id := range ids {
		if lo != nil && lo.LeftOut(id) {
			left++
		} else {
			routed++
		}
	}
	c.routed.Store(routed)
	c.leftOut.Store(left)
	st.workers.Store(routed)
	st.leftOut.Store(left)
}

// String says how many workers are routed, and how many left out.
func (c *workerCount) String() string {
	s := fmt.Sprintf("%d workers", c.routed.Load())
	if n := c.leftOut.Load(); n > 0 {
		s += fmt.Sprintf(", %d left out: their engine is another worker's", n)
	}
	return s
}

// badRecord counts and logs (rate-limited) a record that was skipped.
func (s *backendStats) badRecord(where string, err error) {
	s.bad.Inc()
	s.log.Warn("discovery: skipping bad worker record", "backend", s.name, "source", where, "err", err)
}

// health is a backend's connectivity state for Health().
type health struct {
	mu      sync.Mutex
	ok      bool
	since   time.Time
	lastErr string
	synced  bool
	syncCh  chan struct{}
}

func newHealth() *health { return &health{syncCh: make(chan struct{})} }

// waitSynced waits for the first successful list of backend.
func (h *health) waitSynced(ctx context.Context, backend string) error {
	select {
	case <-h.syncCh:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("%s discovery not synced: %w", backend, ctx.Err())
	}
}

// set records a state change; it returns true when the state flipped.
func (h *health) set(ok bool, err error) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	// The first success is a start, not a recovery.
	flipped := h.ok != ok && (h.synced || !ok)
	if flipped || h.since.IsZero() {
		h.since = time.Now()
	}
	h.ok = ok
	if err != nil {
		h.lastErr = err.Error()
	} else {
		h.lastErr = ""
	}
	if ok && !h.synced {
		h.synced = true
		close(h.syncCh)
	}
	return flipped
}

func (h *health) get() (ok bool, since time.Time, lastErr string, synced bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.ok, h.since, h.lastErr, h.synced
}

// backoff returns the next retry delay, doubling from 200ms up to max.
func backoff(prev, max time.Duration) time.Duration {
	if prev <= 0 {
		return 200 * time.Millisecond
	}
	if prev *= 2; prev > max {
		prev = max
	}
	return prev
}
