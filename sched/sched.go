package sched

import (
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/infera/infera/config"
	"github.com/infera/infera/fleet"
	"github.com/infera/infera/internal/memlimit"
)

// Request is what the scheduler knows about one request. The proxy fills it
// from the parsed body; byte slices alias request memory that is only valid
// until the request handler returns. Reuse Requests (Reset) to keep Pick
// allocation-free: the prefix index keeps its block hashes in r.
type Request struct {
	Model     []byte
	Stream    bool
	MaxTokens int
	// PromptTokens is the prompt length estimate in tokens.
	PromptTokens int
	// Prompts is how many prompts the body batches (a completion prompt
	// that is a list; 1, or 0 when unknown, otherwise). A vLLM
	// prefill/decode pair does not take a batch (Topology).
	Prompts int
	// Prompt is the prompt text (completion prompt, or chat message contents
	// concatenated) used for prefix matching.
	Prompt []byte
	// SessionID is the value of the header named by
	// config.SessionAffinity.Header, if any.
	SessionID []byte
	// DirectWorker and DirectPrefill are x-worker-instance-id and
	// x-prefill-instance-id (router mode direct): DirectWorker names the
	// mixed or decode worker, DirectPrefill the prefill worker.
	DirectWorker  []byte
	DirectPrefill []byte
	// Prefer is the engine r goes to when its worker is an available
	// candidate, before any layer (a Responses follow-up to the engine
	// that stored its previous response, also after a reload replaced its
	// worker with the same id and address); the zero Ref for none. A
	// candidate the Gate finds full is taken still (the caller waits for
	// it); one whose breaker is half-open with its trial slot taken makes
	// Pick fail with ErrPreferredOnTrial, one whose breaker is open (its
	// cooldown not over) with ErrPreferredOpen, one draining with
	// ErrPreferredDraining; when it is not a candidate (removed, tried),
	// the layers decide.
	Prefer fleet.Ref
	// Leg is the part of the request the next Acquire picks a worker for
	// (pd.go): the whole request (LegMixed, the zero value), or a PD pair's
	// prefill or decode leg (set with SetLeg).
	Leg Leg
	// BlockHashes are the router's block hashes of the prompt tokens
	// (kv-aware routing); nil when unknown.
	BlockHashes []uint64
	// LoadOnly routes r by session affinity and load alone: no kv layer,
	// no prefix index (neither matched nor recorded). Embeddings take it:
	// an embedding model reuses no prefix cache.
	LoadOnly bool
	// Tried lists Worker.Idx values already tried by this request (failover).
	Tried []int
	// Gate, when set, lets Pick pass over candidates that cannot take the
	// request now (gate.go); Reset clears it.
	Gate Gate
	// Tentative makes Pick leave the session binding and the prefix index
	// record of its decision to Commit: the caller may hand the lease back
	// unused (request rate limiting's seat wait), and only the attempt
	// that is dispatched may bind the session and claim the prompt. Reset
	// clears it.
	Tentative bool

	// phash holds the chained hashes of the prompt's full blocks (prefix
	// index); its capacity is kept by Reset.
	phash []uint64
	// hashed is set once the prompt went through the prefix index; pdepth
	// is how many leading blocks were indexed then.
	hashed bool
	pdepth int
	// pidx is the index the prompt was matched against; forgot counts the
	// Tried workers taken off it again (Pick).
	pidx   *prefixIndex
	forgot int
	// psnap holds the workers of the pdepth matched blocks as the match saw
	// them (prefix layer, record); its capacity is kept by Reset.
	psnap []pslots
	// pd is the request's PD routing (pd.go), set by Topology.
	pd pdRoute
	// counted: a decision of the request is in
	// infera_route_decisions_total (one per request, retries aside).
	counted bool
	// gated holds Pick's candidates before the gate passed over the full
	// ones (nil: no gate): a session's bound worker that is only full
	// keeps its binding (affinityLookup).
	gated []*fleet.Worker
	// canary is the canary rule that gave r a turn, and cturn that turn
	// plus one (canaryService): r's later picks (after a seat wait, a
	// retry) keep it, so a request takes one turn of the split.
	canary *canaryRule
	cturn  int
}

