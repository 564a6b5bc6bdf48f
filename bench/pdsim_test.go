package bench

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alecthomas/kong"
)

// pdWorkload: long prompts, long outputs (where the mixed engine's
// prefills stall every running stream).
func pdWorkload(t *testing.T, n int, rate float64) []TraceRequest {
	t.Helper()
	gc := DefaultGenConfig(WorkloadUnique)
	gc.Requests, gc.Rate, gc.PromptTokens, gc.OutputTokens = n, rate, 2048, 128
	reqs, err := Generate(gc)
	if err != nil {
		t.Fatal(err)
	}
	return reqs
}

func TestSimulatePDServesEveryRequestInBothModes(t *testing.T) {
	reqs := pdWorkload(t, 120, 6)
	lc := DefaultLoadConfig()
	core := testCore(1)
	core.CapacityBlocks = 8192
	for _, mode := range []string{"sglang", "vllm"} {
		cfg := PDSimConfig{Prefill: 1, Decode: 3, Mode: mode, Core: core, Policy: "least-requests", Load: lc}
		a, err := SimulatePD(reqs, cfg)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := SimulatePD(reqs, cfg)
		sa := Summarize(mode, a.Run.Results, a.Run.ITLs, a.Run.Wall, SLO{}, 3)
		sb := Summarize(mode, b.Run.Results, b.Run.ITLs, b.Run.Wall, SLO{}, 3)
		if sa.TTFT != sb.TTFT || sa.TPOT != sb.TPOT {
			t.Fatalf("%s: not deterministic: %+v vs %+v", mode, sa.TTFT, sb.TTFT)
		}
		if sa.OK != len(reqs) || len(sa.PerWorker) != 3 {
			t.Fatalf("%s: ok %d of %d, decode workers used %v (first error %q)", mode, sa.OK, len(reqs), sa.PerWorker, firstErr(a.Run.Results))
		}
		// The client's first token needs a prefill of the whole prompt and
		// the transfer of its 128 blocks: never less than their times.
		tm := core.Time
		for i := range a.Run.Results {
			r := &a.Run.Results[i]
			floor := tm.PrefillTime(r.PromptTokens, 1) + tm.TransferTime((r.PromptTokens+15)/16)
			if r.TTFT < floor || r.OutputTokens != reqs[r.Index].OutputLength {
				t.Fatalf("%s: request %d: TTFT %v below the floor %v, or %d tokens of %d", mode, i, r.TTFT, floor, r.OutputTokens, reqs[r.Index].OutputLength)
			}
		}
		t.Logf("%s: TTFT p50 %.1f ms, TPOT p50 %.2f ms", mode, sa.TTFT.P50, sa.TPOT.P50)
	}
}

// Where disaggregation pays in this model: long prompts keep mixed engines
// prefilling, and every prefill stalls their running streams. The PD
// fleet's decode engines never prefill: its time per output token is
// lower and flat (the p99 no longer carries the stalls). It pays for it in
// TTFT (the prefill engines queue, and the KV moves).
func TestSimulatePDRemovesPrefillInterference(t *testing.T) {
	reqs := pdWorkload(t, 300, 12)
	lc := DefaultLoadConfig()
	core := testCore(1)
	core.CapacityBlocks = 8192
	mixed, err := Simulate(reqs, SimConfig{Engines: 4, Core: core, Policy: "least-requests", Load: lc})
	if err != nil {
		t.Fatal(err)
	}
	pd, err := SimulatePD(reqs, PDSimConfig{Prefill: 2, Decode: 2, Mode: "sglang", Core: core, Policy: "least-requests", Load: lc})
	if err != nil {
		t.Fatal(err)
	}
	m := Summarize("mixed", mixed.Run.Results, mixed.Run.ITLs, mixed.Run.Wall, SLO{}, 4)
	p := Summarize("pd", pd.Run.Results, pd.Run.ITLs, pd.Run.Wall, SLO{}, 2)
	t.Logf("mixed: TTFT p50 %.1f p99 %.1f, TPOT p50 %.2f p99 %.2f, ITL p99 %.1f", m.TTFT.P50, m.TTFT.P99, m.TPOT.P50, m.TPOT.P99, m.ITL.P99)
	t.Logf("pd:    TTFT p50 %.1f p99 %.1f, TPOT p50 %.2f p99 %.2f, ITL p99 %.1f", p.TTFT.P50, p.TTFT.P99, p.TPOT.P50, p.TPOT.P99, p.ITL.P99)
	if m.OK != len(reqs) || p.OK != len(reqs) {
		t.Fatalf("ok: mixed %d pd %d", m.OK, p.OK)
	}
	if !(p.TPOT.P99 < m.TPOT.P99 && p.ITL.P99 < m.ITL.P99/2) {
		t.Fatalf("PD did not remove the prefill stalls from decoding")
	}
	if !(p.TTFT.P50 > m.TTFT.P50) {
		t.Fatalf("PD's first token came sooner than the mixed fleet's: the transfer and prefill queue cost nothing?")
	}
}

