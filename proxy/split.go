package proxy

import (
	"bytes"
	"errors"
	"slices"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/infera/infera/config"
	"github.com/infera/infera/fleet"
	"github.com/infera/infera/sched"
	upstreams "github.com/infera/infera/upstream"
	"github.com/valyala/fasthttp"
)

var (
	mSplitFailovers = metrics.NewCounter(`infera_split_proxy_failovers_total`)
	// An external entry skipped: its breaker open within its cooldown, or
	// half-open with its one probe already in flight.
	mSplitUnavailableOpen  = metrics.NewCounter(`infera_split_proxy_unavailable_total{reason="breaker_open"}`)
	mSplitUnavailableTrial = metrics.NewCounter(`infera_split_proxy_unavailable_total{reason="probe_in_flight"}`)
	// An external entry skipped: out after a first-byte timeout
	// (split_proxy.timeout_backoff_ms), or its one trial in flight.
	mSplitUnavailableBackoff = metrics.NewCounter(`infera_split_proxy_unavailable_total{reason="timeout_backoff"}`)
)

// externalFirstByte returns the first-byte deadline of an attempt on an
// external upstream of kind k started at now, fb being the timeouts
// section's (timeouts.stream_first_packet_s for a stream, the request's
// total otherwise), and whether the upstream's own bound is the one: a
// member's (forwardFirstByte), or for a split entry's non-streamed answer
// split_proxy.non_stream_first_byte_ms. Bounded only by
// timeouts.non_stream_total_s, a hung entry held each non-streamed request
// 900 s, and its expiry was the request's own deadline (no failover, not
// the entry's fault: its breaker never counted it).
func externalFirstByte(cfg *config.Config, k extKind, stream bool, now, fb time.Time) (time.Time, bool) {
	if k == extMember {
		return forwardFirstByte(&cfg.GlobalScheduling, stream, now, fb)
	}
	if stream {
		return fb, false
	}
	return soonerFirstByte(cfg.SplitProxy.NonStreamFirstByteMS, now, fb)
}

// splitBackoff returns the timeout backoff settings of sp.
func splitBackoff(sp *config.SplitProxy) (base, max time.Duration) {
	return msDuration(sp.TimeoutBackoffMS), msDuration(sp.TimeoutMaxBackoffMS)
}

func msDuration(v float64) time.Duration { return time.Duration(v * float64(time.Millisecond)) }

// entryDown reports whether external entry u is left out at now (unix
// ns): its breaker open (within its cooldown, or its probe in flight), or
// out after a first-byte timeout (its backoff not over, or its trial in
// flight).
func entryDown(sp *config.SplitProxy, u *extUpstream, now int64) bool {
	base, max := splitBackoff(sp)
	return !u.w.Breaker.Available(now) || !u.out.Ready(now, base, max)
}

// splitOutcome tells external entry u's timeout backoff how an attempt on
// it went (ar; f the request's last failure, prev the one before the
// attempt): a first-byte timeout puts it out for
// split_proxy.timeout_backoff_ms from now (unix ns), and so does any fault of its trial (a
// failed trial doubles the backoff); an answer (a 4xx relayed included)
// ends its trial; anything else (nothing sent, the client gone, a 429)
// hands the trial to the next request.
func splitOutcome(sp *config.SplitProxy, u *extUpstream, now int64, trial bool, ar attemptResult, prev, f *failure) {
	switch {
	case ar == attemptCommitted:
		u.out.Succeeded(trial)
	case f == nil || f == prev:
		u.out.Abandon(trial)
	case f.kind == failTimeout || trial && f.outcome() == sched.OutcomeFault:
		base, _ := splitBackoff(sp)
		if u.out.Failed(now, trial, base) {
			upstreamLog.Warn("split proxy: external entry left out after a timeout", "proxy", u.name, "backoff_ms", sp.TimeoutBackoffMS)
		}
	case f.kind == failStatus && f.status < 500 && f.status != 429:
		u.out.Succeeded(trial)
	default:
		u.out.Abandon(trial)
	}
}

