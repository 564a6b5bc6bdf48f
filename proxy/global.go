package proxy

import (
	"errors"
	"strings"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/infera/infera/config"
	"github.com/infera/infera/fleet"
	"github.com/infera/infera/sched"
	upstreams "github.com/infera/infera/upstream"
	"github.com/valyala/fasthttp"
)

// Global scheduling: when the local fleet is saturated for a request (no
// routable worker for its model, or every candidate at its concurrency
// limit), the request is forwarded to the member gateway that reports the
// most free capacity (upstream.Poller.Pick), through the same lease,
// transport and relay as any upstream, with upstream.HopHeader set. A
// request that carries the hop header is never forwarded again.

var (
	mGlobalSaturated = metrics.NewCounter(`infera_global_saturated_total`)
	mGlobalNoMember  = metrics.NewCounter(`infera_global_no_member_total`)
	mGlobalHopKept   = metrics.NewCounter(`infera_global_hop_kept_total`)
	mGlobalFailed    = metrics.NewCounter(`infera_global_forward_failed_total`)
)

// UnlimitedWorkerSlots is the concurrency a worker counts for in the
// capacity report when request rate limiting sets no limit.
const UnlimitedWorkerSlots = 256

// globalOn reports whether global scheduling may forward requests.
func (s *Server) globalOn(cfg *config.Config) bool {
	return cfg.GlobalScheduling.Enabled && s.o.Poller != nil
}

// forwardGlobal forwards a request the local fleet cannot take now to the
// member with the most free capacity for its model, trying each member at
// most once (a member that fails before the first byte as its fault is out
// for its backoff, forward_failure_backoff_ms, then tried by one request;
// one that fails otherwise is dropped until its next capacity report). It returns true when the request is settled: an
// answer was committed, or the client left. Otherwise (a forwarded request,
// no member qualifies, every member failed) the caller answers as it would
// without global scheduling; when the local fleet had no worker at all
// (res.schedErr set), the last member's failure is what the client gets.
//
// Request rate limiting calls it too, when it refuses the request a local
// seat (seatRefused). A request is forwarded at most once: later calls
// return false.
func (s *Server) forwardGlobal(ctx *fasthttp.RequestCtx, cfg *config.Config, rs *reqState, res *tries) bool {
	if res.globalTried {
		return false
	}
	res.globalTried = true
	if hasHeader(&ctx.Request.Header, upstreams.HopHeader) {
		mGlobalHopKept.Inc()
		return false
	}
	tbl := s.ext.memberTable(&cfg.GlobalScheduling)
	fr := tries{allConnect: true}
	picked := false
	// Each turn either ends the walk or drops the member it picked: at
	// most one turn per member the poller knows (the request's snapshot
	// may list fewer, a reload having added some since).
	for range s.o.Poller.Members() {
		m := s.o.Poller.Pick(rs.sreq.Model)
		if m == nil {
			break
		}
		u := s.memberUpstream(tbl, m.Name())
		if u == nil {
			// Neither this request's snapshot nor the current one has
			// it: a reload is removing it.
			m.Failed()
			continue
		}
		if !u.w.Breaker.Available(s.sched.Now()) {
			// Nothing would be sent: not a forward, nor a failed one.
			m.Failed()
			continue
		}
		ok, trial := m.Admit()
		if !ok {
			continue // another request took its trial: Pick skips it now
		}
		picked = true
		m.Forwarded()
		prev := fr.last
		m.Sending()
		ar := s.attemptExternal(ctx, cfg, rs, u, true, true, &fr)
		m.Sent(memberAnswered(ar, prev, fr.last))
		memberOutcome(m, trial, ar, prev, fr.last)
		switch ar {
		case attemptCommitted:
			res.committed = true
			return true
		case attemptStop:
			res.stop, res.last, res.lastW = true, fr.last, fr.lastW
			return true
		}
		mGlobalFailed.Inc()
	}
	if !picked {
		mGlobalNoMember.Inc()
		// A model no local worker serves that members serve, all of them
		// without room now: busy (503), not unknown (404).
		res.globalBusy = errors.Is(res.schedErr, sched.ErrUnknownModel) && s.o.Poller.Serves(rs.sreq.Model)
	}
	switch {
	case fr.last == nil:
	case res.schedErr != nil:
		// The local fleet had no worker: the members' failure is the one.
		res.last, res.lastW, res.allConnect, res.fleetDown = fr.last, fr.lastW, fr.allConnect, true
	case res.last != nil:
		// Local attempts failed first (failOverGlobal): the last failure,
		// a member's, is what the client gets (its answer, stashed over
		// the local one, names the member).
		res.last, res.lastW, res.allConnect, res.fleetDown = fr.last, fr.lastW, res.allConnect && fr.allConnect, true
	}
	return false
}

