package proxy

import (
	"context"
	"errors"
	"math"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/infera/infera/config"
	"github.com/infera/infera/fleet"
	"github.com/infera/infera/govern"
	"github.com/infera/infera/sched"
	"github.com/valyala/fasthttp"
)

// Governance on the request path (docs/governance.md; the govern package
// decides, this file asks it at the right moments and maps its answers):
//
//   - authenticate (server.go): the global --api-key, or a user's key
//     (govern.Identify) once users are configured;
//   - admit (after parsing): the user's quota template, one Ticket per
//     request that covers all its attempts, ended exactly once when the
//     request state is released (refunded when nothing was served,
//     reconciled with the engine's reported usage otherwise). With the
//     counters in Redis and request rate limiting on, the admission is
//     deferred to the first seat acquisition and runs in the same script
//     (govern.AdmitAcquire): one round trip per request;
//   - acquire (each dispatch attempt): the scheduler's pick, steered away
//     from workers without a free concurrency seat (seatGate), and a seat
//     attached to the attempt's lease, so it ends when the lease does.
//
// Every wait (a user's or a seat's queue) runs on the request's
// reqContext, which the liveness watchdog cancels when the client leaves.

// maxSeatTargets bounds the candidates one seat acquisition considers: the
// scheduler's choice and up to 7 others, open ones and the least loaded
// first (with Redis, each costs 3 keys in the acquisition's one round trip).
const maxSeatTargets = 8

// govState is a request's governance state, part of the pooled reqState.
type govState struct {
	user   *govern.User // nil: the global key, or no authentication
	tk     govern.Ticket
	status int // the status committed to the client; 0 while none

	// deferred: the admission of req waits for the first seat acquisition
	// (admit); refused is the user's refusal found there.
	deferred bool
	req      govern.Request
	refused  *govern.Rejection

	ctx  reqContext
	gate seatGate
	// seat holds the seat attached to the attempt's lease (rs.lease: a
	// mixed attempt, or a PD pair's decode leg; the prefill leg's is the
	// pdDispatch's, which may outlive the request).
	seat seatHold

	targets []govern.Target
	tw      []*fleet.Worker // the worker of each target

	// lim is the user's rate limits as the admission (or its refusal)
	// left them, for the answer's headers (ratelimit.go); rlBuf is their
	// scratch space.
	lim   govern.Limits
	rlBuf []byte
}

func (gs *govState) reset() {
	gs.user, gs.tk, gs.status = nil, govern.Ticket{}, 0
	gs.deferred, gs.req, gs.refused = false, govern.Request{}, nil
	gs.lim = govern.Limits{}
	gs.ctx.reset()
	gs.gate.reset()
	gs.seat.reset()
	clear(gs.tw)
	gs.targets, gs.tw = gs.targets[:0], gs.tw[:0]
}

