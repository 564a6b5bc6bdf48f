package sched

import (
	"fmt"
	"slices"

	"github.com/VictoriaMetrics/metrics"
	"github.com/infera/infera/config"
	"github.com/infera/infera/fleet"
)

// Prefill-decode disaggregation: the topology decision, the decode policy
// and the pairing of prefill and decode workers. The proxy drives the legs
// (proxy/pd.go); docs/pd.md is the reference.
//
// A request on a fleet with prefill or decode workers is routed once
// (Topology): its candidate workers, of every role, are kept in the
// Request for all its legs and attempts, so model routing and canary rules
// decide once per request and both legs of a pair come from the same
// candidate set. A fleet without such workers never gets here.

// Leg is the part of a request one lease serves.
type Leg uint8

// Legs.
const (
	// LegMixed is a whole request on one mixed worker.
	LegMixed Leg = iota
	// LegPrefill is a PD pair's prompt on a prefill worker: its work ends
	// at the KV transfer. The primary pipeline (affinity, prefix/KV, load
	// balancing) picks it.
	LegPrefill
	// LegDecode is a PD pair's generation on a decode worker, to the end of
	// the response. pd.decode_policy picks it.
	LegDecode
)

func (l Leg) String() string {
	switch l {
	case LegPrefill:
		return "prefill"
	case LegDecode:
		return "decode"
	}
	return "mixed"
}

// role is the worker role that serves the leg.
func (l Leg) role() fleet.Role {
	switch l {
	case LegPrefill:
		return fleet.RolePrefill
	case LegDecode:
		return fleet.RoleDecode
	}
	return fleet.RoleMixed
}

// Topology is how a request is served.
type Topology uint8

// Topologies.
const (
	// TopologyMixed: one mixed worker serves the whole request.
	TopologyMixed Topology = iota
	// TopologyPD: a prefill worker and a decode worker serve it.
	TopologyPD
)

func (t Topology) String() string {
	if t == TopologyPD {
		return "pd"
	}
	return "mixed"
}

// PDMode is the KV connector of a pair, which decides the legs' bodies.
type PDMode uint8

// PD modes.
const (
	PDModeUnknown PDMode = iota
	// PDModeSGLang is SGLang's push connector (Mooncake): both legs at once,
	// with bootstrap_host, bootstrap_port and bootstrap_room.
	PDModeSGLang
	// PDModeVLLM is vLLM's pull connector (NixlConnector): the prefill leg
	// answers kv_transfer_params, then the decode leg carries them.
	PDModeVLLM
)

// ParsePDMode maps sglang / vllm to a PDMode.
func ParsePDMode(s string) (PDMode, bool) {
	switch s {
	case "sglang":
		return PDModeSGLang, true
	case "vllm":
		return PDModeVLLM, true
	}
	return PDModeUnknown, false
}

func (m PDMode) String() string {
	switch m {
	case PDModeSGLang:
		return "sglang"
	case PDModeVLLM:
		return "vllm"
	}
	return "unknown"
}

// pdRoute is a request's PD routing, kept across its legs and attempts.
type pdRoute struct {
	// routed: Topology ran; cands and the fields below are the request's.
	routed bool
	// cands are the request's candidates of every role, ordered by ID.
	cands []*fleet.Worker
	// np and nd count the prefill and decode workers in cands.
	np, nd int
	// model and svc are what model routing resolved.
	model, svc string
	mode       PDMode
	// aligned: prefill and decode workers pair by aligned index.
	aligned bool
	// prefill is the decode leg's partner.
	prefill *fleet.Worker
	// decode is the decode worker router mode direct named, if any.
	decode *fleet.Worker
	// whole: a decode worker serves the request whole, prefill included
	// (a vLLM batch on a fleet without mixed workers: Topology).
	whole bool
}

func (p *pdRoute) reset() {
	cands := p.emptied()
	*p = pdRoute{}
	p.cands = cands
}

// emptied returns cands cleared (no worker pinned by the pool) and
// emptied, for the next request.
func (p *pdRoute) emptied() []*fleet.Worker {
	clear(p.cands)
	return p.cands[:0]
}

// SetLeg selects the leg the next Acquire picks a worker for. prefill is
// the pair's prefill worker, for the decode leg (pairing by aligned index
// depends on it).
func (r *Request) SetLeg(l Leg, prefill *fleet.Worker) {
	r.Leg = l
	r.pd.prefill = prefill
}

// PDMode is the connector of the request's pair (valid once Topology said
// TopologyPD).
func (r *Request) PDMode() PDMode { return r.pd.mode }

