package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alecthomas/kong"

	"github.com/infera/infera/engine"
)

// startEngine runs a real in-process simulated engine on a loopback port.
func startEngine(t *testing.T, id string, core engine.CoreConfig) string {
	t.Helper()
	srv, err := engine.NewServer(engine.Config{ID: id, Models: []string{"sim-model"}, Core: core, DefaultMaxTokens: 16})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return "http://" + ln.Addr().String()
}

func testCore(speedup float64) engine.CoreConfig {
	tm := engine.DefaultTimeModel()
	tm.Speedup = speedup
	return engine.CoreConfig{BlockSize: 16, CapacityBlocks: 4096, MaxBatch: 32, MaxPrefillTokens: 8192, Time: tm}
}

func smallShared(n int) []TraceRequest {
	c := DefaultGenConfig(WorkloadShared)
	c.Requests, c.Rate, c.SystemPrompts, c.SystemTokens, c.Users, c.OutputTokens = n, 40, 2, 1024, 8, 16
	reqs, err := Generate(c)
	if err != nil {
		panic(err)
	}
	return reqs
}

func TestRunLoadAgainstEngine(t *testing.T) {
	url := startEngine(t, "e0", testCore(4))
	reqs := smallShared(30)
	for _, api := range []struct {
		api    string
		tokens bool
		stream bool
	}{{"chat", false, true}, {"completions", true, true}, {"completions", false, false}} {
		t.Run(api.api+strconv.FormatBool(api.tokens)+strconv.FormatBool(api.stream), func(t *testing.T) {
			if err := postJSON(url+"/admin/clear-cache", []byte("{}")); err != nil {
				t.Fatal(err)
			}
			cl, err := NewClient(url, 64, true)
			if err != nil {
				t.Fatal(err)
			}
			lc := DefaultLoadConfig()
			lc.API, lc.TokenPrompts, lc.Stream = api.api, api.tokens, api.stream
			lc.Timeout = 20 * time.Second
			run, err := RunLoad(context.Background(), cl, reqs, lc)
			if err != nil {
				t.Fatal(err)
			}
			s := Summarize("e", run.Results, run.ITLs, run.Wall, SLO{}, 1)
			if s.OK != len(reqs) {
				t.Fatalf("%d/%d ok, first error %q", s.OK, len(reqs), firstErr(run.Results))
			}
			if s.PerWorker["e0"] != len(reqs) {
				t.Fatalf("worker header not read: %v", s.PerWorker)
			}
			if s.HitRate < 0.5 {
				t.Fatalf("shared prefixes should hit the prefix cache, hit rate %.3f", s.HitRate)
			}
			for _, r := range run.Results {
				if r.OutputTokens != reqs[r.Index].OutputLength {
					t.Fatalf("request %d: %d output tokens, want %d", r.Index, r.OutputTokens, reqs[r.Index].OutputLength)
				}
				if api.stream && (r.TTFT <= 0 || r.TTFT > r.E2E || r.TPOT() <= 0) {
					t.Fatalf("bad timings %+v", r)
				}
			}
		})
	}
}

func TestClosedAndPoissonArrivals(t *testing.T) {
	url := startEngine(t, "e0", testCore(8))
	reqs := smallShared(20)
	for _, arr := range []string{ArrivalClosed, ArrivalPoisson} {
		cl, _ := NewClient(url, 64, false)
		lc := DefaultLoadConfig()
		lc.Arrival, lc.Concurrency, lc.Rate = arr, 4, 50
		run, err := RunLoad(context.Background(), cl, reqs, lc)
		if err != nil {
			t.Fatal(err)
		}
		if len(run.Results) != len(reqs) {
			t.Fatalf("%s: %d results", arr, len(run.Results))
		}
		for _, r := range run.Results {
			if !r.OK() {
				t.Fatalf("%s: %+v", arr, r)
			}
		}
	}
	// Duration cap stops issuing.
	cl, _ := NewClient(url, 64, false)
	lc := DefaultLoadConfig()
	lc.Duration = 30 * time.Millisecond
	slow := append([]TraceRequest(nil), reqs...)
	for i := range slow {
		slow[i].Timestamp = int64(i) * 100
	}
	run, err := RunLoad(context.Background(), cl, slow, lc)
	if err != nil {
		t.Fatal(err)
	}
	if len(run.Results) != 1 {
		t.Fatalf("duration cap: %d requests sent, want 1", len(run.Results))
	}
}