// memberOutcome tells member m how a forward to it went (ar; f the
// request's last failure, prev the one before the forward): a failure that
// is its fault (unreachable, a timeout, an invalid answer, 5xx, the
// gateway's key refused) keeps it out for its backoff
// (forward_failure_backoff_ms), whatever its polls say; an answer, a 4xx
// relayed included, is a success (its trial's readmits it); anything else
// (a 429, the router's own connection limit, its breaker taken meanwhile,
// the client gone) says nothing of it: a failed forward drops it until its
// next good poll, as before, and a trial is handed to the next request.
func memberOutcome(m *upstreams.Member, trial bool, ar attemptResult, prev, f *failure) {
	switch {
	case ar == attemptCommitted:
		m.ForwardSucceeded(trial)
		return
	case f == nil || f == prev:
		m.ForwardAbandoned(trial) // nothing was sent (AcquireExternal refused)
	case f.outcome() == sched.OutcomeFault:
		m.ForwardFailed(trial)
		return
	case f.kind == failStatus && f.status < 500 && f.status != fasthttp.StatusTooManyRequests:
		m.ForwardSucceeded(trial) // its 4xx answer, relayed
		return
	default:
		m.ForwardAbandoned(trial)
	}
	if ar == attemptFailed {
		m.Failed()
	}
}

// memberAnswered reports whether a forward got an answer from the member
// (ar; f the request's last failure, prev the one before the forward): a
// committed one, or an answer that was not relayed as one (a status the
// dispatch fails over on, a refusal of the gateway's key, an invalid
// answer). A timeout, an unreachable member, a client that left or
// nothing sent is none: the member's stall clock (upstream.Member.Sent)
// runs on.
func memberAnswered(ar attemptResult, prev, f *failure) bool {
	if ar == attemptCommitted {
		return true
	}
	if f == nil || f == prev {
		return false
	}
	return f.kind == failStatus || f.kind == failUpstreamAuth || f.kind == failProtocol
}

// forwardFirstByte returns the first-byte deadline of an attempt started
// at now on a member gateway: fb (the timeouts section's) or, when sooner,
// the forward's own bound (global_scheduling.forward_stream_first_packet_ms
// for a stream, forward_non_stream_first_byte_ms otherwise), and whether
// the forward's bound is the one. A member that answers its capacity polls
// but hangs on forwarded requests held each client for the general
// timeouts (300 s to a stream's first packet, 900 s for a non-streamed
// answer); past its own bound the forward fails as a timeout (the
// member's fault), the member is out for its backoff
// (forward_failure_backoff_ms, memberOutcome), and the request goes on as
// after any failed forward.
func forwardFirstByte(g *config.GlobalScheduling, stream bool, now, fb time.Time) (time.Time, bool) {
	ms := g.ForwardNonStreamFirstByteMS
	if stream {
		ms = g.ForwardStreamFirstPacketMS
	}
	return soonerFirstByte(ms, now, fb)
}

// soonerFirstByte returns the first-byte deadline of an attempt started at
// now: fb, or now plus ms when that is sooner (and ms positive), and
// whether the latter is the one.
func soonerFirstByte(ms float64, now, fb time.Time) (time.Time, bool) {
	if ms <= 0 {
		return fb, false
	}
	d := now.Add(time.Duration(ms * float64(time.Millisecond)))
	if fb.IsZero() || d.Before(fb) {
		return d, true
	}
	return fb, false
}

// memberUpstream returns the upstream of the member named name: tbl's (the
// request's snapshot), else the current snapshot's. The poller follows the
// current config, so a member a reload added after the request read its
// snapshot (while the classifier held it, say) is picked for it; it is
// reached as the current config has it, as a stale snapshot's members are
// (staleTable). It used to be marked failed until its next good poll,
// a healthy new member losing the requests of that window too.
func (s *Server) memberUpstream(tbl *extTable, name string) *extUpstream {
	if u := tbl.member(name); u != nil {
		return u
	}
	if cur := &s.store.Load().GlobalScheduling; tbl.src != any(cur) {
		return s.ext.memberTable(cur).member(name)
	}
	return nil
}

// pinnedLocal reports whether r is a Responses follow-up kept on the local
// engine holding its previous response (respaffinity.go): that engine is in
// the fleet, whatever its breaker's state. Another region's engines cannot
// know the id (404), so such a request is never forwarded: it waits for or
// is refused its seat there, as the local rules say, or is answered 503
// while the engine's breaker is open or on trial (sched.ErrPreferredOpen,
// sched.ErrPreferredOnTrial), 410 while it is draining
// (sched.ErrPreferredDraining). A follow-up whose engine is gone is routed
// as any request.
func (s *Server) pinnedLocal(r *sched.Request) bool {
	if r.Prefer.ID == "" {
		return false
	}
	w := s.sched.Fleet.Get(r.Prefer.ID)
	return w != nil && r.Prefer.Is(w)
}

