package sched

import (
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/infera/infera/config"
	"github.com/infera/infera/fleet"
)

// maxCanarySeq bounds the precomputed weighted round-robin sequence; rules
// whose reduced weights sum higher run the smooth algorithm under a mutex.
const maxCanarySeq = 4096

// canaryRule is one compiled canary rule.
//
// The split is a deterministic smooth weighted round-robin (nginx's
// algorithm): every turn each target gains its weight, the target with the
// highest current value is chosen and loses the total. Over any window of
// sum(weights)/gcd(weights) consecutive requests matched by the rule, each
// service receives exactly weight/gcd of them, interleaved rather than in
// bursts. The sequence of one period is precomputed at compile time and read
// with one atomic counter, so concurrent requests never lock. The state
// restarts when the config is reloaded.
type canaryRule struct {
	pat      string // lower-cased glob
	services []string
	seq      []uint16 // indexes into services, one period
	ctr      atomic.Uint64

	// For weights too large to precompute (sum/gcd > maxCanarySeq).
	mu      sync.Mutex
	weights []int
	current []int
	total   int
}

func newCanaryRule(r config.CanaryRule) *canaryRule {
	cr := &canaryRule{pat: lowerASCII(strings.TrimSpace(r.Model))}
	g := 0
	for _, t := range r.Targets {
		if t.Weight > 0 {
			cr.services = append(cr.services, t.Service)
			cr.weights = append(cr.weights, t.Weight)
			g = gcd(g, t.Weight)
		}
	}
	if len(cr.services) == 0 {
		// Validation forbids it; never divide by zero on bad input.
		for _, t := range r.Targets {
			cr.services = append(cr.services, t.Service)
			cr.weights = append(cr.weights, 1)
		}
		g = 1
	}
	for i := range cr.weights {
		cr.weights[i] /= g
		cr.total += cr.weights[i]
	}
	cr.current = make([]int, len(cr.weights))
	if cr.total <= maxCanarySeq {
		cr.seq = make([]uint16, cr.total)
		for i := range cr.seq {
			cr.seq[i] = uint16(cr.smooth())
		}
		clear(cr.current)
	}
	return cr
}

// next returns the index in services of the next matched request's turn
// (-1 when the rule has no service).
func (cr *canaryRule) next() int {
	if len(cr.services) == 0 {
		return -1
	}
	if cr.seq != nil {
		n := cr.ctr.Add(1) - 1
		return int(cr.seq[n%uint64(len(cr.seq))])
	}
	cr.mu.Lock()
	i := cr.smooth()
	cr.mu.Unlock()
	return i
}

// routable reports whether one of cr's services has a routable worker in
// v: when none has, model routing decides (route, ServedModel).
func (cr *canaryRule) routable(v *fleet.View) bool {
	for _, svc := range cr.services {
		if len(v.ByService[svc]) > 0 {
			return true
		}
	}
	return false
}

// canaryService returns the service of cr that r goes to; "" when no
// service of cr has a routable worker (cr.routable is false: model
// routing decides).
//
// The session's service comes first (canarySession), then the rule's
// turn (next), taken once per request: its later picks keep it. A turn that lands on a service none of whose workers can
// take r (each already tried by r, draining, or with its breaker open)
// passes to the rule's other services in order after it, so a retry
// reaches a healthy service instead of ErrExhausted, and a service the
// breakers took out gets no traffic while another can serve. With every
// service healthy the turn is kept, so the split stays exact. When no
// service can take r, the first (from the turn) with an untried worker
// is kept, else the first with any routable worker: Pick then dispatches
// anyway (every breaker open) or answers ErrExhausted, as it would for
// the turn's service.
func (s *Scheduler) canaryService(c *compiled, cr *canaryRule, v *fleet.View, r *Request, now int64) string {
	if svc := s.canarySession(c, cr, r, now); svc != "" && len(v.ByService[svc]) > 0 {
		return svc
	}
	turn := r.cturn - 1
	if r.canary != cr || turn < 0 {
		// The request's first pick under this rule takes a turn; a pick
		// again (after a seat wait for the worker that pick chose, a
		// retry) keeps it: a new turn sent it to another service, which
		// held no seat for it.
		if turn = cr.next(); turn < 0 {
			return ""
		}
		r.canary, r.cturn = cr, turn+1
	}
	open, some := -1, -1
	for k := range cr.services {
		i := (turn + k) % len(cr.services)
		ws := v.ByService[cr.services[i]]
		if len(ws) == 0 {
			continue
		}
		if some < 0 {
			some = i
		}
		switch canTake(ws, r, now) {
		case takeNow:
			return cr.services[i]
		case takeOpen:
			if open < 0 {
				open = i
			}
		}
	}
	switch {
	case open >= 0:
		return cr.services[open]
	case some >= 0:
		return cr.services[some]
	}
	return ""
}

// take says how one of a set of workers can take a request.
type take uint8

const (
	takeNone take = iota // every worker was tried by the request, or drains
	takeOpen             // untried workers, every one's breaker open
	takeNow              // an untried worker whose breaker lets it through
)

// canTake returns how one of ws can take r at now.
func canTake(ws []*fleet.Worker, r *Request, now int64) take {
	t := takeNone
	for _, w := range ws {
		if !live(w) || r.tried(w) {
			continue
		}
		if w.Breaker.Available(now) {
			return takeNow
		}
		t = takeOpen
	}
	return t
}

// canarySession returns the service of the worker r's session is bound
// to, when session affinity is on and that service is one of the rule's
// targets: a session keeps its side of the split (and its engine's cache)
// instead of following the rule's sequence on each turn, which only new
// sessions and requests without a session advance. "" otherwise, and
// when the bound worker cannot take the request (it left or drains, this
// request already failed on it, its breaker is open): the sequence
// decides, as for a new session, and the session is re-bound.
func (s *Scheduler) canarySession(c *compiled, cr *canaryRule, r *Request, now int64) string {
	sa := &c.cfg.SessionAffinity
	if !sa.Enabled || len(r.SessionID) == 0 {
		return ""
	}
	w := s.affinity(c).get(sessionKey(r), now, int64(sa.TTLSeconds*float64(time.Second)))
	if w == nil || !live(w) || r.tried(w) || !w.Breaker.Available(now) || !slices.Contains(cr.services, w.Service) {
		return ""
	}
	return w.Service
}

// smooth runs one turn of smooth weighted round-robin.
func (cr *canaryRule) smooth() int {
	best := 0
	for i, w := range cr.weights {
		cr.current[i] += w
		if cr.current[i] > cr.current[best] {
			best = i
		}
	}
	cr.current[best] -= cr.total
	return best
}

func gcd(a, b int) int {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}
