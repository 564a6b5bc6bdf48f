package upstream

import (
	"sync"
	"sync/atomic"
	"time"
)

// Backoff states, as the infera_*_backoff_state gauges export them.
const (
	BackoffIn    int32 = 0 // takes requests
	BackoffTrial int32 = 1 // its backoff is over and one request tries it
	BackoffOut   int32 = 2 // out until its backoff is over
)

// Backoff keeps an upstream whose requests fail out of the candidates: the
// first failure puts it out for base, and then one request tries it (the
// trial) while the others still skip it; the trial's success puts it back
// in, its failure puts it out again for twice as long as the last time, up
// to max. The settings are passed to every call (hot-reloadable: the
// backoff of the config in force applies to an upstream that is out), and
// base <= 0 turns it off (an upstream that is out is back in at once).
//
// It is the state machine of fleet.Breaker and of the classifier's breaker
// with a threshold of one failure: a request it lets through while the
// upstream is in, ending after the upstream went out, says nothing the
// trial will not say, and is ignored. Callers own the trial they were
// given: exactly one of Succeeded, Failed or Abandon ends it.
type Backoff struct {
	state atomic.Int32
	// since is when the upstream last went out (unix ns); doublings how
	// many failed trials in a row doubled its backoff since it first did.
	since     atomic.Int64
	doublings atomic.Int32

	mu sync.Mutex // serializes going out and coming back in
}

// maxDoublings caps the doublings (any cap is reached long before).
const maxDoublings = 40

// backoffFor is the backoff after n failed trials in a row.
func backoffFor(base, max time.Duration, n int32) time.Duration {
	d := base
	for i := int32(0); i < n && d < max; i++ {
		d *= 2
	}
	if d > max {
		d = max
	}
	return d
}

// State returns BackoffIn, BackoffTrial or BackoffOut.
func (b *Backoff) State() int32 { return b.state.Load() }

// Ready reports whether a request at now (unix ns) may be sent: the
// upstream is in, or out with its backoff over (that request is its trial,
// taken by Admit). It takes nothing.
func (b *Backoff) Ready(now int64, base, max time.Duration) bool {
	if base <= 0 {
		return true
	}
	switch b.state.Load() {
	case BackoffIn:
		return true
	case BackoffOut:
		return now >= b.since.Load()+int64(backoffFor(base, max, b.doublings.Load()))
	}
	return false // a trial is in flight
}

// Admit is called just before a request is sent. ok is false when the
// upstream is out within its backoff or another request holds its trial;
// trial is true when this request is the trial, which the caller must end.
func (b *Backoff) Admit(now int64, base, max time.Duration) (ok, trial bool) {
	if base <= 0 {
		if b.state.Load() != BackoffIn {
			b.reset()
		}
		return true, false
	}
	switch b.state.Load() {
	case BackoffIn:
		return true, false
	case BackoffOut:
		if now >= b.since.Load()+int64(backoffFor(base, max, b.doublings.Load())) &&
			b.state.CompareAndSwap(BackoffOut, BackoffTrial) {
			return true, true
		}
	}
	return false, false
}

// Succeeded records a request that got its answer: a trial's success puts
// the upstream back in.
func (b *Backoff) Succeeded(trial bool) {
	if !trial {
		return
	}
	b.mu.Lock()
	if b.state.Load() == BackoffTrial {
		b.doublings.Store(0)
		b.state.Store(BackoffIn)
	}
	b.mu.Unlock()
}

// Failed records a request that failed as the upstream's fault at now
// (unix ns): an upstream that was in goes out for the base backoff, a
// failed trial doubles it. It reports whether the upstream went out.
func (b *Backoff) Failed(now int64, trial bool, base time.Duration) bool {
	if base <= 0 {
		return false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	switch s := b.state.Load(); {
	case s == BackoffIn:
		b.doublings.Store(0)
	case s == BackoffTrial && trial:
		if b.doublings.Load() < maxDoublings {
			b.doublings.Add(1)
		}
	default:
		return false // a request sent before it went out: the trial decides
	}
	b.since.Store(now)
	b.state.Store(BackoffOut)
	return true
}

// Abandon ends a trial that said nothing of the upstream (the client left,
// nothing was sent, an answer that is neither a success nor its fault): the
// next request tries it.
func (b *Backoff) Abandon(trial bool) {
	if !trial {
		return
	}
	b.mu.Lock()
	if b.state.Load() == BackoffTrial {
		b.state.Store(BackoffOut) // its backoff is over: the next Admit is the trial
	}
	b.mu.Unlock()
}

func (b *Backoff) reset() {
	b.mu.Lock()
	b.doublings.Store(0)
	b.state.Store(BackoffIn)
	b.mu.Unlock()
}
