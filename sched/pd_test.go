package sched

import (
	"encoding/json"
	"errors"
	"fmt"
	"testing"

	"github.com/infera/infera/config"
	"github.com/infera/infera/fleet"
)

// pdRec describes a prefill or decode worker serving m.
func pdRec(id, role, mode string, models ...string) fleet.Record {
	r := rec(id, "", models...)
	r.Role = role
	if mode != "" {
		r.Bootstrap = json.RawMessage(`{"pd_mode":"` + mode + `","bootstrap_port":8998}`)
	}
	return r
}

// pair picks both legs of r as the proxy does: Topology, then the prefill
// lease, then the decode lease paired with it. The leases are ended.
func pair(t *testing.T, s *Scheduler, cfg *config.Config, r *Request) (p, d Decision) {
	t.Helper()
	scratch := make([]*fleet.Worker, 0, 16)
	top, err := s.Topology(cfg, r, scratch)
	if err != nil {
		t.Fatalf("topology: %v", err)
	}
	if top != TopologyPD {
		t.Fatalf("topology %s, want pd", top)
	}
	var pl, dl Lease
	r.SetLeg(LegPrefill, nil)
	if err := s.Acquire(cfg, r, scratch, &pl); err != nil {
		t.Fatalf("prefill leg: %v", err)
	}
	r.SetLeg(LegDecode, pl.Worker)
	if err := s.Acquire(cfg, r, scratch, &dl); err != nil {
		pl.Done(OutcomeNeutral)
		t.Fatalf("decode leg: %v", err)
	}
	p, d = pl.Decision, dl.Decision
	pl.Done(OutcomeSuccess)
	dl.Done(OutcomeSuccess)
	return p, d
}

func TestTopologyOfAMixedFleetCostsNothingAndRoutesAsBefore(t *testing.T) {
	s, _ := newTestSched(t, rec("a", "", "m"), rec("b", "", "m"))
	cfg := config.Default()
	r := &Request{Model: []byte("m")}
	top, err := s.Topology(cfg, r, nil)
	if err != nil || top != TopologyMixed || r.pd.routed {
		t.Fatalf("topology %s err %v routed %v", top, err, r.pd.routed)
	}
	if d := pick(t, s, cfg, r); d.Leg != LegMixed || (d.Worker.ID != "a" && d.Worker.ID != "b") {
		t.Fatalf("decision %+v", d)
	}
}

// A model whose candidates include a prefill and a decode worker is served
// by a pair; a model with only mixed workers (or an incomplete pair) by a
// mixed worker, never by a prefill or decode worker.
func TestTopologyIsChosenPerModelFromItsCandidates(t *testing.T) {
	s, _ := newTestSched(t,
		rec("mx", "", "m", "solo"), pdRec("p0", "prefill", "vllm", "m", "half"), pdRec("d0", "decode", "", "m"))
	cfg := config.Default()
	p, d := pair(t, s, cfg, &Request{Model: []byte("m")})
	if p.Worker.ID != "p0" || d.Worker.ID != "d0" || p.Leg != LegPrefill || d.Leg != LegDecode {
		t.Fatalf("pair %s/%s legs %s/%s", p.Worker.ID, d.Worker.ID, p.Leg, d.Leg)
	}
	for _, model := range []string{"solo", "half"} {
		r := &Request{Model: []byte(model)}
		top, err := s.Topology(cfg, r, nil)
		if top != TopologyMixed {
			t.Fatalf("%s: topology %s", model, top)
		}
		var l Lease
		err2 := s.Acquire(cfg, r, make([]*fleet.Worker, 0, 4), &l)
		switch model {
		case "solo":
			if err != nil || err2 != nil || l.Worker.ID != "mx" {
				t.Fatalf("solo: %v %v %+v", err, err2, l.Decision)
			}
			l.Done(OutcomeSuccess)
		case "half":
			// Only a prefill worker: no pair and no mixed worker.
			if err != nil || !errors.Is(err2, ErrNoWorkers) {
				t.Fatalf("half: topology err %v, acquire err %v", err, err2)
			}
		}
	}
	if _, err := s.Topology(cfg, &Request{Model: []byte("nope")}, nil); !errors.Is(err, ErrUnknownModel) {
		t.Fatalf("unknown model: %v", err)
	}
}

