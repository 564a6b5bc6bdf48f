package sched

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/infera/infera/fleet"
)

// Outcome is how a dispatch attempt ended, as far as the worker's circuit
// breaker is concerned.
type Outcome uint8

// Outcomes.
const (
	// OutcomeSuccess: the worker served the request (any status below 400).
	OutcomeSuccess Outcome = iota + 1
	// OutcomeFault: the worker failed: unreachable, 5xx, timed out while the
	// router waited on it, or its stream broke.
	OutcomeFault
	// OutcomeNeutral: not the worker's fault: a 4xx or 429 answer, the client
	// left, the request's own deadline or wall-clock cap, a local limit, or
	// the broker restarting. The breaker does not count it; a probe is
	// handed back.
	OutcomeNeutral
)

func (o Outcome) String() string {
	switch o {
	case OutcomeSuccess:
		return "success"
	case OutcomeFault:
		return "fault"
	case OutcomeNeutral:
		return "neutral"
	}
	return "none"
}

// Seat is something a dispatch attempt holds besides the worker's load
// units (a concurrency seat, a quota pre-deduction): the lease tells it when
// the first token arrives and when the attempt ends. Both calls come at most
// once each, FirstToken before Done, possibly from another goroutine than
// the one that attached the seat.
type Seat interface {
	FirstToken()
	Done(o Outcome)
}

const maxSeats = 4

// Lease is one dispatch attempt. Scheduler.Pick fills it: the chosen worker
// and why (Decision), the worker's load units (requests, tokens, prefill
// tokens, KV blocks) and, when the worker's breaker is half-open, its probe
// slot. It has exactly one way to end: Done, called once (later calls do
// nothing), from any goroutine. FirstToken releases the prefill share.
//
// A Lease is reused (embedded in pooled per-request state): Pick resets it,
// and it must have ended before the next Pick.
type Lease struct {
	Decision

	tokens, prefill, blocks int64
	start                   time.Time
	// mu serializes FirstToken, Done and Attach (they may come from the
	// handler and from the relay or a watchdog); uncontended in practice.
	mu sync.Mutex
	// state: 0 free, 1 held, 2 first token seen, 3 done. Written with mu
	// held; Held reads it without (one load, no lock: it is asked two or
	// three times per request, by the pooled state's release and resets).
	state atomic.Uint32
	// settled: the breaker already has its verdict (Verdict).
	settled bool
	// sent: the attempt went to the worker (Sent).
	sent  bool
	seats [maxSeats]Seat
	nseat int
	obs   FirstTokenObserver
	now   func() int64 // the scheduler's clock (unix ns)
}

// FirstTokenObserver learns from first-token latencies (the kv-aware cost
// function may learn engine speed from them).
type FirstTokenObserver interface {
	ObserveFirstToken(w *fleet.Worker, prefillTokens int64, ttft time.Duration)
}

// Held reports whether the lease holds a worker (Pick succeeded and Done
// was not called yet).
func (l *Lease) Held() bool {
	s := l.state.Load()
	return s == 1 || s == 2
}

// acquire takes the worker's load units. Pick calls it once the decision
// is final (the probe slot, if any, is already in d.Probe).
func (l *Lease) acquire(d Decision, tokens, prefill, blocks int64, obs FirstTokenObserver, now func() int64) {
	l.now = now
	l.Decision = d
	l.tokens, l.prefill, l.blocks = tokens, prefill, blocks
	if obs != nil {
		l.start = time.Now() // only observers need the dispatch time
	}
	l.nseat = 0
	l.obs = obs
	l.sent = false
	d.Worker.Acquire(tokens, prefill, blocks)
	l.mu.Lock()
	l.state.Store(1)
	l.mu.Unlock()
}

// Sent records that the attempt is being sent to its worker: the worker's
// infera_router_worker_requests_total counts it, once per lease. A lease
// handed back unsent (the request waits for a seat, or takes one on
// another worker) counts nothing. Called by the goroutine that sends.
func (l *Lease) Sent() {
	if l.sent {
		return
	}
	l.sent = true
	l.Worker.CountSent()
}

// Attach makes the lease end s with itself. It returns false (and does not
// attach) when the lease is not held or has no room; the caller then owns s.
func (l *Lease) Attach(s Seat) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	st := l.state.Load()
	if (st != 1 && st != 2) || l.nseat == maxSeats {
		return false
	}
	l.seats[l.nseat] = s
	l.nseat++
	if st == 2 {
		s.FirstToken()
	}
	return true
}

// FirstToken records that the worker produced its first byte: the prefill
// share of the load is released and attached seats are told. Idempotent;
// a no-op once Done.
func (l *Lease) FirstToken() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.state.Load() != 1 {
		return
	}
	l.state.Store(2)
	w := l.Worker
	w.FirstToken(l.prefill)
	if l.obs != nil {
		l.obs.ObserveFirstToken(w, l.prefill, time.Since(l.start))
	}
	for i := 0; i < l.nseat; i++ {
		l.seats[i].FirstToken()
	}
}

// Done ends the attempt: the load units return, the breaker learns the
// outcome (a fault counts toward tripping; success closes, and a fault
// re-opens, a half-open breaker only when this lease held the probe;
// neutral hands the probe back), and attached seats end. Only the first call has an effect.
func (l *Lease) Done(o Outcome) {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.state.Load()
	if s != 1 && s != 2 {
		return
	}
	l.state.Store(3)
	w := l.Worker
	w.Release(l.tokens, l.prefill, l.blocks, s == 2)
	if !l.settled {
		l.settled = true
		l.tellBreaker(o)
	}
	for i := 0; i < l.nseat; i++ {
		if s != 2 {
			l.seats[i].FirstToken()
		}
		l.seats[i].Done(o)
		l.seats[i] = nil
	}
	l.nseat = 0
}

// Verdict tells the worker's breaker the attempt's outcome before the
// attempt ends, when the response head already decided it (a 4xx or 5xx
// answer that is still being relayed): a half-open probe is settled at once
// instead of blocking other probes for as long as the body takes. Done then
// only returns the load. Only the first Verdict (or Done) counts.
func (l *Lease) Verdict(o Outcome) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if s := l.state.Load(); (s != 1 && s != 2) || l.settled {
		return
	}
	l.settled = true
	l.tellBreaker(o)
}

// tellBreaker must be called with l.mu held.
func (l *Lease) tellBreaker(o Outcome) {
	w := l.Worker
	switch o {
	case OutcomeSuccess:
		w.Breaker.Success(l.Probe)
	case OutcomeFault:
		w.Fault(l.now(), l.Probe)
	default:
		w.Breaker.Abandon(l.Probe)
	}
}

// Reset clears a lease that has ended (or was never held) for reuse.
func (l *Lease) Reset() {
	if l.Held() {
		panic("BUG: Lease.Reset on a held lease")
	}
	l.Decision = Decision{}
	l.tokens, l.prefill, l.blocks = 0, 0, 0
	l.start, l.sent, l.nseat, l.obs = time.Time{}, false, 0, nil
	l.mu.Lock()
	l.state.Store(0)
	l.settled = false
	l.mu.Unlock()
}
