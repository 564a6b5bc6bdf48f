package gateway

import (
	"testing"
	"time"

	"github.com/infera/infera/internal/testsrv"
)

// A static worker listed without --worker-model whose host drops SYNs (a
// blackholed node) held the router's start for 3 s whatever
// --connect-timeout said: its /v1/models was dialled by a client of its
// own. The start now waits --connect-timeout for it, and the live
// worker beside it serves from the start.
func TestTheStartWaitsTheConnectTimeoutForAStaticWorkerThatDropsSYNs(t *testing.T) {
	_, live := startEngine(t, "--speedup", "50")
	f := parseServe(t, "--workers", "live="+live+",dead=http://"+testsrv.SYNDropping(t),
		"--connect-timeout", "300ms", "--router-policy", "round-robin", "--admin-port", "0")
	start := time.Now()
	g, err := New(f)
	took := time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if took > 300*time.Millisecond+time.Second { // the bound and slack for a loaded machine
		t.Fatalf("the start took %v with --connect-timeout 300ms", took.Round(time.Millisecond))
	}
	if n := len(g.Fleet().View().ByModel["sim-model"]); n != 1 {
		t.Fatalf("%d workers serve sim-model at start, want the live one", n)
	}
	if w := g.Fleet().Get("dead"); w == nil || len(w.Models) != 0 {
		t.Fatalf("dead: %v, want listed without models", w)
	}
}