// TestSimulatorMatchesEngine replays the same workload against one real
// in-process engine and against the simulator with the same core config,
// using the real run's observed send times as the simulator's arrivals (so
// load-generator lateness on a busy machine is not counted as model error).
// Stated tolerance: mean TTFT within 25% + 3 ms (HTTP, SSE and timer jitter
// at this speed-up), mean E2E within 15% + 3 ms, hit rate within 0.05.
// The real engine runs in wall-clock time, so a scheduling stall of the test
// machine (CI runs many packages at once on two cores) can add milliseconds
// the model cannot know about: a mismatch is measured a second time, on a
// fresh engine, before it fails the test. A wrong model fails both times.
func TestSimulatorMatchesEngine(t *testing.T) {
	const attempts = 2
	for i := 1; ; i++ {
		err := compareSimulatorWithEngine(t)
		if err == nil {
			return
		}
		if i == attempts {
			t.Fatal(err)
		}
		t.Logf("attempt %d: %v; measuring again", i, err)
	}
}

func compareSimulatorWithEngine(t *testing.T) error {
	core := testCore(1)
	url := startEngine(t, "e0", core)
	reqs := smallShared(40)
	lc := DefaultLoadConfig()
	cl, _ := NewClient(url, 64, true)
	run, err := RunLoad(context.Background(), cl, reqs, lc)
	if err != nil {
		t.Fatal(err)
	}
	real := Summarize("real", run.Results, run.ITLs, run.Wall, SLO{}, 1)
	sim, err := Simulate(ObservedArrivals(reqs, run.Results), SimConfig{Engines: 1, Core: core, Policy: "round-robin", Load: lc})
	if err != nil {
		t.Fatal(err)
	}
	simS := Summarize("sim", sim.Run.Results, sim.Run.ITLs, sim.Run.Wall, SLO{}, 1)
	t.Logf("real: TTFT mean %.1f p50 %.1f E2E mean %.1f hit %.3f | sim: TTFT mean %.1f p50 %.1f E2E mean %.1f hit %.3f",
		real.TTFT.Mean, real.TTFT.P50, real.E2E.Mean, real.HitRate, simS.TTFT.Mean, simS.TTFT.P50, simS.E2E.Mean, simS.HitRate)
	if real.OK != len(reqs) || simS.OK != len(reqs) {
		t.Fatalf("ok: real %d sim %d of %d", real.OK, simS.OK, len(reqs))
	}
	if d := math.Abs(real.TTFT.Mean - simS.TTFT.Mean); d > 0.25*simS.TTFT.Mean+3 {
		return fmt.Errorf("mean TTFT differs too much: real %.2f sim %.2f", real.TTFT.Mean, simS.TTFT.Mean)
	}
	if d := math.Abs(real.E2E.Mean - simS.E2E.Mean); d > 0.15*simS.E2E.Mean+3 {
		return fmt.Errorf("mean E2E differs too much: real %.2f sim %.2f", real.E2E.Mean, simS.E2E.Mean)
	}
	if d := math.Abs(real.HitRate - simS.HitRate); d > 0.05 {
		return fmt.Errorf("hit rate differs: real %.3f sim %.3f", real.HitRate, simS.HitRate)
	}
	return nil
}

// A reasoning model streams its first tokens as reasoning_content (vLLM's
// and SGLang's reasoning parsers): they are output tokens, so TTFT is the
// first of them and every gap after it is an inter-token gap, as vLLM's
// benchmark_serving counts them. Counting only "content" put TTFT after
// the whole reasoning and left those gaps out of ITL and TPOT.
func TestClientDoTimesReasoningTokens(t *testing.T) {
	srv, err := engine.NewServer(engine.Config{ID: "r0", Models: []string{"sim-model"}, Core: testCore(1), DefaultMaxTokens: 16, Reasoning: true})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	cl, err := NewClient("http://"+ln.Addr().String(), 4, true)
	if err != nil {
		t.Fatal(err)
	}
	body := []byte(`{"model":"sim-model","messages":[{"role":"user","content":"think first"}],"max_tokens":16,` +
		`"chat_template_kwargs":{"enable_thinking":true},"stream":true,"stream_options":{"include_usage":true}}`)
	var res Result
	cl.Do("/v1/chat/completions", body, true, &res)
	if !res.OK() {
		t.Fatalf("request failed: %+v", res)
	}
	t.Logf("TTFT %v, E2E %v, %d output tokens, %d inter-token gaps", res.TTFT, res.E2E, res.OutputTokens, res.ITLCount)
	if res.OutputTokens != 16 || res.ITLCount != 15 || len(cl.TakeITLs()) != 15 {
		t.Fatalf("16 streamed tokens (8 of them reasoning) must give 15 inter-token gaps, got %d of %d tokens", res.ITLCount, res.OutputTokens)
	}
	if res.TTFT > res.E2E/2 {
		t.Fatalf("TTFT %v is past the reasoning tokens (E2E %v): it must be the first token's", res.TTFT, res.E2E)
	}
}

