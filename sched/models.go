package sched

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync/atomic"

	"github.com/infera/infera/config"
	"github.com/infera/infera/fleet"
)

// compiled is what Pick needs from one config snapshot, built once per
// *config.Config (configs are immutable) and cached behind an atomic pointer.
type compiled struct {
	cfg *config.Config
	// stale is set once a newer config was seen (see Scheduler.compiled).
	stale        atomic.Bool
	mappings     []compiledMapping
	canary       []*canaryRule
	defaultModel []byte
	defaultLower []byte // defaultModel lower-cased, for the rules' patterns
}

type compiledMapping struct {
	pat      string // lower-cased glob
	services []string
}

// compiled returns the compiled form of cfg, building it on first use.
//
// The newest config becomes current and the previous one is retired. An
// older one (a request that loaded the config before a reload: a failover
// retry, a request that waited in a queue) gets its compiled form marked
// stale: its rules apply to that request, but it never replaces the shared
// state (prefix index, session table) that the newest config shaped. With
// Latest set, the newest is the store's current config; without it, a
// config pointer not seen among the current one and the last eight
// retired is taken as the newest.
func (s *Scheduler) compiled(cfg *config.Config) *compiled {
	if c := s.comp.Load(); c != nil && c.cfg == cfg {
		return c
	}
	s.compMu.Lock()
	defer s.compMu.Unlock()
	cur := s.comp.Load()
	if cur != nil && cur.cfg == cfg {
		return cur
	}
	latest := s.Latest != nil && s.Latest() == cfg
	if !latest {
		for _, r := range s.retired {
			if r != nil && r.cfg == cfg {
				return r
			}
		}
	}
	c := compile(cfg, cur)
	if s.Latest != nil && !latest {
		c.stale.Store(true)
		s.retire(c)
		return c
	}
	if cur != nil {
		cur.stale.Store(true)
		s.retire(cur)
	}
	s.comp.Store(c)
	return c
}

// retire keeps c among the retired compiled forms. compMu must be held.
func (s *Scheduler) retire(c *compiled) {
	copy(s.retired[1:], s.retired[:])
	s.retired[0] = c
}

// compile builds cfg's compiled form. A canary rule unchanged since prev
// keeps its place in the weighted rotation: rebuilt on every reload (of
// any section), it restarted with the heaviest target, and a 1:9 canary
// reloaded every few requests got none of them.
func compile(cfg *config.Config, prev *compiled) *compiled {
	c := &compiled{cfg: cfg}
	for _, m := range cfg.ModelRouting.Mappings {
		c.mappings = append(c.mappings, compiledMapping{pat: lowerASCII(m.Pattern), services: m.Services})
	}
	for _, r := range cfg.Canary.Rules {
		c.canary = append(c.canary, prev.canaryFor(r))
	}
	if cfg.ModelRouting.DefaultModel != "" {
		c.defaultModel = []byte(cfg.ModelRouting.DefaultModel)
		c.defaultLower = appendLower(nil, c.defaultModel)
	}
	return c
}

// canaryFor returns c's compiled rule equal to r, or a new one.
func (c *compiled) canaryFor(r config.CanaryRule) *canaryRule {
	if c != nil {
		for i, pr := range c.cfg.Canary.Rules {
			if i < len(c.canary) && pr.Model == r.Model && slices.Equal(pr.Targets, r.Targets) {
				return c.canary[i]
			}
		}
	}
	return newCanaryRule(r)
}

// maxModelNameLen is the longest model name accepted; longer ones are
// unknown models (bounds the work of pattern matching on client input;
// upstream.MaxModelBytes, global scheduling's bound, is the same).
const maxModelNameLen = 1024

// maxModelName bounds the model names matched without allocation; longer
// names are matched through a heap copy.
const maxModelName = 256

// route appends to dst the candidate workers for r: canary rule, model
// mapping, exact / fuzzy model match, default model. It returns the model
// name resolved (may be "" when a service decided) and the canary service.
// now is the time the workers' breakers are asked at.
func (s *Scheduler) route(c *compiled, v *fleet.View, r *Request, now int64, dst []*fleet.Worker) ([]*fleet.Worker, string, string, error) {
	if len(v.Routable) == 0 {
		return dst, "", "", ErrNoWorkers
	}
	name := r.Model
	if len(name) > maxModelNameLen {
		return dst, "", "", &UnknownModelError{Model: string(name[:64]) + "..."}
	}
	if len(name) == 0 && c.cfg.ModelRouting.Enabled && len(c.defaultModel) > 0 {
		name = c.defaultModel
	}
	if !c.cfg.Canary.Enabled && !c.cfg.ModelRouting.Enabled {
		// Neither reads the lower-cased name: routeName's buffer for it
		// (zeroed on every call) is not set up.
		return s.routeExact(c, v, r, name, dst)
	}
	return s.routeName(c, v, r, name, now, dst)
}

