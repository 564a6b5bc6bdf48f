package bench

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/alecthomas/kong"

	"github.com/infera/infera/fleet"
	"github.com/infera/infera/kvroute"
	"github.com/infera/infera/radix"
	"github.com/infera/infera/sched"
)

func TestSimulateBasics(t *testing.T) {
	gc := DefaultGenConfig(WorkloadShared)
	gc.Requests, gc.Rate, gc.SystemPrompts, gc.SystemTokens, gc.Users, gc.OutputTokens = 200, 40, 8, 1024, 64, 16
	reqs, err := Generate(gc)
	if err != nil {
		t.Fatal(err)
	}
	lc := DefaultLoadConfig()
	core := testCore(1)
	core.CapacityBlocks = 4096 // no eviction: policies differ by cold misses only
	run := func(policy string, engines int, lc LoadConfig) Summary {
		t.Helper()
		r, err := Simulate(reqs, SimConfig{Engines: engines, Core: core, Policy: policy, Load: lc})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: layers %v, index blocks %d", policy, r.Layers, r.IndexBlocks)
		if r.Virtual <= 0 || r.Real <= 0 {
			t.Fatalf("bad times %+v", r)
		}
		return Summarize(policy, r.Run.Results, r.Run.ITLs, r.Run.Wall, SLO{}, engines)
	}
	a, b := run("round-robin", 4, lc), run("round-robin", 4, lc)
	if a.TTFT != b.TTFT || a.HitRate != b.HitRate {
		t.Fatalf("simulation is not deterministic: %+v vs %+v", a.TTFT, b.TTFT)
	}
	if a.OK != len(reqs) || a.Imbalance != 1 {
		t.Fatalf("round-robin: ok %d imbalance %v", a.OK, a.Imbalance)
	}
	// 4 system prompts over 4 engines: the router's prefix index keeps
	// each prompt on few engines, so it must clearly beat round-robin.
	p := run("prefix", 4, lc)
	t.Logf("hit rate round-robin %.3f prefix %.3f; TTFT p50 %.1f vs %.1f", a.HitRate, p.HitRate, a.TTFT.P50, p.TTFT.P50)
	if p.HitRate < a.HitRate+0.03 {
		t.Fatalf("prefix routing hit rate %.3f below round-robin %.3f", p.HitRate, a.HitRate)
	}
	// kv-aware: the router's KVAware scorer over the index fed by the
	// simulated engines' KV events. Its cost also weighs decode load, so it
	// spreads cold misses more than the prefix layer; it must not lose to
	// round-robin and must actually route by KV.
	kr, err := Simulate(reqs, SimConfig{Engines: 4, Core: core, Policy: "kv-aware", Load: lc})
	if err != nil {
		t.Fatal(err)
	}
	if kr.Layers["kv"] == 0 || kr.IndexBlocks == 0 {
		t.Fatalf("kv-aware did not use the KV index: layers %v, index blocks %d", kr.Layers, kr.IndexBlocks)
	}
	kva := run("kv-aware", 4, lc)
	t.Logf("kv-aware hit rate %.3f TTFT p50 %.1f", kva.HitRate, kva.TTFT.P50)
	if kva.HitRate < a.HitRate || kva.HitRate == 0 {
		t.Fatalf("kv-aware hit rate %.3f not above round-robin %.3f", kva.HitRate, a.HitRate)
	}
	// Many engines: every request still served, fast.
	big := run("least-requests", 256, lc)
	if big.OK != len(reqs) {
		t.Fatalf("256 engines: %d ok", big.OK)
	}
	// Closed loop at concurrency 1 never overlaps requests.
	cl := lc
	cl.Arrival, cl.Concurrency = ArrivalClosed, 1
	r, err := Simulate(reqs[:20], SimConfig{Engines: 2, Core: core, Policy: "round-robin", Load: cl})
	if err != nil {
		t.Fatal(err)
	}
	res := r.Run.Results
	for i := 1; i < len(res); i++ {
		if res[i].Start < res[i-1].Start+res[i-1].E2E {
			t.Fatalf("closed loop overlapped: %d starts at %v before %d ends at %v", i, res[i].Start, i-1, res[i-1].Start+res[i-1].E2E)
		}
	}
	// Duration cap.
	dl := lc
	dl.Duration = 500 * time.Millisecond
	r, err = Simulate(reqs, SimConfig{Engines: 2, Core: core, Policy: "round-robin", Load: dl})
	if err != nil {
		t.Fatal(err)
	}
	for _, x := range r.Run.Results {
		if x.Start > dl.Duration {
			t.Fatalf("request at %v past the duration cap", x.Start)
		}
	}
	if _, err := Simulate(reqs, SimConfig{Engines: 2, Core: core, Policy: "nope", Load: lc}); err == nil {
		t.Fatal("unknown policy accepted")
	}
	if _, err := Simulate(reqs, SimConfig{Engines: 0, Core: core, Policy: "round-robin", Load: lc}); err == nil {
		t.Fatal("zero engines accepted")
	}
}