// keepBlocks bounds the per-block buffers (prefix hashes and snapshots) a
// reset Request keeps: a burst of huge prompts must not pin memory in a
// pool of requests.
const keepBlocks = 1024

// Reset clears r for reuse, keeping capacity (up to keepBlocks blocks for
// the prefix buffers). r is zeroed in place and its buffers put back: a
// composite literal naming them would be built on the stack and copied
// over r, twice the work (TestRequestResetClearsEveryField).
func (r *Request) Reset() {
	tried, hashes, ph, ps, cands := r.Tried[:0], r.BlockHashes[:0], r.phash[:0], r.psnap[:0], r.pd.emptied()
	if cap(ph) > keepBlocks {
		ph = nil
	}
	if cap(ps) > keepBlocks {
		ps = nil
	}
	*r = Request{}
	r.Tried, r.BlockHashes, r.phash, r.psnap, r.pd.cands = tried, hashes, ph, ps, cands
}

func (r *Request) tried(w *fleet.Worker) bool {
	for _, i := range r.Tried {
		if i == w.Idx {
			return true
		}
	}
	return false
}

// PrefillTokens is the prefill work r puts on d.Worker: the prompt tokens
// not covered by the cache hit the decision counted on (Ratio). Load
// accounting uses it for Worker.Acquire/FirstToken/Release, so a worker busy
// prefilling mostly cached prompts does not look as loaded as one computing
// them from scratch.
func (d *Decision) PrefillTokens(r *Request) int64 {
	p := int64(r.PromptTokens)
	if d.Ratio > 0 && d.Ratio <= 1 {
		p -= int64(d.Ratio * float64(p))
	}
	return p
}

// Decision is the scheduler's answer.
type Decision struct {
	Worker *fleet.Worker
	// Probe is true when this request is the worker's half-open breaker probe.
	Probe bool
	// Layer names what chose the worker.
	Layer Layer
	// Reason says why: the hit for the choosing layer, or for lb/fallback
	// what made the earlier layers pass.
	Reason Reason
	// Ratio is the prefix hit ratio (matched bytes / prompt bytes) of the
	// chosen worker when Layer is prefix.
	Ratio float64
	// Model is the model name the chosen worker serves for this request. It
	// differs from Request.Model when routing resolved an alias (fuzzy match,
	// default model, mapping or canary): see Rewrite.
	Model string
	// Rewrite is true when the proxy should replace the body's model field
	// with Model before forwarding (the engine does not know the requested
	// name).
	Rewrite bool
	// Service is the canary service chosen, if a canary rule matched.
	Service string
	// Leg is the part of the request the worker serves (a lease's leg: the
	// governance seats attached to it count the leg's phase).
	Leg Leg

	// rebind tells finish to (re)bind the session to Worker.
	rebind bool
}

// AppendRoute appends a compact description of d for a debug header, e.g.
// "layer=prefix; reason=prefix-hit; ratio=0.83".
func (d *Decision) AppendRoute(dst []byte) []byte {
	dst = append(dst, "layer="...)
	dst = append(dst, d.Layer.String()...)
	if d.Reason != ReasonNone {
		dst = append(dst, "; reason="...)
		dst = append(dst, d.Reason.String()...)
	}
	if d.Layer == LayerPrefix {
		dst = append(dst, "; ratio="...)
		dst = appendRatio(dst, d.Ratio)
	}
	if d.Service != "" {
		dst = append(dst, "; service="...)
		dst = append(dst, d.Service...)
	}
	return dst
}

// appendRatio appends x in [0,1] with two decimals.
func appendRatio(dst []byte, x float64) []byte {
	if x < 0 {
		x = 0
	}
	if x > 1 {
		x = 1
	}
	n := int(x*100 + 0.5)
	return append(dst, byte('0'+n/100), '.', byte('0'+n/10%10), byte('0'+n%10))
}