// A fleet that gains a prefill and a decode worker switches topology on the
// next request, and back when they leave.
func TestTopologyFollowsTheFleet(t *testing.T) {
	s, _ := newTestSched(t, rec("mx", "", "m"))
	cfg := cfgWith(t, func(c *config.Config) { c.PD.Mode = "sglang" })
	top := func() Topology {
		t.Helper()
		top, err := s.Topology(cfg, &Request{Model: []byte("m")}, nil)
		if err != nil {
			t.Fatal(err)
		}
		return top
	}
	if top() != TopologyMixed {
		t.Fatal("mixed fleet served by a pair")
	}
	s.Fleet.Upsert(pdRec("p0", "prefill", "", "m"))
	if top() != TopologyMixed {
		t.Fatal("prefill worker alone made a pair")
	}
	s.Fleet.Upsert(pdRec("d0", "decode", "", "m"))
	if top() != TopologyPD {
		t.Fatal("the fleet gained a pair but requests stay mixed")
	}
	s.Fleet.Remove("d0")
	if top() != TopologyMixed {
		t.Fatal("the pair left but requests still go to it")
	}
}

func TestPDModeComesFromConfigOrThePrefillRecord(t *testing.T) {
	s, _ := newTestSched(t, pdRec("p0", "prefill", "vllm", "m"), pdRec("d0", "decode", "", "m"),
		pdRec("p1", "prefill", "", "x"), pdRec("d1", "decode", "", "x"))
	f := func(mode, model string, want PDMode) {
		t.Helper()
		cfg := cfgWith(t, func(c *config.Config) { c.PD.Mode = mode })
		r := &Request{Model: []byte(model)}
		top, err := s.Topology(cfg, r, nil)
		if want == PDModeUnknown {
			var me *PDModeError
			if !errors.As(err, &me) || me.Worker != "p1" || me.HTTPStatus() != 503 || !errors.Is(err, ErrNoWorkers) {
				t.Fatalf("mode %q model %s: err %v", mode, model, err)
			}
			return
		}
		if err != nil || top != TopologyPD || r.PDMode() != want {
			t.Fatalf("mode %q model %s: %s %v %s", mode, model, top, err, r.PDMode())
		}
	}
	f("", "m", PDModeVLLM)
	f("sglang", "m", PDModeSGLang) // the setting wins over the record
	f("vllm", "x", PDModeVLLM)
	f("", "x", PDModeUnknown)
}

// Without pd.mode, the mode is the first prefill worker's (by id) that
// says one, and only prefill workers of that mode take the request: one
// without a mode first by id failed every request (503 naming it) though
// another could serve, and one of another mode got the first's protocol.
func TestPDModeFromRecordsSkipsPrefillWorkersOfAnotherOrNoMode(t *testing.T) {
	for _, c := range []struct {
		p0, p1 string
		want   PDMode
		only   string
	}{{"", "vllm", PDModeVLLM, "p1"}, {"sglang", "vllm", PDModeSGLang, "p0"}} {
		s, _ := newTestSched(t, pdRec("p0", "prefill", c.p0, "m"), pdRec("p1", "prefill", c.p1, "m"), pdRec("d0", "decode", "", "m"))
		cfg := cfgWith(t, nil)
		for i := 0; i < 4; i++ {
			r := &Request{Model: []byte("m")}
			p, _ := pair(t, s, cfg, r)
			if r.PDMode() != c.want || p.Worker.ID != c.only {
				t.Fatalf("p0 %q, p1 %q: mode %s, prefill %s; want %s on %s", c.p0, c.p1, r.PDMode(), p.Worker.ID, c.want, c.only)
			}
		}
	}
}

