package fleet

import (
	"strings"
	"sync/atomic"

	"github.com/VictoriaMetrics/metrics"
)

// Role is a worker's part in PD disaggregation.
type Role uint8

// Roles.
const (
	RoleMixed Role = iota
	RolePrefill
	RoleDecode
)

// ParseRole maps mixed/prefill/decode to a Role (unknown -> mixed, false).
func ParseRole(s string) (Role, bool) {
	switch strings.ToLower(s) {
	case "", "mixed":
		return RoleMixed, true
	case "prefill":
		return RolePrefill, true
	case "decode":
		return RoleDecode, true
	}
	return RoleMixed, false
}

func (r Role) String() string {
	switch r {
	case RolePrefill:
		return "prefill"
	case RoleDecode:
		return "decode"
	}
	return "mixed"
}

// Status values a worker record may carry.
const (
	StatusActive   = "ACTIVE"
	StatusDraining = "DRAINING"
)

// Load holds a worker's live load counters. All fields are updated with
// atomics on the request path; the struct is padded so two workers' counters
// never share a cache line.
type Load struct {
	// Requests is the number of requests dispatched and not yet finished.
	Requests atomic.Int64
	// Tokens is the sum over active requests of prompt estimate + max_tokens.
	Tokens atomic.Int64
	// PrefillTokens is the sum of prompt tokens of requests that have not yet
	// produced their first token.
	PrefillTokens atomic.Int64
	// Blocks is the sum of KV blocks (prompt + output) of active requests.
	Blocks atomic.Int64
	// Pending counts requests dispatched that have not produced a first byte.
	Pending atomic.Int64
	// Picked is the number of the scheduler's last load-balancing pick
	// that chose the worker (round-robin takes the candidate picked least
	// recently; the least-* algorithms break ties by it).
	Picked atomic.Uint64
	_      [16]byte
}

// Worker is one routable engine instance. Fields other than the atomics are
// immutable after the worker is added to a Fleet; a changed record replaces
// the Worker.
type Worker struct {
	// Idx is a small integer id, unique among live workers, reused after removal.
	Idx int
	// Serial is unique over the fleet's lifetime (never reused), so indexes
	// keyed by Idx can tell a new worker from a removed one with the same Idx.
	Serial uint32
	// ID is the instance id from discovery (or the URL for static workers).
	ID string
	// URL is the engine base URL, e.g. http://127.0.0.1:8100.
	URL string
	// Addr is host:port taken from URL.
	Addr string
	// TLS is true for https URLs.
	TLS bool
	// Models served by the worker (as reported by discovery or /v1/models).
	Models []string
	// Service names the group this worker belongs to for model routing and
	// canary rules (defaults to its first model).
	Service string
	Role    Role
	// KV event endpoints (ZMQ) and the engine's block size in tokens.
	KVEventsEndpoint string
	KVReplayEndpoint string
	BlockSize        int
	// DPSize is the engine's data-parallel size (KV events per rank).
	DPSize int
	// Record is the discovery record the worker was built from.
	Record Record
	// PD is the record's disaggregation data (prefill and decode workers).
	PD PD

	// Client is the transport's per-worker client (e.g. *fasthttp.HostClient),
	// set by a fleet hook before the worker becomes routable.
	Client any

	// Load is the worker's in-flight load. A worker that replaces one
	// with the same ID and address (a changed record, or one removed and
	// added again while requests it took still run) shares its
	// predecessor's Load: the balancer sees the requests still running on
	// the engine, and their releases land on the counters it reads.
	Load    *Load
	Breaker Breaker

	draining atomic.Bool
	removed  atomic.Bool
	// maxModelLen: the record's MaxModelLen, kept up to date when a
	// record with the same endpoint changes it (MaxModelLen).
	maxModelLen atomic.Int64

	// metrics resolved once at registration.
	mRequests *metrics.Counter
	mFailures *metrics.Counter

	// Prompt and cached tokens of the answers' reported usage.
	usagePrompt, usageCached atomic.Int64

	// handoff is the worker's record of its last PD KV handoff
	// (HandoffFailed): handoffNone, handoffTaken, handoffBlamed, or the
	// peer's Serial+2 when it failed with that peer.
	handoff atomic.Uint64
}

