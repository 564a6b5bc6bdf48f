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

// Pick returns the chosen candidate. rr is a shared rotation counter: ties in
// the least-* algorithms are broken by rotating the scan start so equal
// workers share load evenly.
func (b Balancer) Pick(cands []*fleet.Worker, rr *atomic.Uint64) *fleet.Worker {
	n := len(cands)
	if n == 1 {
		return cands[0]
	}
	start := int(rr.Add(1) % uint64(n))
	if b == RoundRobin {
		return cands[start]
	}
	best := cands[start]
	bestV := b.value(best)
	for i := 1; i < n; i++ {
		w := cands[(start+i)%n]
		if v := b.value(w); v < bestV {
			best, bestV = w, v
		}
	}
	return best
}

func (b Balancer) value(w *fleet.Worker) int64 {
	if b == LeastTokens {
		return w.Load.Tokens.Load()
	}
	return w.Load.Requests.Load()
}
