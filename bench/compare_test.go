package bench

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// inferaBin returns an infera binary with the engine and serve subcommands:
// $INFERA_BENCH_BIN, or one built from this module (not under -short). It
// skips the test when the binary cannot be built or lacks `infera engine`.
func inferaBin(t *testing.T) string {
	t.Helper()
	if b := os.Getenv("INFERA_BENCH_BIN"); b != "" {
		return b
	}
	if testing.Short() {
		t.Skip("building infera can take over 30 s: set INFERA_BENCH_BIN or run without -short")
	}
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("go tool not found to build infera")
	}
	bin := filepath.Join(t.TempDir(), "infera")
	cmd := exec.Command(gobin, "build", "-o", bin, ".")
	cmd.Dir = ".."
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Skipf("cannot build infera (the tree may be mid-edit): %v\n%s", err, out)
	}
	if out, err := exec.Command(bin, "engine", "--help").CombinedOutput(); err != nil {
		t.Skipf("this infera build has no engine subcommand yet: %s", bytes.TrimSpace(out))
	}
	return bin
}

// TestCompareEndToEnd runs compare mode against real `infera engine` and
// `infera serve` processes on a tiny workload, then cross-checks the
// round-robin run against the simulator fed the same arrival times.
// Stated tolerance (2 engines, one router, real processes on loopback):
// mean TTFT within 30% + 5 ms, mean E2E within 15% + 5 ms, prefix hit rate
// within 0.05 and the same per-engine request counts.
func TestCompareEndToEnd(t *testing.T) {
	bin := inferaBin(t)
	// Timing on a shared 2-core machine is noisy: one retry.
	var err error
	for attempt := 1; attempt <= 2; attempt++ {
		if err = compareEndToEnd(t, bin); err == nil {
			return
		}
		t.Logf("attempt %d: %v", attempt, err)
	}
	t.Fatal(err)
}

func compareEndToEnd(t *testing.T, bin string) error {
	c := DefaultGenConfig(WorkloadShared)
	c.Requests, c.Rate, c.SystemPrompts, c.SystemTokens, c.Users, c.OutputTokens = 30, 30, 3, 1024, 12, 16
	reqs, err := Generate(c)
	if err != nil {
		t.Fatal(err)
	}
	ec := EngineConfig{BlockSize: 16, KVCapacityBlocks: 2048, MaxBatch: 32, MaxPrefillTokens: 8192, Speedup: 2}
	lc := DefaultLoadConfig()
	lc.Timeout = 20 * time.Second
	var logBuf bytes.Buffer
	cc := CompareConfig{Bin: bin, Policies: []string{"round-robin", "prefix", "kv-aware"}, Engines: 2, Engine: ec, KVEvents: true,
		Load: lc, LogDir: filepath.Join(t.TempDir(), "logs", "run"), Log: &logBuf, ReadyTimeout: 15 * time.Second, Ceiling: true}
	// --log-dir need not exist: it is made (it aborted on the first log).
	res, err := Compare(context.Background(), reqs, "tiny", cc)
	if err != nil {
		t.Fatalf("%v\n%s", err, logBuf.String())
	}
	if len(res.Summaries) != 3 || len(res.Runs) != 3 {
		t.Fatalf("got %d summaries", len(res.Summaries))
	}
	if res.Ceiling == nil || res.Ceiling.HitRate <= 0 || res.Ceiling.Blocks != 2*2048 {
		t.Fatalf("no pooled-cache ceiling: %+v", res.Ceiling)
	}
	for _, s := range res.Summaries {
		if s.OK != len(reqs) || s.Errors != 0 {
			t.Fatalf("%s: %d/%d ok, errors %v", s.Name, s.OK, s.Requests, s.ErrorsByStatus)
		}
		total := 0
		for _, n := range s.PerWorker {
			total += n
		}
		if total != len(reqs) || len(s.PerWorker) != 2 {
			t.Fatalf("%s: X-Infera-Worker not seen on every response: %v", s.Name, s.PerWorker)
		}
		if s.HitRate <= 0 || s.TTFT.P50 <= 0 || s.CeilingHitRate != res.Ceiling.HitRate || s.CeilingShare != s.HitRate/s.CeilingHitRate {
			t.Fatalf("%s: implausible summary %+v", s.Name, s)
		}
	}
	if l := res.Summaries[2].Layers; l["kv"] == 0 {
		t.Fatalf("kv-aware policy: router /metrics shows no KV decisions: %v", l)
	}
	if l := res.Summaries[1].Layers; l["prefix"] == 0 {
		t.Fatalf("prefix policy: router /metrics shows no prefix-layer decisions: %v", l)
	}
	var svg, js bytes.Buffer
	if err := WriteSVG(&svg, "t", res.Summaries); err != nil || !bytes.Contains(svg.Bytes(), []byte("<polyline")) {
		t.Fatalf("svg: %v", err)
	}
	if err := WriteJSON(&js, res); err != nil {
		t.Fatal(err)
	}

	// Cross-check round-robin and kv-aware against the simulator.
	for _, i := range []int{0, 2} {
		if err := agreesWithSimulator(t, reqs, res.Summaries[i], res.Runs[i], lc, 2, 2048); err != nil {
			return err
		}
	}
	return nil
}

