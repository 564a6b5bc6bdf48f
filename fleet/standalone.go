package fleet

import "github.com/VictoriaMetrics/metrics"

// NewStandalone returns a worker that belongs to no Fleet: an upstream the
// proxy sends requests to with the same lease, breaker, load counters and
// transport as a fleet worker, but that the scheduler never picks and no
// View lists (a split proxy's external API, another region's gateway).
//
// Its Idx is -1 (it is never in a Request's Tried list), its breaker
// follows bc (kept by reference: the process-wide breaker flags), and
// requests and failures, when not nil, count what
// infera_router_worker_requests_total and infera_router_worker_failures_total
// count for fleet workers (the caller names the series). The caller sets
// URL, Addr, TLS and Client before the worker's first request; they are
// immutable afterwards, as for fleet workers.
func NewStandalone(id string, bc *BreakerConfig, requests, failures *metrics.Counter) *Worker {
	w := &Worker{Idx: -1, ID: id, Service: id, Load: new(Load)}
	w.Breaker.init(bc)
	w.mRequests, w.mFailures = requests, failures
	return w
}