// Errors returned by Pick. Proxy mapping: ErrSessionRequired -> 400,
// ErrUnknownModel (an *UnknownModelError) -> 404, ErrNoWorkers,
// ErrExhausted, ErrPreferredOnTrial and ErrPreferredOpen -> 503,
// ErrPreferredDraining -> 410.
var (
	ErrNoWorkers       = errors.New("no workers available")
	ErrUnknownModel    = errors.New("model not served by any worker")
	ErrExhausted       = errors.New("all candidate workers were tried")
	ErrSessionRequired = errors.New("session id header is required")
	// ErrPreferredOnTrial: the engine Request.Prefer names is half-open
	// and another request holds its one trial slot. Only that engine holds
	// what the request names, so it is not sent elsewhere.
	ErrPreferredOnTrial = errors.New("the preferred worker's breaker is half-open and its trial request is in flight")
	// ErrPreferredOpen: the engine Request.Prefer names has its breaker
	// open, the cooldown not over (fleet.Breaker.OpenUntil). Not sent
	// elsewhere either, for the same reason.
	ErrPreferredOpen = errors.New("the preferred worker's breaker is open")
	// ErrPreferredDraining: the engine Request.Prefer names is draining
	// (its record says DRAINING: it finishes its in-flight requests, takes
	// no new one, and leaves the fleet). Only that engine holds what the
	// request names, so it is not sent elsewhere (another engine can only
	// answer 404), nor to it.
	ErrPreferredDraining = errors.New("the preferred worker is draining")
)

// UnknownModelError is returned when no worker may serve the requested
// model. errors.Is(err, ErrUnknownModel) matches it.
type UnknownModelError struct {
	Model string
	// Close lists model names a client may ask for that resemble Model,
	// closest first (at most 5).
	Close []string
}

func (e *UnknownModelError) Error() string {
	if len(e.Close) == 0 {
		return fmt.Sprintf("model %q not served by any worker", e.Model)
	}
	return fmt.Sprintf("model %q not served by any worker; did you mean %s?", e.Model, strings.Join(e.Close, ", "))
}

// Is makes errors.Is(err, ErrUnknownModel) true.
func (e *UnknownModelError) Is(target error) bool { return target == ErrUnknownModel }

// Suggestions returns the close names (the proxy lists them in the 404).
func (e *UnknownModelError) Suggestions() []string { return e.Close }

// HTTPStatus is 404.
func (e *UnknownModelError) HTTPStatus() int { return 404 }

// SessionRequiredError is returned when session_affinity.require_session_id
// is on and the request lacks the header. errors.Is(err,
// ErrSessionRequired) matches it; the proxy answers 400.
type SessionRequiredError struct{ Header string }

func (e *SessionRequiredError) Error() string {
	return fmt.Sprintf("%s: send the %s header", ErrSessionRequired, e.Header)
}

// Is makes errors.Is(err, ErrSessionRequired) true.
func (e *SessionRequiredError) Is(target error) bool { return target == ErrSessionRequired }

// HTTPStatus is 400.
func (e *SessionRequiredError) HTTPStatus() int { return 400 }

// KVScorer chooses among candidates by KV cache overlap (kv-aware policy).
// It returns nil to defer (no KV events for these candidates, no overlap).
type KVScorer interface {
	PickKV(cands []*fleet.Worker, r *Request) *fleet.Worker
}

// KVRatioScorer may be implemented by a KVScorer to report the share of the
// prompt the chosen worker has cached, so that the prefix layer's hit rate
// threshold applies to KV matches too.
type KVRatioScorer interface {
	PickKVRatio(cands []*fleet.Worker, r *Request) (*fleet.Worker, float64)
}