// routeExact is routeName without model routing: the workers that serve
// name as it is written (every routable worker for no name).
func (s *Scheduler) routeExact(c *compiled, v *fleet.View, r *Request, name []byte, dst []*fleet.Worker) ([]*fleet.Worker, string, string, error) {
	if len(name) == 0 {
		return appendRole(dst, v.Routable, r), "", "", nil
	}
	if ws := v.ByModel[string(name)]; len(ws) > 0 {
		return appendRole(dst, ws, r), "", "", nil
	}
	return dst, "", "", s.unknownModel(c, v, name)
}

// routeName is route for the model name (r's, or the default model).
func (s *Scheduler) routeName(c *compiled, v *fleet.View, r *Request, name []byte, now int64, dst []*fleet.Worker) ([]*fleet.Worker, string, string, error) {
	cfg := c.cfg
	mr := &cfg.ModelRouting
	var buf [maxModelName]byte
	var lower []byte
	lowered := false
	lowerName := func() []byte {
		if !lowered {
			lowered = true
			if len(name) <= len(buf) {
				lower = appendLower(buf[:0], name)
			} else {
				lower = appendLower(nil, name)
			}
		}
		return lower
	}
	canaryMatched := false
	if cfg.Canary.Enabled {
		var svc string
		if dst, svc, canaryMatched = s.canaryRoute(c, v, r, lowerName(), now, dst); svc != "" {
			return dst, byService, svc, nil
		}
	}
	if !mr.Enabled {
		return s.routeExact(c, v, r, name, dst)
	}
	for i := range c.mappings {
		m := &c.mappings[i]
		if !globMatch(m.pat, lowerName()) {
			continue
		}
		for _, svc := range m.services {
			dst = appendRole(dst, v.ByService[svc], r)
		}
		if len(dst) == 0 {
			return dst, "", "", fmt.Errorf("%w: model %q is mapped to services %v, none has a routable worker", ErrNoWorkers, name, m.services)
		}
		return dst, byService, "", nil
	}
	if len(name) == 0 {
		return appendRole(dst, v.Routable, r), "", "", nil
	}
	mi := s.modelIndex(v)
	if model := mi.resolve(name, mr.FuzzyMatch); model != "" {
		if cfg.Canary.Enabled && !canaryMatched {
			// Another notation of a served model (or its abbreviation,
			// org prefix, wildcard) is that model: its canary rule splits
			// it as it splits the model's own name.
			var mb [maxModelName]byte
			if ml := appendLower(mb[:0], model); string(ml) != string(lowerName()) {
				var svc string
				if dst, svc, _ = s.canaryRoute(c, v, r, ml, now, dst); svc != "" {
					return dst, byService, svc, nil
				}
			}
		}
		return appendRole(dst, v.ByModel[model], r), model, "", nil
	}
	if len(c.defaultModel) > 0 && string(name) != mr.DefaultModel {
		// An unmatched name is served as the default model is: by its
		// canary rule or model mapping (an alias), else the model it names.
		if ws, model, svc, err := s.routeName(c, v, r, c.defaultModel, now, dst); !errors.Is(err, ErrUnknownModel) {
			return ws, model, svc, err
		}
	}
	return dst, "", "", s.unknownModel(c, v, name)
}

// canaryRoute runs c's canary rules for the lower-cased model name: the
// first rule matching it decides, appending its chosen service's workers
// to dst, unless none of its services has a routable worker (svc is "",
// matched true: model routing decides).
func (s *Scheduler) canaryRoute(c *compiled, v *fleet.View, r *Request, lower []byte, now int64, dst []*fleet.Worker) (ws []*fleet.Worker, svc string, matched bool) {
	rule := c.canaryRule(lower)
	if rule == nil {
		return dst, "", false
	}
	if svc := s.canaryService(c, rule, v, r, now); svc != "" {
		return appendRole(dst, v.ByService[svc], r), svc, true
	}
	s.m.canaryEmpty.Inc()
	return dst, "", true
}