// The primary pipeline picks the prefill worker (here by prefix cache), the
// decode policy the decode worker; the prompt is indexed for the prefill
// worker only.
func TestPrefillByPrimaryPipelineDecodeByDecodePolicy(t *testing.T) {
	s, _ := newTestSched(t,
		pdRec("p0", "prefill", "", "m"), pdRec("p1", "prefill", "", "m"),
		pdRec("d0", "decode", "", "m"), pdRec("d1", "decode", "", "m"), pdRec("d2", "decode", "", "m"))
	cfg := cfgWith(t, func(c *config.Config) {
		c.PD.Mode = "vllm"
		c.PrefixCache.Enabled = true
		c.PD.DecodePolicy = "least-tokens"
	})
	v := s.Fleet.View()
	byID := func(id string) *fleet.Worker { return v.ByID([]byte(id)) }
	// d1 carries many tokens, d0 many requests: least-tokens avoids d1.
	byID("d1").Acquire(100000, 0, 1)
	byID("d0").Acquire(10, 0, 1)
	byID("d0").Acquire(10, 0, 1)
	long := prompt("the same system prompt ", 4096)
	p1, d1 := pair(t, s, cfg, &Request{Model: []byte("m"), Prompt: long, PromptTokens: 1024, MaxTokens: 10})
	if d1.Worker.ID == "d1" || d1.Layer != LayerLB {
		t.Fatalf("least-tokens chose %s by %s", d1.Worker.ID, d1.Layer)
	}
	for i := 0; i < 5; i++ {
		p, _ := pair(t, s, cfg, &Request{Model: []byte("m"), Prompt: long, PromptTokens: 1024, MaxTokens: 10})
		if p.Worker != p1.Worker || p.Layer != LayerPrefix {
			t.Fatalf("request %d: prefill %s by %s, want %s by prefix", i, p.Worker.ID, p.Layer, p1.Worker.ID)
		}
	}
	// round-robin spreads decodes evenly, least-requests follows requests.
	cfg = cfgWith(t, func(c *config.Config) { c.PD.Mode = "vllm"; c.PD.DecodePolicy = "round-robin" })
	seen := map[string]int{}
	for i := 0; i < 30; i++ {
		_, d := pair(t, s, cfg, &Request{Model: []byte("m")})
		seen[d.Worker.ID]++
	}
	if seen["d0"] != 10 || seen["d1"] != 10 || seen["d2"] != 10 {
		t.Fatalf("round-robin decodes %v", seen)
	}
	cfg = cfgWith(t, func(c *config.Config) { c.PD.Mode = "vllm"; c.PD.DecodePolicy = "least-requests" })
	byID("d1").Release(100000, 0, 1, false)
	byID("d2").Acquire(1, 0, 1)
	for i := 0; i < 4; i++ {
		if _, d := pair(t, s, cfg, &Request{Model: []byte("m")}); d.Worker.ID != "d1" {
			t.Fatalf("least-requests chose %s over the idle d1", d.Worker.ID)
		}
	}
	// Decode decisions are counted apart from the per-request layers.
	if n := s.pd.decode[LayerLB].Get(); n < 40 {
		t.Fatalf("decode decisions counted %d", n)
	}
}

// With the mode from the workers' records (pd.mode empty, the default),
// independent pairing applies to SGLang pairs: off, P[i] meets only its
// aligned decode workers; on, every decode worker.
func TestSGLangIndependentPairingFollowsTheRecordsMode(t *testing.T) {
	recs := []fleet.Record{pdRec("p-a", "prefill", "sglang", "m"), pdRec("p-b", "prefill", "sglang", "m")}
	for i := 0; i < 4; i++ {
		recs = append(recs, pdRec(fmt.Sprintf("d-%d", i), "decode", "sglang", "m"))
	}
	s, _ := newTestSched(t, recs...)
	s.Fleet.View().ByID([]byte("p-b")).Acquire(1, 1, 1) // the pipeline picks p-a
	for _, independent := range []bool{false, true} {
		cfg := cfgWith(t, func(c *config.Config) { c.PD.SGLangIndependentPairing = independent; c.PD.DecodePolicy = "round-robin" })
		met := map[string]bool{}
		for i := 0; i < 40; i++ {
			if p, d := pair(t, s, cfg, &Request{Model: []byte("m")}); p.Worker.ID == "p-a" {
				met[d.Worker.ID] = true
			}
		}
		if want := map[bool]int{false: 2, true: 4}[independent]; len(met) != want || (!independent && (!met["d-0"] || !met["d-2"])) {
			t.Fatalf("independent %v: p-a met %v", independent, met)
		}
	}
}