// admit runs user admission for rs (after parsing: the prompt estimate and
// max_tokens are known). On a refusal it answers the client and returns
// false. A request of the global key or of an open router is not limited.
//
// With the counters in Redis and request rate limiting on, the admission
// is deferred (nothing is sent yet) when the request's first step is a
// local seat acquisition, which then runs it in the same round trip
// (acquire); not when another upstream (split proxy, another region) may
// take the request first, nor when it is mirrored (a refused request must
// not be), nor when smart model selection would call its classifier first
// (a refused request must cost nothing).
func (s *Server) admit(ctx *fasthttp.RequestCtx, cfg *config.Config, rs *reqState) bool {
	u := rs.gov.user
	if u == nil {
		return true
	}
	r := &rs.sreq
	// The engine generates up to max_tokens for each choice of each prompt.
	req := govern.Request{PromptTokens: r.PromptTokens, MaxTokens: max(0, r.MaxTokens), Generations: rs.parsed.generations(),
		NoOutput: poolingKind(rs.acc.kind) || byIDKind(rs.acc.kind), Model: rs.parsed.model}
	if rs.proto.background && req.MaxTokens == 0 {
		// The engine generates a background Response where the router
		// reads no usage: it is charged its estimate for good. Without
		// max_output_tokens, its output is estimated with the user
		// template's rate.default_output_tokens, else with what the
		// engine may generate (vLLM's default max_tokens: max_model_len
		// less the prompt), else the router's default.
		req.MaxTokens = s.sched.DefaultMaxTokens
		if d := u.DefaultOutputTokens(); d > 0 {
			req.MaxTokens = int(d)
		} else if l := s.modelMaxLen(cfg, rs.parsed.model); l > 0 {
			req.MaxTokens = max(l-max(r.PromptTokens, 0), 1)
		}
	}
	if rs.acc.kind == kindCountTokens {
		// Counting tokens (passed through to the engine) runs no model:
		// it counts as a request, and costs no tokens (as at Anthropic).
		req.PromptTokens, req.NoOutput = 0, true
	}
	g := s.gov
	if g.Shared() && g.Limited() && !cfg.SplitProxy.Enabled && !s.globalOn(cfg) && !(cfg.Mirror.Enabled && s.o.Mirror != nil) &&
		!cfg.SmartModelSelection.Enabled {
		rs.gov.deferred, rs.gov.req = true, req
		return true
	}
	s.watch(ctx, rs) // a queued request whose client leaves is removed at once
	tk, rej := g.Admit(&rs.gov.ctx, u, req)
	if rej != nil {
		s.live.remove(rs)
		s.writeRejection(ctx, rs, rej)
		return false
	}
	rs.gov.tk, rs.gov.lim = tk, tk.Limits()
	return true
}

// admitNow is admit for a request that must be admitted before it asks
// the state store anything (a stored Response's retrieve or cancel whose
// id only Redis may hold: respstored.go): a deferred admission runs now,
// alone, instead of with the first acquisition's seat. ok is false when
// the request was answered.
func (s *Server) admitNow(ctx *fasthttp.RequestCtx, cfg *config.Config, rs *reqState) bool {
	return s.admit(ctx, cfg, rs) && s.admitPending(ctx, rs)
}

// admitPending runs an admitted request's deferred admission now, alone
// (admitNow; a follow-up whose previous_response_id only Redis may hold:
// previousShared). ok is false when the request was answered.
func (s *Server) admitPending(ctx *fasthttp.RequestCtx, rs *reqState) bool {
	if !rs.gov.deferred {
		return true
	}
	s.watch(ctx, rs) // a queued request whose client leaves is removed at once
	if err := s.admitDeferred(rs); err != nil {
		s.live.remove(rs)
		s.writeRejection(ctx, rs, rs.gov.refused)
		return false
	}
	return true
}

// modelMaxLen is the largest max_model_len the routable workers route may
// send model to told in their /v1/models (fleet.Worker.MaxModelLen); 0
// when none did. Those workers are found as route finds them
// (sched.Serving): by a canary rule or a model mapping (an alias, which no
// worker serves by name), else by the model served under that name, in
// another notation or by fuzzy match, else the default model. The largest,
// not the smallest: the engine may be any of them and the estimate is
// never settled, so a smaller one would leave output uncharged. The
// background Responses without an output limit ask it (admit), not the
// request path of others.
func (s *Server) modelMaxLen(cfg *config.Config, model []byte) int {
	n := 0
	for _, w := range s.sched.Serving(cfg, model, nil) {
		n = max(n, w.MaxModelLen())
	}
	return n
}

// errUserRefused is acquire's error when the request's deferred admission
// was refused (rs.gov.refused: the answer).
var errUserRefused = errors.New("the user's admission was refused")

