package govern

import (
	"context"
	"math"
	"sync"
	"time"
	"unsafe"
)

func unsafeString(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }

// Request is what admission needs to know of a request.
type Request struct {
	// PromptTokens is the router's estimate of the prompt's tokens (exact
	// when it tokenizes; 0 when unknown). It is pre-deducted from TPM and
	// the token quotas.
	PromptTokens int
	// MaxTokens is the request's max_tokens / max_completion_tokens; 0
	// when absent (the template's default output estimate is used).
	MaxTokens int
	// Generations is how many completions the engine generates, each up
	// to MaxTokens: n (or best_of) for each prompt of a batch. 0 means 1.
	Generations int
	// NoOutput: the request generates nothing (embeddings), so no output
	// estimate is pre-deducted.
	NoOutput bool
	// Model is the model the client named (valid while the request runs):
	// a request waiting in the user's queue is refused when a reload no
	// longer allows its user that model.
	Model []byte
}

// Usage is the token usage an engine reported for a request.
type Usage struct {
	// PromptTokens includes CachedTokens (OpenAI's usage.prompt_tokens).
	PromptTokens int
	// CachedTokens is usage.prompt_tokens_details.cached_tokens.
	CachedTokens int
	// CompletionTokens is usage.completion_tokens.
	CompletionTokens int
	// Known: the engine reported usage. Without it a served request keeps
	// its pre-deducted estimate.
	Known bool
	// Abandoned: the request was written to an engine and then abandoned
	// before its first byte (its client left). Such a request, never
	// served, is settled as a served one all the same: its request counts
	// (quota requests, RPM) stay taken, and it is charged the usage when
	// Known, else its estimate's prompt part (only the completion part is
	// refunded). The engine did the prefill (all of a non-streamed
	// answer's generation, even) before the router could cancel it: a
	// refund would let a client that leaves just before each answer run
	// the engines free of any limit. Set it only then: a request that
	// failed before its first byte (an engine's error, no engine reached)
	// or never reached an engine is refunded entirely. Once the request
	// was served (Ticket.FirstToken) it changes nothing.
	Abandoned bool
}

// estimate is what an admission pre-deducts.
type estimate struct {
	tpm   int64 // tokens
	quota int64 // milli weighted tokens
	// tpmPrompt and quotaPrompt are the prompt's part of tpm and quota:
	// what an abandoned request is charged (Usage.Abandoned).
	tpmPrompt, quotaPrompt int64
}

func (t *template) estimate(r Request) estimate {
	out := int64(r.MaxTokens)
	switch {
	case r.NoOutput:
		out = 0
	case out <= 0:
		out = t.defOut
	}
	out *= int64(max(r.Generations, 1))
	p := int64(max(r.PromptTokens, 0))
	e := estimate{
		tpm:   min(p+out, maxCount),
		quota: milli(float64(p)*t.wPrompt + float64(out)*t.wOut),
	}
	e.tpmPrompt, e.quotaPrompt = min(p, e.tpm), min(milli(float64(p)*t.wPrompt), e.quota)
	return e
}

// maxCount bounds an estimate or a charge, in tokens or milli weighted
// tokens. It is far above any limit, so a request estimated at it is
// refused wherever a token limit applies, and its sums stay integers:
// max_tokens 2^31 times n and a batch's prompts (2^20) times an output
// weight of 5 passed 2^63 milli tokens and wrapped to a negative estimate
// that the quota admitted; Redis's Lua numbers (doubles) stored the window
// as a float HINCRBY could no longer add to, voiding the quota for the
// rest of its window.
const maxCount = 1 << 50

// maxWindowCount bounds a quota window's count of milli-tokens, in
// process and in Redis (winCountLua): far above any limit (maxCount, and
// max_tokens up to 2^40 tokens), with room below 2^63 for a settlement of
// maxCount. A window with no token limit counts every reservation: 8,192
// in flight at maxCount each wrapped an int64 to a negative count.
const maxWindowCount = 1 << 62

// addWindow adds d to a window count n, bounded to [0, maxWindowCount].
func addWindow(n, d int64) int64 { return min(max(n+d, 0), maxWindowCount) }

func (t *template) weighted(u Usage) int64 {
	prompt := max(u.PromptTokens, 0)
	cached := min(max(u.CachedTokens, 0), prompt)
	return milli(float64(prompt-cached)*t.wIn + float64(cached)*t.wCached + float64(max(u.CompletionTokens, 0))*t.wOut)
}

