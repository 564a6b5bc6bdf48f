package sched

import (
	"fmt"
	"testing"

	"github.com/infera/infera/config"
	"github.com/infera/infera/fleet"
)

// pdBench builds np prefill and nd decode workers serving "m".
func pdBench(tb testing.TB, np, nd int) *Scheduler {
	var recs []fleet.Record
	for i := 0; i < np; i++ {
		recs = append(recs, pdRec(fmt.Sprintf("p%04d", i), "prefill", "", "m"))
	}
	for i := 0; i < nd; i++ {
		recs = append(recs, pdRec(fmt.Sprintf("d%04d", i), "decode", "", "m"))
	}
	s, _ := newTestSched(tb, recs...)
	return s
}

var modelM = []byte("m")

// pdPair runs what the proxy does per PD request: reset, Topology, the
// prefill lease, the decode lease, both ended.
func pdPair(tb testing.TB, s *Scheduler, cfg *config.Config, r *Request, scratch []*fleet.Worker, pl, dl *Lease) {
	r.Reset()
	r.Model = modelM
	r.PromptTokens, r.MaxTokens = 1000, 100
	if top, err := s.Topology(cfg, r, scratch); top != TopologyPD || err != nil {
		tb.Fatalf("topology %s %v", top, err)
	}
	r.SetLeg(LegPrefill, nil)
	if err := s.Acquire(cfg, r, scratch, pl); err != nil {
		tb.Fatal(err)
	}
	r.SetLeg(LegDecode, pl.Worker)
	if err := s.Acquire(cfg, r, scratch, dl); err != nil {
		tb.Fatal(err)
	}
	pl.FirstToken()
	pl.Done(OutcomeSuccess)
	dl.FirstToken()
	dl.Done(OutcomeSuccess)
}

// BenchmarkPDPair measures the scheduling of one PD request (topology and
// both legs) under independent and aligned pairing, against
// BenchmarkMixedTopology: what the topology check costs a mixed fleet.
func BenchmarkPDPair(b *testing.B) {
	for _, pairing := range []string{"independent", "aligned"} {
		for _, n := range [][2]int{{2, 6}, {32, 96}} {
			b.Run(fmt.Sprintf("%s/%dP%dD", pairing, n[0], n[1]), func(b *testing.B) {
				s := pdBench(b, n[0], n[1])
				cfg := cfgWith(b, func(c *config.Config) {
					c.PD.Mode = "sglang"
					c.PD.SGLangIndependentPairing = pairing == "independent"
				})
				r := &Request{}
				scratch := make([]*fleet.Worker, 0, n[0]+n[1])
				var pl, dl Lease
				b.ReportAllocs()
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					pdPair(b, s, cfg, r, scratch, &pl, &dl)
				}
			})
		}
	}
}

// BenchmarkMixedTopology is the topology check on a fleet without PD
// workers: one view load.
func BenchmarkMixedTopology(b *testing.B) {
	s, _ := newTestSched(b, workers(8, "m")...)
	cfg := config.Default()
	r := &Request{Model: []byte("m")}
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		if top, _ := s.Topology(cfg, r, nil); top != TopologyMixed {
			b.Fatal(top)
		}
	}
}