// agreesWithSimulator replays a real run's arrivals in the simulator (same
// policy, same engines) and checks the stated tolerance: mean TTFT within
// 30% + 5 ms, mean E2E within 15% + 5 ms, prefix hit rate within 0.05.
func agreesWithSimulator(t *testing.T, reqs []TraceRequest, real Summary, run *Run, lc LoadConfig, engines, blocks int) error {
	t.Helper()
	core := testCore(2)
	core.CapacityBlocks = blocks
	sim, err := Simulate(ObservedArrivals(reqs, run.Results), SimConfig{Engines: engines, Core: core, Policy: real.Name, Load: lc})
	if err != nil {
		t.Fatal(err)
	}
	ss := Summarize("sim", sim.Run.Results, sim.Run.ITLs, sim.Run.Wall, SLO{}, engines)
	t.Logf("real %s: TTFT mean %.1f E2E mean %.1f hit %.3f workers %v | sim: TTFT mean %.1f E2E mean %.1f hit %.3f workers %v",
		real.Name, real.TTFT.Mean, real.E2E.Mean, real.HitRate, real.PerWorker, ss.TTFT.Mean, ss.E2E.Mean, ss.HitRate, ss.PerWorker)
	return Agree(real, ss)
}

func TestAgreeTolerance(t *testing.T) {
	s := func(ttft, e2e, hit float64) Summary {
		return Summary{Name: "p", TTFT: Stats{Mean: ttft}, E2E: Stats{Mean: e2e}, HitRate: hit}
	}
	f := func(real, sim Summary, ok bool) {
		t.Helper()
		if err := Agree(real, sim); (err == nil) != ok {
			t.Fatalf("Agree(%+v, %+v) = %v, want ok=%v", real, sim, err, ok)
		}
	}
	f(s(100, 1000, 0.5), s(100, 1000, 0.5), true)
	f(s(135, 1155, 0.549), s(100, 1000, 0.5), true) // all at the edge
	f(s(136, 1000, 0.5), s(100, 1000, 0.5), false)  // TTFT 30% + 5 ms
	f(s(100, 1156, 0.5), s(100, 1000, 0.5), false)  // E2E 15% + 5 ms
	f(s(100, 1000, 0.56), s(100, 1000, 0.5), false) // hit rate 0.05
	f(s(64, 1000, 0.5), s(100, 1000, 0.5), false)   // both directions
}