func milli(x float64) int64 {
	if !(x < maxCount/1000) { // NaN included
		return maxCount
	}
	return int64(math.Ceil(x * 1000))
}

// userState is a user's counters (in process) and admission queue. It is
// made when the user's first request needs it (Governor.state), and
// outlives reloads while the user exists.
type userState struct {
	name    string
	goneSeq uint64 // its last removal by a reload (Governor.keepGone); guarded by Governor.mu

	mu     sync.Mutex
	active int // requests holding a concurrency slot
	rpm    bucket
	tpm    bucket
	win    [numPeriods]winCount
	q      waitList // admission queue (concurrency overlimit queue)
}

type winCount struct{ start, req, tok int64 }

func newUserState(name string) *userState { return &userState{name: name} }

// state returns u's counters, made at its first request that needs them:
// a configured user that sends none costs no state (about 200 bytes each;
// with 50,000 users imported they were half of what the governance kept,
// TestAppliedUsersWithoutRequestsKeepNoCounters). Once made, it is one
// load.
func (g *Governor) state(u *User) *userState {
	if st := u.st.Load(); st != nil {
		return st
	}
	return g.makeState(u)
}

// makeState finds or makes the state of u's user, as Apply would have
// given it: the one of its name that a request through another snapshot's
// User made (a reload may have run since u was identified), the one kept
// for it when a reload removed it, else a fresh one. It is stored in u
// and in the current snapshot's User of that name, so that the next Apply
// and every later request find it.
func (g *Governor) makeState(u *User) *userState {
	g.mu.Lock()
	defer g.mu.Unlock()
	if st := u.st.Load(); st != nil {
		return st
	}
	cur := g.snap.Load().users[u.name]
	st := g.states[u.name]
	switch {
	case st != nil:
	case cur == nil:
		// A reload removed the user after u was identified: its counters
		// are those kept for it, or new ones kept as a removed user's
		// would have been, for the user added back.
		if st = g.gone[u.name]; st == nil {
			st = newUserState(u.name)
			g.keepGone([]*userState{st})
		}
	default:
		st = newUserState(u.name)
		g.states[u.name] = st
	}
	if cur != nil {
		cur.st.Store(st)
	}
	u.st.Store(st)
	return st
}

// bucket is a token bucket refilled continuously at capacity per minute.
type bucket struct {
	level float64
	last  int64 // ns; 0: never used (full)
}

// refill brings the bucket to now; capacity may have changed by a reload.
func (b *bucket) refill(capacity int64, now int64) {
	c := float64(capacity)
	if b.last == 0 {
		b.level, b.last = c, now
		return
	}
	if now > b.last {
		b.level += float64(now-b.last) * c / 60e9
		b.last = now
	}
	if b.level > c {
		b.level = c
	}
}

// wait is the time until level reaches need.
func (b *bucket) wait(capacity int64, need float64) int64 {
	if b.level >= need {
		return 0
	}
	return waitNanos((need - b.level) * 60e9 / float64(capacity))
}

// failures is a set of codes.
type failures uint64

func (f failures) has(c Code) bool { return f&(1<<c) != 0 }

// first is the code reported for a set: the lowest (quotas before RPM,
// TPM and concurrency).
func (f failures) first() Code {
	for c := Code(0); c < numCodes; c++ {
		if f.has(c) {
			return c
		}
	}
	return CodeNone
}

// checkLocked evaluates the rules with counters (all but periods) and
// returns the failing ones and the longest known wait. Lock must be held.
func (st *userState) checkLocked(t *template, cs *calState, now int64, e estimate) (f failures, retry int64) {
	sec := now / 1e9
	if t.quota {
		for p := range numPeriods {
			w := &t.win[p]
			if !w.on {
				continue
			}
			c := &st.win[p]
			ws := cs.win[p]
			// late: a later window began already (a request that read
			// the clock after this one took the lock first); this late
			// admission counts in it, as with Redis (resetting it to
			// this one's start lost the new window's count).
			late := c.start >= ws.end
			if !late {
				if !ws.holds(c.start, sec) {
					*c = winCount{}
				}
				c.start = ws.start
			}
			hit := false
			if w.maxReq > 0 && c.req+1 > w.maxReq {
				f |= 1 << quotaRequestsCode(p)
				hit = true
			}
			if w.maxTok > 0 && c.tok+e.quota > w.maxTok {
				f |= 1 << quotaTokensCode(p)
				hit = true
			}
			if hit {
				end := ws.end
				if late {
					end = cs.later(p, c.start).end // that window's own end
				}
				retry = max(retry, end*1e9-now) // to the ns: Retry-After-Ms
			}
		}
	}
	if t.rpm > 0 {
		st.rpm.refill(t.rpm, now)
		if st.rpm.level < 1 {
			f |= 1 << CodeRPM
			retry = max(retry, st.rpm.wait(t.rpm, 1))
		}
	}
	if t.tpm > 0 {
		st.tpm.refill(t.tpm, now)
		need := float64(min(e.tpm, t.tpm))
		if st.tpm.level < need {
			f |= 1 << CodeTPM
			retry = max(retry, st.tpm.wait(t.tpm, need))
		}
	}
	if t.concLimit > 0 && st.active >= t.concLimit {
		f |= 1 << CodeConcurrencyUser
	}
	return f, retry
}