// --duration bounds a run in time under every arrival mode. It also cut
// the workload to the requests whose trace timestamps fall inside it,
// which under closed and poisson arrivals (sent at once or at --rate, not
// at their timestamps) ended the run early: closed-loop `replay --duration
// 1s` against a fast engine sent the 15 requests stamped in the first
// second (at the generator's --rate 20) and stopped after 0.04 s.
func TestReplayDurationBoundsAClosedLoopByTime(t *testing.T) {
	tm := engine.DefaultTimeModel()
	tm.Speedup = 50
	url := startEngine(t, "e0", engine.CoreConfig{BlockSize: 16, CapacityBlocks: 4096, MaxBatch: 32, MaxPrefillTokens: 8192, Time: tm})
	s := runReplay(t, "--url", url, "--arrival", "closed", "--concurrency", "8",
		"--requests", "5000", "--duration", "1s", "--output-tokens", "8")
	t.Logf("closed loop, --duration 1s: %d requests (%d ok) in %.2f s", s.Requests, s.OK, s.WallS)
	if s.WallS < 0.9 || s.Requests <= 20 || s.Requests >= 5000 || s.OK != s.Requests {
		t.Fatalf("a closed loop bounded by --duration 1s ran %.2f s and sent %d requests (%d ok, errors %v)", s.WallS, s.Requests, s.OK, s.ErrorsByStatus)
	}
}

// runReplay runs `infera bench replay args...` as the command line parses it
// and returns its summary.
func runReplay(t *testing.T, args ...string) Summary {
	t.Helper()
	out := filepath.Join(t.TempDir(), "replay.json")
	var cli struct {
		Bench Cmd `cmd:""`
	}
	p, err := kong.New(&cli)
	if err != nil {
		t.Fatal(err)
	}
	kctx, err := p.Parse(append([]string{"bench", "replay", "--json", out}, args...))
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
	var rep struct{ Summary Summary }
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatal(err)
	}
	return rep.Summary
}

// A closed loop keeps --concurrency requests in flight whatever
// --max-in-flight (the open-loop cap) says. The client was sized by
// --max-in-flight alone, so `--arrival closed --concurrency 8
// --max-in-flight 2` kept 2 requests in flight, and the other 6 waited for a
// connection inside the client with their clock running: against an engine
// their TTFT mean was 40.1 ms instead of 1.7 ms.
func TestReplayClosedLoopKeepsItsConcurrencyInFlight(t *testing.T) {
	var cur, peak atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := cur.Add(1)
		defer cur.Add(-1)
		for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
		}
		time.Sleep(50 * time.Millisecond)
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"choices":[{"index":0,"message":{"role":"assistant","content":"a"},"finish_reason":"length"}],"usage":{"prompt_tokens":10,"completion_tokens":1}}`))
	}))
	defer srv.Close()
	s := runReplay(t, "--url", srv.URL, "--arrival", "closed", "--concurrency", "4", "--max-in-flight", "1",
		"--requests", "8", "--no-stream")
	t.Logf("closed loop of 4 with --max-in-flight 1: %d/%d ok, peak %d in flight at the server", s.OK, s.Requests, peak.Load())
	if s.OK != 8 || peak.Load() != 4 {
		t.Fatalf("a closed loop of 4 kept at most %d requests in flight (%d/%d ok)", peak.Load(), s.OK, s.Requests)
	}
}

// Open-loop arrivals beyond --max-in-flight are never sent: they count as
// errors apart ("overload", as LoadConfig.MaxInFlight says), not under "0",
// which is a transport error (a connection refused, reset or timed out).
func TestOpenLoopOverloadIsNotATransportError(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(100 * time.Millisecond)
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"choices":[{"index":0,"message":{"role":"assistant","content":"a"},"finish_reason":"length"}],"usage":{"prompt_tokens":10,"completion_tokens":1}}`))
	}))
	defer srv.Close()
	s := runReplay(t, "--url", srv.URL, "--arrival", "poisson", "--rate", "200", "--max-in-flight", "1",
		"--requests", "10", "--no-stream")
	t.Logf("%d/%d ok, errors %v", s.OK, s.Requests, s.ErrorsByStatus)
	if s.Errors == 0 || s.ErrorsByStatus["overload"] != s.Errors {
		t.Fatalf("arrivals refused by --max-in-flight 1: errors %v, want them all as overload", s.ErrorsByStatus)
	}
}