// Pairing by aligned index (SGLang, independent pairing off): P[i] pairs
// with D[j] when i mod k == j mod k, k = min(#P, #D), workers ordered by ID.
func TestSGLangPairingByAlignedIndex(t *testing.T) {
	recs := []fleet.Record{pdRec("p-a", "prefill", "", "m"), pdRec("p-b", "prefill", "", "m")}
	for i := 0; i < 6; i++ {
		recs = append(recs, pdRec(fmt.Sprintf("d-%d", i), "decode", "", "m"))
	}
	s, _ := newTestSched(t, recs...)
	aligned := cfgWith(t, func(c *config.Config) { c.PD.Mode = "sglang"; c.PD.DecodePolicy = "round-robin" })
	group := map[string]string{"d-0": "p-a", "d-2": "p-a", "d-4": "p-a", "d-1": "p-b", "d-3": "p-b", "d-5": "p-b"}
	seen := map[string]bool{}
	for i := 0; i < 60; i++ {
		p, d := pair(t, s, aligned, &Request{Model: []byte("m")})
		if group[d.Worker.ID] != p.Worker.ID {
			t.Fatalf("aligned pairing paired %s with %s", p.Worker.ID, d.Worker.ID)
		}
		seen[d.Worker.ID] = true
	}
	if len(seen) != 6 {
		t.Fatalf("decodes used %v, want all six", seen)
	}
	// Independent pairing: p-a (the less loaded prefill worker, so the
	// primary pipeline picks it every time) meets every decode worker.
	s.Fleet.View().ByID([]byte("p-b")).Acquire(1, 1, 1)
	free := cfgWith(t, func(c *config.Config) {
		c.PD.Mode = "sglang"
		c.PD.SGLangIndependentPairing = true
		c.PD.DecodePolicy = "round-robin"
	})
	met := map[string]bool{}
	for i := 0; i < 60; i++ {
		if p, d := pair(t, s, free, &Request{Model: []byte("m")}); p.Worker.ID == "p-a" {
			met[d.Worker.ID] = true
		}
	}
	if len(met) != 6 {
		t.Fatalf("independent pairing: p-a met %v", met)
	}
	met = map[string]bool{}
	for i := 0; i < 30; i++ {
		if p, d := pair(t, s, aligned, &Request{Model: []byte("m")}); p.Worker.ID == "p-a" {
			met[d.Worker.ID] = true
		}
	}
	if len(met) != 3 || !met["d-0"] || !met["d-2"] || !met["d-4"] {
		t.Fatalf("aligned pairing: p-a met %v, want d-0, d-2, d-4", met)
	}
	// vLLM ignores alignment (independent pairing is an SGLang setting).
	vllm := cfgWith(t, func(c *config.Config) { c.PD.Mode = "vllm"; c.PD.DecodePolicy = "round-robin" })
	met = map[string]bool{}
	for i := 0; i < 60; i++ {
		if p, d := pair(t, s, vllm, &Request{Model: []byte("m")}); p.Worker.ID == "p-a" {
			met[d.Worker.ID] = true
		}
	}
	if len(met) != 6 {
		t.Fatalf("vllm: p-a met %v", met)
	}

	s.Fleet.View().ByID([]byte("p-b")).Release(1, 1, 1, false)
	// Failover keeps the alignment: once p-a's decodes are all tried, only
	// p-b may serve the prefill leg.
	r := &Request{Model: []byte("m")}
	scratch := make([]*fleet.Worker, 0, 16)
	if top, err := s.Topology(aligned, r, scratch); top != TopologyPD || err != nil {
		t.Fatal(top, err)
	}
	v := s.Fleet.View()
	for _, id := range []string{"d-0", "d-2", "d-4"} {
		r.Tried = append(r.Tried, v.ByID([]byte(id)).Idx)
	}
	for i := 0; i < 4; i++ {
		var pl, dl Lease
		r.SetLeg(LegPrefill, nil)
		if err := s.Acquire(aligned, r, scratch, &pl); err != nil || pl.Worker.ID != "p-b" {
			t.Fatalf("prefill after p-a's decodes failed: %v %v", err, pl.Decision.Worker)
		}
		r.SetLeg(LegDecode, pl.Worker)
		if err := s.Acquire(aligned, r, scratch, &dl); err != nil || group[dl.Worker.ID] != "p-b" {
			t.Fatalf("decode: %v %v", err, dl.Decision.Worker)
		}
		pl.Done(OutcomeSuccess)
		dl.Done(OutcomeSuccess)
	}
	// With every decode tried there is no prefill left either.
	for _, id := range []string{"d-1", "d-3", "d-5"} {
		r.Tried = append(r.Tried, v.ByID([]byte(id)).Idx)
	}
	var pl Lease
	r.SetLeg(LegPrefill, nil)
	if err := s.Acquire(aligned, r, scratch, &pl); !errors.Is(err, ErrNoWorkers) {
		t.Fatalf("all decodes tried: %v", err)
	}
}