// canaryRule returns the first canary rule of c matching the lower-cased
// name, or nil.
func (c *compiled) canaryRule(lower []byte) *canaryRule {
	for _, rule := range c.canary {
		if globMatch(rule.pat, lower) {
			return rule
		}
	}
	return nil
}

// errModelsPending answers a name no worker is known to serve while a
// routable worker's models are not known yet (a static worker listed
// without them, whose engine has not answered /v1/models: an engine
// started after the router): 503, which clients retry, not a 404 that
// would be wrong once the models are learned.
var errModelsPending = fmt.Errorf("%w: the models of a worker are not known yet", ErrNoWorkers)

// modelsPending reports a routable worker whose models are not known.
func modelsPending(v *fleet.View) bool {
	for _, w := range v.Routable {
		if len(w.Models) == 0 {
			return true
		}
	}
	return false
}

// ServedModel returns the served model another name resolves to under
// cfg's model routing: a fuzzy match or the default model (the default
// model's own name when a canary rule or a model mapping serves it; "" when
// name is served as it is, when a canary rule or a model mapping decides by
// service, or when nothing matches). A canary rule none of whose services
// has a routable worker does not decide, as in route: the model routing
// that then serves the name is what ServedModel answers. Access control
// checks it beside the name asked for (users[].models). It does not
// allocate for names up to 256 bytes.
func (s *Scheduler) ServedModel(cfg *config.Config, name []byte) string {
	mr := &cfg.ModelRouting
	if !mr.Enabled || len(name) > maxModelNameLen {
		return ""
	}
	v := s.Fleet.View()
	if len(v.ByModel[string(name)]) > 0 {
		return ""
	}
	c := s.compiled(cfg)
	var buf [maxModelName]byte
	var lower []byte
	if len(name) <= len(buf) {
		lower = appendLower(buf[:0], name)
	} else {
		lower = appendLower(nil, name)
	}
	if c.byRule(v, lower) {
		return ""
	}
	mi := s.modelIndex(v)
	if model := mi.resolve(name, mr.FuzzyMatch); model != "" {
		return model
	}
	if len(c.defaultModel) > 0 && string(name) != mr.DefaultModel {
		if c.byRule(v, c.defaultLower) {
			// The default model is an alias: a pattern that lets the name
			// through must not open it.
			return mr.DefaultModel
		}
		return mi.resolve(c.defaultModel, mr.FuzzyMatch)
	}
	return ""
}

// UnknownModel returns the error route gives a request for the model name
// when nothing serves it (an *UnknownModelError: 404; errModelsPending while
// a routable worker's models are not known), without picking a worker: no
// canary turn is taken and nothing is counted. nil when a canary rule, a
// model mapping, a served model (exact, another notation, fuzzy) or the
// default model takes the name, or when the fleet has no routable worker
// (route's ErrNoWorkers, not an unknown model). For answers the router makes
// itself for a model (count_tokens), which must not count a model the
// request path would refuse.
func (s *Scheduler) UnknownModel(cfg *config.Config, name []byte) error {
	v := s.Fleet.View()
	if len(v.Routable) == 0 {
		return nil
	}
	if len(name) > maxModelNameLen {
		return &UnknownModelError{Model: string(name[:64]) + "..."}
	}
	c := s.compiled(cfg)
	if len(name) == 0 && cfg.ModelRouting.Enabled && len(c.defaultModel) > 0 {
		name = c.defaultModel
	}
	if s.routes(c, v, name) {
		return nil
	}
	return s.unknownModel(c, v, name)
}

// routes reports whether routeName finds a route for name (workers or a
// service's refusal), as UnknownModel needs it.
func (s *Scheduler) routes(c *compiled, v *fleet.View, name []byte) bool {
	mr := &c.cfg.ModelRouting
	if c.byRule(v, appendLower(nil, name)) {
		return true
	}
	if len(name) == 0 {
		return true
	}
	if !mr.Enabled {
		return len(v.ByModel[string(name)]) > 0
	}
	if s.modelIndex(v).resolve(name, mr.FuzzyMatch) != "" {
		return true
	}
	if len(c.defaultModel) > 0 && string(name) != mr.DefaultModel {
		return s.routes(c, v, c.defaultModel)
	}
	return false
}