func TestSimulateTooLong(t *testing.T) {
	core := testCore(1)
	core.CapacityBlocks = 8
	reqs := []TraceRequest{{Timestamp: 0, InputLength: 4096, OutputLength: 4, HashIDs: []int64{1}}}
	r, err := Simulate(reqs, SimConfig{Engines: 1, Core: core, Policy: "round-robin", Load: DefaultLoadConfig()})
	if err != nil {
		t.Fatal(err)
	}
	if r.Run.Results[0].OK() || r.Run.Results[0].Status != 400 {
		t.Fatalf("oversized request should fail with 400: %+v", r.Run.Results[0])
	}
}

// On a generated chat workload kv-aware keeps conversations where their
// prefixes are: it reaches 95% of the pooled-cache ceiling with requests
// per engine within 1.2 x the mean, and beats round-robin's TTFT.
func TestSimulateKVAwareNearCeiling(t *testing.T) {
	for _, wl := range []string{WorkloadChat, WorkloadAgent} {
		gc := DefaultGenConfig(wl)
		gc.Requests, gc.Rate = 1200, 10
		reqs, err := Generate(gc)
		if err != nil {
			t.Fatal(err)
		}
		core := testCore(1)
		core.CapacityBlocks, core.MaxBatch = 1024, 64
		lc := DefaultLoadConfig()
		ceil, err := PooledCeiling(reqs, CeilingConfig{Engines: 8, EngineBlocks: core.CapacityBlocks, BlockSize: core.BlockSize, Load: lc})
		if err != nil {
			t.Fatal(err)
		}
		sum := map[string]Summary{}
		for _, pol := range []string{"round-robin", "kv-aware"} {
			r, err := Simulate(reqs, SimConfig{Engines: 8, Core: core, Policy: pol, Load: lc})
			if err != nil {
				t.Fatal(err)
			}
			s := Summarize(pol, r.Run.Results, r.Run.ITLs, r.Run.Wall, SLO{}, 8)
			s.SetCeiling(ceil.HitRate)
			if s.OK != len(reqs) {
				t.Fatalf("%s %s: %d/%d ok", wl, pol, s.OK, len(reqs))
			}
			sum[pol] = s
		}
		kv, rr := sum["kv-aware"], sum["round-robin"]
		t.Logf("%s: ceiling %.3f; kv-aware hit %.3f (%.1f%%) imbalance %.2f TTFT %.1f/%.1f ms; round-robin hit %.3f TTFT %.1f/%.1f ms",
			wl, ceil.HitRate, kv.HitRate, 100*kv.CeilingShare, kv.Imbalance, kv.TTFT.Mean, kv.TTFT.P99, rr.HitRate, rr.TTFT.Mean, rr.TTFT.P99)
		if kv.CeilingShare < 0.95 || kv.Imbalance > 1.2 || kv.TTFT.Mean >= rr.TTFT.Mean || kv.TTFT.P99 >= rr.TTFT.P99 {
			t.Fatalf("%s: kv-aware %+v vs round-robin TTFT %+v", wl, kv, rr.TTFT)
		}
	}
}