// Router mode direct: x-worker-instance-id names the decode (or mixed)
// worker, x-prefill-instance-id the prefill worker; each falls back to the
// policy when absent or unusable.
func TestDirectModeNamesEachLeg(t *testing.T) {
	s, _ := newTestSched(t, rec("mx", "", "m"),
		pdRec("p0", "prefill", "", "m"), pdRec("p1", "prefill", "", "m"),
		pdRec("d0", "decode", "", "m"), pdRec("d1", "decode", "", "m"))
	s.Mode = ModeDirect
	cfg := cfgWith(t, func(c *config.Config) { c.PD.Mode = "sglang" }) // aligned: p0-d0, p1-d1
	v := s.Fleet.View()
	// Both headers, against the alignment: the headers win.
	p, d := pair(t, s, cfg, &Request{Model: []byte("m"), DirectWorker: []byte("d0"), DirectPrefill: []byte("p1")})
	if p.Worker.ID != "p1" || d.Worker.ID != "d0" || p.Layer != LayerDirect || d.Layer != LayerDirect {
		t.Fatalf("both headers: %s by %s, %s by %s", p.Worker.ID, p.Layer, d.Worker.ID, d.Layer)
	}
	// Only the decode header: the prefill by policy, among the named decode
	// worker's aligned prefill workers (p0, though p1 is less loaded).
	v.ByID([]byte("p0")).Acquire(1, 1, 1)
	p, d = pair(t, s, cfg, &Request{Model: []byte("m"), DirectWorker: []byte("d0")})
	if p.Worker.ID != "p0" || p.Layer != LayerLB || d.Worker.ID != "d0" || d.Layer != LayerDirect {
		t.Fatalf("decode header: %s by %s, %s by %s", p.Worker.ID, p.Layer, d.Worker.ID, d.Layer)
	}
	// With independent pairing the policy is free: the less loaded p1.
	free := cfgWith(t, func(c *config.Config) { c.PD.Mode = "sglang"; c.PD.SGLangIndependentPairing = true })
	if p, _ = pair(t, s, free, &Request{Model: []byte("m"), DirectWorker: []byte("d0")}); p.Worker.ID != "p1" {
		t.Fatalf("decode header, independent pairing: prefill %s", p.Worker.ID)
	}
	// Only the prefill header: the decode by policy, aligned with p0.
	p, d = pair(t, s, cfg, &Request{Model: []byte("m"), DirectPrefill: []byte("p0")})
	if p.Worker.ID != "p0" || p.Layer != LayerDirect || d.Worker.ID != "d0" || d.Layer != LayerLB {
		t.Fatalf("prefill header: %s by %s, %s by %s", p.Worker.ID, p.Layer, d.Worker.ID, d.Layer)
	}
	// A header naming a mixed worker: mixed topology, that worker.
	r := &Request{Model: []byte("m"), DirectWorker: []byte("mx")}
	if top, err := s.Topology(cfg, r, nil); top != TopologyMixed || err != nil {
		t.Fatalf("mixed header: %s %v", top, err)
	}
	if d := pick(t, s, cfg, r); d.Worker.ID != "mx" || d.Layer != LayerDirect {
		t.Fatalf("mixed header: %s by %s", d.Worker.ID, d.Layer)
	}
	// Headers naming the wrong role or unknown workers fall back.
	p, d = pair(t, s, cfg, &Request{Model: []byte("m"), DirectWorker: []byte("p0"), DirectPrefill: []byte("d1")})
	if p.Layer == LayerDirect || d.Layer == LayerDirect || p.Worker.Role != fleet.RolePrefill || d.Worker.Role != fleet.RoleDecode {
		t.Fatalf("wrong roles: %s by %s, %s by %s", p.Worker.ID, p.Layer, d.Worker.ID, d.Layer)
	}
	// A decode named for a model nobody serves still gets a named prefill.
	p, d = pair(t, s, cfg, &Request{Model: []byte("other"), DirectWorker: []byte("d1"), DirectPrefill: []byte("p1")})
	if p.Worker.ID != "p1" || d.Worker.ID != "d1" {
		t.Fatalf("direct pair for an unrouted model: %s %s", p.Worker.ID, d.Worker.ID)
	}
}