// Errors of the PD topology. Proxy mapping: 503.
var (
	errNoMixed   = fmt.Errorf("%w: no mixed worker serves this model, and its prefill and decode workers do not make a pair", ErrNoWorkers)
	errNoPrefill = fmt.Errorf("%w: no prefill worker is left for this request", ErrNoWorkers)
	errNoDecode  = fmt.Errorf("%w: no decode worker is left to pair with the prefill worker", ErrNoWorkers)
)

// PDModeError is returned by Topology when pd.mode is empty and the prefill
// worker's record does not name its connector. HTTP status 503.
type PDModeError struct{ Worker string }

func (e *PDModeError) Error() string {
	return fmt.Sprintf("prefill worker %q does not advertise its KV connector (bootstrap pd_mode): set pd.mode to sglang or vllm", e.Worker)
}

// HTTPStatus is 503.
func (e *PDModeError) HTTPStatus() int { return 503 }

// Is makes errors.Is(err, ErrNoWorkers) true.
func (e *PDModeError) Is(target error) bool { return target == ErrNoWorkers }

// Topology decides how r is served under cfg and routes it once: model
// routing and canary rules run here, and the candidates they give (every
// role) stay with r for all its legs and attempts. A request is served by
// a pair when its candidates include a prefill and a decode worker (in
// router mode direct, when x-worker-instance-id names a decode worker and
// a prefill worker is available), otherwise by one mixed worker. On a fleet
// without prefill or decode workers it returns TopologyMixed at once, and
// leaves r to Pick as before.
func (s *Scheduler) Topology(cfg *config.Config, r *Request, scratch []*fleet.Worker) (Topology, error) {
	v := s.Fleet.View()
	if v.PD == 0 {
		return TopologyMixed, nil
	}
	if err := s.CheckSession(cfg, r); err != nil {
		s.m.errSession.Inc()
		return TopologyMixed, err
	}
	c := s.compiled(cfg)
	p := &r.pd
	p.reset()
	p.routed = true
	now := s.Now()
	all, model, svc, err := s.route(c, v, r, now, scratch[:0])
	var named, namedPrefill *fleet.Worker
	if s.Mode == ModeDirect {
		named = directNamed(v, r.DirectWorker, r, fleet.RolePrefill, true)
		namedPrefill = directNamed(v, r.DirectPrefill, r, fleet.RolePrefill, false)
	}
	p.cands = append(p.cands, all...)
	sortByID(p.cands)
	p.model, p.svc = model, svc
	var upPrefill, upDecode, upMixed int // candidates whose breaker admits requests
	for _, w := range p.cands {
		up := w.Breaker.Available(now)
		switch w.Role {
		case fleet.RolePrefill:
			p.np++
			upPrefill += b2i(up)
		case fleet.RoleDecode:
			p.nd++
			upDecode += b2i(up)
		default:
			upMixed += b2i(up)
		}
	}
	hasPrefill := p.np > 0 || namedPrefill != nil
	if named != nil && named.Role == fleet.RoleDecode {
		p.decode = named
	}
	pd := p.np > 0 && p.nd > 0
	if pd && upMixed > 0 && (upPrefill == 0 || upDecode == 0) {
		// Every prefill or every decode candidate's breaker is open: the
		// pair would only be tried by the all-open fallback, while a mixed
		// worker can take the request.
		pd = false
	}
	if named != nil {
		switch {
		case named.Role == fleet.RoleMixed:
			pd = false
		case hasPrefill:
			pd = true
		}
	}
	if !pd {
		if err != nil && (named == nil || named.Role != fleet.RoleMixed) {
			s.m.countErr(err)
			return TopologyMixed, err
		}
		s.pd.mixed.Inc()
		return TopologyMixed, nil
	}
	mode, ok := ParsePDMode(cfg.PD.Mode)
	if !ok {
		// From the prefill workers' records: the named one's, else the
		// first (by id) that says; the prefill workers that say another
		// mode, or none, are no candidates of this request (the first by id
		// decided for every candidate, and one without a mode failed them
		// all).
		pw := namedPrefill
		if pw == nil {
			for _, w := range p.cands {
				if _, says := ParsePDMode(w.PD.Mode); w.Role == fleet.RolePrefill && (says || pw == nil) {
					if pw = w; says {
						break
					}
				}
			}
		}
		if mode, ok = ParsePDMode(pw.PD.Mode); !ok {
			s.pd.noMode.Inc()
			return TopologyMixed, &PDModeError{Worker: pw.ID}
		}
		if namedPrefill == nil {
			k := 0
			p.np = 0
			for _, w := range p.cands {
				if w.Role == fleet.RolePrefill {
					if m, _ := ParsePDMode(w.PD.Mode); m != mode {
						continue
					}
					p.np++
				}
				p.cands[k] = w
				k++
			}
			clear(p.cands[k:])
			p.cands = p.cands[:k]
		}
	}
	if mode == PDModeVLLM && r.Prompts > 1 && named == nil {
		// vLLM's prefill answer carries the kv_transfer_params of its first
		// prompt only (serving_completion: final_res_batch[0]): the decode
		// leg would read that prompt's KV for every prompt of the batch,
		// and the prefill engine would hold the others' blocks until its
		// abort timeout. One worker serves the batch whole: a mixed one,
		// else a decode worker (a vLLM instance without kv_transfer_params
		// computes the prompt itself).
		if len(p.cands) == p.np+p.nd {
			r.Leg, p.whole = LegDecode, true
		}
		s.pd.mixed.Inc()
		return TopologyMixed, nil
	}
	p.mode = mode
	p.aligned = mode == PDModeSGLang && !cfg.PD.SGLangIndependentPairing
	s.pd.pairs.Inc()
	return TopologyPD, nil
}

