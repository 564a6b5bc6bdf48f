package govern

import (
	"sync/atomic"
)

// Ticket is one admitted request of a user: it owns the request's
// concurrency slot and pre-deductions until Done. The zero Ticket (no
// limits apply) is valid and its methods do nothing.
//
// A Ticket is a small value; copies share one state. FirstToken and Done
// are idempotent and safe from any goroutine, also concurrently; calls
// after Done (from any copy) do nothing.
type Ticket struct {
	ts  *ticketState
	gen uint64
}

// ticketState is pooled; state = gen<<2 | flags.
type ticketState struct {
	state atomic.Uint64

	g    *Governor
	u    *User
	t    *template
	conc bool // holds a concurrency slot
	rpm  bool
	tpm  bool
	// tpmEst and quotaEst are the pre-deductions (tokens, milli weighted
	// tokens); tpmPrompt and quotaPrompt their prompt parts (estimate).
	tpmEst, quotaEst       int64
	tpmPrompt, quotaPrompt int64
	win                    [numPeriods]takenWin
	at                     int64 // admission time, ns
	lim                    Limits

	// Redis: the member of the user's seat set, the key of its mark
	// (finishLua), and whether the remote counters were touched (false
	// after a fail-open admission).
	member string
	mark   string
	remote bool
}

type takenWin struct {
	on    bool
	start int64
}

const (
	tkActive = 1 << 0
	tkServed = 1 << 1
	tkFlags  = 2
)

func (g *Governor) getTicket(u *User, t *template) *ticketState {
	ts := g.ticketPool.Get().(*ticketState)
	ts.u, ts.t = u, t
	ts.at, ts.lim = 0, Limits{}
	ts.conc, ts.rpm, ts.tpm, ts.remote = false, false, false, false
	ts.tpmEst, ts.quotaEst, ts.tpmPrompt, ts.quotaPrompt = 0, 0, 0, 0
	ts.win = [numPeriods]takenWin{}
	ts.member, ts.mark = "", ""
	return ts
}

// putTicket returns a ticket state that was never handed out.
func (g *Governor) putTicket(ts *ticketState) {
	ts.u, ts.t = nil, nil
	g.ticketPool.Put(ts)
}

// handle activates ts under a new generation and returns its Ticket.
func (ts *ticketState) handle(u *User) Ticket {
	gen := ts.state.Load()>>tkFlags + 1
	ts.state.Store(gen<<tkFlags | tkActive)
	if u.m != nil {
		u.m.requests.Inc()
	}
	return Ticket{ts: ts, gen: gen}
}

// FirstToken records that the engine's answer has begun: from now on the
// request counts as served (Done reconciles instead of refunding).
func (t Ticket) FirstToken() {
	if t.ts == nil {
		return
	}
	for {
		s := t.ts.state.Load()
		if s>>tkFlags != t.gen || s&tkActive == 0 || s&tkServed != 0 {
			return
		}
		if t.ts.state.CompareAndSwap(s, s|tkServed) {
			return
		}
	}
}

// Done ends the request and returns what it holds. A request that never
// reached FirstToken (it failed before the first byte, or never reached an
// engine) is refunded: its request counts and pre-deductions are given
// back; unless u.Abandoned (an engine had it when its client left), which
// settles it as served, charged its estimate's prompt part when the usage
// is not known. A served request is reconciled with u when u.Known (the
// difference to the estimate is refunded or charged), else it keeps its
// estimate.
func (t Ticket) Done(u Usage) {
	ts := t.ts
	if ts == nil {
		return
	}
	var s uint64
	for {
		s = ts.state.Load()
		if s>>tkFlags != t.gen || s&tkActive == 0 {
			return
		}
		if ts.state.CompareAndSwap(s, t.gen<<tkFlags) {
			break
		}
	}
	served := s&tkServed != 0
	if served {
		u.Abandoned = false // its answer began: the estimate stays, as for any served request
	} else if u.Abandoned {
		served = true // it counts, charged its prompt (charges)
	}
	g := ts.g
	// Buckets are refilled lazily: reconciling at the admission time (a
	// no-op refill when the bucket moved since) spares a clock read.
	now := ts.at
	if m := ts.u.m; m != nil && served {
		_, w := ts.charges(served, u)
		m.tokens.Add(float64(w) / 1000)
	}
	if ts.remote {
		g.rds.finishUser(ts, served, u, now)
	} else if g.rds == nil {
		st := ts.u.st.Load()
		st.mu.Lock()
		st.finishLocked(ts, served, u, now)
		if ts.conc {
			g.pumpLocal(st)
		}
		st.mu.Unlock()
	}
	ts.u, ts.t = nil, nil
	g.ticketPool.Put(ts)
}

// charges returns what replaces ts's pre-deductions at its end (tokens,
// milli weighted tokens): nothing when it is refunded (not served); the
// usage when the engine reported it; else the estimate's prompt part for
// a request abandoned before its first byte (Usage.Abandoned), the whole
// estimate for a served one.
func (ts *ticketState) charges(served bool, u Usage) (tpm, quota int64) {
	switch {
	case !served:
		return 0, 0
	case u.Known:
		return int64(max(u.PromptTokens, 0) + max(u.CompletionTokens, 0)), ts.t.weighted(u)
	case u.Abandoned:
		return ts.tpmPrompt, ts.quotaPrompt
	}
	return ts.tpmEst, ts.quotaEst
}

// active reports whether t still holds its state (tests).
func (t Ticket) active() bool {
	if t.ts == nil {
		return false
	}
	s := t.ts.state.Load()
	return s>>tkFlags == t.gen && s&tkActive != 0
}