// takeLocked pre-deducts e and records what was taken in ts. Lock must be held.
func (st *userState) takeLocked(t *template, cs *calState, e estimate, ts *ticketState) {
	if t.quota {
		for p := range numPeriods {
			if !t.win[p].on {
				continue
			}
			c := &st.win[p]
			c.req++
			c.tok = addWindow(c.tok, e.quota)
			ts.win[p] = takenWin{on: true, start: c.start}
		}
		ts.quotaEst, ts.quotaPrompt = e.quota, e.quotaPrompt
	}
	if t.rpm > 0 {
		st.rpm.level--
		ts.rpm = true
	}
	if t.tpm > 0 {
		st.tpm.level -= float64(e.tpm)
		ts.tpm = true
	}
	ts.tpmEst, ts.tpmPrompt = e.tpm, e.tpmPrompt
	if t.concLimit > 0 {
		st.active++
		ts.conc = true
	}
}

// finishLocked reconciles ts with the usage (or refunds it when nothing
// was served) and returns its concurrency slot. Lock must be held.
func (st *userState) finishLocked(ts *ticketState, served bool, u Usage, now int64) {
	tpmCharge, quotaCharge := ts.charges(served, u) // what replaces the estimates
	rpm, tpm := ts.rates()
	if ts.rpm && !served && rpm > 0 {
		st.rpm.refill(rpm, now)
		st.rpm.level = min(st.rpm.level+1, float64(rpm))
	}
	if ts.tpm && tpm > 0 {
		st.tpm.refill(tpm, now)
		st.tpm.level = min(st.tpm.level-float64(tpmCharge-ts.tpmEst), float64(tpm))
	}
	for p := range numPeriods {
		w := &ts.win[p]
		if !w.on || st.win[p].start != w.start {
			continue // the window rolled: the reservation stays in the old one
		}
		if !served {
			st.win[p].req--
		}
		st.win[p].tok = addWindow(st.win[p].tok, quotaCharge-ts.quotaEst)
	}
	if ts.conc {
		st.active--
	}
}

// rates returns the RPM and TPM (0: off) of the buckets ts gives back to
// or charges at its end: its user's as the configuration stands now (a
// reload since its admission may have changed them; ending under the
// limits it was admitted under cut a bucket a reload had raised down to
// the old limit), or its admission's when its user is gone.
func (ts *ticketState) rates() (rpm, tpm int64) {
	t := ts.t
	st := ts.u.st.Load()
	if u := ts.g.snap.Load().users[st.name]; u != nil && u.st.Load() == st {
		if u.tmpl == nil {
			return 0, 0
		}
		t = u.tmpl
	}
	return t.rpm, t.tpm
}

// Admit admits a request of user u (nil: an anonymous or admin request,
// always admitted with a zero Ticket). Every enabled rule of the user's
// template is checked and the pre-deduction taken atomically: either all
// counters move or none. A request over the concurrency limit in queue
// mode waits in the user's FIFO queue until a slot frees, its queue
// timeout passes or ctx ends (the client left: it is removed at once).
// The returned Ticket must be Done once the request ends.
func (g *Governor) Admit(ctx context.Context, u *User, r Request) (Ticket, *Rejection) {
	return g.admit(ctx, u, r, nil)
}