// Ref names an engine across its worker's replacements: a worker replaced
// by a reload or by discovery with the same id and address (another
// Serial) is the same engine, holding what the old one held (its KV
// cache, the responses it stored, the requests it runs: the fleet carries
// its Load over by the same test, inheritLoad).
type Ref struct{ ID, Addr string }

// Ref is w's engine.
func (w *Worker) Ref() Ref { return Ref{w.ID, w.Addr} }

// Is reports whether w is the engine r names.
func (r Ref) Is(w *Worker) bool { return r == w.Ref() }

// Handoff records (Worker.handoff).
const (
	handoffNone   = 0
	handoffTaken  = 1
	handoffBlamed = ^uint64(0)
)

// HandoffFailed records that decode worker d answered 5xx to a request
// whose KV prefill worker p had handed off, and reports which of them is
// blamed: p (true) or d (false). Either may be at fault (d's engine, or a
// KV endpoint of p that d cannot reach), so the records of both workers'
// last handoffs decide:
//
//  1. p's last handoff failed with another decode worker (or p is already
//     blamed), and d's did not fail with another prefill worker: p is
//     blamed, and stays blamed until a handoff of its is taken;
//  2. the same for d and another prefill worker: d is blamed;
//  3. p's last handoff was taken: d is blamed;
//  4. d's last handoff was taken: p is blamed;
//  5. no evidence (a first failure, the same pair failing again with no
//     other handoff through either, or both failing with others, as when
//     a whole decode tier fails): d is blamed, as for a request that is
//     not disaggregated.
//
// So a prefill engine whose KV endpoint cannot be reached trips its own
// breaker instead of every healthy decode worker's, and a sick decode
// engine still trips its own.
func HandoffFailed(p, d *Worker) (prefillBlamed bool) { return judgeHandoff(p, d, false) }

// HandoffTimedOut records that SGLang prefill worker p timed out waiting
// for decode worker d to join its bootstrap room while d had not answered
// either, and reports which of them is blamed: p (true) or d (false).
// Either engine may hang (each waits for the other), so the records decide
// as for HandoffFailed, except that with no evidence (rule 5) p is blamed:
// the leg that reached its own deadline.
//
// So a hung decode engine, which every prefill engine paired with it
// waits for, trips its own breaker instead of the healthy prefill
// workers'.
func HandoffTimedOut(p, d *Worker) (prefillBlamed bool) { return judgeHandoff(p, d, true) }

// judgeHandoff applies HandoffFailed's rules; prefillByDefault is the
// verdict without evidence.
func judgeHandoff(p, d *Worker, prefillByDefault bool) (prefillBlamed bool) {
	pl, dl := p.handoff.Load(), d.handoff.Load()
	failedElsewhere := func(rec uint64, peer *Worker) bool {
		return rec == handoffBlamed || rec > handoffTaken && rec != uint64(peer.Serial)+2
	}
	pe, de := failedElsewhere(pl, d), failedElsewhere(dl, p)
	switch {
	case pe && !de:
		prefillBlamed = true
		p.handoff.Store(handoffBlamed)
		d.handoffFailed(p)
	case de && !pe:
		d.handoff.Store(handoffBlamed)
		p.handoffFailed(d)
	case pe && de:
		// Both failed with others (a decode tier failing as a whole, say):
		// no evidence either way.
		prefillBlamed = prefillByDefault
		p.handoffFailed(d)
		d.handoffFailed(p)
	case pl == handoffTaken:
		p.handoffFailed(d)
		d.handoffFailed(p)
	case dl == handoffTaken:
		prefillBlamed = true
		p.handoffFailed(d)
		d.handoffFailed(p)
	default:
		prefillBlamed = prefillByDefault
		p.handoffFailed(d)
		d.handoffFailed(p)
	}
	return prefillBlamed
}