// Each leg's lease accounts its own work: the prefill worker the prompt
// and one token (its work ends at the transfer), the decode worker the
// prompt's KV and the output but no prefill.
func TestLegLeasesAccountTheirPhase(t *testing.T) {
	s, _ := newTestSched(t, pdRec("p0", "prefill", "", "m"), pdRec("d0", "decode", "", "m"))
	cfg := cfgWith(t, func(c *config.Config) { c.PD.Mode = "vllm" })
	r := &Request{Model: []byte("m"), PromptTokens: 100, MaxTokens: 50}
	scratch := make([]*fleet.Worker, 0, 4)
	if top, err := s.Topology(cfg, r, scratch); top != TopologyPD || err != nil {
		t.Fatal(top, err)
	}
	var pl, dl Lease
	r.SetLeg(LegPrefill, nil)
	if err := s.Acquire(cfg, r, scratch, &pl); err != nil {
		t.Fatal(err)
	}
	r.SetLeg(LegDecode, pl.Worker)
	if err := s.Acquire(cfg, r, scratch, &dl); err != nil {
		t.Fatal(err)
	}
	p, d := pl.Worker, dl.Worker
	load := func(w *fleet.Worker) [4]int64 {
		return [4]int64{w.Load.Requests.Load(), w.Load.Tokens.Load(), w.Load.PrefillTokens.Load(), w.Load.Blocks.Load()}
	}
	if got, want := load(p), [4]int64{1, 101, 100, 7}; got != want {
		t.Fatalf("prefill load %v, want %v", got, want)
	}
	if got, want := load(d), [4]int64{1, 150, 0, 10}; got != want {
		t.Fatalf("decode load %v, want %v", got, want)
	}
	if pl.Leg != LegPrefill || dl.Leg != LegDecode {
		t.Fatalf("lease legs %s %s", pl.Leg, dl.Leg)
	}
	pl.FirstToken()
	pl.Done(OutcomeSuccess) // the transfer: the prefill worker is free
	if got := load(p); got != [4]int64{} {
		t.Fatalf("prefill load after the transfer %v", got)
	}
	if got := load(d); got[0] != 1 {
		t.Fatalf("decode load after the transfer %v", got)
	}
	dl.FirstToken()
	dl.Done(OutcomeFault)
	if got := load(d); got != [4]int64{} || d.Breaker.State() != fleet.BreakerClosed {
		t.Fatalf("decode load after the end %v", got)
	}
}

// Model routing and canary rules run once per request: a 1:1 canary over
// two PD services gives both legs the same service.
func TestBothLegsComeFromOneRouting(t *testing.T) {
	mk := func(id, role, svc string) fleet.Record {
		r := pdRec(id, role, "", "m")
		r.Service = svc
		return r
	}
	s, _ := newTestSched(t, mk("a-p", "prefill", "a"), mk("a-d", "decode", "a"), mk("b-p", "prefill", "b"), mk("b-d", "decode", "b"))
	cfg := cfgWith(t, func(c *config.Config) {
		c.PD.Mode = "vllm"
		c.Canary.Enabled = true
		c.Canary.Rules = []config.CanaryRule{{Model: "m", Targets: []config.CanaryTarget{{Service: "a", Weight: 1}, {Service: "b", Weight: 1}}}}
	})
	n := map[string]int{}
	for i := 0; i < 20; i++ {
		p, d := pair(t, s, cfg, &Request{Model: []byte("m")})
		if p.Worker.Service != d.Worker.Service || p.Service != d.Service {
			t.Fatalf("request %d: prefill in %s, decode in %s", i, p.Worker.Service, d.Worker.Service)
		}
		n[p.Service]++
	}
	if n["a"] != 10 || n["b"] != 10 {
		t.Fatalf("canary split %v", n)
	}
}