// admitDeferred runs rs's deferred admission alone (a request that waits
// in a queue before its first seat, or whose router stopped limiting
// seats); it may wait in the user's queue.
func (s *Server) admitDeferred(rs *reqState) error {
	gs := &rs.gov
	if !gs.deferred {
		return nil
	}
	gs.deferred = false
	tk, rej := s.gov.Admit(&gs.ctx, gs.user, gs.req)
	if rej != nil {
		gs.refused = rej
		return errUserRefused
	}
	gs.tk, gs.lim = tk, tk.Limits()
	return nil
}

// committed records the status of the answer committed to the client: from
// now on the request counts as served, unless the engine did not serve it
// (a server error, or 429: it is busy), which is refunded like a request
// that failed before its first byte.
func (gs *govState) committed(status int) {
	gs.status = status
	if served(status) {
		gs.tk.FirstToken()
	}
}

func served(status int) bool { return status < 500 && status != fasthttp.StatusTooManyRequests }

// end ends the request's ticket (releaseState, exactly once per request):
// reconciled with the usage the engine reported, or, when it reported none,
// as govern documents (a served request keeps its estimate). Another error
// answer of the engine (4xx) counts the request and no tokens. A request
// with no answer is refunded, unless its client left (the liveness
// watchdog cancelled gs.ctx) after an engine was sent it (sent: the
// request's call wrote it, call.wrote): that one counts, and is charged
// its prompt (govern.Usage.Abandoned). A client leaving just before each
// answer, after the engine's prefill or a non-streamed answer's whole
// generation, escaped every limit when it was refunded.
func (gs *govState) end(u *usage, sent bool) {
	if gs.status == 0 && sent && gs.ctx.Err() != nil {
		gs.tk.Done(govern.Usage{
			PromptTokens:     u.prompt,
			CachedTokens:     u.cached,
			CompletionTokens: u.completion,
			Known:            u.known(),
			Abandoned:        true,
		})
		return
	}
	if !served(gs.status) || gs.status == 0 {
		gs.tk.Done(govern.Usage{})
		return
	}
	gs.tk.Done(govern.Usage{
		PromptTokens:     u.prompt,
		CachedTokens:     u.cached,
		CompletionTokens: u.completion,
		Known:            u.known() || gs.status >= 400,
	})
}