// DefaultModelWorkers returns the routable workers cfg's default model is
// served by, found as route finds them for an unmatched name (a canary
// rule or a model mapping of that name, else the served model it names
// exactly, in another notation or by fuzzy match); nil when model routing
// is off, there is no default model or none serves it. The capacity
// report advertises them as "*". It allocates: not for the request path.
func (s *Scheduler) DefaultModelWorkers(cfg *config.Config, v *fleet.View) []*fleet.Worker {
	mr := &cfg.ModelRouting
	if !mr.Enabled || mr.DefaultModel == "" {
		return nil
	}
	c := s.compiled(cfg)
	var ws []*fleet.Worker
	byServices := func(svcs []string) []*fleet.Worker {
		for _, svc := range svcs {
			ws = append(ws, v.ByService[svc]...)
		}
		return ws
	}
	if cfg.Canary.Enabled {
		for _, rule := range c.canary {
			if !globMatch(rule.pat, c.defaultLower) {
				continue
			}
			if rule.routable(v) {
				return byServices(rule.services)
			}
			break
		}
	}
	for i := range c.mappings {
		if globMatch(c.mappings[i].pat, c.defaultLower) {
			return byServices(c.mappings[i].services)
		}
	}
	if model := s.modelIndex(v).resolve(c.defaultModel, mr.FuzzyMatch); model != "" {
		if cfg.Canary.Enabled && c.canaryRule(c.defaultLower) == nil {
			// As route: the served model's canary rule splits it.
			if rule := c.canaryRule(appendLower(nil, model)); rule != nil && rule.routable(v) {
				return byServices(rule.services)
			}
		}
		return v.ByModel[model]
	}
	return nil
}

// byRule reports whether a canary rule or a model mapping routes the
// (lower-cased) name by service, as route does: a canary rule none of
// whose targets has a routable worker does not decide (route falls
// through to model routing).
func (c *compiled) byRule(v *fleet.View, lower []byte) bool {
	if c.cfg.Canary.Enabled {
		for _, rule := range c.canary {
			if !globMatch(rule.pat, lower) {
				continue
			}
			if rule.routable(v) {
				return true
			}
			break
		}
	}
	if c.cfg.ModelRouting.Enabled {
		for i := range c.mappings {
			if globMatch(c.mappings[i].pat, lower) {
				return true
			}
		}
	}
	return false
}

// appendRole appends ws (every role: the PD legs' roles are kept by
// candidates, pd.go).
func appendRole(dst, ws []*fleet.Worker, r *Request) []*fleet.Worker {
	return append(dst, ws...)
}

// unknownModel is the error for a name no worker serves: ErrUnknownModel
// (404), or errModelsPending while a routable worker's models are not known.
func (s *Scheduler) unknownModel(c *compiled, v *fleet.View, name []byte) error {
	if modelsPending(v) {
		return errModelsPending
	}
	return &UnknownModelError{Model: string(name), Close: closeNames(s.Models(c.cfg, v), string(name), 5)}
}

// Models returns what a client may ask for under cfg, sorted: the models
// routable workers serve, the default model, the plain (wildcard-free)
// names of model mappings and canary rules whose services have routable
// workers, and smart model selection's plain match_models names when one
// of its tiers' models is among them. GET /v1/models lists these.
func (s *Scheduler) Models(cfg *config.Config, v *fleet.View) []string {
	seen := map[string]bool{}
	var out []string
	add := func(m string) {
		if m != "" && !seen[m] {
			seen[m] = true
			out = append(out, m)
		}
	}
	for _, m := range v.Models {
		add(m)
	}
	hasWorkers := func(svcs []string) bool {
		for _, svc := range svcs {
			if len(v.ByService[svc]) > 0 {
				return true
			}
		}
		return false
	}
	if cfg.ModelRouting.Enabled {
		if dm := cfg.ModelRouting.DefaultModel; dm != "" && s.modelIndex(v).resolve([]byte(dm), cfg.ModelRouting.FuzzyMatch) != "" {
			add(dm)
		}
		for _, m := range cfg.ModelRouting.Mappings {
			if !strings.Contains(m.Pattern, "*") && hasWorkers(m.Services) {
				add(m.Pattern)
			}
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
			// The name the rule matches: its pattern is trimmed.
			if m := strings.TrimSpace(r.Model); !strings.Contains(m, "*") && hasWorkers(svcs) {
				add(m)
			}
		}
	}
	if sm := &cfg.SmartModelSelection; sm.Enabled && len(sm.MatchModels) > 0 {
		// A smart-selection name ("auto") is a model a client may ask for
		// once one of its tiers' models is: clients pick from this list.
		served := false
		for _, t := range [...]string{sm.Tiers.L1, sm.Tiers.L2, sm.Tiers.L3} {
			if t != "" && (seen[t] || cfg.ModelRouting.Enabled && s.modelIndex(v).resolve([]byte(t), cfg.ModelRouting.FuzzyMatch) != "") {
				served = true
			}
		}
		for _, p := range sm.MatchModels {
			if served && !strings.Contains(p, "*") {
				add(p)
			}
		}
	}
	sort.Strings(out)
	return out
}