// Scheduler picks workers. Mode, Policy and KV are process-level
// (--router-mode, --router-policy); everything else comes from the config
// snapshot passed to Pick, so a reload takes effect on the next request.
//
// Create it with NewScheduler, start Run for the maintenance sweep, and Close
// it to unregister its metrics.
type Scheduler struct {
	Fleet *fleet.Fleet
	// Mode is auto or direct (direct: trust x-worker-instance-id).
	Mode Mode
	// Policy is kv-aware, round-robin, least-requests, least-tokens, or
	// config (use the config's load_balancing.algorithm). kv-aware uses KV as
	// the prefix layer's match basis and the config's algorithm for layer 3.
	Policy Policy
	// BlockSize is the engines' KV block size in tokens, for the KV blocks a
	// lease accounts (default 16).
	BlockSize int
	// DefaultMaxTokens is the output estimate of a request without
	// max_tokens (default 1024).
	DefaultMaxTokens int
	// KV is consulted under the kv-aware policy; nil leaves layer 2 to the
	// prefix index.
	KV KVScorer
	// Now returns unix nanoseconds (time.Now by default; tests override it).
	Now func() int64
	// Memory reports the process memory and the container memory limit in
	// bytes for the prefix index's eviction (memlimit.Read by default; tests
	// inject a fake).
	Memory func() (process, limit uint64, err error)
	// Latest returns the config store's current snapshot (set before
	// the first Pick; nil: see compiled). A request's older config then
	// never reshapes the shared state, however many reloads ago it was
	// loaded.
	Latest func() *config.Config

	rr      atomic.Uint64
	pd      pdSched
	comp    atomic.Pointer[compiled]
	compMu  sync.Mutex
	retired [8]*compiled
	aff     atomic.Pointer[affinityTable]
	pidx    atomic.Pointer[prefixIndex]
	// pidxEvicted are the TTL and memory evictions of the indexes
	// replaced (a block size change).
	pidxEvicted [2]atomic.Uint64
	mi          atomic.Pointer[modelIndex]
	sb          schedBreaker
	m           *schedMetrics
}

// NewScheduler returns a scheduler over f in auto mode.
func NewScheduler(f *fleet.Fleet, policy Policy) *Scheduler {
	s := &Scheduler{
		Fleet:            f,
		Mode:             ModeAuto,
		Policy:           policy,
		BlockSize:        16,
		DefaultMaxTokens: 1024,
		Now:              func() int64 { return time.Now().UnixNano() },
		Memory:           memlimit.Read,
	}
	s.m = newSchedMetrics(s)
	s.pd.init(s.m.set)
	return s
}

// Close unregisters the scheduler's metrics.
func (s *Scheduler) Close() { s.m.close() }

// Candidates appends to dst the routable workers that serve r's model
// exactly (no model routing rules).
func (s *Scheduler) Candidates(dst []*fleet.Worker, v *fleet.View, r *Request) ([]*fleet.Worker, error) {
	ws := v.ByModel[string(r.Model)]
	if len(ws) == 0 {
		if len(v.Routable) == 0 {
			return dst, ErrNoWorkers
		}
		return dst, ErrUnknownModel
	}
	return append(dst, ws...), nil
}

// CheckSession returns ErrSessionRequired when cfg requires a session id and
// r has none. The proxy calls it right after parsing (HTTP 400, before the
// request is queued); Pick checks it too.
func (s *Scheduler) CheckSession(cfg *config.Config, r *Request) error {
	sa := &cfg.SessionAffinity
	if sa.Enabled && sa.RequireSessionID && len(r.SessionID) == 0 {
		return &SessionRequiredError{Header: sa.Header}
	}
	return nil
}

// Acquire chooses a worker for r under cfg (Pick) and fills l, which then
// holds the worker's load units and, when the worker is half-open, its
// probe slot until l.Done. scratch is reused to avoid allocations (pass a
// slice with capacity for the fleet). On error l holds nothing.
func (s *Scheduler) Acquire(cfg *config.Config, r *Request, scratch []*fleet.Worker, l *Lease) error {
	l.Reset()
	d, err := s.Pick(cfg, r, scratch)
	if err != nil {
		return err
	}
	tokens, prefill, blocks, obs := s.leaseLoad(r, &d)
	l.acquire(d, tokens, prefill, blocks, obs, s.Now)
	return nil
}