// acquire picks a worker for the next attempt and fills l (sched.Acquire)
// and, under request rate limiting, takes a concurrency seat on it,
// attached to l through h. Candidates without a free seat are passed over
// while another has one (seatGate); when the chosen worker has none, the
// seat is taken on another candidate and the lease moves there; when no
// candidate has one, the request is refused, or under overlimit queue
// waits (without holding the lease) for the first seat of a candidate to
// free. On error l holds nothing; a *govern.Rejection error is a refusal
// of request rate limiting (seatRefusal); errUserRefused is the refusal of
// the request's deferred admission (admit), which the first acquisition
// runs together with its seat.
func (s *Server) acquire(cfg *config.Config, rs *reqState, l *sched.Lease, h *seatHold) error {
	r := &rs.sreq
	g := s.gov
	if g == nil || !g.Limited() {
		if err := s.admitDeferred(rs); err != nil {
			return err
		}
		return s.sched.Acquire(cfg, r, rs.scratch[:0], l)
	}
	sg := &rs.gov.gate
	sg.g = g
	r.Gate = sg
	// A lease handed back below must not bind the session or record the
	// prompt: only the one kept does (Commit).
	r.Tentative = true
	defer func() { r.Gate, r.Tentative = nil, false }()
	moved := 0
	for round := 0; round < 3; round++ {
		sg.reset()
		if err := s.sched.Acquire(cfg, r, rs.scratch[:0], l); err != nil {
			return err
		}
		w := l.Worker
		ph := phaseOf(w)
		tg, tw := rs.gov.seatTargets(w)
		if r.Prefer.ID != "" && r.Prefer.Is(w) {
			// A Responses follow-up on the engine holding its previous
			// response (respaffinity.go): another engine's seat is no
			// use (it answers 404), so it takes or waits for a seat there.
			tg, tw = tg[:1], tw[:1]
			rs.gov.targets, rs.gov.tw = tg, tw
		}
		var seat govern.Seat
		var i int
		var rej *govern.Rejection
		switch {
		case g.Queues() && sg.allFull():
			rej = errAllFull // known without asking: wait at once (admitted first, below)
		case rs.gov.deferred:
			rs.gov.deferred = false
			a := g.AdmitAcquire(rs.gov.user, rs.gov.req, tg, ph)
			switch {
			case a.Refused != nil:
				l.Done(sched.OutcomeNeutral)
				rs.gov.refused = a.Refused
				return errUserRefused
			case a.Queue:
				// The user's queue: not held while waiting.
				l.Done(sched.OutcomeNeutral)
				rs.gov.deferred = true
				if err := s.admitDeferred(rs); err != nil {
					return err
				}
				continue
			}
			rs.gov.tk, rs.gov.lim = a.Ticket, a.Ticket.Limits()
			seat, i, rej = a.Seat, a.Index, a.SeatRefused
		default:
			seat, i, rej = g.TryAcquire(tg, ph)
		}
		if rej == nil && i == 0 {
			s.sched.Commit(cfg, r, &l.Decision)
			h.attach(l, seat)
			return nil
		}
		// Not held while waiting, nor when the seat is on another worker.
		l.Done(sched.OutcomeNeutral)
		// A deferred admission still pending here (every candidate full)
		// runs before the seat wait, and may wait in the user's queue.
		if err := s.admitDeferred(rs); err != nil {
			return err
		}
		if rej == errAllFull && !g.Queues() {
			// A reload switched the seats to reject, to dry run or off
			// since the gate found every candidate full: the try that
			// wait stood for decides. errAllFull is no answer: it reached
			// clients as 429 with an empty message, rate limiting off
			// (TestRequestsThatFindTheSeatsFullAreServedWhileReloadsLiftTheLimit).
			seat, i, rej = g.TryAcquire(tg, ph)
		}
		if rej != nil {
			if !g.Queues() || rej.Code == govern.CodeStateUnavailable {
				return rej
			}
			if seat, i, rej = g.AcquireUnless(&rs.gov.ctx, tg, ph, func() *govern.Rejection { return s.seatWaitStale(rs) }); rej != nil {
				switch rej.Code {
				case govern.CodeInvalidKey, govern.CodeUserDisabled, govern.CodeModelNotAllowed:
					rs.gov.refused = rej // a reload revoked the user while it waited
					return errUserRefused
				}
				if rej == govern.TargetsGone {
					// Every candidate left the fleet while it waited:
					// pick again, as a new request would, without using
					// up a round (each is a reload or discovery change;
					// three of them answered 503 no_workers, the fleet
					// serving: TestAQueuedRequestOutlivesReloadsThatMoveItsWorker).
					if moved < maxTargetsGone {
						moved++
						round--
					}
					continue
				}
				return rej
			}
		}
		// The seat is on tw[i]: lease that worker (the gate leaves only it).
		x := tw[i]
		sg.reset()
		sg.only = x
		err := s.sched.Acquire(cfg, r, rs.scratch[:0], l)
		sg.only = nil
		if err != nil {
			seat.Done()
			return err
		}
		if seatFits(l.Worker, x) {
			s.sched.Commit(cfg, r, &l.Decision)
			h.attach(l, seat)
			return nil
		}
		// x stopped being a candidate meanwhile (removed, breaker open):
		// start over.
		l.Done(sched.OutcomeNeutral)
		seat.Done()
	}
	return sched.ErrExhausted
}

// maxTargetsGone bounds how many times one request waiting for a seat
// picks again because its candidates all left the fleet (acquire).
const maxTargetsGone = 64