// byService is route's resolved model when a mapping or a canary rule
// chose the candidates by their service (no worker serves such a name).
const byService = "\x00service"

// modelFor returns the name the chosen worker serves for this request:
// resolved when w serves it, the requested name (exactly or in another
// notation), the worker's only model, or, when a mapping or a canary rule
// chose the worker by its service, the service's model (the name asked
// for is an alias); "" when unknown.
func modelFor(w *fleet.Worker, resolved string, req []byte) string {
	if resolved != "" && resolved != byService {
		for _, m := range w.Models {
			if m == resolved {
				return m
			}
		}
	}
	if m := notationOf(w, req); m != "" {
		return m
	}
	if len(w.Models) == 1 {
		return w.Models[0]
	}
	if resolved == byService && len(w.Models) > 0 {
		// A worker serving several models (served names, LoRA adapters):
		// its service's, which is its first model unless set otherwise.
		for _, m := range w.Models {
			if m == w.Service {
				return m
			}
		}
		return w.Models[0]
	}
	return ""
}

// directModel returns the model to forward to w, the worker router mode
// direct named, for the requested name: the model routing would have w
// serve when it routes the name to w (the name in another notation, a
// fuzzy match, an alias of w's service, the default model); otherwise the
// name as w serves it in another notation, else "" (forwarded as asked).
// The picker is trusted with the worker, not with the model: a worker
// that does not serve the name gets it as asked, and its engine answers
// for it. It used to get its own only model in its place, so a request
// for a model no worker serves, or one the user may not call, was served
// by whatever single-model worker the header named
// (TestADirectWorkerIsNotHandedAModelItDoesNotServe).
func (s *Scheduler) directModel(c *compiled, v *fleet.View, w *fleet.Worker, name []byte) string {
	if len(name) <= maxModelNameLen {
		n := name
		if len(n) == 0 && c.cfg.ModelRouting.Enabled {
			n = c.defaultModel
		}
		if resolved, ok := s.routesTo(c, v, w, n); ok {
			return modelFor(w, resolved, name)
		}
	}
	return notationOf(w, name)
}

// Serving appends to dst the routable workers route may send the model
// name to under cfg (the default model's when name is empty): a canary
// rule's or a model mapping's services' workers (an alias), else those of
// the served model it names (exactly, in another notation, by fuzzy
// match), else the default model's; dst when none. It decides as route
// does (routesTo), without taking a canary rule's turn. It costs a pass
// over the fleet: not for every request (a background Response's
// estimate asks it).
func (s *Scheduler) Serving(cfg *config.Config, name []byte, dst []*fleet.Worker) []*fleet.Worker {
	if len(name) > maxModelNameLen {
		return dst
	}
	v := s.Fleet.View()
	c := s.compiled(cfg)
	if len(name) == 0 && cfg.ModelRouting.Enabled {
		name = c.defaultModel
	}
	for _, w := range v.Routable {
		if _, ok := s.routesTo(c, v, w, name); ok {
			dst = append(dst, w)
		}
	}
	return dst
}