// handoffFailed records a failed handoff with peer, unless w is blamed.
func (w *Worker) handoffFailed(peer *Worker) {
	if w.handoff.Load() != handoffBlamed {
		w.handoff.Store(uint64(peer.Serial) + 2)
	}
}

// HandoffTaken records that decode worker d took prefill worker p's KV
// (its answer began): both records start over.
func HandoffTaken(p, d *Worker) {
	if p.handoff.Load() != handoffTaken {
		p.handoff.Store(handoffTaken)
	}
	if d.handoff.Load() != handoffTaken {
		d.handoff.Store(handoffTaken)
	}
}

// Draining reports whether the worker is draining (no new requests).
func (w *Worker) Draining() bool { return w.draining.Load() }

// MaxModelLen is the longest sequence (prompt and output) the engine
// serves, as its /v1/models told (Record.MaxModelLen); 0 when unknown.
func (w *Worker) MaxModelLen() int { return int(w.maxModelLen.Load()) }

// Removed reports whether the worker has left the fleet.
func (w *Worker) Removed() bool { return w.removed.Load() }

// Serves reports whether the worker serves model (exact match).
func (w *Worker) Serves(model []byte) bool {
	for _, m := range w.Models {
		if m == string(model) {
			return true
		}
	}
	return false
}

// Acquire accounts a request routed to w: tokens is prompt estimate + max
// output, prompt the prompt tokens, blocks the KV blocks it will occupy.
// It does not count the request as sent (CountSent): a routed request may
// be handed back unsent (it waits for a seat, or its seat is elsewhere).
func (w *Worker) Acquire(tokens, prompt, blocks int64) {
	w.Load.Requests.Add(1)
	w.Load.Tokens.Add(tokens)
	w.Load.PrefillTokens.Add(prompt)
	w.Load.Blocks.Add(blocks)
	w.Load.Pending.Add(1)
}

// CountSent counts one request sent to w
// (infera_router_worker_requests_total).
func (w *Worker) CountSent() {
	if w.mRequests != nil {
		w.mRequests.Inc()
	}
}

// FirstToken releases the prefill share of a request (call once).
func (w *Worker) FirstToken(prompt int64) {
	w.Load.PrefillTokens.Add(-prompt)
	w.Load.Pending.Add(-1)
}

// Release undoes Acquire. firstTokenSeen tells whether FirstToken was called.
func (w *Worker) Release(tokens, prompt, blocks int64, firstTokenSeen bool) {
	if !firstTokenSeen {
		w.FirstToken(prompt)
	}
	w.Load.Requests.Add(-1)
	w.Load.Tokens.Add(-tokens)
	w.Load.Blocks.Add(-blocks)
}

// Fault records a worker fault at now (unix ns): the breaker counts it and
// infera_router_worker_failures_total moves. probe tells whether the
// request held the breaker's half-open probe (Breaker.Failure).
func (w *Worker) Fault(now int64, probe bool) {
	if w.mFailures != nil {
		w.mFailures.Inc()
	}
	w.Breaker.Failure(now, probe)
}

// Counts returns how many requests were sent to w and how many of them
// ended in a worker fault (infera_router_worker_requests_total and
// _failures_total).
func (w *Worker) Counts() (requests, failures uint64) {
	if w.mRequests != nil {
		requests = w.mRequests.Get()
	}
	if w.mFailures != nil {
		failures = w.mFailures.Get()
	}
	return requests, failures
}

// CountUsage adds an answer's prompt tokens and the cached part of them, as
// the engine reported (its prefix cache hit rate is cached / prompt).
func (w *Worker) CountUsage(prompt, cached int) {
	w.usagePrompt.Add(int64(prompt))
	w.usageCached.Add(int64(cached))
}

// HitRate returns the worker's prefix cache hit rate over the answers it
// reported usage for (cached / prompt tokens), or -1 before any.
func (w *Worker) HitRate() float64 {
	p := w.usagePrompt.Load()
	if p <= 0 {
		return -1
	}
	return float64(w.usageCached.Load()) / float64(p)
}