// The breaker of each worker counts its own leg's faults: a decode worker
// that keeps failing opens and is avoided while its prefill workers stay
// closed.
func TestBreakersCountFaultsPerLeg(t *testing.T) {
	s, c := newTestSched(t, pdRec("p0", "prefill", "", "m"), pdRec("d0", "decode", "", "m"), pdRec("d1", "decode", "", "m"))
	cfg := cfgWith(t, func(c *config.Config) { c.PD.Mode = "vllm"; c.PD.DecodePolicy = "round-robin" })
	v := s.Fleet.View()
	d0 := v.ByID([]byte("d0"))
	scratch := make([]*fleet.Worker, 0, 4)
	for i := 0; i < 8; i++ {
		r := &Request{Model: []byte("m")}
		s.Topology(cfg, r, scratch)
		var pl, dl Lease
		r.SetLeg(LegPrefill, nil)
		if err := s.Acquire(cfg, r, scratch, &pl); err != nil {
			t.Fatal(err)
		}
		r.SetLeg(LegDecode, pl.Worker)
		if err := s.Acquire(cfg, r, scratch, &dl); err != nil {
			t.Fatal(err)
		}
		pl.Done(OutcomeSuccess)
		if dl.Worker == d0 {
			dl.Done(OutcomeFault)
		} else {
			dl.Done(OutcomeSuccess)
		}
	}
	if d0.Breaker.State() != fleet.BreakerOpen || v.ByID([]byte("p0")).Breaker.State() != fleet.BreakerClosed {
		t.Fatalf("breakers: d0 %d p0 %d", d0.Breaker.State(), v.ByID([]byte("p0")).Breaker.State())
	}
	for i := 0; i < 6; i++ {
		if _, d := pair(t, s, cfg, &Request{Model: []byte("m")}); d.Worker == d0 {
			t.Fatal("an open decode worker was chosen")
		}
	}
	c.add(2 * 1e9) // past the cooldown: d0 gets a probe again
	probed := false
	for i := 0; i < 6 && !probed; i++ {
		_, d := pair(t, s, cfg, &Request{Model: []byte("m")})
		probed = d.Worker == d0 && d.Probe
	}
	if !probed {
		t.Fatal("the open decode worker never got its probe")
	}
}

// Under aligned pairing, round-robin decode rotates within each prefill
// worker's group: prefill workers taken in turn must not each keep hitting
// the same decode worker (2 prefill, 4 decode: all 4 used evenly).
func TestAlignedRoundRobinRotatesPerGroup(t *testing.T) {
	s := pdBench(t, 2, 4)
	s.Policy = PolicyRoundRobin
	cfg := cfgWith(t, func(c *config.Config) { c.PD.Mode = "sglang"; c.PD.DecodePolicy = "round-robin" })
	n := map[string]int{}
	for i := 0; i < 40; i++ {
		_, d := pair(t, s, cfg, &Request{Model: []byte("m")})
		n[d.Worker.ID]++
	}
	if len(n) != 4 || n["d0000"] != 10 || n["d0001"] != 10 || n["d0002"] != 10 || n["d0003"] != 10 {
		t.Fatalf("decode legs %v, want 10 each", n)
	}
}

// A decode leg picked tentatively (request rate limiting: a pick handed
// back while the request waits for a seat, then picked again) is counted
// once, for the decision it is sent on (Commit), as the request's own
// decision is: infera_pd_decode_decisions_total counted every pick, 22 for
// 12 decode legs of which 10 had queued for a seat.
func TestADecodeLegPickedAgainForASeatIsCountedOnce(t *testing.T) {
	s, _ := newTestSched(t,
		pdRec("p0", "prefill", "", "m"), pdRec("d0", "decode", "", "m"), pdRec("d1", "decode", "", "m"))
	cfg := cfgWith(t, func(c *config.Config) { c.PD.Mode = "vllm" })
	count := func() (n uint64) {
		for _, c := range s.pd.decode {
			if c != nil {
				n += c.Get()
			}
		}
		return n
	}
	before := count()
	scratch := make([]*fleet.Worker, 0, 16)
	r := &Request{Model: []byte("m")}
	if top, err := s.Topology(cfg, r, scratch); err != nil || top != TopologyPD {
		t.Fatalf("topology %s, %v", top, err)
	}
	var pl, dl Lease
	r.SetLeg(LegPrefill, nil)
	if err := s.Acquire(cfg, r, scratch, &pl); err != nil {
		t.Fatal(err)
	}
	defer pl.Done(OutcomeSuccess)
	r.SetLeg(LegDecode, pl.Worker)
	r.Tentative = true
	for i := 0; i < 3; i++ { // picked, handed back (no seat yet), picked again
		if err := s.Acquire(cfg, r, scratch, &dl); err != nil {
			t.Fatal(err)
		}
		if i < 2 {
			dl.Done(OutcomeNeutral)
		}
	}
	s.Commit(cfg, r, &dl.Decision)
	r.Tentative = false
	dl.Done(OutcomeSuccess)
	if n := count() - before; n != 1 {
		t.Fatalf("one decode leg counted %d decode decisions", n)
	}
	// Without rate limiting (not tentative) each pick is sent: counted.
	r.SetLeg(LegDecode, pl.Worker)
	if err := s.Acquire(cfg, r, scratch, &dl); err != nil {
		t.Fatal(err)
	}
	dl.Done(OutcomeSuccess)
	if n := count() - before; n != 2 {
		t.Fatalf("two decode legs counted %d decode decisions", n)
	}
}