// Admission is the answer of AdmitAcquire.
type Admission struct {
	// Refused is the user's refusal (as Admit's); nothing is held.
	Refused *Rejection
	// Queue: the request would wait in the user's queue for a concurrency
	// slot. Nothing is held: the caller gives back what it should not hold
	// while queued and calls Admit, which waits.
	Queue bool
	// Ticket is the admitted request's ticket (Refused and Queue unset).
	Ticket Ticket
	// Seat and Index are TryAcquire's answer for the request's first
	// seat, SeatRefused its refusal; the Ticket is held either way.
	Seat        Seat
	Index       int
	SeatRefused *Rejection
}

// AdmitAcquire is Admit followed by TryAcquire(targets, ph) for the
// request's first seat, without waiting. With the counters in Redis both
// run in one script: a request's admission costs one round trip. The seat
// is asked for only once the user's admission passed (or in dry run).
func (g *Governor) AdmitAcquire(u *User, r Request, targets []Target, ph Phase) Admission {
	sa := seatAsk{targets: targets, ph: ph}
	tk, rej := g.admit(context.Background(), u, r, &sa)
	switch {
	case rej != nil:
		return Admission{Refused: rej}
	case sa.queue:
		return Admission{Queue: true}
	}
	if !sa.done {
		sa.seat, sa.idx, sa.rej = g.TryAcquire(targets, ph)
	}
	return Admission{Ticket: tk, Seat: sa.seat, Index: sa.idx, SeatRefused: sa.rej}
}

// seatAsk is AdmitAcquire's seat: what to acquire, and the answer when the
// admission took it (done); queue reports an admission that would wait.
type seatAsk struct {
	targets []Target
	ph      Phase
	done    bool
	queue   bool
	seat    Seat
	idx     int
	rej     *Rejection
}

func (g *Governor) admit(ctx context.Context, u *User, r Request, sa *seatAsk) (Ticket, *Rejection) {
	if u == nil {
		return Ticket{}, nil
	}
	t := u.tmpl
	if t == nil {
		if u.m != nil {
			u.m.requests.Inc()
		}
		return Ticket{}, nil
	}
	s := g.snap.Load()
	dry := s.userDry || t.dry
	now := g.now().UnixNano()
	cs := s.cal.state(now / 1e9)
	if t.periods != nil {
		minute, wd := cs.local(now / 1e9)
		if !t.periods.has(wd, minute) {
			hit(CodeOutsidePeriod, dry)
			if !dry {
				u.rejected()
				rej := g.outsidePeriod(s.cal, t.periods, now)
				if (t.rpm > 0 || t.tpm > 0) && g.rds == nil {
					// The buckets as they stand, as other refusals tell
					// them (Redis's are not read for a refusal made here).
					st := g.state(u)
					st.mu.Lock()
					if t.rpm > 0 {
						st.rpm.refill(t.rpm, now)
					}
					if t.tpm > 0 {
						st.tpm.refill(t.tpm, now)
					}
					rej.Limits = st.limitsLocked(t)
					st.mu.Unlock()
				}
				return Ticket{}, rej
			}
		}
	}
	if !t.counted {
		if u.m != nil {
			u.m.requests.Inc()
		}
		return Ticket{}, nil
	}
	e := t.estimate(r)
	ts := g.getTicket(u, t)
	ts.at = now
	if g.rds != nil {
		return g.admitRemote(ctx, s, u, t, ts, cs, r, e, dry, now, sa)
	}
	st := g.state(u)
	st.mu.Lock()
	f, retry := st.checkLocked(t, cs, now, e)
	if t.concQueue && st.q.n > 0 {
		f |= 1 << CodeConcurrencyUser // no overtaking the queue
	}
	if f != 0 {
		if !dry && f == 1<<CodeConcurrencyUser && t.concQueue {
			if sa != nil {
				st.mu.Unlock()
				g.putTicket(ts)
				sa.queue = true
				return Ticket{}, nil
			}
			return g.queueUser(ctx, u, t, ts, r, e) // unlocks; counts it
		}
		hits(f, dry)
		if !dry {
			rej := reject(f.first(), retry, false)
			rej.Limits = st.limitsLocked(t)
			st.mu.Unlock()
			g.putTicket(ts)
			u.rejected()
			return Ticket{}, rej
		}
	}
	st.takeLocked(t, cs, e, ts)
	if !dry {
		ts.lim = st.limitsLocked(t)
	}
	st.mu.Unlock()
	return ts.handle(u), nil
}