// Simulate feeds the kv-aware scorer's speed learning with first tokens
// on the virtual clock, and slow engines are slow.
func TestSimulateHeterogeneousFleet(t *testing.T) {
	gc := DefaultGenConfig(WorkloadChat)
	gc.Requests, gc.Rate = 300, 1
	reqs, err := Generate(gc)
	if err != nil {
		t.Fatal(err)
	}
	core := testCore(1)
	core.CapacityBlocks, core.MaxBatch = 4096, 64
	var obs *countingObserver
	r, err := Simulate(reqs, SimConfig{Engines: 2, Core: core, Policy: "kv-aware", Load: DefaultLoadConfig(), EngineSlow: []float64{1, 3},
		Scorer: func(ix *radix.Index, clock func() int64) sched.KVScorer {
			obs = &countingObserver{KVAware: kvroute.NewKVAware(kvroute.KVAwareConfig{Index: ix, LearnSpeed: true, Clock: clock}), clock: clock}
			return obs
		}})
	if err != nil {
		t.Fatal(err)
	}
	if obs.n != len(reqs) || obs.badClock {
		t.Fatalf("first tokens observed %d of %d (clock ok: %v)", obs.n, len(reqs), !obs.badClock)
	}
	var tt [2]time.Duration
	var n [2]int
	for _, x := range r.Run.Results {
		i := 0
		if x.Worker == "sim-1" {
			i = 1
		}
		tt[i] += x.TTFT
		n[i]++
	}
	if n[0] == 0 || n[1] == 0 || tt[1]/time.Duration(n[1]) < 2*tt[0]/time.Duration(n[0]) {
		t.Fatalf("slow engine not slower: TTFT sums %v over %v requests", tt, n)
	}
}

type countingObserver struct {
	*kvroute.KVAware
	clock    func() int64
	n        int
	last     int64
	badClock bool
}

func (c *countingObserver) ObserveFirstToken(w *fleet.Worker, prefill int64, ttft time.Duration) {
	c.n++
	now := c.clock()
	if now < c.last || ttft <= 0 {
		c.badClock = true
	}
	c.last = now
	c.KVAware.ObserveFirstToken(w, prefill, ttft)
}

func TestSimulateFlagMappings(t *testing.T) {
	if overlapWeightFromFlag(0) >= 0 || overlapWeightFromFlag(2.5) != 2.5 {
		t.Fatal("--kv-overlap-weight 0 must reach the scorer as 0, not as the default")
	}
}

// A simulation cut by --duration reports only the requests it issued, as
// RunLoad does. It used to return every request of the workload, the ones
// never sent as failures (status 0): they inflated the errors and deflated
// the goodput.
func TestSimulateDurationReportsOnlyIssuedRequests(t *testing.T) {
	reqs := smallShared(40)
	lc := DefaultLoadConfig()
	lc.Arrival, lc.Rate = ArrivalPoisson, 10 // 40 arrivals take ~4 s
	lc.Duration = time.Second
	r, err := Simulate(reqs, SimConfig{Engines: 2, Core: testCore(1), Policy: "round-robin", Load: lc})
	if err != nil {
		t.Fatal(err)
	}
	s := Summarize("sim", r.Run.Results, r.Run.ITLs, r.Run.Wall, SLO{}, 2)
	t.Logf("results %d, ok %d, errors %d (%v), goodput fraction %.3f", s.Requests, s.OK, s.Errors, s.ErrorsByStatus, s.GoodputFrac)
	if s.Errors != 0 || s.Requests != s.OK || s.Requests == 0 || s.Requests >= len(reqs) {
		t.Fatalf("a duration-limited simulation of %d requests reports %d results, %d ok, %d errors (%v)",
			len(reqs), s.Requests, s.OK, s.Errors, s.ErrorsByStatus)
	}
}

