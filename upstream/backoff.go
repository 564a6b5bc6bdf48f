package upstream

import (
	"time"

	"github.com/infera/infera/breaker"
)

// Backoff states, as the infera_*_backoff_state gauges export them (the
// values of breaker.Closed, HalfOpen and Open).
const (
	BackoffIn    = int32(breaker.Closed)   // takes requests
	BackoffTrial = int32(breaker.HalfOpen) // its backoff is over and one request tries it
	BackoffOut   = int32(breaker.Open)     // out until its backoff is over
)

// Backoff keeps an upstream whose requests fail out of the candidates: the
// first failure puts it out for base, and then one request tries it (the
// trial) while the others still skip it; the trial's success puts it back
// in, its failure puts it out again for twice as long as the last time, up
// to max. The settings are passed to every call (hot-reloadable: the
// backoff of the config in force applies to an upstream that is out), and
// base <= 0 turns it off (an upstream that is out is back in at once).
//
// It is a breaker.Breaker with a threshold of one failure (the state
// machine of every breaker of infera, docs/router.md#circuit-breakers): a
// request it lets through while the upstream is in, ending after the
// upstream went out, says nothing the trial will not say, and is ignored.
// Callers own the trial they were given: exactly one of Succeeded, Failed
// or Abandon ends it.
type Backoff struct {
	b breaker.Breaker
}

// backoffSettings are the breaker settings of a backoff from base to max.
func backoffSettings(base, max time.Duration) breaker.Settings {
	if base <= 0 {
		return breaker.Settings{}
	}
	return breaker.Settings{Threshold: 1, Cooldown: base, MaxCooldown: max}
}

// State returns BackoffIn, BackoffTrial or BackoffOut.
func (b *Backoff) State() int32 { return int32(b.b.State()) }

// Ready reports whether a request at now (unix ns) may be sent: the
// upstream is in, or out with its backoff over (that request is its trial,
// taken by Admit). It takes nothing.
func (b *Backoff) Ready(now int64, base, max time.Duration) bool {
	return b.b.Available(backoffSettings(base, max), now)
}

// Admit is called just before a request is sent. ok is false when the
// upstream is out within its backoff or another request holds its trial;
// trial is true when this request is the trial, which the caller must end.
func (b *Backoff) Admit(now int64, base, max time.Duration) (ok, trial bool) {
	ok, trial, _ = b.b.Admit(backoffSettings(base, max), now)
	return ok, trial
}

// Succeeded records a request that got its answer: a trial's success puts
// the upstream back in.
func (b *Backoff) Succeeded(trial bool) {
	// Success reads no durations; a turned-off backoff was put back in
	// by Admit, and its trial is stale.
	b.b.Success(breaker.Settings{Threshold: 1}, 0, trial)
}

// Failed records a request that failed as the upstream's fault at now
// (unix ns): an upstream that was in goes out for the base backoff, a
// failed trial doubles it. It reports whether the upstream went out.
func (b *Backoff) Failed(now int64, trial bool, base time.Duration) bool {
	return b.b.Failure(backoffSettings(base, base), now, trial) // Failure reads no durations
}

// Abandon ends a trial that said nothing of the upstream (the client left,
// nothing was sent, an answer that is neither a success nor its fault): the
// next request tries it.
func (b *Backoff) Abandon(trial bool) { b.b.Abandon(trial) }