// Under aligned pairing, a prefill worker whose every decode worker has an
// open breaker is no candidate while another group has a decode worker
// that can take the leg: its prefill was picked, its decode leg sent to the
// open-breaker worker anyway (the all-open fallback of its group), and with
// a dead decode engine half the requests of a 2P2D fleet failed (503
// no_workers_reachable with --request-max-retries 0) though a healthy pair
// was there. When every group's decode workers are open, the pair is still
// tried, as every open candidate is.
func TestAlignedPairingAvoidsAGroupWhoseDecodeBreakersAreOpen(t *testing.T) {
	s, clk := newTestSched(t,
		pdRec("p0", "prefill", "", "m"), pdRec("p1", "prefill", "", "m"),
		pdRec("d0", "decode", "", "m"), pdRec("d1", "decode", "", "m"))
	_ = clk
	cfg := cfgWith(t, func(c *config.Config) { c.PD.Mode = "sglang"; c.LoadBalancing.Algorithm = "round-robin" })
	v := s.Fleet.View()
	d1 := v.ByID([]byte("d1"))
	for i := 0; i < 3; i++ {
		d1.Breaker.Failure(s.Now(), false)
	}
	if d1.Breaker.Available(s.Now()) {
		t.Fatal("d1's breaker did not open")
	}
	for i := 0; i < 10; i++ {
		p, d := pair(t, s, cfg, &Request{Model: []byte("m")})
		if p.Worker.ID != "p0" || d.Worker.ID != "d0" {
			t.Fatalf("request %d: paired %s with %s (by %s), want p0 with d0", i, p.Worker.ID, d.Worker.ID, d.Layer)
		}
	}
	d0 := v.ByID([]byte("d0"))
	for i := 0; i < 3; i++ {
		d0.Breaker.Failure(s.Now(), false)
	}
	seen := map[string]bool{}
	for i := 0; i < 10; i++ {
		p, d := pair(t, s, cfg, &Request{Model: []byte("m")})
		seen[p.Worker.ID+"/"+d.Worker.ID] = true
		if d.Reason != ReasonAllBreakersOpen {
			t.Fatalf("every decode breaker open: decode %s by %s (%v)", d.Worker.ID, d.Layer, d.Reason)
		}
	}
	if !seen["p0/d0"] || !seen["p1/d1"] || len(seen) != 2 {
		t.Fatalf("every decode breaker open: pairs %v, want both aligned pairs tried", seen)
	}
}

// A model served by mixed workers and by prefill/decode pairs goes to a
// mixed worker while every prefill or every decode candidate has an open
// breaker: every request went to the pair, its decode leg to the dead
// decode worker by the all-open fallback, and failed (12 of 12 answered
// 503 no_workers_reachable) while a healthy mixed worker stood idle. With
// the mixed workers' breakers open too, the pair is tried as before.
func TestTopologyGoesMixedWhileNoPairCanBeAdmitted(t *testing.T) {
	s, _ := newTestSched(t, rec("mx", "", "m"), pdRec("p0", "prefill", "", "m"), pdRec("d0", "decode", "", "m"))
	cfg := cfgWith(t, func(c *config.Config) { c.PD.Mode = "sglang" })
	top := func() Topology {
		t.Helper()
		top, err := s.Topology(cfg, &Request{Model: []byte("m")}, nil)
		if err != nil {
			t.Fatal(err)
		}
		return top
	}
	v := s.Fleet.View()
	trip := func(id string) {
		w := v.ByID([]byte(id))
		for i := 0; i < 3; i++ {
			w.Breaker.Failure(s.Now(), false)
		}
	}
	if top() != TopologyPD {
		t.Fatal("a healthy pair does not serve the request")
	}
	trip("d0")
	if top() != TopologyMixed {
		t.Fatal("every decode breaker open: the request still goes to the pair, not the healthy mixed worker")
	}
	trip("mx")
	if top() != TopologyPD {
		t.Fatal("every breaker open: the pair is no longer tried")
	}
}