// directNamed returns the live worker named by id (router mode direct),
// nil when none or when its role does not fit: with not set, any role but
// role; else exactly role.
func directNamed(v *fleet.View, id []byte, r *Request, role fleet.Role, not bool) *fleet.Worker {
	if len(id) == 0 {
		return nil
	}
	w := v.ByID(id)
	if w == nil || w.Draining() || (w.Role == role) == not {
		return nil
	}
	return w
}

// sortByID orders ws by ID (insertion sort: candidate lists are short and
// mostly sorted already; no allocation).
func sortByID(ws []*fleet.Worker) {
	for i := 1; i < len(ws); i++ {
		for j := i; j > 0 && ws[j].ID < ws[j-1].ID; j-- {
			ws[j], ws[j-1] = ws[j-1], ws[j]
		}
	}
}

// candidates appends r's candidates for its leg. Without Topology's
// routing (a fleet without PD workers, or a caller that picks legs
// itself) it is route, keeping the leg's role when the fleet has PD
// workers; after Topology it is the request's own candidates of the leg's
// role that are still live, paired by aligned index when that applies.
func (s *Scheduler) candidates(c *compiled, v *fleet.View, r *Request, now int64, dst []*fleet.Worker) ([]*fleet.Worker, string, string, error) {
	p := &r.pd
	if !p.routed {
		dst, model, svc, err := s.route(c, v, r, now, dst)
		if err != nil || (v.PD == 0 && r.Leg == LegMixed) {
			return dst, model, svc, err
		}
		dst = keepRole(dst, r.Leg.role())
		if len(dst) == 0 {
			return dst, "", "", legError(r.Leg)
		}
		return dst, model, svc, nil
	}
	n := len(dst)
	dst = p.appendLeg(dst, r, now)
	if len(dst) == n {
		return dst, "", "", legError(r.Leg)
	}
	return dst, p.model, p.svc, nil
}

func legError(l Leg) error {
	switch l {
	case LegPrefill:
		return errNoPrefill
	case LegDecode:
		return errNoDecode
	}
	return errNoMixed
}

// keepRole filters ws in place to the workers of role.
func keepRole(ws []*fleet.Worker, role fleet.Role) []*fleet.Worker {
	out := ws[:0]
	for _, w := range ws {
		if w.Role == role {
			out = append(out, w)
		}
	}
	return out
}

func live(w *fleet.Worker) bool { return !w.Removed() && !w.Draining() }

// maxGroups bounds the aligned groups tracked without allocation; larger
// fleets pair freely beyond it.
const maxGroups = 4096