// Aligned pairing in the simulator follows the router: with 2 prefill and
// 4 decode engines, each prefill engine's requests decode on its 2 decode
// engines only.
func TestSimulatePDPairing(t *testing.T) {
	reqs := pdWorkload(t, 60, 10)
	core := testCore(4)
	core.CapacityBlocks = 8192
	for _, indep := range []bool{false, true} {
		r, err := SimulatePD(reqs, PDSimConfig{Prefill: 2, Decode: 4, Mode: "sglang", Core: core, Policy: "round-robin",
			DecodePolicy: "round-robin", IndependentPairing: indep, Load: DefaultLoadConfig()})
		if err != nil {
			t.Fatal(err)
		}
		s := Summarize("x", r.Run.Results, r.Run.ITLs, r.Run.Wall, SLO{}, 4)
		if s.OK != len(reqs) || len(s.PerWorker) != 4 {
			t.Fatalf("independent=%v: ok %d, decode workers %v", indep, s.OK, s.PerWorker)
		}
		for w, n := range s.PerWorker {
			if n != len(reqs)/4 {
				t.Fatalf("independent=%v: round-robin decode policy gave %s %d requests of %d: %v", indep, w, n, len(reqs), s.PerWorker)
			}
		}
	}
}

func TestPDFlags(t *testing.T) {
	f := func(pd string, engines int, want string) {
		t.Helper()
		fl := PDFlags{PD: pd, PDMode: "sglang", PDDecodePolicy: "least-requests", PDTransferBase: time.Millisecond}
		err := fl.Check(engines)
		if (err == nil) != (want == "") || (err != nil && !strings.Contains(err.Error(), want)) {
			t.Fatalf("--pd %q --engines %d: %v, want %q", pd, engines, err, want)
		}
	}
	f("", 8, "")
	f("2:6", 8, "")
	f("2:6", 16, "--engines 8")
	f("2", 2, "want P:D")
	f("0:4", 4, "want P:D")
	f("a:b", 4, "want P:D")
	if _, err := SimulatePD(nil, PDSimConfig{Prefill: 1, Decode: 1, Mode: "mooncake", Core: testCore(1), Load: DefaultLoadConfig()}); err == nil {
		t.Fatal("unknown mode accepted")
	}
	if _, err := SimulatePD(nil, PDSimConfig{Prefill: 0, Decode: 1, Mode: "vllm", Core: testCore(1), Load: DefaultLoadConfig()}); err == nil {
		t.Fatal("a fleet without prefill engines accepted")
	}
}

// The same in the PD simulator: a run cut by --duration used to return the
// requests it never issued as failed results (status 0).
func TestSimulatePDDurationReportsOnlyIssuedRequests(t *testing.T) {
	reqs := pdWorkload(t, 40, 6)
	lc := DefaultLoadConfig()
	lc.Arrival, lc.Rate = ArrivalPoisson, 10
	lc.Duration = time.Second
	core := testCore(1)
	core.CapacityBlocks = 8192
	r, err := SimulatePD(reqs, PDSimConfig{Prefill: 1, Decode: 1, Mode: "sglang", Core: core, Policy: "least-requests", Load: lc})
	if err != nil {
		t.Fatal(err)
	}
	s := Summarize("pd", r.Run.Results, r.Run.ITLs, r.Run.Wall, SLO{}, 1)
	t.Logf("results %d, ok %d, errors %d (%v)", s.Requests, s.OK, s.Errors, s.ErrorsByStatus)
	if s.Errors != 0 || s.Requests != s.OK || s.Requests == 0 || s.Requests >= len(reqs) {
		t.Fatalf("a duration-limited PD simulation of %d requests reports %d results, %d ok, %d errors (%v)",
			len(reqs), s.Requests, s.OK, s.Errors, s.ErrorsByStatus)
	}
}