// compare --sim-check replays the arrivals the client observed, whatever
// the load's arrival mode. Under --arrival poisson it used to draw a fresh
// Poisson process (the simulator's own, not the client's), and under
// closed it sent each request as one finished, so the real run was checked
// against other arrival times.
func TestSimCheckReplaysObservedArrivals(t *testing.T) {
	reqs := smallShared(10)
	// The real client observed all ten sends within 90 ms.
	results := make([]Result, len(reqs))
	for i := range results {
		results[i] = Result{Index: i, Start: time.Duration(i) * 10 * time.Millisecond, Status: 200}
	}
	core := testCore(1)
	f := func(arrival string, rate float64, concurrency int) {
		t.Helper()
		lc := DefaultLoadConfig()
		lc.Arrival, lc.Rate, lc.Concurrency = arrival, rate, concurrency
		c := CompareConfig{Load: lc, SimCheck: &core, Model: "sim-model"}
		ss, err := c.simulate(reqs, "round-robin", &Run{Results: results}, 2)
		if err != nil {
			t.Fatal(err)
		}
		replay := lc
		replay.Arrival = ArrivalTrace
		sim, err := Simulate(ObservedArrivals(reqs, results), SimConfig{Engines: 2, Core: core, Policy: "round-robin", Load: replay})
		if err != nil {
			t.Fatal(err)
		}
		want := Summarize("want", sim.Run.Results, sim.Run.ITLs, sim.Run.Wall, SLO{}, 2)
		t.Logf("--arrival %s: sim-check wall %.2f s, TTFT mean %.1f ms; observed arrivals replayed: wall %.2f s, TTFT mean %.1f ms",
			arrival, ss.WallS, ss.TTFT.Mean, want.WallS, want.TTFT.Mean)
		if ss.WallS != want.WallS || ss.TTFT != want.TTFT || ss.Requests != len(reqs) {
			t.Fatalf("sim-check under --arrival %s did not replay the observed arrivals (wall %.2f s vs %.2f s, %d requests)",
				arrival, ss.WallS, want.WallS, ss.Requests)
		}
	}
	f(ArrivalPoisson, 0.5, 16) // a fresh Poisson draw spans ~20 s
	f(ArrivalClosed, 20, 1)    // one at a time: each waits for the last
}

// compare and its PD fleet start routers with --serve-arg flags; a router
// started with --api-key answered the readiness probe and every replayed
// request with 401 (the run died "not ready after 20s"), since neither the
// probe nor the replay client could send a key. --api-key gives it to both,
// never in the log, the results or the router's admin listener (which a
// keyed router opened on the fixed port 8081).
func TestCompareSendsTheAPIKeyToTheRoutersItStarts(t *testing.T) {
	bin := inferaBin(t)
	const key = "compare-key-5f0c1e9a7b3d"
	c := DefaultGenConfig(WorkloadShared)
	c.Requests, c.Rate, c.SystemPrompts, c.SystemTokens, c.Users, c.OutputTokens = 6, 50, 2, 256, 4, 4
	reqs, err := Generate(c)
	if err != nil {
		t.Fatal(err)
	}
	lc := DefaultLoadConfig()
	lc.Timeout = 20 * time.Second
	var logBuf bytes.Buffer
	logDir := t.TempDir()
	cc := CompareConfig{Bin: bin, Policies: []string{"round-robin"}, Engines: 2,
		Engine:    EngineConfig{BlockSize: 16, KVCapacityBlocks: 1024, MaxBatch: 16, MaxPrefillTokens: 8192, Speedup: 4},
		ServeArgs: []string{"--api-key=" + key}, APIKey: key,
		Load: lc, LogDir: logDir, Log: &logBuf, ReadyTimeout: 15 * time.Second}
	res, err := Compare(context.Background(), reqs, "tiny", cc)
	if err == nil {
		pd := PDFlags{PD: "1:1", PDMode: "sglang", PDDecodePolicy: "least-requests", PDTransferBase: time.Millisecond, PDTransferPerBlock: 40 * time.Microsecond}
		res, err = pd.comparePD(context.Background(), res, reqs, cc)
	}
	if err != nil {
		t.Fatalf("%v\n%s", err, logBuf.String())
	}
	if len(res.Summaries) != 2 {
		t.Fatalf("want the mixed and the PD fleet's summaries, got %d", len(res.Summaries))
	}
	for _, s := range res.Summaries {
		if s.OK != len(reqs) {
			t.Fatalf("%s: %d/%d ok, errors %v", s.Name, s.OK, s.Requests, s.ErrorsByStatus)
		}
	}
	var js bytes.Buffer
	if err := WriteJSON(&js, res); err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(js.Bytes(), []byte(key)) || bytes.Contains(logBuf.Bytes(), []byte(key)) {
		t.Fatal("the API key is printed in the progress log or the results")
	}
	logs, _ := filepath.Glob(filepath.Join(logDir, "*router.log"))
	if len(logs) != 2 {
		t.Fatalf("want two router logs, got %v", logs)
	}
	for _, l := range logs {
		b, _ := os.ReadFile(l)
		if bytes.Contains(b, []byte("admin API and console listening")) {
			t.Fatalf("%s: the router opened its admin listener (default port 8081):\n%s", l, b)
		}
	}
}