// hasHeader reports whether the request carries header k, whatever its
// value (an empty one included).
func hasHeader(h *fasthttp.RequestHeader, k string) bool {
	return len(h.PeekAll(k)) > 0
}

// localSaturated reports whether the local fleet cannot take r now:
// Options.Saturated when set; when every worker serving r's model exactly
// has its breaker open (no rate limit needed: the capacity report counts
// them for nothing, and the request would go to a dead engine); with the
// governor's seats in process,
// Server.Saturated (govern.go: no candidate has a free seat and the request
// could not wait for one); otherwise, when rate_limit sets a concurrency
// limit, whether every routable worker serving r's model exactly is at its
// limit (free capacity 0, as the capacity endpoint computes it). With the
// seats in Redis a request also finds out in its seat acquisition, and a
// refusal forwards it then (seatRefused). Only called with global
// scheduling on; the caller counts a saturated request (countSaturated).
func (s *Server) localSaturated(cfg *config.Config, r *sched.Request) bool {
	if f := s.o.Saturated; f != nil {
		return f(cfg, r)
	}
	if s.breakersOpen(r) {
		return true
	}
	if s.gov != nil && !s.gov.Shared() {
		return s.Saturated(cfg, r)
	}
	if !cfg.RateLimit.Limited() {
		return false
	}
	v := s.sched.Fleet.View()
	ws := v.ByModel[string(r.Model)]
	return len(ws) > 0 && freeOf(&cfg.RateLimit, v, ws, s.sched.Now()) == 0
}

// countSaturated counts a request that found the local fleet saturated in
// infera_global_saturated_total, once per request: one found saturated
// before the scheduler and then refused its seat (no member took it) is
// one request.
func countSaturated(res *tries) {
	if !res.saturated {
		res.saturated = true
		mGlobalSaturated.Inc()
	}
}

// breakersOpen reports whether r's model has workers (by its exact name)
// and none that takes client requests (mixed or prefill) has a breaker
// that lets requests through.
func (s *Server) breakersOpen(r *sched.Request) bool {
	ws := s.sched.Fleet.View().ByModel[string(r.Model)]
	if len(ws) == 0 {
		return false
	}
	now := s.sched.Now()
	for _, w := range ws {
		if w.Role != fleet.RoleDecode && w.Breaker.Available(now) {
			return false
		}
	}
	return true
}

// handleCapacity answers GET upstream.CapacityPath: how much more work this
// gateway takes now (upstream.Capacity), for the other regions' pollers.
func (s *Server) handleCapacity(ctx *fasthttp.RequestCtx) {
	if !ctx.IsGet() {
		methodNotAllowed(ctx, "use GET", "GET")
		return
	}
	cfg := s.store.Load()
	v := s.sched.Fleet.View()
	c := capacityOf(cfg, v, s.sched.Now(), s.sched.DefaultModelWorkers(cfg, v))
	if s.o.QueueLength != nil {
		c.Queued = max(0, s.o.QueueLength())
	} else {
		c.Queued = s.SeatQueueLength()
	}
	ctx.SetContentType("application/json")
	ctx.SetBody(c.AppendJSON(make([]byte, 0, 256)))
}