// Pick runs the scheduling pipeline and returns the decision without
// taking the worker's load units (Acquire does; the fleet simulator
// accounts load itself). When d.Probe is set the decision holds the
// worker's half-open probe slot, which Acquire's lease hands back.
//
// The pipeline: require-session check; router mode direct; model routing and
// canary (candidate set); per-worker breakers; then, unless the scheduling
// breaker is open, the three layers (session affinity, prefix caching or
// KV, load balancing) under the scheduling wait timeout, falling back to
// local round-robin. The dispatch is then recorded in the session table and
// the prefix index (with r.Tentative, by Commit).
func (s *Scheduler) Pick(cfg *config.Config, r *Request, scratch []*fleet.Worker) (Decision, error) {
	now := s.Now()
	if err := s.CheckSession(cfg, r); err != nil {
		s.m.errSession.Inc()
		return Decision{}, err
	}
	v := s.Fleet.View()
	c := s.compiled(cfg)
	if len(r.Tried) > r.forgot {
		s.forgetTried(v, r)
	}
	if s.Mode == ModeDirect {
		if d, ok := s.direct(c, v, r, now); ok {
			s.finish(cfg, c, r, &d, now)
			return d, nil
		}
	}
	if r.Prefer.ID != "" && r.Leg != LegDecode && preferredDraining(v, r.Prefer) {
		return Decision{}, ErrPreferredDraining
	}
	all, model, svc, err := s.candidates(c, v, r, now, scratch[:0])
	if err != nil {
		s.m.countErr(err)
		return Decision{}, err
	}
	// Drop tried workers; keep breaker-open ones aside in case every
	// candidate is open (then the router dispatches anyway).
	avail := all[:0]
	var open []*fleet.Worker
	for _, w := range all {
		if r.tried(w) {
			continue
		}
		if w.Breaker.Available(now) {
			avail = append(avail, w)
		} else if open == nil {
			open = openMark(w)
		} else {
			open = append(open, w)
		}
	}
	r.gated = nil
	if r.Gate != nil && len(avail) > 0 {
		r.gated = avail
		avail = gate(r.Gate, avail)
	}
	if r.Prefer.ID != "" && r.Leg != LegDecode {
		if err := preferredExcluded(open, r.Prefer); err != nil {
			return Decision{}, err
		}
	}
	var d Decision
	switch {
	case len(avail) == 0 && len(open) == 0:
		s.m.errExhausted.Inc()
		return Decision{}, ErrExhausted
	case len(avail) == 0:
		d = Decision{Worker: s.roundRobin(open), Layer: LayerFallback, Reason: ReasonAllBreakersOpen}
	case r.Leg == LegDecode:
		d = s.pickDecode(cfg, avail, now) // pd.decode_policy
	default:
		if r.Prefer.ID != "" {
			// A candidate the gate found full counts too: only this
			// engine holds what the request names (its caller waits for
			// a seat there).
			cands := avail
			if r.gated != nil {
				cands = r.gated
			}
			d = preferred(cands, r.Prefer)
		}
		if d.Worker == nil {
			d = s.decide(cfg, c, v, avail, r, now)
		}
		if ok, probe := d.Worker.Breaker.Admit(now); ok {
			d.Probe = probe
		} else if r.Prefer.ID != "" && r.Prefer.Is(d.Worker) {
			// Another request took the preferred worker's probe slot, or
			// its breaker opened: no other engine holds what the request
			// names.
			if d.Worker.Breaker.State() == fleet.BreakerOpen {
				return Decision{}, ErrPreferredOpen
			}
			return Decision{}, ErrPreferredOnTrial
		} else {
			// Another request took the chosen worker's probe slot.
			d = s.readmit(cfg, avail, d.Worker, now)
		}
	}
	d.Service = svc
	d.Model = modelFor(d.Worker, model, r.Model)
	d.Rewrite = d.Model != "" && d.Model != string(r.Model)
	s.finish(cfg, c, r, &d, now)
	return d, nil
}

// preferred is the decision for the worker of engine ref among avail
// (Request.Prefer); none when it is not among them.
func preferred(avail []*fleet.Worker, ref fleet.Ref) Decision {
	for _, w := range avail {
		if ref.Is(w) {
			return Decision{Worker: w, Layer: LayerAffinity, Reason: ReasonAffinityHit}
		}
	}
	return Decision{}
}

// preferredDraining reports whether the worker of engine ref is in the
// fleet and draining (Request.Prefer, ErrPreferredDraining).
func preferredDraining(v *fleet.View, ref fleet.Ref) bool {
	i := sort.Search(len(v.All), func(i int) bool { return v.All[i].ID >= ref.ID })
	return i < len(v.All) && ref.Is(v.All[i]) && v.All[i].Draining()
}

// preferredExcluded tells why the worker of engine ref, when it is among
// open (not available), may not take the request: ErrPreferredOnTrial
// when its breaker is half-open (its trial request in flight),
// ErrPreferredOpen when it is open (its cooldown not over); nil when it is
// not among them.
func preferredExcluded(open []*fleet.Worker, ref fleet.Ref) error {
	for _, w := range open {
		if ref.Is(w) {
			if w.Breaker.State() == fleet.BreakerHalfOpen {
				return ErrPreferredOnTrial
			}
			return ErrPreferredOpen
		}
	}
	return nil
}