func (g *Governor) outsidePeriod(cal *calendar, m *minuteMask, now int64) *Rejection {
	next := cal.nextAllowed(m, now/1e9)
	msg := "requests are not allowed at this time"
	retry := int64(0)
	if !next.IsZero() {
		msg += "; next allowed at " + next.Format("2006-01-02 15:04 MST") + " (" + cal.loc.String() + ")"
		retry = next.UnixNano() - now
	}
	return &Rejection{Code: CodeOutsidePeriod, Status: 403, Message: msg, RetryAfter: retrySeconds(retry), RetryAfterMS: retryMillis(retry)}
}

// queueUser waits in st's queue. st.mu is held on entry and released.
func (g *Governor) queueUser(ctx context.Context, u *User, t *template, ts *ticketState, r Request, e estimate) (Ticket, *Rejection) {
	st := u.st.Load() // made by the admission that queues
	if st.q.n >= t.concQueueSize {
		st.mu.Unlock()
		g.putTicket(ts)
		u.rejected()
		hit(CodeConcurrencyUser, false)
		return Ticket{}, reject(CodeConcurrencyUser, 0, true)
	}
	w := &waiter{ch: make(chan struct{}, 1), ts: ts, t: t, r: r, e: e, since: time.Now()}
	st.q.push(w)
	userQueued.Add(1)
	st.mu.Unlock()
	hitQueued(CodeConcurrencyUser)
	if g.rds != nil {
		g.rds.kickUser(st)
	}
	granted, timedOut := g.waitQueued(ctx, w.ch, w.since, func(s *snapshot) time.Duration { return w.timeout(s, st) })
	st.mu.Lock()
	gone := !granted && w.state == waiting
	if gone {
		st.q.remove(w)
		w.state = left // a Redis pump pass holding w gives back what it took for it
	}
	st.mu.Unlock()
	userQueued.Add(-1)
	userQueueWait.UpdateDuration(w.since)
	if gone {
		if g.rds == nil { // with Redis the queue loop may still be using ts
			g.putTicket(ts)
		}
		u.rejected()
		if timedOut {
			hit(CodeConcurrencyUser, false) // refused in the end; a client that left is not counted
		}
		return Ticket{}, reject(CodeConcurrencyUser, 0, true)
	}
	if w.state == rejected {
		if g.rds == nil {
			g.putTicket(ts)
		}
		u.rejected()
		return Ticket{}, w.rej
	}
	h := ts.handle(u)
	if !granted { // granted as the wait ended: give it back
		h.Done(Usage{})
		u.rejected()
		return Ticket{}, reject(CodeConcurrencyUser, 0, true)
	}
	return h, nil
}

// pumpLocal serves st's queue head while slots are free, under the
// user's current template. Lock must be held.
func (g *Governor) pumpLocal(st *userState) {
	if st.q.n == 0 {
		return
	}
	s := g.snap.Load()
	now := g.now().UnixNano()
	cs := s.cal.state(now / 1e9)
	for w := st.q.head; w != nil; w = st.q.head {
		if rej := s.revoked(st.name, &w.r); rej != nil {
			st.q.remove(w)
			w.state, w.rej = rejected, rej
			w.ch <- struct{}{}
			continue
		}
		if rej, t := g.outsideQueued(s, st, w, now); rej != nil {
			st.q.remove(w)
			if t.rpm > 0 {
				st.rpm.refill(t.rpm, now)
			}
			if t.tpm > 0 {
				st.tpm.refill(t.tpm, now)
			}
			rej.Limits = st.limitsLocked(t)
			w.state, w.rej = rejected, rej
			w.ch <- struct{}{}
			continue
		}
		t, e := w.current(s, st)
		if t == nil { // no rule counts any more: nothing to take
			st.q.remove(w)
			w.ts.at = now
			w.state = granted
			w.ch <- struct{}{}
			continue
		}
		dry := s.userDry || t.dry
		f, retry := st.checkLocked(t, cs, now, e)
		if f == 1<<CodeConcurrencyUser && !dry && t.concQueue {
			return
		} // (full, and overlimit is reject now: refused below)
		st.q.remove(w)
		if f != 0 && !dry {
			hits(f, false)
			w.state, w.rej = rejected, reject(f.first(), retry, false)
			w.rej.Limits = st.limitsLocked(t)
		} else {
			w.ts.t = t
			st.takeLocked(t, cs, e, w.ts)
			if !dry {
				w.ts.lim = st.limitsLocked(t)
			}
			w.ts.at = now
			w.state = granted
		}
		w.ch <- struct{}{}
	}
}

