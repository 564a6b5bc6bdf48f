package sched

import (
	"errors"
	"sync/atomic"
	"time"

	"github.com/infera/infera/config"
)

// Request is what the scheduler knows about one request. The proxy fills it
// from the parsed body; byte slices alias request memory that is only valid
// until the request handler returns.
type Request struct {
	Model     []byte
	Stream    bool
	MaxTokens int
	// PromptTokens is the prompt length estimate in tokens.
	PromptTokens int
	// Prompt is the prompt text (completion prompt, or chat message contents
	// concatenated) used for prefix matching.
	Prompt []byte
	// SessionID is the session header's value, if any.
	SessionID []byte
	// DirectWorker and DirectPrefill are x-worker-instance-id and
	// x-prefill-instance-id (router mode direct).
	DirectWorker  []byte
	DirectPrefill []byte
	// BlockHashes are the router's block hashes of the prompt tokens
	// (kv-aware routing); nil when unknown.
	BlockHashes []uint64
	// Tried lists Worker.Idx values already tried by this request (failover).
	Tried []int
}

// Reset clears r for reuse, keeping capacity.
func (r *Request) Reset() {
	tried, hashes := r.Tried[:0], r.BlockHashes[:0]
	*r = Request{Tried: tried, BlockHashes: hashes}
}

func (r *Request) tried(w *Worker) bool {
	for _, i := range r.Tried {
		if i == w.Idx {
			return true
		}
	}
	return false
}

// Decision is the scheduler's answer.
type Decision struct {
	Worker *Worker
	// Probe is true when this request is the worker's half-open breaker probe.
	Probe bool
	// Layer names what chose the worker: direct, affinity, prefix, kv, lb, fallback.
	Layer string
}

// Errors returned by Pick.
var (
	ErrNoWorkers    = errors.New("no workers available")
	ErrUnknownModel = errors.New("model not served by any worker")
	ErrExhausted    = errors.New("all candidate workers were tried")
)

// KVScorer chooses among candidates by KV cache overlap (kv-aware policy).
// It returns nil to defer to load balancing.
type KVScorer interface {
	PickKV(cands []*Worker, r *Request) *Worker
}

// Scheduler picks workers. Policy is process-level (--router-policy);
// everything else comes from the config snapshot passed to Pick.
type Scheduler struct {
	Fleet *Fleet
	// Policy is kv-aware, round-robin, least-requests, least-tokens, or
	// config (use the config's load_balancing.algorithm).
	Policy string
	// KV is consulted under the kv-aware policy; nil falls back to the
	// config's load balancing.
	KV KVScorer
	// Now returns unix nanoseconds (time.Now by default; tests override it).
	Now func() int64

	rr atomic.Uint64
}

// NewScheduler returns a scheduler over f.
func NewScheduler(f *Fleet, policy string) *Scheduler {
	return &Scheduler{Fleet: f, Policy: policy, Now: func() int64 { return time.Now().UnixNano() }}
}

// Candidates appends to dst the routable workers that may serve r's model.
func (s *Scheduler) Candidates(dst []*Worker, v *View, r *Request) ([]*Worker, error) {
	ws := v.ByModel[string(r.Model)]
	if len(ws) == 0 {
		if len(v.Routable) == 0 {
			return dst, ErrNoWorkers
		}
		return dst, ErrUnknownModel
	}
	return append(dst, ws...), nil
}

// Pick chooses a worker for r. scratch is reused to avoid allocations.
func (s *Scheduler) Pick(cfg *config.Config, r *Request, scratch []*Worker) (Decision, error) {
	v := s.Fleet.View()
	all, err := s.Candidates(scratch[:0], v, r)
	if err != nil {
		return Decision{}, err
	}
	now := s.Now()
	// Drop tried workers; keep breaker-open ones at the tail in case every
	// candidate is open (then the router dispatches anyway).
	avail := all[:0]
	var open []*Worker
	for _, w := range all {
		if r.tried(w) {
			continue
		}
		if w.Breaker.Available(now) {
			avail = append(avail, w)
		} else if open == nil {
			open = w.openMark()
		} else {
			open = append(open, w)
		}
	}
	if len(avail) == 0 {
		if len(open) == 0 {
			return Decision{}, ErrExhausted
		}
		// Every untried candidate is open: dispatch anyway.
		w := s.balancer(cfg).Pick(open, &s.rr)
		return Decision{Worker: w, Layer: "fallback"}, nil
	}
	for len(avail) > 0 {
		w, layer := s.choose(cfg, avail, r)
		ok, probe := w.Breaker.Admit(now)
		if ok {
			return Decision{Worker: w, Probe: probe, Layer: layer}, nil
		}
		avail = without(avail, w)
	}
	w := s.balancer(cfg).Pick(all[:1], &s.rr)
	return Decision{Worker: w, Layer: "fallback"}, nil
}

func (s *Scheduler) choose(cfg *config.Config, cands []*Worker, r *Request) (*Worker, string) {
	if s.Policy == "kv-aware" && s.KV != nil {
		if w := s.KV.PickKV(cands, r); w != nil {
			return w, "kv"
		}
	}
	return s.balancer(cfg).Pick(cands, &s.rr), "lb"
}

func (s *Scheduler) balancer(cfg *config.Config) Balancer {
	if b, ok := ParseBalancer(s.Policy); ok {
		return b
	}
	b, _ := ParseBalancer(cfg.LoadBalancing.Algorithm)
	return b
}

// openMark returns a one-element slice holding w. Open workers are rare, so
// this small allocation stays off the steady-state path.
func (w *Worker) openMark() []*Worker { return []*Worker{w} }

func without(ws []*Worker, w *Worker) []*Worker {
	for i, x := range ws {
		if x == w {
			ws[i] = ws[len(ws)-1]
			return ws[:len(ws)-1]
		}
	}
	return ws
}