// capacityOf is the capacity report of fleet view v under cfg at now (unix
// ns). Free counts the workers that take client requests (mixed and
// prefill) whose breaker lets requests through; models are the served
// models, and the names model routing, canary rules and smart model
// selection accept (wildcards included; a default model accepts any name:
// "*", with dflt, the default model's workers as model routing finds
// them).
func capacityOf(cfg *config.Config, v *fleet.View, now int64, dflt []*fleet.Worker) upstreams.Capacity {
	rl := &cfg.RateLimit
	c := upstreams.Capacity{Workers: len(v.Routable), Models: []upstreams.ModelCapacity{}}
	for _, w := range v.Routable {
		c.Inflight += int(w.Load.Requests.Load())
	}
	c.Free = freeOf(rl, v, v.Routable, now)
	add := func(name string, ws []*fleet.Worker) {
		if name == "" || len(ws) == 0 || listed(c.Models, name) {
			return
		}
		c.Models = append(c.Models, upstreams.ModelCapacity{Name: name, Free: freeOf(rl, v, ws, now)})
	}
	for _, m := range v.Models {
		add(m, v.ByModel[m])
	}
	byServices := func(svcs []string) []*fleet.Worker {
		var ws []*fleet.Worker
		for _, svc := range svcs {
			ws = append(ws, v.ByService[svc]...)
		}
		return ws
	}
	if mr := &cfg.ModelRouting; mr.Enabled {
		for _, m := range mr.Mappings {
			add(m.Pattern, byServices(m.Services))
		}
		if mr.DefaultModel != "" {
			add("*", dflt)
		}
	}
	if cfg.Canary.Enabled {
		for _, r := range cfg.Canary.Rules {
			svcs := make([]string, 0, len(r.Targets))
			for _, t := range r.Targets {
				if t.Weight > 0 {
					svcs = append(svcs, t.Service)
				}
			}
			add(strings.TrimSpace(r.Model), byServices(svcs)) // the name the rule matches
		}
	}
	if sm := &cfg.SmartModelSelection; sm.Enabled {
		// A name smart model selection takes is served as its tier's
		// model, known only once the classifier answered: its room is the
		// least among the tiers' models listed above. A tier whose model
		// the split proxy sends to an external upstream has no room to
		// count here; a tier served neither way leaves the names out (a
		// request forwarded here, classified into it, could go nowhere:
		// a forwarded request is not forwarded again). Every name is
		// taken when match_models is empty.
		free, all := -1, true
		for _, t := range [...]string{sm.Tiers.L1, sm.Tiers.L2, sm.Tiers.L3} {
			switch f := c.FreeFor([]byte(t)); {
			case f >= 0:
				if free < 0 || f < free {
					free = f
				}
			case !splitExternal(&cfg.SplitProxy, t):
				all = false
			}
		}
		names := sm.MatchModels
		if len(names) == 0 {
			names = []string{"*"}
		}
		for _, name := range names {
			if all && free >= 0 && !listed(c.Models, name) {
				c.Models = append(c.Models, upstreams.ModelCapacity{Name: name, Free: free})
			}
		}
	}
	return c
}

// splitExternal reports whether the split proxy sends a request for model
// to an external upstream first.
func splitExternal(sp *config.SplitProxy, model string) bool {
	if !sp.Enabled {
		return false
	}
	var buf [8]int
	p := upstreams.Plan(buf[:0], sp, []byte(model), 0)
	return len(p) > 0 && !sp.Proxies[p[0]].Local
}

// listed reports whether models holds name (ASCII case ignored).
func listed(models []upstreams.ModelCapacity, name string) bool {
	for i := range models {
		if strings.EqualFold(models[i].Name, name) {
			return true
		}
	}
	return false
}

// freeOf is the free capacity of workers ws (a subset of v.Routable):
// requests they would start now without queueing under request rate
// limiting rl. Per instance: the sum of (limit - in flight) over the
// workers; per service: the same per service, its workers sharing one
// limit; per gateway: one limit for the whole fleet. The limit is
// overall_concurrency (in flight: requests not finished), else
// prefill_concurrency (in flight: requests before their first token), else
// UnlimitedWorkerSlots per worker. Decode workers and workers whose breaker
// is open count for nothing; negative terms count as 0.
func freeOf(rl *config.RateLimit, v *fleet.View, ws []*fleet.Worker, now int64) int {
	limit, prefill := int64(rl.OverallConcurrency), false
	if limit <= 0 && rl.PrefillConcurrency > 0 {
		limit, prefill = int64(rl.PrefillConcurrency), true
	}
	inflight := func(w *fleet.Worker) int64 {
		if prefill {
			return w.Load.Pending.Load()
		}
		return w.Load.Requests.Load()
	}
	usable := func(w *fleet.Worker) bool {
		return w.Role != fleet.RoleDecode && w.Breaker.Available(now)
	}
	var free int64
	switch {
	case limit <= 0:
		for _, w := range ws {
			if usable(w) {
				free += max(0, UnlimitedWorkerSlots-w.Load.Requests.Load())
			}
		}
	case rl.Scope == config.ScopeGateway:
		any := false
		for _, w := range ws {
			any = any || usable(w)
		}
		if any {
			var used int64
			for _, w := range v.Routable {
				if w.Role != fleet.RoleDecode {
					used += inflight(w)
				}
			}
			free = max(0, limit-used)
		}
	case rl.Scope == config.ScopeService:
		for i, w := range ws {
			if !usable(w) || seenService(ws[:i], w.Service, now) {
				continue
			}
			var used int64
			for _, sw := range v.ByService[w.Service] {
				if sw.Role != fleet.RoleDecode {
					used += inflight(sw)
				}
			}
			free += max(0, limit-used)
		}
	default: // instance
		for _, w := range ws {
			if usable(w) {
				free += max(0, limit-inflight(w))
			}
		}
	}
	return int(min(free, 1<<31-1))
}

// seenService reports whether a usable worker of svc is among ws.
func seenService(ws []*fleet.Worker, svc string, now int64) bool {
	for _, w := range ws {
		if w.Service == svc && w.Role != fleet.RoleDecode && w.Breaker.Available(now) {
			return true
		}
	}
	return false
}
