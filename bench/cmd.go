package bench

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/infera/infera/engine"
	"github.com/infera/infera/kvroute"
)

// Cmd is `infera bench`.
type Cmd struct {
	Replay   ReplayCmd   `cmd:"" help:"Replay a trace or synthetic workload against one OpenAI-compatible endpoint."`
	Compare  CompareCmd  `cmd:"" help:"Start engines and one router per policy, replay the same workload against each, compare."`
	Simulate SimulateCmd `cmd:"" help:"Discrete-event simulation of a fleet with the engine's time model and the router's scheduler."`
	Gen      GenCmd      `cmd:"" help:"Generate a synthetic workload as a Mooncake JSONL trace."`
	Proxy    ProxyCmd    `cmd:"" help:"Measure proxy overhead: direct vs infera serve vs nginx, plain and streaming."`
	Mirror   MirrorCmd   `cmd:"" help:"Measure traffic mirroring's CPU cost in the router: off, copy only, sent, per 10k requests."`
	// NaiveProxy is the reference proxy of bench proxy --naive.
	NaiveProxy NaiveProxyCmd `cmd:"" hidden:"" name:"naive-proxy" help:"The thinnest fasthttp reverse proxy (the reference of bench proxy --naive)."`
}

// GenFlags parameterise the synthetic generators.
type GenFlags struct {
	Workload       string  `help:"Synthetic workload (when no --trace): shared-prefix, chat, agent or unique." default:"shared-prefix" enum:"shared-prefix,chat,agent,unique" env:"INFERA_BENCH_WORKLOAD"`
	Requests       int     `help:"Requests to generate." default:"200" env:"INFERA_BENCH_REQUESTS"`
	Rate           float64 `help:"Mean arrival rate of generated requests (sessions for chat/agent) per second; also the --arrival poisson rate." default:"20" env:"INFERA_BENCH_RATE"`
	Seed           uint64  `help:"Random seed of generators and Poisson arrivals." default:"1" env:"INFERA_BENCH_SEED"`
	SystemPrompts  int     `help:"shared-prefix: number of distinct system prompts." default:"16" env:"INFERA_BENCH_SYSTEM_PROMPTS"`
	SystemTokens   int     `help:"shared-prefix: tokens per system prompt." default:"2048" env:"INFERA_BENCH_SYSTEM_TOKENS"`
	Users          int     `help:"shared-prefix: distinct users (each sticks to one system prompt)." default:"64" env:"INFERA_BENCH_USERS"`
	QuestionTokens int     `help:"Mean tokens of each new user message (0: workload default)." default:"0" env:"INFERA_BENCH_QUESTION_TOKENS"`
	Turns          int     `help:"chat/agent: turns per session (0: workload default)." default:"0" env:"INFERA_BENCH_TURNS"`
	ThinkMs        float64 `help:"chat/agent: mean pause between turns in ms (<0: workload default)." default:"-1" env:"INFERA_BENCH_THINK_MS"`
	OutputTokens   int     `help:"Mean output tokens (0: workload default)." default:"0" env:"INFERA_BENCH_OUTPUT_TOKENS"`
	PromptTokens   int     `help:"unique: mean prompt tokens." default:"1024" env:"INFERA_BENCH_PROMPT_TOKENS"`
	TokensPerBlock int     `help:"Tokens one trace hash id stands for (512 in Mooncake traces)." default:"512" env:"INFERA_BENCH_TOKENS_PER_BLOCK"`
}

// Validate refuses negative lengths where 0 stands for the workload's
// default: a negative value was replaced by the default without a word.
func (g *GenFlags) Validate() error {
	for _, f := range []struct {
		name string
		v    int
	}{{"--question-tokens", g.QuestionTokens}, {"--turns", g.Turns}, {"--output-tokens", g.OutputTokens}} {
		if f.v < 0 {
			return fmt.Errorf("%s must not be negative (0: the workload's default), got %d", f.name, f.v)
		}
	}
	return nil
}

func (g *GenFlags) config() GenConfig {
	c := DefaultGenConfig(g.Workload)
	c.Requests, c.Rate, c.Seed = g.Requests, g.Rate, g.Seed
	c.SystemPrompts, c.SystemTokens, c.Users, c.PromptTokens = g.SystemPrompts, g.SystemTokens, g.Users, g.PromptTokens
	c.BlockTokens = g.TokensPerBlock
	if g.QuestionTokens > 0 {
		c.QuestionTokens = g.QuestionTokens
	}
	if g.Turns > 0 {
		c.Turns = g.Turns
	}
	if g.ThinkMs >= 0 {
		c.ThinkMS = g.ThinkMs
	}
	if g.OutputTokens > 0 {
		c.OutputTokens = g.OutputTokens
	}
	return c
}

