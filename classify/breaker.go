package classify

import (
	"time"

	"github.com/infera/infera/breaker"
	"github.com/infera/infera/config"
)

// Classifier breaker states, as infera_classifier_breaker_state exports
// them.
const (
	BreakerClosed   = breaker.Closed
	BreakerHalfOpen = breaker.HalfOpen
	BreakerOpen     = breaker.Open
)

// Each classifier URL has a breaker.Breaker (target.br) with the
// hot-reloadable settings of smart_model_selection (each call reads those
// of the request's snapshot): after breaker_failure_threshold failed calls
// in a row it opens, and requests take the fallback tier without asking
// for breaker_cooldown_ms; then one request probes the classifier (the
// breaker's trial) while the others still skip it: its success closes the
// breaker, its failure reopens it with the cooldown doubled, up to
// breaker_max_cooldown_ms. The cooldown of the config in force applies to
// an open breaker (a reload that shortens it lets the probe come sooner). A
// threshold of 0 closes it and leaves it closed.

func ms(v float64) time.Duration { return time.Duration(v * float64(time.Millisecond)) }

// breakerSettings are the breaker settings of cfg.
func breakerSettings(cfg *config.SmartModelSelection) breaker.Settings {
	return breaker.Settings{Threshold: cfg.BreakerFailureThreshold,
		Cooldown: ms(cfg.BreakerCooldownMS), MaxCooldown: ms(cfg.BreakerMaxCooldownMS)}
}

// record tells b the outcome of a call it admitted at now (unix ns): ok
// when the classifier answered a tier, any other outcome is a failure. It
// reports whether the call opened the breaker (a trip, or a failed
// probe).
func record(b *breaker.Breaker, s breaker.Settings, now int64, ok, probe bool) (opened bool) {
	if ok {
		b.Success(s, now, probe)
		return false
	}
	return b.Failure(s, now, probe)
}

// BreakerStatus is what the breaker of one classifier URL says.
type BreakerStatus struct {
	// State is BreakerClosed, BreakerHalfOpen or BreakerOpen.
	State breaker.State
	// ProbeIn is, while open, the time left before a request probes the
	// classifier (0: the next one does).
	ProbeIn time.Duration
}

// Breaker returns the state of the breaker of the classifier cfg names,
// at now; closed when no request asked it yet.
func (c *Client) Breaker(cfg *config.SmartModelSelection, now time.Time) BreakerStatus {
	t := c.cur.Load().find(cfg.ClassifierURL)
	if t == nil || cfg.BreakerFailureThreshold <= 0 {
		return BreakerStatus{}
	}
	st := BreakerStatus{State: t.br.State()}
	if st.State == BreakerOpen {
		st.ProbeIn = max(0, time.Duration(t.br.OpenUntil(breakerSettings(cfg))-now.UnixNano()))
	}
	return st
}
