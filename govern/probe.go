package govern

import "github.com/infera/infera/config"

// Non-taking looks at request rate limiting, for the scheduler (pass over
// candidates that have no free seat) and for global scheduling (is the
// local fleet saturated?). They answer from what this router knows without
// a round trip: in process exactly, as of the call (a seat may be taken or
// freed right after: Acquire decides); with Redis the counts are in Redis,
// so Full reports false and a request finds out in its Acquire (one round
// trip over all its candidates).

// Limited reports whether request rate limiting sets a concurrency limit
// (seats are taken).
func (g *Governor) Limited() bool { return g.snap.Load().rl.limited }

// Full reports whether target t has no free seat for phase ph now: one of
// the counters ph takes is at its limit, or requests wait in the queue for
// t's scope (a newcomer does not overtake them). Without a limit, in dry
// run and with Redis it reports false. It does not allocate.
func (g *Governor) Full(t Target, ph Phase) bool {
	rl := &g.snap.Load().rl
	if !rl.limited || rl.dry || g.rds != nil {
		return false
	}
	l := &g.seats
	l.mu.Lock()
	defer l.mu.Unlock()
	var c *counters
	switch rl.scope {
	case scopeGateway:
		c = l.gw
	case scopeService:
		c = l.svc[t.Service]
	default:
		c = l.inst[t.Instance]
	}
	if c == nil {
		return false // no seat taken there yet
	}
	return c.full(ph, &rl.lim) != CodeNone || c.waiting > 0
}

// CanQueue reports whether a request that finds no free seat now would
// wait for one (over-limit handling queue, with room in this router's
// queue) rather than be refused at once. In dry run nothing waits and
// nothing is refused: it reports true.
func (g *Governor) CanQueue() bool {
	rl := &g.snap.Load().rl
	if rl.dry {
		return true
	}
	if !rl.queue {
		return false
	}
	l := &g.seats
	l.mu.Lock()
	n := l.q.n
	l.mu.Unlock()
	return n < rl.queueSize
}

// QueueLength is the number of this router's requests waiting for a seat.
func (g *Governor) QueueLength() int {
	l := &g.seats
	l.mu.Lock()
	n := l.q.n
	l.mu.Unlock()
	return n
}

// Queues reports whether over-limit handling is queue (a request without
// a free seat waits for one) rather than reject.
func (g *Governor) Queues() bool {
	rl := &g.snap.Load().rl
	return rl.queue && !rl.dry
}

// DryRun reports whether rate limiting only observes (rate_limit.dry_run):
// nothing waits and nothing is refused.
func (g *Governor) DryRun() bool { return g.snap.Load().rl.dry }

// Applied returns the config Apply made current last (the config store
// publishes a reload a moment before its hooks apply it here).
func (g *Governor) Applied() *config.Config { return g.applied.Load() }

// Shared reports whether the counters live in Redis (--state), so that
// every Ticket and Seat call is a round trip.
func (g *Governor) Shared() bool { return g.rds != nil }
