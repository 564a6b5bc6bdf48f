//go:build !race

package sched

import (
	"testing"

	"github.com/infera/infera/config"
	"github.com/infera/infera/fleet"
)

func TestAffinityHitNoAlloc(t *testing.T) {
	s, _ := newTestSched(t, workers(8, "m")...)
	cfg := affCfg(t, nil)
	r := sess("abc")
	scratch := make([]*fleet.Worker, 0, 8)
	if _, err := s.Pick(cfg, r, scratch); err != nil {
		t.Fatal(err)
	}
	n := testing.AllocsPerRun(100, func() {
		d, _ := s.Pick(cfg, r, scratch)
		if d.Layer != LayerAffinity {
			t.Fatalf("layer %s", d.Layer)
		}
	})
	if n != 0 {
		t.Fatalf("affinity hit allocates %.1f/op", n)
	}
}

func TestPickNoAlloc(t *testing.T) {
	for _, layer := range []string{"lb", "prefix", "three-layer"} {
		t.Run(layer, func(t *testing.T) {
			s, _ := newTestSched(t, workers(8, "Qwen2.5-72B-Instruct")...)
			cfg := cfgWith(t, func(c *config.Config) {
				c.PrefixCache.Enabled = layer != "lb"
				c.SessionAffinity.Enabled = layer == "three-layer"
				c.ModelRouting.Enabled = layer == "three-layer"
			})
			r := &Request{Model: []byte("qwen2.5-72b"), Prompt: prompt("alloc test ", 1024)}
			if layer != "three-layer" {
				r.Model = []byte("Qwen2.5-72B-Instruct")
			} else {
				r.SessionID = []byte("sess")
			}
			scratch := make([]*fleet.Worker, 0, 8)
			for i := 0; i < 3; i++ { // warm: index entries, session binding
				r.hashed = false
				if _, err := s.Pick(cfg, r, scratch); err != nil {
					t.Fatal(err)
				}
			}
			n := testing.AllocsPerRun(200, func() {
				r.hashed = false
				if _, err := s.Pick(cfg, r, scratch); err != nil {
					t.Fatal(err)
				}
			})
			if n != 0 {
				t.Fatalf("%s: %.1f allocs/op", layer, n)
			}
		})
	}
}

// A canary rule's turn, also one passed to the rule's other service (its
// own worker tried, or its breaker open), allocates nothing.
func TestCanaryPickNoAlloc(t *testing.T) {
	s := modelFleet(t)
	cfg := cfgWith(t, func(c *config.Config) {
		c.Canary.Enabled = true
		c.Canary.Rules = []config.CanaryRule{{Model: "deepseek-*", Targets: []config.CanaryTarget{{Service: "deepseek", Weight: 1}, {Service: "deepseek-canary", Weight: 1}}}}
	})
	scratch := make([]*fleet.Worker, 0, 8)
	for _, tried := range []bool{false, true} {
		r := &Request{Model: []byte("deepseek-v3"), Tried: make([]int, 0, 1)}
		if tried {
			r.Tried = append(r.Tried, s.Fleet.Get("ds").Idx)
		}
		n := testing.AllocsPerRun(200, func() {
			d, err := s.Pick(cfg, r, scratch)
			if err != nil || tried && d.Worker.ID != "ds2" {
				t.Fatalf("tried %v: %v %v", tried, d.Worker, err)
			}
		})
		if n != 0 {
			t.Fatalf("tried %v: %.1f allocs/op", tried, n)
		}
	}
}

// An unmatched name served by a default model that is an alias (routed
// again by its mapping) allocates nothing.
func TestDefaultAliasPickNoAlloc(t *testing.T) {
	s := modelFleet(t)
	cfg := routeCfg(t, func(mr *config.ModelRouting) {
		mr.DefaultModel = "chat"
		mr.Mappings = []config.ModelMapping{{Pattern: "chat", Services: []string{"qwen72"}}}
	})
	scratch := make([]*fleet.Worker, 0, 8)
	r := &Request{Model: []byte("unknown-model")}
	n := testing.AllocsPerRun(200, func() {
		if d, err := s.Pick(cfg, r, scratch); err != nil || d.Worker.ID != "q72" {
			t.Fatalf("%v %v", d.Worker, err)
		}
	})
	if n != 0 {
		t.Fatalf("%.1f allocs/op", n)
	}
}