// Under --no-stream the simulator reports what the client measures of an
// answer read whole: TTFT = E2E, no TPOT or inter-token gaps. It used to
// report streamed figures (TTFT at the first token, TPOT), so compare
// --no-stream --sim-check compared different quantities and disagreed.
func TestSimulateNoStreamReportsAnswersReadWhole(t *testing.T) {
	reqs := smallShared(10)
	lc := DefaultLoadConfig()
	lc.Stream = false
	r, err := Simulate(reqs, SimConfig{Engines: 2, Core: testCore(1), Policy: "round-robin", Load: lc})
	if err != nil {
		t.Fatal(err)
	}
	s := Summarize("sim", r.Run.Results, r.Run.ITLs, r.Run.Wall, SLO{}, 2)
	t.Logf("--no-stream simulation: TTFT mean %.1f ms, E2E mean %.1f ms, TPOT n=%d, ITL n=%d", s.TTFT.Mean, s.E2E.Mean, s.TPOT.N, s.ITL.N)
	if s.OK != len(reqs) || s.TPOT.N != 0 || s.ITL.N != 0 {
		t.Fatalf("--no-stream simulation: %d of %d ok, TPOT n=%d, ITL n=%d", s.OK, len(reqs), s.TPOT.N, s.ITL.N)
	}
	for _, res := range r.Run.Results {
		if !res.Whole || res.TTFT != res.E2E || res.ITLCount != 0 {
			t.Fatalf("request %d simulated without streaming: TTFT %v, E2E %v, Whole %v, %d gaps; the client reports TTFT = E2E for a whole answer",
				res.Index, res.TTFT, res.E2E, res.Whole, res.ITLCount)
		}
	}
}

// A zero --block-size is refused with an error. warnOversized divided by it
// first: `infera bench simulate --block-size 0` (and compare) panicked with
// an integer divide by zero.
func TestSimulateAndCompareRefuseAZeroBlockSize(t *testing.T) {
	for _, cmd := range []string{"simulate", "compare"} {
		var cli struct {
			Bench Cmd `cmd:""`
		}
		p, err := kong.New(&cli)
		if err != nil {
			t.Fatal(err)
		}
		kctx, err := p.Parse([]string{"bench", cmd, "--block-size", "0", "--requests", "5", "--no-ceiling", "--svg", "", "--json", ""})
		if err != nil {
			t.Fatal(err)
		}
		func() {
			defer func() {
				if r := recover(); r != nil {
					t.Fatalf("bench %s --block-size 0 panicked: %v", cmd, r)
				}
			}()
			if err := kctx.Run(); err == nil || !strings.Contains(err.Error(), "--block-size") {
				t.Fatalf("bench %s --block-size 0: err %v, want a --block-size error", cmd, err)
			}
		}()
	}
}

// A time model infera engine refuses is refused by simulate too (it ran
// --engine-speedup 0 and --engine-slow 0 or -1 as 1: another model than the
// one a compare run's engines would run), and by compare before it starts
// its engines.
func TestSimulateRefusesATimeModelTheEngineRefuses(t *testing.T) {
	for _, args := range [][]string{
		{"simulate", "--engine-speedup=0"},
		{"simulate", "--engine-speedup=-2"},
		{"compare", "--engine-speedup=0"},
		{"simulate", "--engine-slow=1,0"},
		{"simulate", "--engine-slow=-1"},
	} {
		var cli struct {
			Bench Cmd `cmd:""`
		}
		p, err := kong.New(&cli)
		if err != nil {
			t.Fatal(err)
		}
		kctx, err := p.Parse(append([]string{"bench"}, append(args, "--requests", "5", "--no-ceiling", "--svg", "", "--json", "")...))
		if err != nil {
			t.Fatal(err)
		}
		flag, _, _ := strings.Cut(args[1], "=")
		if err := kctx.Run(); err == nil || !strings.Contains(err.Error(), flag) {
			t.Errorf("bench %v: err %v, want a %s error", args, err, flag)
		}
	}
}

