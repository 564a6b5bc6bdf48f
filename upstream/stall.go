package upstream

import (
	"sync/atomic"
	"time"
)

// stallClock tells a member that takes forwards and answers none: it is
// stalled once a forward has been waiting for its first byte for the
// bound, with no forward answered since. It keeps no per-forward state:
// the count of waiting forwards, when that count last rose from zero
// (the oldest waiting forward was sent no earlier), and the last answer.
// Under load the member's answers keep coming, however slow each one
// is, so it is never stalled; a hung member answers none.
type stallClock struct {
	waiting  atomic.Int64
	since    atomic.Int64 // unix ns: waiting last rose from zero
	answered atomic.Int64 // unix ns: the last forward answered
}

// sending records a forward sent at now (unix ns).
func (c *stallClock) sending(now int64) {
	if c.waiting.Add(1) == 1 {
		c.since.Store(now)
	}
}

// sent ends a forward at now, answered when the member answered it.
func (c *stallClock) sent(now int64, answered bool) {
	if answered {
		c.answered.Store(now)
	}
	if c.waiting.Add(-1) < 0 {
		panic("BUG: a member's forward ended twice")
	}
}

// stalled reports whether, at now, forwards have been waiting for longer
// than bound without an answer; bound <= 0 turns it off.
func (c *stallClock) stalled(now int64, bound time.Duration) bool {
	if bound <= 0 || c.waiting.Load() == 0 {
		return false
	}
	return now-max(c.since.Load(), c.answered.Load()) > int64(bound)
}