// seatRefused records that request rate limiting refused the request a
// local seat: the local fleet is saturated for it. Global scheduling may
// forward it to another region, the split proxy may fail over to an
// external upstream (which takes no seat); otherwise the client gets the
// refusal (answerFailed); a Responses follow-up kept on its local engine
// (pinnedLocal) is not forwarded. A request whose client left while it waited
// for a seat stops here (499).
func (s *Server) seatRefused(ctx *fasthttp.RequestCtx, cfg *config.Config, rs *reqState, res *tries, rej *govern.Rejection) {
	if rs.gov.ctx.Err() != nil {
		res.stop, res.last, res.lastW = true, fail(failCanceled, nil), nil
		return
	}
	// The refusal is what the client gets, unless a later attempt fails.
	res.seatRej, res.last, res.lastW = rej, nil, nil
	if s.globalOn(cfg) && rej.Code != govern.CodeStateUnavailable && !s.pinnedLocal(&rs.sreq) {
		countSaturated(res)
		s.forwardGlobal(ctx, cfg, rs, res)
	}
}

// errAllFull marks a seat acquisition that skips its try: the gate saw
// every candidate full and the request will wait.
var errAllFull = &govern.Rejection{Code: govern.CodeConcurrencyOverall, Status: 429}

// seatRefusal reports whether err (from acquire) is a refusal of request
// rate limiting.
// acquire returns it unwrapped; a type assertion, unlike errors.As, does
// not allocate on the scheduler's error paths.
func seatRefusal(err error) (*govern.Rejection, bool) {
	rej, ok := err.(*govern.Rejection)
	return rej, ok
}

// seatTargets returns the targets of a seat acquisition for a request the
// scheduler gave to w: w first, then up to maxSeatTargets-1 other candidates
// the gate saw, open ones first, least loaded first. The slices are rs's.
func (gs *govState) seatTargets(w *fleet.Worker) ([]govern.Target, []*fleet.Worker) {
	sg := &gs.gate
	tw := append(gs.tw[:0], w)
	for len(tw) < maxSeatTargets {
		best := -1
		for j, k := range sg.key {
			if k != taken && sg.cands[j] != w && (best < 0 || k < sg.key[best]) {
				best = j
			}
		}
		if best < 0 {
			break
		}
		tw = append(tw, sg.cands[best])
		sg.key[best] = taken
	}
	tg := gs.targets[:0]
	for _, x := range tw {
		tg = append(tg, target(x))
	}
	gs.targets, gs.tw = tg, tw
	return tg, tw
}

// seatWaitStale says why rs, queued for a seat, stops waiting
// (govern.Governor.AcquireUnless; the governor asks it as rs queues, when
// a worker leaves the fleet and at a reload): its user's refusal when a
// reload revoked the user (as a new request's), TargetsGone when every
// worker of the wait (tw) left the fleet; nil while it waits on.
func (s *Server) seatWaitStale(rs *reqState) *govern.Rejection {
	if u := rs.gov.user; u != nil {
		if rej := s.gov.Revoked(u, rs.parsed.model); rej != nil {
			return rej
		}
	}
	var v *fleet.View
	for _, w := range rs.gov.tw {
		if !w.Removed() {
			return nil
		}
		if v == nil {
			v = s.sched.Fleet.View()
		}
		if successor(v, w) != nil {
			return nil
		}
	}
	return govern.TargetsGone
}

// seatFits reports whether a seat granted on x serves a lease of w: w is
// x, or the worker a reload or the discovery put in x's place with the
// same id, engine, service and role (another model list, say), whose seat
// target and phase are x's. A request queued for a seat that only
// accepted x itself left the queue at every such reload, and after three
// was answered 503 no_workers (TestAQueuedRequestOutlivesReloadsThatReplaceItsWorker).
func seatFits(w, x *fleet.Worker) bool {
	return w == x || (w.Ref() == x.Ref() && w.Service == x.Service && w.Role == x.Role)
}