// routesTo reports whether route sends the name to w among its
// candidates, and the model it resolves (as route's), without advancing
// a canary rule's sequence.
func (s *Scheduler) routesTo(c *compiled, v *fleet.View, w *fleet.Worker, name []byte) (string, bool) {
	cfg := c.cfg
	mr := &cfg.ModelRouting
	var buf [maxModelName]byte
	var lower []byte
	if len(name) <= len(buf) {
		lower = appendLower(buf[:0], name)
	} else {
		lower = appendLower(nil, name)
	}
	canaryMatched := false
	if cfg.Canary.Enabled {
		if rule := c.canaryRule(lower); rule != nil {
			if rule.routable(v) {
				return byService, slices.Contains(rule.services, w.Service)
			}
			canaryMatched = true
		}
	}
	if !mr.Enabled {
		return "", len(name) == 0 || slices.Contains(v.ByModel[string(name)], w)
	}
	for i := range c.mappings {
		if globMatch(c.mappings[i].pat, lower) {
			return byService, slices.Contains(c.mappings[i].services, w.Service)
		}
	}
	if len(name) == 0 {
		return "", true
	}
	if model := s.modelIndex(v).resolve(name, mr.FuzzyMatch); model != "" {
		if cfg.Canary.Enabled && !canaryMatched {
			// As route: the served model's canary rule splits it.
			var mb [maxModelName]byte
			if ml := appendLower(mb[:0], model); string(ml) != string(lower) {
				if rule := c.canaryRule(ml); rule != nil && rule.routable(v) {
					return byService, slices.Contains(rule.services, w.Service)
				}
			}
		}
		return model, slices.Contains(w.Models, model)
	}
	if len(c.defaultModel) > 0 && string(name) != mr.DefaultModel {
		return s.routesTo(c, v, w, c.defaultModel)
	}
	return "", false
}

// notationOf returns w's model that is req exactly or in another notation
// (case and separators ignored, org prefix too), or "".
func notationOf(w *fleet.Worker, req []byte) string {
	for _, m := range w.Models {
		if m == string(req) {
			return m
		}
	}
	if len(req) > 0 && len(req) <= maxModelName {
		var a, b [maxModelName]byte
		rq := appendCollapsed(a[:0], req, true)
		for _, m := range w.Models {
			if len(m) <= maxModelName && string(appendCollapsed(b[:0], m, true)) == string(rq) {
				return m
			}
		}
	}
	return ""
}

// modelIndex holds normalized forms of a view's models, built once per view.
type modelIndex struct {
	v *fleet.View
	// strict maps the case/separator-insensitive form to a model.
	strict map[string]string
	// loose maps the form that also ignores an org prefix to a model.
	loose map[string]string
	// canon holds each model's org-stripped canonical form (lower case,
	// separator runs as '-') for abbreviation matching, sorted like v.Models.
	canon []string
}

func (s *Scheduler) modelIndex(v *fleet.View) *modelIndex {
	if mi := s.mi.Load(); mi != nil && mi.v == v {
		return mi
	}
	mi := &modelIndex{v: v, strict: map[string]string{}, loose: map[string]string{}}
	for _, m := range v.Models { // sorted: the first model wins a collision
		k := string(appendCollapsed(nil, m, false))
		if _, ok := mi.strict[k]; !ok {
			mi.strict[k] = m
		}
		k = string(appendCollapsed(nil, m, true))
		if _, ok := mi.loose[k]; !ok {
			mi.loose[k] = m
		}
		mi.canon = append(mi.canon, string(appendCanon(nil, stripOrg(m))))
	}
	s.mi.Store(mi)
	return mi
}

// resolve maps a requested model name to a served model, or "".
//
// Always: exact name, then the same name in another notation (case and
// separators '-', '_', ' ' ignored). With fuzzy on, also: ① an org prefix
// ("Qwen/") is ignored, ② an abbreviation matches the full deployment name
// when its tokens are a leading run of the deployment's tokens (qwen2.5-72b
// -> Qwen2.5-72B-Instruct; the shortest such name wins, then the first in
// sort order), ③ a name with '*' is an anchored, case-insensitive wildcard
// (the first matching model in sort order).
func (mi *modelIndex) resolve(name []byte, fuzzy bool) string {
	if ws := mi.v.ByModel[string(name)]; len(ws) > 0 {
		return firstServed(ws, name)
	}
	if len(name) > maxModelName {
		return ""
	}
	var buf [maxModelName]byte
	if m, ok := mi.strict[string(appendCollapsed(buf[:0], name, false))]; ok {
		return m
	}
	if !fuzzy {
		return ""
	}
	if m, ok := mi.loose[string(appendCollapsed(buf[:0], name, true))]; ok {
		return m
	}
	if hasStar(name) {
		low := appendLower(buf[:0], name)
		for _, m := range mi.v.Models {
			if globMatchString(low, m) || globMatchString(low, stripOrg(m)) {
				return m
			}
		}
		return ""
	}
	cn := appendCanon(buf[:0], stripOrgBytes(name))
	if len(cn) == 0 {
		return ""
	}
	best := -1
	for i, c := range mi.canon {
		if len(c) > len(cn) && c[len(cn)] == '-' && c[:len(cn)] == string(cn) {
			if best < 0 || len(c) < len(mi.canon[best]) {
				best = i
			}
		}
	}
	if best >= 0 {
		return mi.v.Models[best]
	}
	return ""
}

