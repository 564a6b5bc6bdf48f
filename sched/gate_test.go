package sched

import (
	"testing"

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
	r := &Request{Gate: &fullGate{}}
	r.Reset()
	if r.Gate != nil {
		t.Fatal("Reset kept the gate")
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