// dispatchSplit tries the split proxy's plan for the request
// (upstream.Plan): the primary entry (by weight, or by model rules), then
// the failover-flagged external entries in list order, moving on when an
// entry is unavailable (disabled upstream, breaker open) or fails before
// the first response byte. The local entry is the local fleet, with its own
// retries across workers and global scheduling; an external entry is one
// attempt through httpTransport, and takes no request rate limiting seat
// (external upstreams follow their own limits). A request that arrived
// forwarded upstream.MaxForwards times tries the local entries only; a
// Responses follow-up whose previous response a local engine holds, the
// first enabled local entry alone; one whose previous response an
// external entry made, that entry alone.
func (s *Server) dispatchSplit(ctx *fasthttp.RequestCtx, cfg *config.Config, rs *reqState, res *tries) {
	sp := &cfg.SplitProxy
	tbl := s.ext.splitTable(sp)
	bound := -1
	if i := activeLocal(sp); i >= 0 && s.pinnedLocal(&rs.sreq) {
		// A Responses follow-up whose previous response a local engine
		// holds (respaffinity.go) goes to the local fleet alone, whatever
		// the weights or rules: an external upstream cannot know the id
		// and would answer 404, hiding the local engine's own answer, as
		// global scheduling never forwards it (pinnedLocal). Split by the
		// weights, every other follow-up got an external entry's 404.
		rs.ext.plan = append(rs.ext.plan[:0], i)
	} else if i := heldExternal(sp, tbl, rs.sreq.Prefer); i >= 0 {
		// A follow-up of a response an external entry made goes back
		// to that entry alone: no other upstream knows the id. Split by
		// the weights, every other one reached the local engines and
		// got their 404.
		rs.ext.plan = append(rs.ext.plan[:0], i)
	} else if sp.Strategy != config.SplitPrefix {
		// A session keeps the entry it started on: only new sessions and
		// requests without one take the splitter's next turn, so the
		// weights split sessions, not turns (as a canary rule does).
		if bound = s.splitBound(cfg, sp, tbl, rs); bound >= 0 {
			rs.ext.plan = upstreams.PlanFrom(rs.ext.plan[:0], sp, bound)
		} else {
			// An external entry whose breaker is open is left out of the
			// draw (its share goes to the others): drawn, with no
			// failover entry (the local one cannot be), its share was
			// answered 503 while the others had room.
			// So is one out after a first-byte timeout (entryDown).
			var down uint64
			now := s.sched.Now()
			for i, u := range tbl.ups {
				if i < 64 && u != nil && entryDown(sp, u, now) {
					down |= 1 << i
				}
			}
			rs.ext.plan = upstreams.PlanDrawn(rs.ext.plan[:0], sp, s.splitter.Next(), down)
		}
	} else {
		rs.ext.plan = upstreams.Plan(rs.ext.plan[:0], sp, rs.sreq.Model, 0)
	}
	if upstreams.Forwards(&ctx.Request.Header) >= upstreams.MaxForwards {
		// Forwarded through as many gateways as a chain may have: a split
		// proxy entry leads back here. Only the local entries are tried.
		rs.ext.plan = slices.DeleteFunc(rs.ext.plan, func(i int) bool { return !sp.Proxies[i].Local })
	}
	plan := rs.ext.plan
	gone, local := false, false
	for i, idx := range plan {
		if i > 0 {
			mSplitFailovers.Inc()
		}
		more := i < len(plan)-1
		u := tbl.ups[idx]
		if sp.Proxies[idx].Local {
			local = true
			s.dispatchLocal(ctx, cfg, rs, res, more)
			if w := res.refuser(); w != nil && w.Idx >= 0 {
				// The local worker of the last attempt refused the
				// session (a 429 opens no breaker), its answer kept
				// aside or relayed (no retry left): if the session is
				// bound to it (its own worker, or the one the scheduler
				// just gave it), the binding is dropped and its next
				// request is split again, as for an external entry. A
				// refusal by another worker (a soft-mode overflow turn,
				// a prefill leg, a member region) leaves the binding to
				// the worker that holds the session's cache alone.
				s.sched.UnbindSession(cfg, &rs.sreq, w)
			}
			if res.committed || res.stop || res.schedErr != nil && !noWorker(res.schedErr) {
				return
			}
			continue
		}
		if u == nil {
			// Gone from the config in force: a reload removed the entry,
			// or turned the split proxy off, after this request read its
			// config (while the classifier answered, say). An address
			// config validation refused never gets here.
			gone = true
			continue
		}
		ar := s.attemptExternal(ctx, cfg, rs, u, false, more, res)
		if ar != attemptCommitted && idx == bound && res.last != nil && res.lastW == u.w && res.last.refusal() {
			// The entry the session is bound to refused it (429, 5xx,
			// unreachable, ...): its next request is split again. Held
			// there, a session whose entry kept answering 429 (which
			// never opens its breaker) failed on every turn. An entry
			// that was not tried (its breaker's probe slot taken) left
			// an earlier failure in res.last: not its refusal.
			s.sched.UnbindSession(cfg, &rs.sreq, u.w)
		}
		switch ar {
		case attemptCommitted:
			if sp.Strategy != config.SplitPrefix && idx != bound {
				s.sched.BindSession(cfg, &rs.sreq, u.w)
			}
			return
		case attemptStop:
			return
		}
	}
	if gone && !local && !res.stop && localTakes(&s.store.Load().SplitProxy) {
		// The local fleet is where the config in force sends what the
		// removed entries had: such a request was answered 503
		// no_upstreams, the local engines idle
		// (TestARequestRoutedToASplitEntryAReloadRemovedIsServedLocally).
		s.dispatchLocal(ctx, cfg, rs, res, false)
		return
	}
	res.fleetDown = true // every entry of the plan was tried
}