// decide runs the layers under the scheduling breaker and wait timeout.
func (s *Scheduler) decide(cfg *config.Config, c *compiled, v *fleet.View, avail []*fleet.Worker, r *Request, now int64) Decision {
	st := &cfg.SchedTimeout
	mode := s.sb.enter(st, now)
	if mode == sbSkip {
		s.m.fbBreaker.Inc()
		// The session table was not consulted: leave bindings alone.
		return Decision{Worker: s.roundRobin(avail), Layer: LayerFallback, Reason: ReasonSchedBreakerOpen}
	}
	limit := st.WaitTimeoutMS
	if mode == sbProbe {
		limit = st.ProbeWaitMS
	}
	var deadline int64
	if limit > 0 {
		deadline = now + int64(limit*float64(time.Millisecond))
	}
	d, end := s.layers(cfg, c, v, avail, r, now, deadline)
	failed := d.Reason == ReasonSchedTimeout
	if failed {
		s.m.timeouts.Inc()
	}
	s.sb.done(st, end, failed, mode == sbProbe, s.m)
	return d
}

// readmit picks again by load balancing when the chosen worker could not be
// admitted (its half-open probe slot was taken by a concurrent request).
func (s *Scheduler) readmit(cfg *config.Config, avail []*fleet.Worker, skip *fleet.Worker, now int64) Decision {
	first := avail[0]
	avail = without(avail, skip)
	b := s.balancer(cfg)
	for len(avail) > 0 {
		w := b.Pick(avail, &s.rr)
		if ok, probe := w.Breaker.Admit(now); ok {
			return Decision{Worker: w, Probe: probe, Layer: LayerLB, Reason: ReasonWorkerBreakerBusy, rebind: true}
		}
		avail = without(avail, w)
	}
	return Decision{Worker: first, Layer: LayerFallback, Reason: ReasonAllBreakersOpen, rebind: true}
}

// layers runs session affinity, prefix caching (or KV) and load balancing,
// first hit wins. deadline (unix ns, 0 = none) is checked between layers
// and inside the prefix walk; past it, local round-robin decides. It returns
// the decision and the time of the last clock read.
func (s *Scheduler) layers(cfg *config.Config, c *compiled, v *fleet.View, avail []*fleet.Worker, r *Request, now, deadline int64) (Decision, int64) {
	var ls loadStats
	reason := ReasonNone
	rebind := false
	sa := &cfg.SessionAffinity
	if sa.Enabled {
		if len(r.SessionID) == 0 {
			reason = ReasonNoSession
		} else {
			w, why := s.affinityLookup(c, avail, r, now, &ls)
			if w != nil {
				return Decision{Worker: w, Layer: LayerAffinity, Reason: ReasonAffinityHit}, now
			}
			reason = why
			rebind = why != ReasonAffinityOverload
			// The clock is read again after a lookup only: without one,
			// nothing ran since now was read.
			if deadline != 0 {
				if now = s.Now(); now > deadline {
					return s.timedOut(avail, rebind), now
				}
			}
		}
	}
	if r.LoadOnly {
		return Decision{Worker: s.balancer(cfg).Pick(avail, &s.rr), Layer: LayerLB, Reason: reason, rebind: rebind}, now
	}
	if s.Policy == PolicyKVAware && s.KV != nil {
		if d, ok := s.kvLayer(cfg, avail, r, &ls); ok {
			d.rebind = rebind
			return d, now
		}
	}
	p, depth, late := s.indexPrompt(c, r, now, deadline)
	if late {
		return s.timedOut(avail, rebind), s.Now()
	}
	if cfg.PrefixCache.Enabled {
		if p != nil && depth > 0 {
			d, why := s.prefixLayer(cfg, p, v, avail, r, depth, &ls)
			if d.Worker != nil {
				d.rebind = rebind
				return d, now
			}
			reason = why
		} else if len(r.Prompt) > 0 {
			reason = ReasonPrefixMiss
		}
	}
	if deadline != 0 {
		if now = s.Now(); now > deadline {
			return s.timedOut(avail, rebind), now
		}
	}
	return Decision{Worker: s.balancer(cfg).Pick(avail, &s.rr), Layer: LayerLB, Reason: reason, rebind: rebind}, now
}

