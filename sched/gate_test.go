package sched

import (
	"errors"
	"testing"
	"time"

	"github.com/infera/infera/config"
	"github.com/infera/infera/fleet"
)

// fullGate reports the workers in full as full and records what it was asked.
type fullGate struct {
	full  map[string]bool
	asked []string
}

func (g *fullGate) Full(w *fleet.Worker) bool {
	g.asked = append(g.asked, w.ID)
	return g.full[w.ID]
}

func TestGatePassesOverFullWorkersWhileAnotherIsOpen(t *testing.T) {
	s, _ := newTestSched(t, workers(3, "m")...)
	cfg := cfgWith(t, func(c *config.Config) { c.LoadBalancing.Algorithm = "round-robin" })
	g := &fullGate{full: map[string]bool{"w000": true, "w002": true}}
	for i := 0; i < 6; i++ {
		g.asked = g.asked[:0]
		r := &Request{Model: []byte("m"), Gate: g}
		if d := pick(t, s, cfg, r); d.Worker.ID != "w001" {
			t.Fatalf("pick %d chose %s, the only open worker is w001", i, d.Worker.ID)
		}
		if len(g.asked) != 3 {
			t.Fatalf("gate asked about %v, want each of the 3 candidates once", g.asked)
		}
	}
	// Tried workers are not candidates: the gate is not asked about them.
	g.asked = g.asked[:0]
	r := &Request{Model: []byte("m"), Gate: g, Tried: []int{s.Fleet.Get("w001").Idx}}
	d := pick(t, s, cfg, r)
	if d.Worker.ID == "w001" || len(g.asked) != 2 {
		t.Fatalf("chose %s, asked %v", d.Worker.ID, g.asked)
	}
	// Every candidate full: the gate is ignored, every worker may be chosen.
	g.full["w001"] = true
	seen := map[string]bool{}
	for i := 0; i < 6; i++ {
		seen[pick(t, s, cfg, &Request{Model: []byte("m"), Gate: g}).Worker.ID] = true
	}
	if len(seen) != 3 {
		t.Fatalf("with every worker full, round-robin chose only %v", seen)
	}
}

func TestGateIsClearedByReset(t *testing.T) {
	r := &Request{Gate: &fullGate{}, Tentative: true}
	r.Reset()
	if r.Gate != nil || r.Tentative {
		t.Fatal("Reset kept the gate or the tentative mark")
	}
}

// A strong-affinity session whose bound worker is full (its concurrency
// seats all taken) goes elsewhere for that request and stays bound: it was
// re-bound to the worker that took the request, for good.
func TestASessionsFullBoundWorkerKeepsTheBinding(t *testing.T) {
	s, _ := newTestSched(t, workers(2, "m")...)
	cfg := affCfg(t, func(sa *config.SessionAffinity) { sa.Mode = "strong" })
	req := func(g Gate) *Request {
		r := sess("s1")
		r.Gate = g
		return r
	}
	bound := pick(t, s, cfg, req(nil)).Worker
	g := &fullGate{full: map[string]bool{bound.ID: true}}
	if d := pick(t, s, cfg, req(g)); d.Worker == bound || d.Reason != ReasonAffinityOverload {
		t.Fatalf("with its bound worker full: %s (%s)", d.Worker.ID, d.Reason)
	}
	for i := 0; i < 3; i++ {
		if d := pick(t, s, cfg, req(nil)); d.Worker != bound || d.Reason != ReasonAffinityHit {
			t.Fatalf("after its bound worker was full once: %s (%s), want %s", d.Worker.ID, d.Reason, bound.ID)
		}
	}
}

// A tentative pick (request rate limiting: the lease may be handed back
// while the request waits for a seat) binds the session and records the
// prompt only when Commit says it was dispatched. A new session's first
// pick, every worker full, was handed back; the request then took a seat
// on the other worker. The handed-back pick used to bind the session and
// record the prompt: the pick that served the request saw a bound worker
// whose seats were full (affinity-overloaded: binding kept), so the
// session's next turn went to a worker that never saw it, and the prefix
// index claimed that worker held the prompt.
func TestATentativePickBindsAndRecordsOnlyWhenCommitted(t *testing.T) {
	s, _ := newTestSched(t, workers(2, "m")...)
	cfg := cfgWith(t, func(c *config.Config) {
		c.SessionAffinity.Enabled = true
		c.SessionAffinity.Mode = "strong"
		c.PrefixCache.Enabled = true
	})
	base := prompt("system prompt. ", 1024)
	v := s.Fleet.View()
	r := &Request{Model: []byte("m"), SessionID: []byte("s1"), Prompt: base, Tentative: true,
		Gate: &fullGate{full: map[string]bool{"w000": true, "w001": true}}}
	handedBack := pick(t, s, cfg, r).Worker
	served := v.Routable[0]
	if served == handedBack {
		served = v.Routable[1]
	}
	r.Gate = &fullGate{full: map[string]bool{handedBack.ID: true}} // the seat freed on the other
	d := pick(t, s, cfg, r)
	if d.Worker != served {
		t.Fatalf("the pick after the seat wait: %s (%s), want %s", d.Worker.ID, d.Reason, served.ID)
	}
	s.Commit(cfg, r, &d)
	if d := pick(t, s, cfg, sessPrompt("s1", base)); d.Worker != served || d.Reason != ReasonAffinityHit {
		t.Fatalf("the session's next turn: %s (%s), want %s, which served its first", d.Worker.ID, d.Reason, served.ID)
	}
	if d := pick(t, s, cfg, &Request{Model: []byte("m"), Prompt: base, Tried: []int{served.Idx}}); d.Layer == LayerPrefix {
		t.Fatalf("%s is a prefix hit: the handed-back pick's worker is recorded as holding the prompt", d.Worker.ID)
	}
	if d := pick(t, s, cfg, &Request{Model: []byte("m"), Prompt: base}); d.Worker != served || d.Layer != LayerPrefix {
		t.Fatalf("the prompt again: %s by %s, want %s by prefix (the committed pick records it)", d.Worker.ID, d.Layer, served.ID)
	}
}