// localTakes reports whether the local fleet takes traffic under sp: the
// split proxy is off, or one of its local entries is enabled.
func localTakes(sp *config.SplitProxy) bool { return !sp.Enabled || activeLocal(sp) >= 0 }

// activeLocal returns the index of sp's first enabled local entry, or -1.
func activeLocal(sp *config.SplitProxy) int {
	for i := range sp.Proxies {
		if p := &sp.Proxies[i]; p.Local && p.Active() {
			return i
		}
	}
	return -1
}

// heldExternal returns the index of the enabled external entry whose
// upstream is ref, the one that made the response a follow-up's
// previous_response_id names or a retrieve or cancel is for
// (respaffinity.go learns split entries' answers too), or -1.
func heldExternal(sp *config.SplitProxy, tbl *extTable, ref fleet.Ref) int {
	if ref.ID == "" {
		return -1
	}
	for i := range sp.Proxies {
		if p := &sp.Proxies[i]; !p.Local && p.Active() && i < len(tbl.ups) && tbl.ups[i] != nil && ref.Is(tbl.ups[i].w) {
			return i
		}
	}
	return -1
}

// splitBound returns the weight strategy's entry that rs's session is
// bound to (session affinity on), or -1: the local entry when the session
// is bound to a worker of the fleet, the external entry whose upstream
// served it last otherwise. An entry that is disabled, weighs 0 (a reload
// moves its sessions to the others) or whose breaker is open, or a fleet
// worker that left or whose breaker is open, lets the weights decide, and
// the session is bound where it is served then.
func (s *Server) splitBound(cfg *config.Config, sp *config.SplitProxy, tbl *extTable, rs *reqState) int {
	w := s.sched.BoundWorker(cfg, &rs.sreq)
	if w == nil {
		return -1
	}
	for i := range sp.Proxies {
		p := &sp.Proxies[i]
		if !p.Active() || p.Weight <= 0 {
			continue
		}
		if p.Local {
			if w.Idx < 0 {
				continue
			}
			// A fleet worker that left (removed, replaced, draining) or
			// whose breaker is open no longer holds the session's cache:
			// the weights decide, as for an external entry. Held on the
			// local entry, the session was refused there on every turn
			// once no local worker served its model.
			if w.Removed() || w.Draining() || !w.Breaker.Available(s.sched.Now()) {
				return -1
			}
			return i
		}
		// An external entry's worker is standalone (Idx < 0): a fleet
		// worker whose id happens to be "split:<name>" is the local
		// entry's, not that entry's.
		if u := tbl.ups[i]; u != nil && w.Idx < 0 && u.w.ID == w.ID {
			if entryDown(sp, u, s.sched.Now()) {
				return -1
			}
			return i
		}
	}
	return -1
}