// A second Ctrl-C ends an interrupted replay at once. The first stops
// issuing and waits for the requests in flight, each bounded by --timeout;
// the second was swallowed too, so a replay whose request hung in an engine
// could only be killed (it waited out --timeout: 5 minutes by default).
func TestReplayQuitsOnASecondInterrupt(t *testing.T) {
	if url := os.Getenv("INFERA_BENCH_TEST_REPLAY_URL"); url != "" {
		var cli struct {
			Bench Cmd `cmd:""`
		}
		p, err := kong.New(&cli)
		if err != nil {
			t.Fatal(err)
		}
		kctx, err := p.Parse([]string{"bench", "replay", "--url", url, "--requests", "1", "--no-stream", "--timeout", "1m"})
		if err != nil {
			t.Fatal(err)
		}
		_ = kctx.Run()
		return
	}
	arrived := make(chan struct{}, 1)
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case arrived <- struct{}{}:
		default:
		}
		select { // an engine that hangs
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer srv.Close()
	defer close(release)
	cmd := exec.Command(os.Args[0], "-test.run=^TestReplayQuitsOnASecondInterrupt$")
	cmd.Env = append(os.Environ(), "INFERA_BENCH_TEST_REPLAY_URL="+srv.URL)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	defer func() {
		select {
		case <-done:
		default:
			_ = cmd.Process.Kill()
			<-done
		}
	}()
	select {
	case <-arrived:
	case <-time.After(20 * time.Second):
		t.Fatalf("the replay sent nothing; output:\n%s", out.String())
	}
	_ = cmd.Process.Signal(os.Interrupt)
	time.Sleep(300 * time.Millisecond)
	_ = cmd.Process.Signal(os.Interrupt)
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("an interrupted replay with a hung request still runs 5 s after a second Ctrl-C")
	}
}