// maxBytesPerToken bounds --bytes-per-token: no tokenizer averages more
// bytes per token, and a prompt is InputLength times as many bytes.
const maxBytesPerToken = 64

// WorkloadFlags select and shape the workload.
type WorkloadFlags struct {
	Trace         string        `help:"Mooncake JSONL trace (timestamp ms, input_length, output_length, hash_ids); empty uses --workload." default:"" env:"INFERA_BENCH_TRACE" type:"path"`
	Speedup       float64       `help:"Divide trace timestamps by this (time scaling)." default:"1" env:"INFERA_BENCH_SPEEDUP"`
	MaxRequests   int           `help:"Use at most this many requests (0: all)." default:"0" env:"INFERA_BENCH_MAX_REQUESTS"`
	Duration      time.Duration `help:"Stop issuing requests after this long (0: no limit)." default:"0" env:"INFERA_BENCH_DURATION"`
	BytesPerToken int           `help:"Bytes of prompt text per token under the engines' tokenizer (4 for the built-in Simple tokenizer)." default:"4" env:"INFERA_BENCH_BYTES_PER_TOKEN"`
	GenFlags
}

// Build loads or generates the workload, scaled and capped, for requests
// sent by arrival mode arrival. It returns the requests and a short
// description. --duration drops the requests stamped past it only when they
// are sent at their timestamps (ArrivalTrace); closed and poisson runs send
// them at their own pace, and RunLoad and Simulate stop those at --duration.
func (w *WorkloadFlags) Build(stderr io.Writer, arrival string) ([]TraceRequest, string, error) {
	// As Generate checks them for a generated workload: a trace's prompts
	// are rendered with them too (a block of --tokens-per-block x
	// --bytes-per-token bytes per hash id), and a value <= 0 was replaced
	// by the default without a word.
	if w.TokensPerBlock < 1 || w.TokensPerBlock > 1<<16 {
		return nil, "", fmt.Errorf("--tokens-per-block must be in [1, 65536], got %d", w.TokensPerBlock)
	}
	if w.BytesPerToken < 1 || w.BytesPerToken > maxBytesPerToken {
		return nil, "", fmt.Errorf("--bytes-per-token must be in [1, %d], got %d", maxBytesPerToken, w.BytesPerToken)
	}
	if w.MaxRequests < 0 {
		return nil, "", fmt.Errorf("--max-requests must not be negative (0: all), got %d", w.MaxRequests)
	}
	var reqs []TraceRequest
	name := w.Workload
	if w.Trace != "" {
		rs, bad, err := ReadTraceFile(w.Trace)
		if err != nil {
			return nil, "", err
		}
		for i, b := range bad {
			if i == 5 {
				fmt.Fprintf(stderr, "trace %s: ... %d bad lines skipped in total\n", w.Trace, len(bad))
				break
			}
			fmt.Fprintf(stderr, "trace %s: skipped %v\n", w.Trace, b)
		}
		reqs, name = rs, w.Trace
	} else {
		rs, err := Generate(w.config())
		if err != nil {
			return nil, "", err
		}
		reqs = rs
	}
	if !(w.Speedup > 0) || math.IsInf(w.Speedup, 0) {
		return nil, "", fmt.Errorf("--speedup must be positive and finite, got %v", w.Speedup)
	}
	var cutMS int64
	if arrival == ArrivalTrace {
		cutMS = w.Duration.Milliseconds()
	}
	for i := range reqs {
		if w.MaxRequests > 0 && i >= w.MaxRequests {
			break
		}
		ts := float64(reqs[i].Timestamp-reqs[0].Timestamp) / w.Speedup
		if cutMS > 0 && ts >= float64(cutMS) {
			break
		}
		if ts > maxScheduleMS {
			return nil, "", fmt.Errorf("--speedup %v stretches the workload's schedule to %.4g ms (request %d), over the %.0f ms a schedule may span: raise --speedup",
				w.Speedup, ts, i+1, float64(maxScheduleMS))
		}
	}
	reqs = ScaleTrace(reqs, w.Speedup, w.MaxRequests, cutMS)
	if len(reqs) == 0 {
		return nil, "", fmt.Errorf("workload %s has no requests", name)
	}
	if arrival == ArrivalPoisson {
		if err := checkPoissonRate(w.Rate, len(reqs)); err != nil {
			return nil, "", err
		}
	}
	return reqs, name, nil
}