func firstServed(ws []*fleet.Worker, name []byte) string {
	for _, m := range ws[0].Models {
		if m == string(name) {
			return m
		}
	}
	return ""
}

func hasStar(b []byte) bool {
	for _, c := range b {
		if c == '*' {
			return true
		}
	}
	return false
}

func isSep(c byte) bool { return c == '-' || c == '_' || c == ' ' }

func lowerByte(c byte) byte {
	if 'A' <= c && c <= 'Z' {
		return c + 'a' - 'A'
	}
	return c
}

func lowerASCII(s string) string { return string(appendLower(nil, []byte(s))) }

func appendLower[T string | []byte](dst []byte, s T) []byte {
	for i := 0; i < len(s); i++ {
		dst = append(dst, lowerByte(s[i]))
	}
	return dst
}

// appendCollapsed appends s lower-cased without separators; with org it
// drops everything up to the last '/'.
func appendCollapsed[T string | []byte](dst []byte, s T, org bool) []byte {
	start := 0
	if org {
		for i := len(s) - 1; i >= 0; i-- {
			if s[i] == '/' {
				start = i + 1
				break
			}
		}
	}
	for i := start; i < len(s); i++ {
		if !isSep(s[i]) {
			dst = append(dst, lowerByte(s[i]))
		}
	}
	return dst
}

// appendCanon appends s lower-cased with every separator run as one '-',
// trimmed.
func appendCanon[T string | []byte](dst []byte, s T) []byte {
	n0 := len(dst)
	sep := false
	for i := 0; i < len(s); i++ {
		c := s[i]
		if isSep(c) {
			sep = true
			continue
		}
		if sep && len(dst) > n0 {
			dst = append(dst, '-')
		}
		sep = false
		dst = append(dst, lowerByte(c))
	}
	return dst
}

func stripOrg(s string) string {
	if i := strings.LastIndexByte(s, '/'); i >= 0 {
		return s[i+1:]
	}
	return s
}

func stripOrgBytes(b []byte) []byte {
	for i := len(b) - 1; i >= 0; i-- {
		if b[i] == '/' {
			return b[i+1:]
		}
	}
	return b
}

// globMatch reports whether the lower-cased pattern p ('*' matches any run,
// anchored at both ends) matches the lower-cased s.
func globMatch(p string, s []byte) bool {
	pi, si := 0, 0
	star, mark := -1, 0
	for si < len(s) {
		switch {
		case pi < len(p) && p[pi] == '*':
			star, mark = pi, si
			pi++
		case pi < len(p) && p[pi] == s[si]:
			pi++
			si++
		case star >= 0:
			pi = star + 1
			mark++
			si = mark
		default:
			return false
		}
	}
	for pi < len(p) && p[pi] == '*' {
		pi++
	}
	return pi == len(p)
}

// globMatchString matches the lower-cased pattern p against s, folding s's
// ASCII case.
func globMatchString(p []byte, s string) bool {
	var buf [maxModelName]byte
	if len(s) > len(buf) {
		return globMatch(string(p), appendLower(nil, s))
	}
	return globMatch(string(p), appendLower(buf[:0], s))
}

// closeNames returns up to n names resembling name, closest first: same
// collapsed form, one containing the other, or a small edit distance.
func closeNames(names []string, name string, n int) []string {
	q := string(appendCollapsed(nil, name, true))
	if len(q) > 512 {
		q = q[:512]
	}
	type cand struct {
		name string
		dist int
	}
	var cs []cand
	for _, m := range names {
		c := string(appendCollapsed(nil, m, true))
		if len(c) > 512 {
			c = c[:512]
		}
		d := editDistance(q, c)
		if strings.Contains(c, q) || strings.Contains(q, c) {
			d = min(d, 1)
		}
		if d <= max(3, len(q)/3) {
			cs = append(cs, cand{m, d})
		}
	}
	sort.SliceStable(cs, func(i, j int) bool { return cs[i].dist < cs[j].dist })
	out := make([]string, 0, min(n, len(cs)))
	for i := 0; i < len(cs) && i < n; i++ {
		out = append(out, cs[i].name)
	}
	return out
}

// editDistance is the Levenshtein distance between a and b (bytes).
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
