package sched

import "github.com/infera/infera/fleet"

// Gate lets the caller steer Pick away from candidates that cannot take the
// request now: request rate limiting's workers whose concurrency seats are
// all taken. Pick asks Full once for each candidate left after failover
// (Request.Tried) and the breakers, in candidate order, before any layer
// decides; it passes over the full ones while another candidate is open.
// When every candidate is full it ignores the gate (the caller then waits
// for a seat, or refuses the request): a gate never makes Pick fail.
//
// Full must be cheap and must not block: it runs for every candidate of
// every request. Router mode direct does not consult the gate (the header
// decides).
type Gate interface {
	Full(w *fleet.Worker) bool
}

// gate partitions avail so that its open workers come first (in their
// order) and returns them; when none is open it returns avail whole.
func gate(g Gate, avail []*fleet.Worker) []*fleet.Worker {
	k := 0
	for i, w := range avail {
		if !g.Full(w) {
			avail[k], avail[i] = avail[i], avail[k]
			k++
		}
	}
	if k == 0 {
		return avail
	}
	return avail[:k]
}