// checkPoissonRate refuses a --rate whose Poisson schedule of n arrivals
// may pass maxScheduleMS: n exponential gaps of mean 1/rate s add up to
// n/rate s, and to more than 2n+40 of those means almost never.
func checkPoissonRate(rate float64, n int) error {
	if !(rate > 0) || math.IsInf(rate, 0) {
		return fmt.Errorf("--rate must be positive and finite for --arrival poisson, got %v", rate)
	}
	if span := float64(2*n+40) / rate * 1000; span > maxScheduleMS {
		return fmt.Errorf("--rate %v is too low for %d poisson arrivals: their schedule may reach %.4g ms, over the %.0f ms a schedule may span: raise --rate",
			rate, n, span, float64(maxScheduleMS))
	}
	return nil
}

func (w *WorkloadFlags) prompt() PromptConfig {
	return PromptConfig{TokensPerBlock: w.TokensPerBlock, BytesPerToken: w.BytesPerToken}
}

// LoadFlags shape how requests are sent.
type LoadFlags struct {
	Arrival      string        `help:"trace: open loop at the workload's timestamps; poisson: open loop at --rate; closed: --concurrency in flight." default:"trace" enum:"trace,poisson,closed" env:"INFERA_BENCH_ARRIVAL"`
	Concurrency  int           `help:"Closed-loop requests in flight." default:"16" env:"INFERA_BENCH_CONCURRENCY"`
	MaxInFlight  int           `help:"Open-loop cap on requests in flight; arrivals beyond it count as errors." default:"4096" env:"INFERA_BENCH_MAX_IN_FLIGHT"`
	Timeout      time.Duration `help:"Per-request timeout." default:"5m" env:"INFERA_BENCH_TIMEOUT"`
	API          string        `help:"OpenAI API to call." default:"chat" enum:"chat,completions" env:"INFERA_BENCH_API"`
	TokenPrompts bool          `help:"With --api completions, send prompts as token-id arrays." default:"false" env:"INFERA_BENCH_TOKEN_PROMPTS"`
	Stream       bool          `help:"Stream responses (SSE) to measure TTFT and inter-token latency." default:"true" negatable:"" env:"INFERA_BENCH_STREAM"`
	Model        string        `help:"Model name to request." default:"sim-model" env:"INFERA_BENCH_MODEL"`
	SloTTFT      time.Duration `name:"slo-ttft" help:"Goodput SLO on time to first token (0: not checked)." default:"0" env:"INFERA_BENCH_SLO_TTFT"`
	SloTPOT      time.Duration `name:"slo-tpot" help:"Goodput SLO on time per output token (0: not checked)." default:"0" env:"INFERA_BENCH_SLO_TPOT"`
}

func (l *LoadFlags) config(w *WorkloadFlags) LoadConfig {
	return LoadConfig{Arrival: l.Arrival, Rate: w.Rate, Concurrency: l.Concurrency, MaxInFlight: l.MaxInFlight,
		Duration: w.Duration, Timeout: l.Timeout, API: l.API, TokenPrompts: l.TokenPrompts, Stream: l.Stream,
		Model: l.Model, Prompt: w.prompt(), Seed: w.Seed}
}

func (l *LoadFlags) slo() SLO { return SLO{TTFT: l.SloTTFT, TPOT: l.SloTPOT} }

// Validate refuses a TPOT objective without streaming: a whole answer has
// no time per token to judge (it counted as 0, meeting any objective).
func (l *LoadFlags) Validate() error {
	if !l.Stream && l.SloTPOT > 0 {
		return fmt.Errorf("--slo-tpot needs streamed answers (--stream): without them there is no time per output token")
	}
	if l.TokenPrompts && l.API != "completions" {
		return errTokenPromptsChat
	}
	return nil
}

// OutputFlags name result files.
type OutputFlags struct {
	JSON string `name:"json" help:"Write results as JSON to this file (empty: none)." default:"" env:"INFERA_BENCH_JSON"`
}

func writeJSONFile(path string, v any) error {
	if path == "" {
		return nil
	}
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("cannot create %s: %w", path, err)
	}
	if err := WriteJSON(f, v); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// signalContext returns a context cancelled by the first SIGINT or SIGTERM:
// the run stops issuing requests and waits for those in flight (each
// bounded by --timeout). The signals are then handed back to their default
// action, so a second one ends the process at once: a request hung in an
// engine no longer holds an interrupted run for up to --timeout.
func signalContext() (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.Background())
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, os.Interrupt, syscall.SIGTERM)
	go func() {
		select {
		case sig := <-ch:
			signal.Stop(ch)
			fmt.Fprintf(os.Stderr, "%v: stopping; waiting for the requests in flight (again to quit now)\n", sig)
			cancel()
		case <-ctx.Done():
			signal.Stop(ch)
		}
	}()
	return ctx, cancel
}

// ReplayCmd is `infera bench replay`.
type ReplayCmd struct {
	URL     string `help:"Base URL of the router or engine: http(s)://host[:port][/path] (a trailing /v1 is shared with the request path)." default:"http://127.0.0.1:8000" env:"INFERA_BENCH_URL"`
	Workers int    `help:"Fleet size for the load imbalance (0: workers seen in X-Infera-Worker or X-Infera-Engine-Id; never fewer than those seen)." default:"0" env:"INFERA_BENCH_WORKERS"`
	APIKey  string `name:"api-key" help:"API key of the endpoint, sent as 'Authorization: Bearer <key>' and never printed (empty: none)." default:"" env:"INFERA_BENCH_API_KEY"`
	WorkloadFlags
	LoadFlags
	OutputFlags
}

// Run implements the command.
func (c *ReplayCmd) Run() error {
	reqs, name, err := c.Build(os.Stderr, c.Arrival)
	if err != nil {
		return err
	}
	lc := c.config(&c.WorkloadFlags)
	cl, err := NewClient(c.URL, lc.InFlight(), true)
	if err != nil {
		return err
	}
	cl.SetAPIKey(c.APIKey)
	ctx, cancel := signalContext()
	defer cancel()
	fmt.Fprintf(os.Stderr, "replaying %d requests of %s against %s\n", len(reqs), name, c.URL)
	lc.Progress = NewProgress(os.Stderr, "replay")
	run, err := RunLoad(ctx, cl, reqs, lc)
	if err != nil {
		return err
	}
	if w := run.behindWarning(); w != "" {
		fmt.Fprintln(os.Stderr, "WARNING: "+w)
	}
	s := Summarize(c.URL, run.Results, run.ITLs, run.Wall, c.slo(), c.Workers)
	if err := WriteTable(os.Stdout, []Summary{s}); err != nil {
		return err
	}
	if err := writeJSONFile(c.JSON, struct {
		Workload string  `json:"workload"`
		Summary  Summary `json:"summary"`
	}{name, s}); err != nil {
		return err
	}
	if s.OK == 0 && s.Requests > 0 {
		// As compare: an unreachable endpoint, a wrong model or key is a
		// failed run, and the table's error counts do not say why.
		return fmt.Errorf("every request failed (first error: %s)", firstErr(run.Results))
	}
	return nil
}

// EngineFlags mirror `infera engine`'s model flags.
type EngineFlags struct {
	BlockSize        int           `help:"Engine KV block size in tokens." default:"16" env:"INFERA_BENCH_BLOCK_SIZE"`
	KVCapacityBlocks int           `name:"kv-capacity-blocks" help:"Engine KV cache capacity in blocks." default:"1024" env:"INFERA_BENCH_KV_CAPACITY_BLOCKS"`
	MaxBatch         int           `help:"Engine max running sequences." default:"64" env:"INFERA_BENCH_MAX_BATCH"`
	MaxPrefillTokens int           `help:"Engine uncached prompt tokens per step (0: no cap)." default:"8192" env:"INFERA_BENCH_MAX_PREFILL_TOKENS"`
	EngineSpeedup    float64       `help:"Engine time model speed-up (divides every simulated duration; positive and finite, as infera engine --speedup)." default:"2" env:"INFERA_BENCH_ENGINE_SPEEDUP"`
	PrefillBase      time.Duration `help:"Engine fixed cost of a prefill step." default:"8ms" env:"INFERA_BENCH_PREFILL_BASE"`
	PrefillPerToken  time.Duration `help:"Engine prefill cost per uncached token." default:"80us" env:"INFERA_BENCH_PREFILL_PER_TOKEN"`
	PrefillPerSeq    time.Duration `help:"Engine prefill cost per sequence." default:"250us" env:"INFERA_BENCH_PREFILL_PER_SEQ"`
	DecodeBase       time.Duration `help:"Engine fixed cost of a decode step." default:"12ms" env:"INFERA_BENCH_DECODE_BASE"`
	DecodePerSeq     time.Duration `help:"Engine decode cost per running sequence." default:"150us" env:"INFERA_BENCH_DECODE_PER_SEQ"`
}

