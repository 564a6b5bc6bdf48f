package fleet

import "github.com/infera/infera/breaker"

// Breaker states, as exported by infera_router_worker_breaker_state.
const (
	BreakerClosed   = breaker.Closed
	BreakerHalfOpen = breaker.HalfOpen
	BreakerOpen     = breaker.Open
)

// BreakerConfig is the process-wide breaker configuration (flags):
// Threshold consecutive faults remove a worker from the candidate list (0
// disables the breaker), Cooldown is the first exclusion window before a
// probe and MaxCooldown caps its doubling. Ratio is not used.
type BreakerConfig = breaker.Settings

// Breaker is the router's private opinion of one worker's health: a
// breaker.Breaker with the flags' settings. After Threshold consecutive
// faults the worker is excluded for a cooldown, then one probe (the
// breaker's trial) is admitted; success restores it, failure doubles the
// cooldown up to MaxCooldown. 4xx and 429 must never be reported as
// faults.
type Breaker struct {
	cfg *BreakerConfig
	b   breaker.Breaker
}

func (b *Breaker) init(cfg *BreakerConfig) { b.cfg = cfg }

// settings returns the breaker's settings; a breaker never initialized
// (a bare Worker) is off.
func (b *Breaker) settings() BreakerConfig {
	if b.cfg == nil {
		return BreakerConfig{}
	}
	return *b.cfg
}

// State returns the current state (closed, half-open, open).
func (b *Breaker) State() breaker.State { return b.b.State() }

// Trips returns how many times the breaker opened, failed probes
// included.
func (b *Breaker) Trips() uint64 { return b.b.Trips() }

// OpenUntil returns when (unix ns) the cooldown of the breaker's last
// opening ends: the worker is excluded until then while it is open.
func (b *Breaker) OpenUntil() int64 { return b.b.OpenUntil(b.settings()) }

// Available reports whether the worker may be a candidate at now (unix ns):
// closed, or open with the cooldown elapsed (the next dispatch is the probe).
func (b *Breaker) Available(now int64) bool { return b.b.Available(b.settings(), now) }

// Admit is called for the chosen worker just before dispatch. It returns
// ok=false when the worker cannot take the request now (another request holds
// the probe, or the cooldown has not elapsed), and probe=true when this
// request is the half-open probe.
func (b *Breaker) Admit(now int64) (ok, probe bool) {
	ok, probe, _ = b.b.Admit(b.settings(), now)
	return ok, probe
}

// AdmitWhy is Admit that also tells a refusal's cause: onTrial is true
// when the breaker is half-open and another request holds its one probe
// slot (taken even between this call's look at the state and its attempt
// to take it), false when it is open within its cooldown.
func (b *Breaker) AdmitWhy(now int64) (ok, probe, onTrial bool) {
	return b.b.Admit(b.settings(), now)
}

// Success records a successful request: it resets the fault count; when
// probe is true (the half-open probe succeeded) it closes the breaker. A
// non-probe success (a request dispatched before the trip, or a forced
// dispatch) never closes a tripped breaker: only the probe restores it.
func (b *Breaker) Success(probe bool) {
	b.b.Success(b.settings(), 0, probe) // the count rule reads no clock
}

// Failure records a fault (connect error, 5xx, timeout) at now (unix ns).
// probe tells whether the failed request was the half-open probe: only the
// probe's fault re-opens a half-open breaker (and doubles the cooldown). A
// non-probe fault while the breaker is not closed (a request dispatched
// before the trip, or a forced dispatch while every candidate was open)
// says nothing about the worker since the cooldown and is ignored, as
// Success ignores a non-probe success: the probe decides.
func (b *Breaker) Failure(now int64, probe bool) {
	b.b.Failure(b.settings(), now, probe)
}

// Abandon is called when a probe ended with neither success nor fault
// (client went away, 4xx): the next request may probe again.
func (b *Breaker) Abandon(probe bool) { b.b.Abandon(probe) }

// BreakerStateName names a breaker state: closed, half-open or open.
func BreakerStateName(s breaker.State) string { return s.String() }