// outsideQueued is the refusal of queued request w if it were admitted at
// now, outside the allowed periods of its user's current template (its
// wait outlasted the period, or a reload restricted the periods): the
// queue head is admitted against every rule, as a new request is. It
// returns nil when allowed, or in dry run (counted), else the refusal and
// that template.
func (g *Governor) outsideQueued(s *snapshot, st *userState, w *waiter, now int64) (*Rejection, *template) {
	t := w.t
	if u := s.users[st.name]; u != nil && u.st.Load() == st {
		t = u.tmpl
	}
	if t == nil || t.periods == nil {
		return nil, nil
	}
	if minute, wd := s.cal.state(now / 1e9).local(now / 1e9); t.periods.has(wd, minute) {
		return nil, nil
	}
	dry := s.userDry || t.dry
	hit(CodeOutsidePeriod, dry)
	if dry {
		return nil, nil
	}
	return g.outsidePeriod(s.cal, t.periods, now), t
}

// revoked is the refusal of a queued request whose user a reload removed,
// disabled or no longer allows its model (nil: still allowed), as a new
// request of the user would be refused.
func (s *snapshot) revoked(name string, r *Request) *Rejection {
	u := s.users[name]
	switch {
	case u == nil:
		return rejUserGone
	case !u.enabled:
		return rejUserDisabled
	case u.models != nil && len(r.Model) > 0 && !u.AllowsModel(string(r.Model)):
		return rejModelGone
	}
	return nil
}

// Revoked is the refusal a request of u admitted earlier, for model,
// would get now as a new one (a reload removed or disabled u, or no
// longer allows it model); nil while it is still allowed. A request
// waiting for a seat asks it (AcquireUnless).
func (g *Governor) Revoked(u *User, model []byte) *Rejection {
	return g.snap.Load().revoked(u.name, &Request{Model: model})
}

// current returns the template w is served under and its estimate under
// it: its user's template in s (a reload applies to the requests already
// queued), nil when that one counts nothing (w takes nothing). When the
// user is gone from s it is the template w was queued with.
func (w *waiter) current(s *snapshot, st *userState) (*template, estimate) {
	u := s.users[st.name]
	if u == nil || u.st.Load() != st || u.tmpl == w.t {
		return w.t, w.e
	}
	t := u.tmpl
	if t == nil || !t.counted {
		return nil, estimate{}
	}
	return t, t.estimate(w.r)
}

// timeout is how long w may wait under snapshot s: its user's current
// template's queue timeout (the one it was queued under when the user is
// gone or no longer queues: the reload refuses it then).
func (w *waiter) timeout(s *snapshot, st *userState) time.Duration {
	if u := s.users[st.name]; u != nil && u.st.Load() == st && u.tmpl != nil && u.tmpl.concQueue {
		return u.tmpl.concTimeout
	}
	return w.t.concTimeout
}

func (g *Governor) userReloaded(st *userState) {
	if g.rds != nil {
		g.rds.kickUser(st)
		return
	}
	st.mu.Lock()
	g.pumpLocal(st)
	st.mu.Unlock()
}

// waiter is a request queued for a user's concurrency slot.
type waiter struct {
	prev, next *waiter
	ch         chan struct{}
	state      waitState
	rej        *Rejection
	ts         *ticketState
	t          *template // at queueing
	r          Request
	e          estimate // under t
	since      time.Time
}

type waitState uint8

const (
	waiting  waitState = iota // queued
	granted                   // served: it holds what it waited for
	rejected                  // refused by the queue loop (rej)
	// left: its request stopped waiting (client gone or queue timeout)
	// and removed it from the queue; a pump that was serving it from a
	// copy gives back what it took for it.
	left
)

// waitList is an intrusive FIFO.
type waitList struct {
	head, tail *waiter
	n          int
}

func (l *waitList) push(w *waiter) {
	w.prev, w.next = l.tail, nil
	if l.tail != nil {
		l.tail.next = w
	} else {
		l.head = w
	}
	l.tail = w
	l.n++
}

// remove unlinks w and reports whether it was in the list (removing it
// twice does nothing).
func (l *waitList) remove(w *waiter) bool {
	if w.prev == nil && l.head != w {
		return false
	}
	if w.prev != nil {
		w.prev.next = w.next
	} else {
		l.head = w.next
	}
	if w.next != nil {
		w.next.prev = w.prev
	} else {
		l.tail = w.prev
	}
	w.prev, w.next = nil, nil
	l.n--
	return true
}