// successor returns the live worker of v that took the removed w's place
// (seatFits), or nil.
func successor(v *fleet.View, w *fleet.Worker) *fleet.Worker {
	i := sort.Search(len(v.All), func(i int) bool { return v.All[i].ID >= w.ID })
	if i < len(v.All) && v.All[i].ID == w.ID && seatFits(v.All[i], w) {
		return v.All[i]
	}
	return nil
}

func target(w *fleet.Worker) govern.Target {
	return govern.Target{Instance: w.ID, Service: w.Service}
}

// phaseOf is the part of a request a worker serves, as seats count it.
func phaseOf(w *fleet.Worker) govern.Phase {
	switch w.Role {
	case fleet.RolePrefill:
		return govern.PhasePrefill
	case fleet.RoleDecode:
		return govern.PhaseDecode
	}
	return govern.PhaseMixed
}

// seatGate is the scheduler's candidate filter (sched.Gate) under request
// rate limiting: a worker without a free seat is full. It records the
// candidates it is asked about, for the seat acquisition that follows.
// With only set it leaves only that worker open (a seat was granted there),
// or the one that replaced it (seatFits).
type seatGate struct {
	g     *govern.Governor
	only  *fleet.Worker
	cands []*fleet.Worker
	// key orders the candidates for the seat acquisition: open before
	// full, then by requests in flight; taken once chosen.
	key   []int64
	nfull int
}

const (
	fullKey = int64(1) << 61
	taken   = math.MaxInt64
)

var _ sched.Gate = (*seatGate)(nil)

// Full implements sched.Gate.
func (sg *seatGate) Full(w *fleet.Worker) bool {
	f := false
	if sg.only != nil {
		f = !seatFits(w, sg.only)
	} else {
		f = sg.g.Full(target(w), phaseOf(w))
	}
	k := min(max(w.Load.Requests.Load(), 0), fullKey-1)
	if f {
		k += fullKey
		sg.nfull++
	}
	sg.cands = append(sg.cands, w)
	sg.key = append(sg.key, k)
	return f
}

// allFull reports whether the gate saw candidates and every one was full.
func (sg *seatGate) allFull() bool { return len(sg.cands) > 0 && sg.nfull == len(sg.cands) }

func (sg *seatGate) reset() {
	clear(sg.cands)
	sg.cands, sg.key, sg.nfull, sg.only = sg.cands[:0], sg.key[:0], 0, nil
}

// seatHold is a concurrency seat attached to a lease (a sched.Seat): the
// lease tells it the first token and the end. Neither waits: with Redis,
// the seat's returns are queued to ride in the router's next round trip
// (govern), which Redis runs after them, so a client's next request never
// finds its previous request's seat or slot taken.
type seatHold struct {
	s govern.Seat
}

var _ sched.Seat = (*seatHold)(nil)

// FirstToken implements sched.Seat.
func (h *seatHold) FirstToken() { h.s.FirstToken() }

// Done implements sched.Seat.
func (h *seatHold) Done(sched.Outcome) { h.s.Done() }

// attach hangs s on l through h; if l cannot take it, s ends now.
func (h *seatHold) attach(l *sched.Lease, s govern.Seat) {
	h.s = s
	if !l.Attach(h) {
		s.Done()
	}
}

// reset clears h for the next request.
func (h *seatHold) reset() { h.s = govern.Seat{} }

// writeRejection answers a refusal of the governance: OpenAI's error shape
// with the code naming the limit, and Retry-After when a time is known. A
// request whose client left while it waited gets 499 (nobody reads it).
func (s *Server) writeRejection(ctx *fasthttp.RequestCtx, rs *reqState, rej *govern.Rejection) {
	if rs.gov.ctx.Err() != nil {
		dropClient(ctx)
		return
	}
	countStatus(rej.Status)
	if rej.Limits.Any() {
		rs.gov.lim = rej.Limits
	}
	writeError(ctx, rej.Status, rej.Type(), rej.Message, "", rej.Code.String())
	setRetryHeaders(ctx, rej)
}