// attemptExternal sends one attempt to an external upstream: a lease on its
// standalone worker (refused while its breaker is open), the request path
// under its base URL (the client's query is dropped), the header block of
// upstream.AppendHeaders (its key, never the client's credentials; the hop
// header when forwarding to a member gateway), our HTTP/1.1 transport. The
// query of a stored Response's retrieve is kept.
// An unavailable upstream returns attemptFailed without a failure.
func (s *Server) attemptExternal(ctx *fasthttp.RequestCtx, cfg *config.Config, rs *reqState, u *extUpstream, hop, mayRetry bool, res *tries) attemptResult {
	if u.kind != extSplit {
		return s.attemptExternalOnce(ctx, cfg, rs, u, hop, mayRetry, res)
	}
	// A split entry out after a first-byte timeout is skipped until its
	// backoff is over; then this request may be its trial.
	base, max := splitBackoff(&cfg.SplitProxy)
	ok, trial := u.out.Admit(s.sched.Now(), base, max)
	if !ok {
		mSplitUnavailableBackoff.Inc()
		return attemptFailed
	}
	prev := res.last
	ar := s.attemptExternalOnce(ctx, cfg, rs, u, hop, mayRetry, res)
	splitOutcome(&cfg.SplitProxy, u, s.sched.Now(), trial, ar, prev, res.last)
	return ar
}

// attemptExternalOnce is attemptExternal past the split entry's backoff.
func (s *Server) attemptExternalOnce(ctx *fasthttp.RequestCtx, cfg *config.Config, rs *reqState, u *extUpstream, hop, mayRetry bool, res *tries) attemptResult {
	if ok, onTrial := rs.lease.AcquireExternal(u.w, s.sched.Now); !ok {
		if u.kind == extSplit {
			if onTrial {
				mSplitUnavailableTrial.Inc()
			} else {
				mSplitUnavailableOpen.Inc()
			}
		}
		return attemptFailed
	}
	if res.last != nil {
		// An attempt that follows a failed one (the local fleet's, another
		// entry's): a retry, as across workers.
		mRetries.Inc()
		rs.acc.retries++
		if s.debug {
			logDebugRetry(rs, "", res.lastW, res.last, u.label) // debuglog.go
		}
	}
	c := &rs.call
	rs.ext.cur = u
	path := rs.path
	if i := bytes.IndexByte(path, '?'); i >= 0 && !byIDKind(rs.acc.kind) {
		// The client's query is dropped, but a retrieve's (stream,
		// starting_after: cleaned in handleResponseByID), which the
		// entry's API reads as a local engine does.
		path = path[:i]
	}
	rs.ext.path = u.ep.AppendPath(rs.ext.path[:0], path)
	extra := ""
	if cfg.SessionAffinity.Enabled {
		// A member region or another gateway behind the split proxy keeps
		// the session's affinity (the header is the client's session id,
		// no credential).
		extra = cfg.SessionAffinity.Header
	}
	rs.ext.hdr = upstreams.AppendHeaders(rs.ext.hdr[:0], &ctx.Request.Header, u.key, hop, rs.proto.mode == protoConvert, extra, rs.reqID)
	c.path, c.hdr = rs.ext.path, rs.ext.hdr
	return s.attempt(ctx, cfg, rs, httpTransport{}, mayRetry, res)
}

// noWorker reports the scheduler errors that mean the local fleet has no
// worker for the request (as opposed to a client error): the split proxy
// fails over and global scheduling forwards on them.
func noWorker(err error) bool {
	return errors.Is(err, sched.ErrNoWorkers) || errors.Is(err, sched.ErrUnknownModel) || errors.Is(err, sched.ErrExhausted)
}