// check refuses engine flags the engines would refuse, before anything
// divides by them (warnOversized, the ceiling).
func (e *EngineFlags) check() error {
	if e.BlockSize < 1 || e.BlockSize > 65536 {
		return fmt.Errorf("--block-size must be in [1, 65536], got %d", e.BlockSize)
	}
	// As infera engine refuses it: a simulated engine runs the same time
	// model a compare run's engines would.
	if !(e.EngineSpeedup > 0) || math.IsInf(e.EngineSpeedup, 0) {
		return fmt.Errorf("--engine-speedup must be positive and finite, got %v", e.EngineSpeedup)
	}
	return nil
}

func (e *EngineFlags) timeModel() engine.TimeModel {
	return engine.TimeModel{PrefillBase: e.PrefillBase, PrefillPerToken: e.PrefillPerToken, PrefillPerSeq: e.PrefillPerSeq,
		DecodeBase: e.DecodeBase, DecodePerSeq: e.DecodePerSeq, Speedup: e.EngineSpeedup}
}

func (e *EngineFlags) coreConfig() engine.CoreConfig {
	return engine.CoreConfig{BlockSize: e.BlockSize, CapacityBlocks: e.KVCapacityBlocks, MaxBatch: e.MaxBatch,
		MaxPrefillTokens: e.MaxPrefillTokens, Time: e.timeModel()}
}

func (e *EngineFlags) engineConfig() EngineConfig {
	d := func(v time.Duration) string { return v.String() }
	return EngineConfig{BlockSize: e.BlockSize, KVCapacityBlocks: e.KVCapacityBlocks, MaxBatch: e.MaxBatch,
		MaxPrefillTokens: e.MaxPrefillTokens, Speedup: e.EngineSpeedup,
		Extra: []string{"--prefill-base", d(e.PrefillBase), "--prefill-per-token", d(e.PrefillPerToken),
			"--prefill-per-seq", d(e.PrefillPerSeq), "--decode-base", d(e.DecodeBase), "--decode-per-seq", d(e.DecodePerSeq)}}
}

func splitList(vs []string) []string {
	var out []string
	for _, v := range vs {
		for _, p := range strings.Split(v, ",") {
			if p = strings.TrimSpace(p); p != "" {
				out = append(out, p)
			}
		}
	}
	return out
}

// CompareCmd is `infera bench compare`.
type CompareCmd struct {
	Policies   []string `help:"Policies to compare, one router each: kv-aware, round-robin, least-requests, least-tokens, prefix (the router's prefix index over least-requests) or POLICY+prefix." default:"round-robin,least-requests,prefix,kv-aware" sep:"," env:"INFERA_BENCH_POLICIES"`
	Engines    int      `help:"Engines to start." default:"4" env:"INFERA_BENCH_ENGINES"`
	EngineURLs []string `name:"engine-urls" help:"Reuse running engines instead of starting them (their caches are cleared between policies)." sep:"," env:"INFERA_BENCH_ENGINE_URLS"`
	InferaBin  string   `name:"infera-bin" help:"infera binary to run engines and routers with (default: this executable)." default:"" env:"INFERA_BENCH_INFERA_BIN"`
	KVEvents   bool     `name:"kv-events" help:"Connect kv-aware routers to the engines' ZMQ KV event streams." default:"true" negatable:"" env:"INFERA_BENCH_KV_EVENTS"`
	ServeArg   []string `name:"serve-arg" help:"Extra flag for infera serve (repeatable)." env:"INFERA_BENCH_SERVE_ARG"`
	APIKey     string   `name:"api-key" help:"API key the routers take (with --serve-arg=--api-key=<key>), sent as 'Authorization: Bearer <key>' and never printed (empty: none)." default:"" env:"INFERA_BENCH_API_KEY"`
	LogDir     string   `help:"Directory for child process logs (default: a new temp dir)." default:"" env:"INFERA_BENCH_LOG_DIR"`
	SVG        string   `name:"svg" help:"Write the TTFT CDF and hit-rate chart here (empty: none)." default:"bench-compare.svg" env:"INFERA_BENCH_SVG"`
	JSON       string   `name:"json" help:"Write results as JSON here (empty: none)." default:"bench-compare.json" env:"INFERA_BENCH_JSON"`
	Ceiling    bool     `help:"Compute the pooled-cache hit-rate ceiling (one LRU cache of engines x --kv-capacity-blocks, no timing; a reference point, not an upper bound: affinity routing over separate caches can beat it) and each policy's share of it." default:"true" negatable:"" env:"INFERA_BENCH_CEILING"`
	SimCheck   bool     `name:"sim-check" help:"Replay each policy's observed arrivals in the simulator with the same engine flags and check agreement (mean TTFT within 30% + 5 ms, mean E2E within 15% + 5 ms, hit rate within 0.05)." default:"false" env:"INFERA_BENCH_SIM_CHECK"`
	EngineFlags
	WorkloadFlags
	LoadFlags
	PDFlags
}