// The same in the PD simulator: under --no-stream it used to report
// streamed TTFT and TPOT where the client reads each answer whole.
func TestSimulatePDNoStreamReportsAnswersReadWhole(t *testing.T) {
	reqs := pdWorkload(t, 10, 6)
	lc := DefaultLoadConfig()
	lc.Stream = false
	core := testCore(1)
	core.CapacityBlocks = 8192
	r, err := SimulatePD(reqs, PDSimConfig{Prefill: 1, Decode: 1, Mode: "vllm", Core: core, Policy: "least-requests", Load: lc})
	if err != nil {
		t.Fatal(err)
	}
	s := Summarize("pd", r.Run.Results, r.Run.ITLs, r.Run.Wall, SLO{}, 1)
	if s.OK != len(reqs) || s.TPOT.N != 0 || s.ITL.N != 0 {
		t.Fatalf("--no-stream PD simulation: %d of %d ok, TPOT n=%d, ITL n=%d", s.OK, len(reqs), s.TPOT.N, s.ITL.N)
	}
	for _, res := range r.Run.Results {
		if !res.Whole || res.TTFT != res.E2E {
			t.Fatalf("request %d: TTFT %v, E2E %v, Whole %v", res.Index, res.TTFT, res.E2E, res.Whole)
		}
	}
}

// simulate --pd runs the same kv-aware router on the PD fleet's prefill
// leg as on the mixed fleet: --kv-overlap-weight 0 (predicted TTFT alone)
// and --kv-load-bound were applied to the mixed fleet only, the PD fleet
// running weight 1 and the default bound whatever the flags said (hit
// rate 0.750 under weight 0 and 1 alike), so the side-by-side compared two
// different routers.
func TestSimulatePDTakesTheKVAwareFlagsOfTheMixedFleet(t *testing.T) {
	pdHitRate := func(args ...string) float64 {
		t.Helper()
		out := filepath.Join(t.TempDir(), "sim.json")
		var cli struct {
			Bench Cmd `cmd:""`
		}
		p, err := kong.New(&cli)
		if err != nil {
			t.Fatal(err)
		}
		kctx, err := p.Parse(append([]string{"bench", "simulate", "--engines", "8", "--pd", "4:4", "--policies", "kv-aware",
			"--workload", "chat", "--requests", "600", "--rate", "60", "--no-ceiling", "--json", out}, args...))
		if err != nil {
			t.Fatal(err)
		}
		if err := kctx.Run(); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(out)
		if err != nil {
			t.Fatal(err)
		}
		var res struct{ Summaries []Summary }
		if err := json.Unmarshal(b, &res); err != nil || len(res.Summaries) != 2 || !strings.HasPrefix(res.Summaries[1].Name, "pd ") {
			t.Fatalf("%v: %s", err, b)
		}
		return res.Summaries[1].HitRate
	}
	def := pdHitRate()
	if w0 := pdHitRate("--kv-overlap-weight", "0"); w0 == def {
		t.Fatalf("PD fleet: --kv-overlap-weight 0 gives the default's hit rate %.4f", def)
	}
	if b := pdHitRate("--kv-load-bound=-1"); b == def {
		t.Fatalf("PD fleet: --kv-load-bound -1 gives the default's hit rate %.4f", def)
	}
}

// compare --pd with --engine-urls is refused before anything runs: the
// refusal came from the PD stage, after every policy had run on the mixed
// fleet (the engines' caches cleared, a router started per policy), and the
// results of that run were thrown away with it.
func TestComparePDRefusesEngineURLsBeforeRunning(t *testing.T) {
	var hits atomic.Int64
	eng := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		w.Write([]byte("{}"))
	}))
	defer eng.Close()
	var cli struct {
		Bench Cmd `cmd:""`
	}
	p, err := kong.New(&cli)
	if err != nil {
		t.Fatal(err)
	}
	kctx, err := p.Parse([]string{"bench", "compare", "--pd", "1:1", "--engines", "2", "--engine-urls", eng.URL + "," + eng.URL,
		"--infera-bin", "/bin/false", "--policies", "round-robin", "--requests", "5", "--no-ceiling", "--svg", "", "--json", "", "--log-dir", t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if err := kctx.Run(); !errors.Is(err, errPDEngineURLs) {
		t.Fatalf("compare --pd --engine-urls: %v, want %v", err, errPDEngineURLs)
	}
	if n := hits.Load(); n != 0 {
		t.Fatalf("the engines got %d requests before --pd --engine-urls was refused", n)
	}
}