// appendLeg appends the live candidates of r's leg.
//
// Pairing by aligned index (SGLang with sglang_independent_pairing off):
// with P[0..np) the request's prefill candidates and D[0..nd) its decode
// candidates, each ordered by worker ID, and k = min(np, nd), P[i] pairs
// with D[j] exactly when i mod k == j mod k. With as many prefill as decode
// workers that is P[i] with D[i]; with 2 prefill and 6 decode workers P[0]
// pairs with D[0], D[2], D[4] and P[1] with D[1], D[3], D[5]. A prefill
// worker is a candidate only while one of its decode workers is live and
// untried, and, while any group has one, one whose breaker is not open
// (a group whose decode workers are all open would get its decode leg by
// the all-open fallback); the decode leg's candidates are its prefill
// worker's decode workers.
func (p *pdRoute) appendLeg(dst []*fleet.Worker, r *Request, now int64) []*fleet.Worker {
	role := r.Leg.role()
	k := min(p.np, p.nd)
	if !p.aligned || r.Leg == LegMixed || k == 0 {
		for _, w := range p.cands {
			if w.Role == role && live(w) {
				dst = append(dst, w)
			}
		}
		return dst
	}
	if r.Leg == LegPrefill {
		var marks [maxGroups / 64]uint64
		// A decode worker named by router mode direct (and not tried yet)
		// is the only one the prefill worker must pair with.
		named := p.decode != nil && live(p.decode) && !r.tried(p.decode) && slices.Contains(p.cands, p.decode)
		// First the groups with a decode worker whose breaker is not open;
		// when there are none, every group with a live untried one.
		for pass, found := 0, false; pass < 2 && !found; pass++ {
			j := 0
			for _, w := range p.cands {
				if w.Role != fleet.RoleDecode {
					continue
				}
				if g := j % k; g < maxGroups && live(w) && !r.tried(w) && (!named || w == p.decode) &&
					(pass == 1 || w.Breaker.Available(now)) {
					marks[g/64] |= 1 << (g % 64)
					found = true
				}
				j++
			}
		}
		i := 0
		for _, w := range p.cands {
			if w.Role != fleet.RolePrefill {
				continue
			}
			if g := i % k; (g >= maxGroups || marks[g/64]&(1<<(g%64)) != 0) && live(w) {
				dst = append(dst, w)
			}
			i++
		}
		return dst
	}
	group := -1 // the partner's position; -1 (not a candidate): any decode
	i := 0
	for _, w := range p.cands {
		if w.Role != fleet.RolePrefill {
			continue
		}
		if w == p.prefill {
			group = i % k
			break
		}
		i++
	}
	j := 0
	for _, w := range p.cands {
		if w.Role != fleet.RoleDecode {
			continue
		}
		if (group < 0 || group >= maxGroups || j%k == group) && live(w) {
			dst = append(dst, w)
		}
		j++
	}
	return dst
}

// pickDecode is the decode policy (pd.decode_policy) over avail, skipping
// workers whose half-open probe slot another request holds. Under aligned
// pairing avail is the prefill worker's own decode workers, and the
// balancer rotates over them (it takes the one picked least recently).
func (s *Scheduler) pickDecode(cfg *config.Config, avail []*fleet.Worker, now int64) Decision {
	b, _ := ParseBalancer(cfg.PD.DecodePolicy)
	first := avail[0]
	for len(avail) > 0 {
		w := b.Pick(avail, &s.rr)
		if ok, probe := w.Breaker.Admit(now); ok {
			return Decision{Worker: w, Probe: probe, Layer: LayerLB}
		}
		avail = without(avail, w)
	}
	return Decision{Worker: first, Layer: LayerFallback, Reason: ReasonWorkerBreakerBusy}
}

// leaseLoad is what a lease for r's leg accounts on its worker: tokens
// (prompt estimate plus output), prefill tokens (released at the first
// token) and KV blocks. A prefill leg's work ends at the transfer: its
// prompt and first token; a decode leg computes no prompt (the KV arrives
// computed) but holds the KV of the prompt and the output. Only prefill
// work teaches the KV cost function engine speed.
func (s *Scheduler) leaseLoad(r *Request, d *Decision) (tokens, prefill, blocks int64, obs FirstTokenObserver) {
	maxTokens := r.MaxTokens
	if maxTokens < 0 {
		maxTokens = s.DefaultMaxTokens
	}
	prompt := int64(r.PromptTokens)
	tokens, prefill = prompt+int64(maxTokens), d.PrefillTokens(r)
	switch {
	case r.Leg == LegPrefill:
		tokens = prompt + 1
	case r.Leg == LegDecode && !r.pd.whole:
		prefill = 0
	}
	bs := int64(max(1, s.BlockSize))
	if r.Leg != LegDecode || r.pd.whole {
		if o, ok := s.KV.(FirstTokenObserver); ok {
			if q, ok := o.(interface{ Observing() bool }); !ok || q.Observing() {
				obs = o
			}
		}
	}
	return tokens, prefill, (tokens + bs - 1) / bs, obs
}

// pdSched is the scheduler's PD state: the PD metrics.
type pdSched struct {
	pairs, mixed, noMode *metrics.Counter
	decode               [numLayers]*metrics.Counter
}

func (p *pdSched) init(set *metrics.Set) {
	p.pairs = set.NewCounter(`infera_pd_topology_total{topology="pd"}`)
	p.mixed = set.NewCounter(`infera_pd_topology_total{topology="mixed"}`)
	p.noMode = set.NewCounter(`infera_sched_errors_total{kind="pd_mode_unknown"}`)
	for _, l := range []Layer{LayerDirect, LayerLB, LayerFallback} {
		p.decode[l] = set.NewCounter(`infera_pd_decode_decisions_total{layer="` + l.String() + `"}`)
	}
}

// countDecode counts a decode leg's decision (decode decisions are kept
// out of infera_route_decisions_total, which counts one per request).
func (p *pdSched) countDecode(d *Decision) {
	if c := p.decode[d.Layer]; c != nil {
		c.Inc()
	}
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}