// The prompt-shape flags are checked for a trace as bench gen checks them
// for a generated workload. With --trace, --tokens-per-block and
// --bytes-per-token of 0 or below ran as 512 and 4 without a word, a
// negative --max-requests as "all", and a large --tokens-per-block built
// a whole block per hash id: simulate of one 10-token request with
// --tokens-per-block 50000000 took 5.4 s and 955 MB.
func TestWorkloadFlagsOutOfRangeAreRefused(t *testing.T) {
	trace := filepath.Join(t.TempDir(), "one.jsonl")
	if err := os.WriteFile(trace, []byte(`{"timestamp":0,"input_length":10,"output_length":2,"hash_ids":[1]}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ cmd, flag, value string }{
		{"simulate", "--tokens-per-block", "50000000"},
		{"simulate", "--tokens-per-block", "0"},
		{"simulate", "--tokens-per-block", "-5"},
		{"simulate", "--bytes-per-token", "0"},
		{"simulate", "--bytes-per-token", "-2"},
		{"simulate", "--bytes-per-token", "100000"},
		{"simulate", "--max-requests", "-1"},
		{"replay", "--bytes-per-token", "0"},
		{"compare", "--tokens-per-block", "0"},
	} {
		var cli struct {
			Bench Cmd `cmd:""`
		}
		p, err := kong.New(&cli)
		if err != nil {
			t.Fatal(err)
		}
		args := []string{"bench", c.cmd, "--trace", trace, c.flag + "=" + c.value, "--json", ""}
		switch c.cmd {
		case "simulate":
			args = append(args, "--engines", "1", "--policies", "round-robin")
		case "replay":
			args = append(args, "--url", "http://127.0.0.1:1")
		case "compare":
			// Nothing to start: a run that got past the flags fails
			// on the engine's cache clear.
			args = append(args, "--svg", "", "--engine-urls", "http://127.0.0.1:1", "--no-ceiling", "--log-dir", t.TempDir())
		}
		kctx, err := p.Parse(args)
		if err != nil {
			t.Fatal(err)
		}
		if err := kctx.Run(); err == nil || !strings.Contains(err.Error(), c.flag) {
			t.Errorf("bench %s %s=%s: err %v, want a %s error", c.cmd, c.flag, c.value, err, c.flag)
		}
	}
}

// simulate with no policy (--policies "" or ",") is refused, as compare
// refuses it; it printed a table of row labels and no column, and exited 0.
func TestSimulateRefusesNoPolicies(t *testing.T) {
	for _, pols := range []string{"", ",", " , "} {
		var cli struct {
			Bench Cmd `cmd:""`
		}
		p, err := kong.New(&cli)
		if err != nil {
			t.Fatal(err)
		}
		kctx, err := p.Parse([]string{"bench", "simulate", "--policies", pols, "--requests", "5", "--engines", "1", "--no-ceiling"})
		if err != nil {
			t.Fatal(err)
		}
		if err := kctx.Run(); err == nil || !strings.Contains(err.Error(), "no policies") {
			t.Errorf("bench simulate --policies %q: err %v, want a refusal", pols, err)
		}
	}
}

// --max-in-flight bounds the simulated client as it bounds the real one:
// an open-loop arrival past it is an "overload" error, never sent. The
// simulators took the flag and ignored it (0 overloads at 200 req/s on one
// engine under --max-in-flight 3), so simulate and replay disagreed on the
// same overloaded run.
func TestSimulateHonoursMaxInFlight(t *testing.T) {
	reqs := smallShared(200)
	lc := DefaultLoadConfig()
	lc.Arrival, lc.Rate, lc.MaxInFlight = ArrivalPoisson, 200, 3
	core := testCore(1)
	check := func(name string, run *Run) {
		t.Helper()
		s := Summarize(name, run.Results, run.ITLs, run.Wall, SLO{}, 0)
		if s.ErrorsByStatus["overload"] == 0 || s.ErrorsByStatus["overload"] != run.Dropped || s.OK+s.Errors != len(reqs) || s.OK == 0 {
			t.Fatalf("%s: --max-in-flight 3 at 200 req/s: %d ok, errors %v, dropped %d", name, s.OK, s.ErrorsByStatus, run.Dropped)
		}
		// Requests in flight never pass the cap: at every sent request's
		// start, fewer than 3 others were in flight.
		for _, r := range run.Results {
			if r.Err == errOverload {
				continue
			}
			n := 0
			for _, o := range run.Results {
				if o.Err != errOverload && o.Index != r.Index && o.Start <= r.Start && o.Start+o.E2E > r.Start {
					n++
				}
			}
			if n >= 3 {
				t.Fatalf("%s: request %d started with %d others in flight", name, r.Index, n)
			}
		}
	}
	r, err := Simulate(reqs, SimConfig{Engines: 1, Core: core, Policy: "round-robin", Load: lc})
	if err != nil {
		t.Fatal(err)
	}
	check("mixed", r.Run)
	pr, err := SimulatePD(reqs, PDSimConfig{Prefill: 1, Decode: 1, Mode: "sglang", Core: core, Policy: "least-requests", DecodePolicy: "least-requests", Load: lc})
	if err != nil {
		t.Fatal(err)
	}
	check("pd", pr.Run)
}

// A --speedup or --rate whose schedule cannot be represented is refused,
// naming the flag, by every command taking it: --speedup 1e-300 or
// --arrival poisson --rate 1e-300 turned the timestamps into float-to-int64
// garbage (negative times), every request was sent at once and the figures
// looked normal.
func TestScheduleTooLongToRepresentIsRefused(t *testing.T) {
	trace := filepath.Join(t.TempDir(), "two.jsonl")
	if err := os.WriteFile(trace, []byte(`{"timestamp":0,"input_length":10,"output_length":2,"hash_ids":[1]}`+"\n"+
		`{"timestamp":1000,"input_length":10,"output_length":2,"hash_ids":[2]}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		cmd, flag string
		args      []string
	}{
		{"simulate", "--speedup", []string{"--trace", trace, "--speedup=1e-300"}},
		{"simulate", "--speedup", []string{"--trace", trace, "--speedup=+Inf"}},
		{"simulate", "--speedup", []string{"--requests", "20", "--speedup=1e-300"}},
		{"simulate", "--rate", []string{"--trace", trace, "--arrival", "poisson", "--rate=1e-300"}},
		{"simulate", "--rate", []string{"--requests", "20", "--arrival", "poisson", "--rate=1e-300"}},
		{"simulate", "--rate", []string{"--requests", "20", "--rate=1e-300"}},
		{"replay", "--speedup", []string{"--trace", trace, "--speedup=1e-300"}},
		{"replay", "--rate", []string{"--trace", trace, "--arrival", "poisson", "--rate=1e-300"}},
		{"compare", "--speedup", []string{"--trace", trace, "--speedup=1e-300"}},
		{"compare", "--rate", []string{"--requests", "20", "--arrival", "poisson", "--rate=1e-300"}},
		{"gen", "--rate", []string{"--requests", "20", "--rate=1e-300"}},
		{"gen", "--think-ms", []string{"--workload", "chat", "--requests", "20", "--think-ms=1e300"}},
	} {
		var cli struct {
			Bench Cmd `cmd:""`
		}
		p, err := kong.New(&cli)
		if err != nil {
			t.Fatal(err)
		}
		args := append([]string{"bench", c.cmd}, c.args...)
		switch c.cmd {
		case "simulate":
			args = append(args, "--engines", "1", "--policies", "round-robin", "--no-ceiling", "--json", "")
		case "replay":
			args = append(args, "--url", "http://127.0.0.1:1", "--json", "")
		case "compare":
			args = append(args, "--svg", "", "--json", "", "--engine-urls", "http://127.0.0.1:1", "--no-ceiling", "--log-dir", t.TempDir())
		case "gen":
			args = append(args, "--out", filepath.Join(t.TempDir(), "out.jsonl"))
		}
		kctx, err := p.Parse(args)
		if err != nil {
			t.Fatal(err)
		}
		if err := kctx.Run(); err == nil || !strings.Contains(err.Error(), c.flag) {
			t.Errorf("bench %s %v: err %v, want a %s error", c.cmd, c.args, err, c.flag)
		}
	}
	// The longest representable schedules still run.
	w := WorkloadFlags{Trace: trace, Speedup: 1e-9, BytesPerToken: 4, GenFlags: GenFlags{TokensPerBlock: 512, Rate: 1}}
	if reqs, _, err := w.Build(io.Discard, ArrivalTrace); err != nil || reqs[1].Timestamp < 1e12-1 { // 1000 / 1e-9 rounds down
		t.Fatalf("a 1e12 ms schedule: %v %+v", err, reqs)
	}
	w.Speedup, w.Rate = 1, 100*1000/maxScheduleMS
	if _, _, err := w.Build(io.Discard, ArrivalPoisson); err != nil {
		t.Fatalf("two poisson arrivals at --rate %v: %v", w.Rate, err)
	}
}