// Run implements the command.
func (c *CompareCmd) Run() error {
	bin, err := ResolveBin(c.InferaBin)
	if err != nil {
		return err
	}
	reqs, name, err := c.Build(os.Stderr, c.Arrival)
	if err != nil {
		return err
	}
	if err := c.EngineFlags.check(); err != nil {
		return err
	}
	lc := c.config(&c.WorkloadFlags)
	warnOversized(os.Stderr, reqs, &lc, c.BlockSize, c.KVCapacityBlocks)
	if err := c.PDFlags.checkCompare(c.Engines, splitList(c.EngineURLs)); err != nil {
		return err
	}
	ctx, cancel := signalContext()
	defer cancel()
	cc := CompareConfig{Bin: bin, Policies: splitList(c.Policies), Engines: c.Engines, EngineURLs: splitList(c.EngineURLs),
		Engine: c.engineConfig(), KVEvents: c.KVEvents, ServeArgs: c.ServeArg, APIKey: c.APIKey, Model: c.Model,
		Load: lc, SLO: c.slo(), LogDir: c.LogDir, Log: os.Stderr, Ceiling: c.Ceiling,
		Progress: func(label string) *Progress { return NewProgress(os.Stderr, label) }}
	if c.SimCheck {
		core := c.coreConfig()
		cc.SimCheck = &core
		// The simulated fleet logs every worker joining (as in simulate);
		// the real processes log to their files.
		slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	}
	fmt.Fprintf(os.Stderr, "comparing %s on %d requests of %s\n", strings.Join(cc.Policies, ", "), len(reqs), name)
	res, err := Compare(ctx, reqs, name, cc)
	if err == nil {
		res, err = c.PDFlags.comparePD(ctx, res, reqs, cc)
	}
	if res != nil && len(res.Summaries) > 0 {
		if werr := WriteTable(os.Stdout, res.Summaries); werr != nil && err == nil {
			err = werr
		}
	}
	if res != nil && len(res.Simulated) > 0 {
		fmt.Fprintln(os.Stdout, "\nthe same arrivals in the simulator:")
		if werr := WriteTable(os.Stdout, res.Simulated); werr != nil && err == nil {
			err = werr
		}
		if len(res.Disagreements) == 0 {
			fmt.Fprintln(os.Stdout, "every policy agrees with the simulator within the tolerance")
		}
		for _, d := range res.Disagreements {
			fmt.Fprintf(os.Stdout, "DISAGREES: %s\n", d)
		}
	}
	if err != nil {
		if res != nil {
			fmt.Fprintf(os.Stderr, "child logs: %s\n", res.LogDir)
		}
		return err
	}
	if c.LogDir == "" {
		_ = os.RemoveAll(res.LogDir) // a temp dir of a successful run
		res.LogDir = ""
	}
	if err := writeJSONFile(c.JSON, res); err != nil {
		return err
	}
	if c.SVG != "" {
		f, err := os.Create(c.SVG)
		if err != nil {
			return fmt.Errorf("cannot create %s: %w", c.SVG, err)
		}
		title := fmt.Sprintf("%s: %d requests, %d engines", name, len(reqs), res.Engines)
		if err := WriteSVG(f, title, res.Summaries); err != nil {
			f.Close()
			return err
		}
		if err := f.Close(); err != nil {
			return err
		}
	}
	fmt.Fprintf(os.Stderr, "wrote %s %s\n", c.JSON, c.SVG)
	return nil
}