// forgetTried takes the workers r tried since the last pick off the
// prefix index blocks r's earlier attempts recorded them on: they failed
// the request, so they did not cache its prompt.
func (s *Scheduler) forgetTried(v *fleet.View, r *Request) {
	tried := r.Tried[r.forgot:]
	r.forgot = len(r.Tried)
	p := s.pidx.Load()
	if !r.hashed || p == nil || p != r.pidx || len(r.phash) == 0 {
		return
	}
	for _, i := range tried {
		if i < len(v.ByIdx) && v.ByIdx[i] != nil {
			p.forget(r.phash, r.psnap, v.ByIdx[i])
		}
	}
}

// ForgetTried is Forget for every worker r tried since its last pick: a
// PD request's last attempt, whose legs each had a pick of their own.
func (s *Scheduler) ForgetTried(r *Request) {
	if len(r.Tried) > r.forgot {
		s.forgetTried(s.Fleet.View(), r)
	}
}

// Forget takes w, the worker of r's last attempt, off the prefix index
// blocks that attempt recorded it on, when it failed and no other attempt
// follows (a retry's Pick does this for the workers tried before it): the
// worker did not cache the prompt, and the prefix layer would send the
// prompt's next requests to it.
func (s *Scheduler) Forget(r *Request, w *fleet.Worker) {
	p := s.pidx.Load()
	if w == nil || !r.hashed || p == nil || p != r.pidx || len(r.phash) == 0 {
		return
	}
	p.forget(r.phash, r.psnap, w)
	if n := len(r.Tried); n > r.forgot && r.Tried[n-1] == w.Idx {
		r.forgot = n // a later Pick (another upstream's failover) must not forget it again
	}
}

// indexPrompt hashes r's prompt into blocks and matches it against the
// prefix index (once per request), accounting the hit-rate ceiling. depth
// is how many leading blocks some worker has seen; late is true when the
// deadline passed while hashing.
func (s *Scheduler) indexPrompt(c *compiled, r *Request, now, deadline int64) (p *prefixIndex, depth int, late bool) {
	if r.hashed {
		// A retry: the first attempt's match stands (its snapshot predates
		// the record of the worker that failed, which is no candidate
		// now), so the prefix layer still finds the other workers holding
		// the prefix (it answered prefix-miss on every retry).
		if p = s.pidx.Load(); p == nil || p != r.pidx {
			return nil, 0, false
		}
		return p, r.pdepth, false
	}
	if len(r.Prompt) == 0 {
		return nil, 0, false
	}
	r.hashed = true
	p = s.prefix(c, now)
	r.pidx = p
	if p == nil || len(r.Prompt) < p.blockSize {
		s.m.observeCeiling(0, len(r.Prompt))
		return p, 0, false
	}
	depth, late = p.hashAndMatch(r, now, deadline, s.Now)
	if !late {
		s.m.observeCeiling(depth*p.blockSize, len(r.Prompt))
	}
	return p, depth, late
}

func (s *Scheduler) timedOut(avail []*fleet.Worker, rebind bool) Decision {
	return Decision{Worker: s.roundRobin(avail), Layer: LayerFallback, Reason: ReasonSchedTimeout, rebind: rebind}
}

// roundRobin is the local round-robin fallback.
func (s *Scheduler) roundRobin(ws []*fleet.Worker) *fleet.Worker {
	return RoundRobin.Pick(ws, &s.rr)
}

// finish records the dispatch: metrics, then (unless r.Tentative leaves
// them to Commit) session binding and prefix index.
func (s *Scheduler) finish(cfg *config.Config, c *compiled, r *Request, d *Decision, now int64) {
	d.Leg = r.Leg
	if r.Leg == LegDecode {
		// The prefill leg's decision bound the session and indexed the
		// prompt (its worker computes and caches it). A tentative pick is
		// counted once it is kept (Commit): picks handed back while the
		// request waits for a seat are no decode legs.
		if !r.Tentative {
			s.pd.countDecode(d)
		}
		return
	}
	if !r.counted {
		r.counted = true
		s.m.countLayer(d.Layer)
	}
	if !r.Tentative {
		s.commit(cfg, c, r, d, now)
	}
}