func sessPrompt(id string, p []byte) *Request {
	return &Request{Model: []byte("m"), SessionID: []byte(id), Prompt: p}
}

// A preferred engine (Request.Prefer: a Responses follow-up's) that the
// gate finds full is chosen still: only it holds what the request names,
// and its caller waits for its seat. It was passed over for an open one.
func TestAPreferredWorkerTheGateFindsFullIsChosen(t *testing.T) {
	s, _ := newTestSched(t, workers(3, "m")...)
	cfg := cfgWith(t, func(c *config.Config) { c.LoadBalancing.Algorithm = "round-robin" })
	g := &fullGate{full: map[string]bool{"w000": true}}
	w0 := s.Fleet.Get("w000")
	for i := 0; i < 4; i++ {
		d := pick(t, s, cfg, &Request{Model: []byte("m"), Gate: g, Prefer: w0.Ref()})
		if d.Worker != w0 || d.Reason != ReasonAffinityHit {
			t.Fatalf("pick %d chose %s (%v), want the preferred full w000", i, d.Worker.ID, d.Reason)
		}
	}
	// Tried, it is not a candidate: the open ones are.
	if d := pick(t, s, cfg, &Request{Model: []byte("m"), Gate: g, Prefer: w0.Ref(), Tried: []int{w0.Idx}}); d.Worker == w0 {
		t.Fatal("a tried preferred worker was chosen")
	}
}

// probeGate takes w's probe slot when it is asked about w: another request
// won the half-open trial between the candidate filter and Admit.
type probeGate struct {
	w   *fleet.Worker
	now func() int64
}

func (g *probeGate) Full(w *fleet.Worker) bool {
	if w == g.w {
		g.w.Breaker.Admit(g.now())
	}
	return false
}

// A preferred engine (Request.Prefer) whose breaker is half-open with its
// one trial slot taken by another request is not replaced by another
// engine (which cannot hold what the request names): Pick fails with
// ErrPreferredOnTrial, whether the trial was taken before this pick or
// during it. It was re-picked by load.
func TestAPreferredWorkerOnTrialIsNotReplaced(t *testing.T) {
	s, c := newTestSched(t, workers(3, "m")...)
	cfg := cfgWith(t, func(c *config.Config) { c.LoadBalancing.Algorithm = "round-robin" })
	w0 := s.Fleet.Get("w000")
	for i := 0; i < 3; i++ { // threshold 3
		w0.Breaker.Failure(s.Now(), false)
	}
	c.add(2 * time.Second) // past the cooldown: the next pick of w0 is its trial
	// Taken during the pick.
	_, err := s.Pick(cfg, &Request{Model: []byte("m"), Prefer: w0.Ref(), Gate: &probeGate{w: w0, now: s.Now}}, make([]*fleet.Worker, 0, 8))
	if !errors.Is(err, ErrPreferredOnTrial) {
		t.Fatalf("trial taken during the pick: %v, want ErrPreferredOnTrial", err)
	}
	// Taken before it (w0 half-open).
	for i := 0; i < 3; i++ {
		if _, err := s.Pick(cfg, &Request{Model: []byte("m"), Prefer: w0.Ref()}, make([]*fleet.Worker, 0, 8)); !errors.Is(err, ErrPreferredOnTrial) {
			t.Fatalf("pick %d: %v, want ErrPreferredOnTrial", i, err)
		}
	}
	// A request that prefers no engine goes to another one.
	if d := pick(t, s, cfg, &Request{Model: []byte("m")}); d.Worker == w0 {
		t.Fatal("w0 on trial was chosen")
	}
	// The trial succeeds: w0 is preferred again.
	w0.Breaker.Success(true)
	if d := pick(t, s, cfg, &Request{Model: []byte("m"), Prefer: w0.Ref()}); d.Worker != w0 {
		t.Fatalf("after the trial: %s", d.Worker.ID)
	}
}