// SimulateCmd is `infera bench simulate`.
type SimulateCmd struct {
	Policies        []string  `help:"Policies to simulate side by side (as in compare), and dynamo: an emulation of NVIDIA Dynamo's KV router cost function on the same index, as a yardstick." default:"round-robin,least-requests,prefix,kv-aware" sep:"," env:"INFERA_BENCH_POLICIES"`
	DynamoWeight    float64   `name:"dynamo-overlap-weight" help:"kv_overlap_score_weight of the dynamo policy (Dynamo's --kv-overlap-score-weight; its default is 1)." default:"1.0" env:"INFERA_BENCH_DYNAMO_OVERLAP_WEIGHT"`
	Engines         int       `help:"Simulated engines." default:"16" env:"INFERA_BENCH_ENGINES"`
	SVG             string    `name:"svg" help:"Write the TTFT CDF and hit-rate chart here (empty: none)." default:"" env:"INFERA_BENCH_SVG"`
	KVOverlapWeight float64   `name:"kv-overlap-weight" help:"kv-aware duplicate-cost weight (as infera serve): 1 is the calibrated default, 0 routes on predicted TTFT alone." default:"1.0" env:"INFERA_BENCH_KV_OVERLAP_WEIGHT"`
	KVLoadBound     float64   `name:"kv-load-bound" help:"kv-aware bounded load: requests in flight a worker may carry above the mean, as a fraction, before it costs (as infera serve; < 0 disables)." default:"0.2" env:"INFERA_BENCH_KV_LOAD_BOUND"`
	KVLearnSpeed    bool      `name:"kv-learn-speed" help:"kv-aware learns each engine's prefill speed from first tokens (as infera serve)." default:"false" env:"INFERA_BENCH_KV_LEARN_SPEED"`
	EngineSlow      []float64 `name:"engine-slow" help:"Slow-down factor per simulated engine, cycled over the fleet (e.g. 1,2: every other engine at half speed; each positive and finite)." sep:"," env:"INFERA_BENCH_ENGINE_SLOW"`
	Ceiling         bool      `help:"Compute the pooled-cache hit-rate ceiling (one LRU cache of engines x --kv-capacity-blocks, no timing; a reference point, not an upper bound: affinity routing over separate caches can beat it) and each policy's share of it." default:"true" negatable:"" env:"INFERA_BENCH_CEILING"`
	EngineFlags
	WorkloadFlags
	LoadFlags
	OutputFlags
	PDFlags
}

// Run implements the command.
func (c *SimulateCmd) Run() error {
	// The simulated fleet logs every worker joining; keep the output readable.
	slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	reqs, name, err := c.Build(os.Stderr, c.Arrival)
	if err != nil {
		return err
	}
	if err := c.EngineFlags.check(); err != nil {
		return err
	}
	if len(splitList(c.Policies)) == 0 {
		// As compare refuses it: the run printed an empty table.
		return fmt.Errorf("no policies to simulate: --policies is empty")
	}
	for _, f := range c.EngineSlow {
		if !(f > 0) || math.IsInf(f, 0) {
			return fmt.Errorf("--engine-slow: every factor must be positive and finite, got %v", f)
		}
	}
	for _, f := range c.EngineSlow {
		if !(f > 0) || math.IsInf(f, 0) {
			return fmt.Errorf("--engine-slow: every factor must be positive and finite, got %v", f)
		}
	}
	lc := c.config(&c.WorkloadFlags)
	warnOversized(os.Stderr, reqs, &lc, c.BlockSize, c.KVCapacityBlocks)
	var ceil *Ceiling
	if c.Ceiling {
		cl, err := computeCeiling(os.Stderr, reqs, c.Engines, c.KVCapacityBlocks, c.BlockSize, lc)
		if err != nil {
			return err
		}
		ceil = &cl
	}
	var sums []Summary
	for _, pol := range splitList(c.Policies) {
		r, err := Simulate(reqs, SimConfig{Engines: c.Engines, Core: c.coreConfig(), Policy: pol, Model: c.Model, Load: lc,
			KVOverlapWeight: overlapWeightFromFlag(c.KVOverlapWeight), KVLoadBound: kvroute.LoadBoundFromFlag(c.KVLoadBound), KVLearnSpeed: c.KVLearnSpeed,
			EngineSlow: c.EngineSlow, Progress: NewProgress(os.Stderr, "simulate "+pol), DynamoOverlapWeight: overlapWeightFromFlag(c.DynamoWeight)})
		if err != nil {
			return fmt.Errorf("policy %s: %w", pol, err)
		}
		fmt.Fprintf(os.Stderr, "simulated %s: %d requests on %d engines, %.1fs virtual in %.2fs real (%.0fx); decisions by layer %v\n",
			pol, len(r.Run.Results), c.Engines, r.Virtual.Seconds(), r.Real.Seconds(), r.Virtual.Seconds()/max(r.Real.Seconds(), 1e-9), r.Layers)
		s := Summarize(pol, r.Run.Results, r.Run.ITLs, r.Run.Wall, c.slo(), c.Engines)
		s.Layers = r.Layers
		if ceil != nil {
			s.SetCeiling(ceil.HitRate)
		}
		sums = append(sums, s)
	}
	sums, err = c.PDFlags.simulatePD(os.Stderr, sums, reqs, splitList(c.Policies), c.Engines, c.coreConfig(), c.Model, c.config(&c.WorkloadFlags), c.slo(),
		overlapWeightFromFlag(c.KVOverlapWeight), kvroute.LoadBoundFromFlag(c.KVLoadBound))
	if err != nil {
		return err
	}
	if err := WriteTable(os.Stdout, sums); err != nil {
		return err
	}
	if c.SVG != "" {
		f, err := os.Create(c.SVG)
		if err != nil {
			return fmt.Errorf("cannot create %s: %w", c.SVG, err)
		}
		if err := WriteSVG(f, fmt.Sprintf("simulated %s: %d requests, %d engines", name, len(reqs), c.Engines), sums); err != nil {
			f.Close()
			return err
		}
		if err := f.Close(); err != nil {
			return err
		}
	}
	return writeJSONFile(c.JSON, struct {
		Workload  string    `json:"workload"`
		Engines   int       `json:"engines"`
		Ceiling   *Ceiling  `json:"ceiling,omitempty"`
		Summaries []Summary `json:"summaries"`
	}{name, c.Engines, ceil, sums})
}