// Commit records d, a decision Pick made for r while r.Tentative was set,
// once the request is dispatched on it: the session binding (when d
// re-binds the session) and the prefix index record, which Pick makes at
// once for a request that is not tentative. Call it once, for the decision
// the request is sent on; decisions handed back unused bind and record
// nothing (TestATentativePickBindsAndRecordsOnlyWhenCommitted). A decode
// leg's decision is counted here (infera_pd_decode_decisions_total).
func (s *Scheduler) Commit(cfg *config.Config, r *Request, d *Decision) {
	if d.Worker == nil {
		return
	}
	if d.Leg == LegDecode {
		s.pd.countDecode(d) // counted here, not at the tentative pick (finish)
		return
	}
	s.commit(cfg, s.compiled(cfg), r, d, s.Now())
}

// commit binds the session and records the prompt for d's worker.
func (s *Scheduler) commit(cfg *config.Config, c *compiled, r *Request, d *Decision, now int64) {
	if d.rebind && cfg.SessionAffinity.Enabled && len(r.SessionID) > 0 {
		s.affinityBind(c, r, d.Worker, now)
	}
	if r.LoadOnly {
		return // nothing of r goes into the prefix index
	}
	// Layers that decided before the prefix layer leave the prompt unhashed.
	s.indexPrompt(c, r, now, 0)
	if p := s.pidx.Load(); p != nil && p.blockSize == cfg.PrefixIndex.BlockSize && len(r.phash) > 0 {
		if p.record(r.phash, r.psnap, d.Worker, now) {
			s.checkMemory(cfg, p, now)
		}
	}
}

// direct resolves router mode direct: the worker named by the header, if it
// is live and routable. The breaker is not consulted (the upstream picker
// decides), except that a probe-eligible worker is marked as the probe.
func (s *Scheduler) direct(c *compiled, v *fleet.View, r *Request, now int64) (Decision, bool) {
	id := r.DirectWorker
	if r.Leg == LegPrefill {
		id = r.DirectPrefill
	}
	if len(id) == 0 {
		return Decision{}, false
	}
	w := v.ByID(id)
	if w == nil || w.Draining() || r.tried(w) || w.Role != r.Leg.role() {
		s.m.directMiss.Inc()
		return Decision{}, false
	}
	d := Decision{Worker: w, Layer: LayerDirect, Reason: ReasonHeader, rebind: true}
	if ok, probe := w.Breaker.Admit(now); ok {
		d.Probe = probe
	}
	d.Model = s.directModel(c, v, w, r.Model)
	d.Rewrite = d.Model != "" && d.Model != string(r.Model)
	return d, true
}

func (s *Scheduler) balancer(cfg *config.Config) Balancer {
	if b, ok := s.Policy.balancer(); ok {
		return b
	}
	b, _ := ParseBalancer(cfg.LoadBalancing.Algorithm)
	return b
}

// openMark returns a one-element slice holding w. Open workers are rare, so
// this small allocation stays off the steady-state path.
func openMark(w *fleet.Worker) []*fleet.Worker { return []*fleet.Worker{w} }

func without(ws []*fleet.Worker, w *fleet.Worker) []*fleet.Worker {
	for i, x := range ws {
		if x == w {
			ws[i] = ws[len(ws)-1]
			return ws[:len(ws)-1]
		}
	}
	return ws
}

// loadStats caches the candidates' average load for one decision.
type loadStats struct {
	done bool
	avg  float64
}

// average returns the mean in-flight request count over cands.
func (ls *loadStats) average(cands []*fleet.Worker) float64 {
	if !ls.done {
		var sum int64
		for _, w := range cands {
			sum += w.Load.Requests.Load()
		}
		ls.avg = float64(sum) / float64(len(cands))
		ls.done = true
	}
	return ls.avg
}

// overloaded reports whether load exceeds avg*factor. A worker with at most
// one in-flight request is never overloaded: at near-zero load the ratio is
// meaningless (one request on one of eight idle workers is 8x the average).
func overloaded(load int64, avg, factor float64) bool {
	if load <= 1 {
		return false
	}
	return float64(load) > avg*factor
}
