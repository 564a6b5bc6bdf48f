//go:build !race

package sched

import (
	"testing"

	"github.com/infera/infera/config"
	"github.com/infera/infera/fleet"
)

// A PD request's scheduling (topology, both leases) allocates nothing once
// the request's candidate buffer has grown.
func TestPDPairNoAlloc(t *testing.T) {
	for _, indep := range []bool{false, true} {
		s := pdBench(t, 2, 6)
		cfg := cfgWith(t, func(c *config.Config) { c.PD.Mode = "sglang"; c.PD.SGLangIndependentPairing = indep })
		r := &Request{}
		scratch := make([]*fleet.Worker, 0, 8)
		var pl, dl Lease
		pdPair(t, s, cfg, r, scratch, &pl, &dl)
		if n := testing.AllocsPerRun(200, func() { pdPair(t, s, cfg, r, scratch, &pl, &dl) }); n != 0 {
			t.Fatalf("independent=%v: %.1f allocs per PD request", indep, n)
		}
	}
}