// maxClientRetry is the longest wait after which the official SDKs' own
// retries are still worth it (the OpenAI SDKs honour Retry-After only up
// to 60 s).
const maxClientRetry = 60

// setRetryHeaders tells when a refused request may pass: Retry-After in
// seconds and Retry-After-Ms (the OpenAI and Anthropic SDKs read it first)
// for a wait of up to a minute; for a longer one (a quota window, an
// allowed period) Retry-After and X-Should-Retry: false, which those SDKs
// obey instead of retrying (the Anthropic SDK would otherwise sleep the
// whole wait, hours for a daily quota, before its retry).
func setRetryHeaders(ctx *fasthttp.RequestCtx, rej *govern.Rejection) {
	if rej.RetryAfter <= 0 {
		return
	}
	h := &ctx.Response.Header
	h.Set("Retry-After", strconv.Itoa(rej.RetryAfter))
	if rej.RetryAfter > maxClientRetry {
		h.Set("X-Should-Retry", "false")
		return
	}
	h.Set("Retry-After-Ms", strconv.FormatInt(rej.RetryAfterMS, 10))
}

// Saturated reports whether the local fleet cannot take r now under
// request rate limiting: no worker serving r's model has a free seat (a
// mixed worker, or a prefill and a decode worker), whether or not it could
// wait for one (overlimit queue: a member region with room takes it now; with
// none it waits here after all). Global
// scheduling asks it before dispatching locally, to forward r to another
// region instead. It answers from this router's knowledge without a round
// trip (govern.Governor.Full): with Redis it reports false, and a request
// finds out in its seat acquisition instead (a refusal, seatRefusal).
// It does not allocate.
func (s *Server) Saturated(cfg *config.Config, r *sched.Request) bool {
	g := s.gov
	// With overlimit "queue" a request could wait here for a seat; while a
	// member region has room, it is forwarded instead (when none has, it
	// waits as without global scheduling). In dry run nothing waits.
	if g == nil || !g.Limited() || g.DryRun() {
		return false
	}
	ws := s.sched.Fleet.View().ByModel[string(r.Model)]
	if len(ws) == 0 {
		return false
	}
	var mixed, prefill, decode bool
	for _, w := range ws {
		if w.Draining() || g.Full(target(w), phaseOf(w)) {
			continue
		}
		switch w.Role {
		case fleet.RolePrefill:
			prefill = true
		case fleet.RoleDecode:
			decode = true
		default:
			mixed = true
		}
	}
	return !mixed && !(prefill && decode)
}

// SeatQueueLength is the number of requests waiting for a concurrency seat
// in this router (the capacity report's "queued").
func (s *Server) SeatQueueLength() int {
	if s.gov == nil {
		return 0
	}
	return s.gov.QueueLength()
}

// reqContext is a request's context.Context for the governance's waits:
// the liveness watchdog cancels it when the client leaves. Its Done channel
// is made on first use (only a request that waits needs one), so a request
// that never waits costs nothing. It lives in the pooled reqState: reset
// between requests.
type reqContext struct {
	mu   sync.Mutex
	done chan struct{}
	err  error
}

var _ context.Context = (*reqContext)(nil)

// Deadline implements context.Context: none (the queues have their own
// timeouts).
func (c *reqContext) Deadline() (time.Time, bool) { return time.Time{}, false }

// Done implements context.Context.
func (c *reqContext) Done() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done == nil {
		c.done = make(chan struct{})
		if c.err != nil {
			close(c.done)
		}
	}
	return c.done
}

// Err implements context.Context.
func (c *reqContext) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// Value implements context.Context.
func (c *reqContext) Value(any) any { return nil }

// cancel ends the context: the client left.
func (c *reqContext) cancel() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return
	}
	c.err = context.Canceled
	if c.done != nil {
		close(c.done)
	}
}

func (c *reqContext) reset() {
	c.mu.Lock()
	c.done, c.err = nil, nil
	c.mu.Unlock()
}
