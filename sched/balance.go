package sched

import (
	"sync/atomic"

	"github.com/infera/infera/fleet"
)

// Balancer picks one worker among candidates (len(cands) > 0).
type Balancer uint8

// Load-balancing algorithms (layer 3 of the primary policy).
const (
	RoundRobin Balancer = iota
	LeastRequests
	LeastTokens
)

// ParseBalancer maps a config/flag name to a Balancer.
func ParseBalancer(s string) (Balancer, bool) {
	switch s {
	case "round-robin":
		return RoundRobin, true
	case "least-requests":
		return LeastRequests, true
	case "least-tokens":
		return LeastTokens, true
	}
	return LeastRequests, false
}

func (b Balancer) String() string {
	switch b {
	case RoundRobin:
		return "round-robin"
	case LeastTokens:
		return "least-tokens"
	}
	return "least-requests"
}

// Pick returns the chosen candidate. seq numbers the picks (one counter
// per scheduler): each pick stores its number in the chosen worker's
// Load.Picked, round-robin takes the candidate picked least recently, and
// the least-* algorithms break ties the same way. The rotation is thus
// over each candidate set: requests for two models interleaved, each
// model with its own workers, still spread over each model's workers (a
// counter modulo the set's size sent every other request to the same
// worker of each).
func (b Balancer) Pick(cands []*fleet.Worker, seq *atomic.Uint64) *fleet.Worker {
	if len(cands) == 1 {
		return cands[0]
	}
	for try := 0; ; try++ {
		best := cands[0]
		bestV, bestP := b.value(best), best.Load.Picked.Load()
		for _, w := range cands[1:] {
			if v, p := b.value(w), w.Load.Picked.Load(); v < bestV || v == bestV && p < bestP {
				best, bestV, bestP = w, v, p
			}
		}
		// A concurrent pick took best meanwhile: look again (twice at most).
		if best.Load.Picked.CompareAndSwap(bestP, seq.Add(1)) || try == 2 {
			return best
		}
	}
}

func (b Balancer) value(w *fleet.Worker) int64 {
	switch b {
	case LeastTokens:
		return w.Load.Tokens.Load()
	case LeastRequests:
		return w.Load.Requests.Load()
	}
	return 0
}