// replay --api-key sends the key as OpenAI clients do ("Authorization:
// Bearer"), so an endpoint with a key (infera serve --api-key, vLLM
// --api-key) can be measured; it had no way to send one, and every request
// of a replay against `infera serve --api-key` failed with 401. The key
// is never printed: a URL carrying credentials (never sent, and printed in
// the progress line, the table and the JSON) is refused, its password
// redacted in the error.
func TestReplaySendsTheAPIKeyAndNeverPrintsIt(t *testing.T) {
	const key = "sk-test-NEVERPRINTED"
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+key {
			w.WriteHeader(http.StatusUnauthorized)
			w.Write([]byte(`{"error":{"message":"bad key","type":"invalid_request_error"}}`))
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"choices":[{"index":0,"message":{"role":"assistant","content":"a"},"finish_reason":"length"}],"usage":{"prompt_tokens":10,"completion_tokens":1}}`))
	}))
	defer srv.Close()
	replay := func(args ...string) ([]byte, error) {
		out := filepath.Join(t.TempDir(), "replay.json")
		var cli struct {
			Bench Cmd `cmd:""`
		}
		p, err := kong.New(&cli)
		if err != nil {
			t.Fatal(err)
		}
		kctx, err := p.Parse(append([]string{"bench", "replay", "--requests", "5", "--rate", "200", "--no-stream", "--json", out}, args...))
		if err != nil {
			t.Fatal(err)
		}
		if err := kctx.Run(); err != nil {
			return nil, err
		}
		return os.ReadFile(out)
	}
	b, err := replay("--url", srv.URL, "--api-key", key)
	if err != nil {
		t.Fatal(err)
	}
	var rep struct{ Summary Summary }
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatal(err)
	}
	if rep.Summary.OK != 5 {
		t.Fatalf("with --api-key: %d/%d ok, errors %v", rep.Summary.OK, rep.Summary.Requests, rep.Summary.ErrorsByStatus)
	}
	if bytes.Contains(b, []byte(key)) {
		t.Fatalf("the JSON results hold the API key:\n%s", b)
	}
	u := strings.Replace(srv.URL, "http://", "http://user:"+key+"@", 1)
	b, err = replay("--url", u)
	if err == nil {
		t.Fatalf("a URL with credentials (which are not sent) was accepted; results:\n%s", b)
	}
	if strings.Contains(err.Error(), key) {
		t.Fatalf("the error shows the key: %v", err)
	}
}

// A replay whose every request failed is a failed run. It printed a table
// of "0/20" and "errors 0:20" and exited 0, against a port nothing listens
// on, a wrong --model or a missing key alike: the reason (connection
// refused, 404, 401) was shown nowhere and a script saw success.
func TestReplayFailsWhenEveryRequestFails(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	out := filepath.Join(t.TempDir(), "replay.json")
	var cli struct {
		Bench Cmd `cmd:""`
	}
	p, err := kong.New(&cli)
	if err != nil {
		t.Fatal(err)
	}
	kctx, err := p.Parse([]string{"bench", "replay", "--url", "http://" + addr, "--requests", "4", "--rate", "200", "--json", out})
	if err != nil {
		t.Fatal(err)
	}
	err = kctx.Run()
	t.Logf("replay against a closed port: %v", err)
	if err == nil || !strings.Contains(err.Error(), "every request failed") || !strings.Contains(err.Error(), "refused") {
		t.Fatalf("a replay whose 4 requests were refused returned %v, want an error saying why", err)
	}
	if _, err := os.Stat(out); err != nil {
		t.Fatalf("the results of a failed run must still be written: %v", err)
	}
}

// A hosted OpenAI-compatible endpoint is https, often with a base path
// (https://host/v1, https://host/openai/v1): replay reaches it (it refused
// every https URL) and puts the base path before the request's, a
// trailing /v1 shared as OpenAI clients do.
func TestReplayReachesAnHTTPSEndpointUnderItsBasePath(t *testing.T) {
	var got atomic.Value
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got.Store(r.URL.Path)
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"choices":[{"index":0,"message":{"role":"assistant","content":"a"},"finish_reason":"length"}],"usage":{"prompt_tokens":10,"completion_tokens":1}}`))
	}))
	defer srv.Close()
	for base, want := range map[string]string{
		srv.URL:                      "/v1/chat/completions",
		srv.URL + "/v1":              "/v1/chat/completions",
		srv.URL + "/v1/":             "/v1/chat/completions",
		srv.URL + "/openai/v1":       "/openai/v1/chat/completions",
		srv.URL + "/serving-engine/": "/serving-engine/v1/chat/completions",
	} {
		cl, err := NewClient(base, 2, false)
		if err != nil {
			t.Fatalf("%s: %v", base, err)
		}
		cl.hc.TLSConfig = srv.Client().Transport.(*http.Transport).TLSClientConfig
		var res Result
		cl.Do("/v1/chat/completions", []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`), false, &res)
		if res.Err != "" || res.Status != 200 {
			t.Fatalf("%s: status %d err %q", base, res.Status, res.Err)
		}
		if p, _ := got.Load().(string); p != want {
			t.Fatalf("%s: the endpoint got %s, want %s", base, p, want)
		}
	}
	for _, bad := range []string{"ftp://h:1", "https://", "http://h:1/v1?x=1", "h:1"} {
		if _, err := NewClient(bad, 1, false); err == nil {
			t.Fatalf("%q accepted", bad)
		}
	}
}

// A trace faster than the client can issue (a high --speedup on a loaded
// machine) is cut by --duration with requests never sent: the run says how
// many (they were silently missing: 1,958 of 6,401 requests stamped within
// 2 s were sent, and nothing told).
func TestATraceTheClientFellBehindOnCountsTheRequestsNeverSent(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(50 * time.Millisecond)
		w.Write([]byte(`{"choices":[{"index":0,"message":{"role":"assistant","content":"a"},"finish_reason":"length"}],"usage":{"prompt_tokens":10,"completion_tokens":1}}`))
	}))
	defer srv.Close()
	cl, err := NewClient(srv.URL, 1, false)
	if err != nil {
		t.Fatal(err)
	}
	// 50,000 requests stamped at 0 ms, one in flight at most (the others
	// are refused at once), and 1 ns to issue them: no machine issues them
	// all in time (with 1 ms a quiet machine refused all 50,000 before the
	// duration's timer fired: 4 runs of 20 failed).
	const n = 50_000
	reqs := make([]TraceRequest, n)
	for i := range reqs {
		reqs[i] = TraceRequest{InputLength: 16, OutputLength: 1}
	}
	lc := DefaultLoadConfig()
	lc.Stream, lc.MaxInFlight, lc.Duration, lc.Timeout = false, 1, time.Nanosecond, 5*time.Second
	run, err := RunLoad(context.Background(), cl, reqs, lc)
	if err != nil {
		t.Fatal(err)
	}
	if run.Behind == 0 || run.Behind+len(run.Results) != n {
		t.Fatalf("%d sent and %d behind of %d stamped within --duration", len(run.Results), run.Behind, n)
	}
}

// replay --json carries the figures of the table: the imbalance over the
// workers seen (no --workers) was written with "workers": 0 beside it, as
// though it had been computed over none. A --workers below the workers
// seen counts those seen: max/mean over 1 of 3 evenly loaded workers read
// 0.33, below the 1 of a perfectly even spread.
func TestReplayJSONNamesTheWorkersOfTheImbalance(t *testing.T) {
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Infera-Engine-Id", "engine-"+strconv.Itoa(int(n.Add(1)%3)))
		w.Write([]byte(`{"choices":[{"index":0,"message":{"role":"assistant","content":"a"},"finish_reason":"length"}],"usage":{"prompt_tokens":10,"completion_tokens":1}}`))
	}))
	defer srv.Close()
	for _, c := range []struct {
		args    []string
		workers int
	}{{nil, 3}, {[]string{"--workers", "4"}, 4}, {[]string{"--workers", "1"}, 3}} {
		out := filepath.Join(t.TempDir(), "replay.json")
		var cli struct {
			Bench Cmd `cmd:""`
		}
		p, err := kong.New(&cli)
		if err != nil {
			t.Fatal(err)
		}
		kctx, err := p.Parse(append([]string{"bench", "replay", "--url", srv.URL, "--requests", "9", "--rate", "200", "--no-stream", "--json", out}, c.args...))
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
		var rep struct{ Summary Summary }
		if err := json.Unmarshal(b, &rep); err != nil {
			t.Fatal(err)
		}
		s := rep.Summary
		if s.Workers != c.workers || len(s.PerWorker) != 3 || s.Imbalance != Imbalance(s.PerWorker, c.workers) {
			t.Fatalf("%v: workers %d (want %d), per worker %v, imbalance %v", c.args, s.Workers, c.workers, s.PerWorker, s.Imbalance)
		}
	}
}

// --token-prompts sends completions prompts as token ids; with the default
// --api chat it was taken and did nothing (the prompts went as text), in
// replay, compare and simulate alike. It is refused at parse time.
func TestTokenPromptsWithoutCompletionsIsRefused(t *testing.T) {
	for _, cmd := range []string{"replay", "compare", "simulate"} {
		var cli struct {
			Bench Cmd `cmd:""`
		}
		p, err := kong.New(&cli)
		if err != nil {
			t.Fatal(err)
		}
		_, err = p.Parse([]string{"bench", cmd, "--token-prompts"})
		if err == nil || !strings.Contains(err.Error(), "--token-prompts needs --api completions") {
			t.Fatalf("bench %s --token-prompts (--api chat): %v", cmd, err)
		}
		if _, err := p.Parse([]string{"bench", cmd, "--token-prompts", "--api", "completions"}); err != nil {
			t.Fatalf("bench %s --token-prompts --api completions: %v", cmd, err)
		}
	}
	lc := DefaultLoadConfig()
	lc.TokenPrompts = true
	if err := lc.Validate(); err == nil {
		t.Fatal("LoadConfig with TokenPrompts and API chat accepted")
	}
}