// A preferred engine (Request.Prefer) whose breaker is open, its cooldown
// not over, is not replaced by another engine either, also when every
// candidate is open (where other requests are dispatched anyway): Pick
// fails with ErrPreferredOpen. After the cooldown its pick is the trial.
// A request preferring an engine that left the fleet is routed by load.
// It was re-picked by load.
func TestAPreferredWorkerBehindAnOpenBreakerIsNotReplaced(t *testing.T) {
	s, c := newTestSched(t, workers(3, "m")...)
	cfg := cfgWith(t, func(c *config.Config) { c.LoadBalancing.Algorithm = "round-robin" })
	w0 := s.Fleet.Get("w000")
	for i := 0; i < 3; i++ { // threshold 3
		w0.Breaker.Failure(s.Now(), false)
	}
	for i := 0; i < 3; i++ {
		if _, err := s.Pick(cfg, &Request{Model: []byte("m"), Prefer: w0.Ref()}, make([]*fleet.Worker, 0, 8)); !errors.Is(err, ErrPreferredOpen) {
			t.Fatalf("pick %d: %v, want ErrPreferredOpen", i, err)
		}
	}
	if d := pick(t, s, cfg, &Request{Model: []byte("m")}); d.Worker == w0 {
		t.Fatal("w0 behind an open breaker was chosen")
	}
	// Every candidate open.
	for _, id := range []string{"w001", "w002"} {
		for i := 0; i < 3; i++ {
			s.Fleet.Get(id).Breaker.Failure(s.Now(), false)
		}
	}
	if _, err := s.Pick(cfg, &Request{Model: []byte("m"), Prefer: w0.Ref()}, make([]*fleet.Worker, 0, 8)); !errors.Is(err, ErrPreferredOpen) {
		t.Fatalf("every candidate open: %v, want ErrPreferredOpen", err)
	}
	c.add(2 * time.Second) // past the cooldown
	d := pick(t, s, cfg, &Request{Model: []byte("m"), Prefer: w0.Ref()})
	if d.Worker != w0 || !d.Probe {
		t.Fatalf("after the cooldown: %s probe=%v, want w000's trial", d.Worker.ID, d.Probe)
	}
	gone := fleet.Ref{ID: "w999", Addr: "10.9.9.9:1"}
	if _, err := s.Pick(cfg, &Request{Model: []byte("m"), Prefer: gone}, make([]*fleet.Worker, 0, 8)); err != nil {
		t.Fatalf("an engine gone: %v", err)
	}
}

// A preferred engine (Request.Prefer) that is draining is not replaced by
// another engine, nor sent the request: Pick fails with
// ErrPreferredDraining, also when it is the only worker of the model.
// Once it is ACTIVE again it is picked; a request preferring an engine at
// another address (a new worker under the id) is routed by load. It was
// passed over by load (the other engine answered 404).
func TestAPreferredWorkerThatIsDrainingIsNotReplaced(t *testing.T) {
	rs := workers(2, "m")
	s, _ := newTestSched(t, rs...)
	cfg := cfgWith(t, func(c *config.Config) { c.LoadBalancing.Algorithm = "round-robin" })
	w0 := s.Fleet.Get("w000")
	ref := w0.Ref()
	drain := rs[0]
	drain.Status = fleet.StatusDraining
	if err := s.Fleet.Upsert(drain); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		if _, err := s.Pick(cfg, &Request{Model: []byte("m"), Prefer: ref}, make([]*fleet.Worker, 0, 8)); !errors.Is(err, ErrPreferredDraining) {
			t.Fatalf("pick %d: %v, want ErrPreferredDraining", i, err)
		}
	}
	if d := pick(t, s, cfg, &Request{Model: []byte("m")}); d.Worker.ID == "w000" {
		t.Fatal("the draining w000 was chosen")
	}
	// The only worker of its model.
	s.Fleet.Remove("w001")
	if _, err := s.Pick(cfg, &Request{Model: []byte("m"), Prefer: ref}, make([]*fleet.Worker, 0, 8)); !errors.Is(err, ErrPreferredDraining) {
		t.Fatalf("alone: %v, want ErrPreferredDraining", err)
	}
	if err := s.Fleet.Upsert(rs[0]); err != nil {
		t.Fatal(err)
	}
	if d := pick(t, s, cfg, &Request{Model: []byte("m"), Prefer: ref}); d.Worker.ID != "w000" {
		t.Fatalf("ACTIVE again: %s", d.Worker.ID)
	}
	other := fleet.Ref{ID: ref.ID, Addr: "10.9.9.9:1"}
	if err := s.Fleet.Upsert(drain); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Pick(cfg, &Request{Model: []byte("m"), Prefer: other}, make([]*fleet.Worker, 0, 8)); errors.Is(err, ErrPreferredDraining) {
		t.Fatal("another engine under the id counted as the draining one")
	}
}