// overlapWeightFromFlag maps --kv-overlap-weight, where 0 is a real
// setting, to SimConfig.KVOverlapWeight, where 0 means the default and a
// negative value 0.
func overlapWeightFromFlag(v float64) float64 {
	if v == 0 {
		return -1
	}
	return v
}

// computeCeiling computes the pooled-cache ceiling with a progress line and
// reports it on log.
func computeCeiling(log io.Writer, reqs []TraceRequest, engines, blocks, blockSize int, lc LoadConfig) (Ceiling, error) {
	start := time.Now()
	p := NewProgress(os.Stderr, "pooled-cache ceiling")
	cl, err := PooledCeiling(reqs, CeilingConfig{Engines: engines, EngineBlocks: blocks, BlockSize: blockSize, Load: lc,
		Progress: func(done, total int, cached, prompt int64) {
			p.Update(done, total, "elapsed", time.Since(start), cached, prompt)
		}})
	p.Done()
	if err != nil {
		return cl, err
	}
	fmt.Fprintf(log, "pooled-cache ceiling: hit rate %.3f (one LRU cache of %d x %d = %d blocks of %d tokens, %d requests in order, no timing; %d skipped; a reference point, not an upper bound: separate caches can beat it) in %.1fs\n",
		cl.HitRate, engines, blocks, cl.Blocks, blockSize, cl.Requests, cl.Skipped, time.Since(start).Seconds())
	return cl, nil
}

// GenCmd is `infera bench gen`.
type GenCmd struct {
	Out string `help:"Output file (- for stdout)." default:"-" env:"INFERA_BENCH_OUT"`
	GenFlags
}

// Run implements the command.
func (c *GenCmd) Run() error {
	reqs, err := Generate(c.config())
	if err != nil {
		return err
	}
	if c.Out == "-" || c.Out == "" {
		return WriteTrace(os.Stdout, reqs)
	}
	f, err := os.Create(c.Out)
	if err != nil {
		return fmt.Errorf("cannot create %s: %w", c.Out, err)
	}
	if err := WriteTrace(f, reqs); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// warnOversized tells the user when requests can never fit one engine's KV
// cache (they get 400 from the engine), naming the flag to raise. It counts
// the prompts as sent (lc: the chat template, --bytes-per-token), as the
// engines and the simulator do.
func warnOversized(w io.Writer, reqs []TraceRequest, lc *LoadConfig, blockSize, capacityBlocks int) {
	pr := newPromptRenderer(lc)
	n, largest := 0, 0
	for i := range reqs {
		r := &reqs[i]
		need := (pr.promptTokens(r) + r.OutputLength + blockSize - 1) / blockSize
		if need > capacityBlocks {
			n++
		}
		largest = max(largest, need)
	}
	if n > 0 {
		fmt.Fprintf(w, "warning: %d of %d requests need more KV blocks than an engine has (largest %d > --kv-capacity-blocks %d); engines will reject them with 400: raise --kv-capacity-blocks to at least %d\n",
			n, len(reqs), largest, capacityBlocks, largest)
	}
}
