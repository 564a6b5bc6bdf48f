package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/infera/infera/engine"
)

// EngineConfig is how compare mode starts each `infera engine`.
type EngineConfig struct {
	BlockSize        int
	KVCapacityBlocks int
	MaxBatch         int
	MaxPrefillTokens int
	Speedup          float64
	// Extra are additional engine flags passed verbatim.
	Extra []string
}

// CompareConfig configures compare mode.
type CompareConfig struct {
	// Bin is the infera binary (subcommands engine and serve).
	Bin string
	// Policies are router policies, one router each.
	Policies []string
	// Engines is the number of engines to start (ignored with EngineURLs).
	Engines int
	// EngineURLs reuses running engines (their caches are cleared between
	// policies via POST /admin/clear-cache).
	EngineURLs []string
	Engine     EngineConfig
	// KVEvents gives kv-aware routers the engines' ZMQ KV event streams.
	KVEvents bool
	// ServeArgs are extra `infera serve` flags.
	ServeArgs []string
	// APIKey is sent as "Authorization: Bearer <key>" to the routers (the
	// readiness probe and every request), for routers started with
	// --api-key in ServeArgs; never printed (empty: none).
	APIKey string
	// Model is the served model name.
	Model string
	Load  LoadConfig
	SLO   SLO
	// LogDir receives child process logs (a temp dir when empty).
	LogDir string
	// ReadyTimeout bounds process start-up.
	ReadyTimeout time.Duration
	// Log receives progress lines (nil: discarded).
	Log io.Writer
	// Ceiling computes the pooled-cache ceiling for Engines (or
	// len(EngineURLs)) x Engine.KVCapacityBlocks blocks and sets every
	// summary's share of it.
	Ceiling bool
	// Progress, if set, returns a progress line for a run label.
	Progress func(label string) *Progress
	// SimCheck, if set, replays every policy's observed arrivals in the
	// simulator with these engines (as started: Engine's flags) and checks
	// the real run against it (Agree).
	SimCheck *engine.CoreConfig
}

// CompareResult is compare mode's output.
type CompareResult struct {
	Workload  string    `json:"workload"`
	Requests  int       `json:"requests"`
	Engines   int       `json:"engines"`
	Summaries []Summary `json:"summaries"`
	LogDir    string    `json:"log_dir"`
	// Ceiling is the pooled-cache ceiling (nil unless computed).
	Ceiling *Ceiling `json:"ceiling,omitempty"`
	// Simulated holds, with SimCheck, each policy's simulation of the same
	// arrivals, and Disagreements what fell outside the tolerance (empty:
	// every policy agrees).
	Simulated     []Summary `json:"simulated,omitempty"`
	Disagreements []string  `json:"disagreements,omitempty"`
	// Runs holds each policy's raw results, in Summaries order.
	Runs []*Run `json:"-"`
}

func (c *CompareConfig) logf(format string, args ...any) {
	if c.Log != nil {
		fmt.Fprintf(c.Log, format+"\n", args...)
	}
}

// Compare replays reqs once per policy against fresh engines (or cleared
// external ones) behind a fresh `infera serve`, and summarises each run.
func Compare(ctx context.Context, reqs []TraceRequest, workload string, c CompareConfig) (*CompareResult, error) {
	if len(c.Policies) == 0 {
		return nil, fmt.Errorf("no policies to compare")
	}
	if len(c.EngineURLs) == 0 && (c.Engines <= 0 || c.Engines > 256) {
		return nil, fmt.Errorf("engines must be in [1, 256], got %d", c.Engines)
	}
	if err := c.Load.Validate(); err != nil {
		return nil, err
	}
	if c.ReadyTimeout <= 0 {
		c.ReadyTimeout = 20 * time.Second
	}
	if c.Model == "" {
		c.Model = "sim-model"
	}
	c.Load.Model = c.Model
	if c.LogDir == "" {
		d, err := os.MkdirTemp("", "infera-bench-")
		if err != nil {
			return nil, fmt.Errorf("cannot create log dir: %w", err)
		}
		c.LogDir = d
	} else if err := os.MkdirAll(c.LogDir, 0o755); err != nil {
		return nil, fmt.Errorf("cannot create --log-dir: %w", err)
	}
	n := c.Engines
	if len(c.EngineURLs) > 0 {
		n = len(c.EngineURLs)
	}
	out := &CompareResult{Workload: workload, Requests: len(reqs), Engines: n, LogDir: c.LogDir}
	if c.Ceiling {
		log := c.Log
		if log == nil {
			log = io.Discard
		}
		cl, err := computeCeiling(log, reqs, n, c.Engine.KVCapacityBlocks, c.Engine.BlockSize, c.Load)
		if err != nil {
			return out, err
		}
		out.Ceiling = &cl
	}
	for _, pol := range c.Policies {
		if err := ctx.Err(); err != nil {
			return out, err
		}
		s, run, err := c.runPolicy(ctx, reqs, pol, c.KVEvents)
		if err != nil && errors.Is(err, errNoKVPublisher) {
			c.logf("WARNING: this infera binary cannot publish KV events; running %s without them (the router falls back to its other layers)", pol)
			s, run, err = c.runPolicy(ctx, reqs, pol, false)
			s.Name += " (no kv events)"
		}
		if err != nil {
			return out, fmt.Errorf("policy %s: %w", pol, err)
		}
		if out.Ceiling != nil {
			s.SetCeiling(out.Ceiling.HitRate)
		}
		out.Summaries = append(out.Summaries, s)
		out.Runs = append(out.Runs, run)
		if c.SimCheck != nil {
			ss, err := c.simulate(reqs, pol, run, n)
			if err != nil {
				return out, fmt.Errorf("policy %s: simulator check: %w", pol, err)
			}
			if out.Ceiling != nil {
				ss.SetCeiling(out.Ceiling.HitRate)
			}
			out.Simulated = append(out.Simulated, ss)
			if err := Agree(s, ss); err != nil {
				out.Disagreements = append(out.Disagreements, err.Error())
				c.logf("policy %-15s DISAGREES with the simulator: %v", pol, err)
			} else {
				c.logf("policy %-15s agrees with the simulator (TTFT mean %.1f vs %.1f ms, hit rate %.3f vs %.3f)", pol, s.TTFT.Mean, ss.TTFT.Mean, s.HitRate, ss.HitRate)
			}
		}
	}
	return out, nil
}

// simulate replays run's observed arrivals in the simulator: whatever the
// load's arrival mode (poisson, closed), the simulator sends each request
// when the client sent it, and every request the client sent.
func (c *CompareConfig) simulate(reqs []TraceRequest, pol string, run *Run, engines int) (Summary, error) {
	lc := c.Load
	lc.Arrival, lc.Duration = ArrivalTrace, 0
	sim, err := Simulate(ObservedArrivals(reqs, run.Results), SimConfig{Engines: engines, Core: *c.SimCheck, Policy: pol, Model: c.Model, Load: lc})
	if err != nil {
		return Summary{}, err
	}
	ss := Summarize(pol+" (sim)", sim.Run.Results, sim.Run.ITLs, sim.Run.Wall, c.SLO, engines)
	ss.Layers = sim.Layers
	return ss, nil
}

// Agree checks a real run against its simulation with the same arrivals,
// within the stated tolerance: mean TTFT within 30% + 5 ms, mean E2E within
// 15% + 5 ms, prefix hit rate within 0.05 (absolute). Real processes add
// network, event-transport and scheduling delays the simulator does not
// model; the tolerance covers them on loopback.
func Agree(real, sim Summary) error {
	var errs []string
	if d := math.Abs(real.TTFT.Mean - sim.TTFT.Mean); d > 0.30*sim.TTFT.Mean+5 {
		errs = append(errs, fmt.Sprintf("mean TTFT %.1f ms real vs %.1f simulated", real.TTFT.Mean, sim.TTFT.Mean))
	}
	if d := math.Abs(real.E2E.Mean - sim.E2E.Mean); d > 0.15*sim.E2E.Mean+5 {
		errs = append(errs, fmt.Sprintf("mean E2E %.1f ms real vs %.1f simulated", real.E2E.Mean, sim.E2E.Mean))
	}
	if d := math.Abs(real.HitRate - sim.HitRate); d > 0.05 {
		errs = append(errs, fmt.Sprintf("hit rate %.3f real vs %.3f simulated", real.HitRate, sim.HitRate))
	}
	if len(errs) > 0 {
		return fmt.Errorf("%s: %s", real.Name, strings.Join(errs, "; "))
	}
	return nil
}

type engineProc struct {
	id, url, kvEndpoint string
}

// errNoKVPublisher is returned when an engine refuses --kv-events-endpoint.
var errNoKVPublisher = errors.New("engine cannot publish KV events")

func (c *CompareConfig) runPolicy(ctx context.Context, reqs []TraceRequest, pol string, kvEvents bool) (Summary, *Run, error) {
	routerPolicy, prefixOn, err := ParsePolicy(pol)
	if err != nil {
		return Summary{}, nil, err
	}
	var g Group
	defer g.StopAll()
	kvEvents = kvEvents && routerPolicy == "kv-aware"
	var engines []engineProc
	if len(c.EngineURLs) > 0 {
		for i, u := range c.EngineURLs {
			u = strings.TrimRight(u, "/")
			if err := postJSON(u+"/admin/clear-cache", []byte("{}")); err != nil {
				return Summary{}, nil, fmt.Errorf("cannot clear engine cache: %w", err)
			}
			engines = append(engines, engineProc{id: "engine-" + strconv.Itoa(i), url: u})
		}
	} else {
		for i := range c.Engines {
			port, err := FreePort()
			if err != nil {
				return Summary{}, nil, err
			}
			e := engineProc{id: "engine-" + strconv.Itoa(i), url: "http://127.0.0.1:" + strconv.Itoa(port)}
			args := []string{"engine", "--host", "127.0.0.1", "--port", strconv.Itoa(port), "--id", e.id,
				"--model", c.Model, "--block-size", strconv.Itoa(c.Engine.BlockSize),
				"--kv-capacity-blocks", strconv.Itoa(c.Engine.KVCapacityBlocks),
				"--max-batch", strconv.Itoa(c.Engine.MaxBatch),
				"--max-prefill-tokens", strconv.Itoa(c.Engine.MaxPrefillTokens),
				"--speedup", strconv.FormatFloat(c.Engine.Speedup, 'g', -1, 64)}
			if kvEvents {
				kp, err := FreePort()
				if err != nil {
					return Summary{}, nil, err
				}
				e.kvEndpoint = "tcp://127.0.0.1:" + strconv.Itoa(kp)
				args = append(args, "--kv-events-endpoint", e.kvEndpoint)
			}
			args = append(args, c.Engine.Extra...)
			p, err := StartProc(pol+"-"+e.id, c.LogDir, c.Bin, args...)
			if err != nil {
				return Summary{}, nil, err
			}
			g.Add(p)
			p.URL = e.url
			engines = append(engines, e)
		}
		for _, p := range g.procs {
			if err := WaitHTTP(ctx, p, p.URL+"/health", c.ReadyTimeout, nil); err != nil {
				if kvEvents && strings.Contains(err.Error(), "KV event publish") {
					return Summary{}, nil, fmt.Errorf("%w: %v", errNoKVPublisher, err)
				}
				return Summary{}, nil, err
			}
		}
	}
	// The router gets its workers from a config file so each can carry
	// its KV event endpoint and block size.
	type wspec struct {
		ID               string   `json:"id"`
		URL              string   `json:"url"`
		Models           []string `json:"models"`
		KVEventsEndpoint string   `json:"kv_events_endpoint,omitempty"`
		BlockSize        int      `json:"block_size,omitempty"`
	}
	type prefixCache struct {
		Enabled bool `json:"enabled"`
	}
	var cfgFile struct {
		Workers     []wspec      `json:"workers"`
		PrefixCache *prefixCache `json:"prefix_cache,omitempty"`
	}
	if prefixOn {
		cfgFile.PrefixCache = &prefixCache{Enabled: true}
	}
	for _, e := range engines {
		cfgFile.Workers = append(cfgFile.Workers, wspec{ID: e.id, URL: e.url, Models: []string{c.Model},
			KVEventsEndpoint: e.kvEndpoint, BlockSize: c.Engine.BlockSize})
	}
	cfgPath := filepath.Join(c.LogDir, pol+"-router.json")
	b, _ := json.MarshalIndent(cfgFile, "", "  ")
	if err := os.WriteFile(cfgPath, b, 0o644); err != nil {
		return Summary{}, nil, fmt.Errorf("cannot write router config: %w", err)
	}
	port, err := FreePort()
	if err != nil {
		return Summary{}, nil, err
	}
	routerURL := "http://127.0.0.1:" + strconv.Itoa(port)
	args := []string{"serve", "--host", "127.0.0.1", "--port", strconv.Itoa(port),
		"--discovery-backend", "static", "--config", cfgPath, "--router-policy", routerPolicy,
		"--kv-block-size", strconv.Itoa(c.Engine.BlockSize),
		// With --api-key the admin listener would start on its default
		// port, 8081, and a router fails to start when it is taken.
		"--admin-port", "0"}
	args = append(args, c.ServeArgs...)
	rp, err := StartProc(pol+"-router", c.LogDir, c.Bin, args...)
	if err != nil {
		return Summary{}, nil, err
	}
	g.Add(rp)
	model := []byte(`"` + c.Model + `"`)
	if err := waitHTTPKey(ctx, rp, routerURL+"/v1/models", c.APIKey, c.ReadyTimeout, func(b []byte) bool { return bytes.Contains(b, model) }); err != nil {
		return Summary{}, nil, err
	}
	c.logf("policy %-15s router %s, %d engines ready; sending %d requests", pol, routerURL, len(engines), len(reqs))
	cl, err := NewClient(routerURL, c.Load.InFlight(), true)
	if err != nil {
		return Summary{}, nil, err
	}
	cl.SetAPIKey(c.APIKey)
	defer cl.CloseIdle()
	lc := c.Load
	if c.Progress != nil {
		lc.Progress = c.Progress("compare " + pol)
	}
	run, err := RunLoad(ctx, cl, reqs, lc)
	if err != nil {
		return Summary{}, nil, err
	}
	if w := run.behindWarning(); w != "" {
		c.logf("WARNING: policy %s: %s", pol, w)
	}
	s := Summarize(pol, run.Results, run.ITLs, run.Wall, c.SLO, len(engines))
	if layers, err := scrapeLayers(routerURL + "/metrics"); err == nil {
		s.Layers = layers
		if routerPolicy == "kv-aware" && layers["kv"] == 0 {
			c.logf("WARNING: the kv-aware router made no KV decisions (is its KV index fed? see %s)", rp.log)
		}
	}
	c.logf("policy %-15s done in %.1fs: %d ok, %d errors, hit rate %.3f, TTFT p50 %.1f ms",
		pol, run.Wall.Seconds(), s.OK, s.Errors, s.HitRate, s.TTFT.P50)
	if s.OK == 0 && s.Requests > 0 {
		return s, run, fmt.Errorf("every request failed (first error: %s); router log tail:\n%s", firstErr(run.Results), rp.LogTail(1500))
	}
	return s, run, nil
}

func firstErr(rs []Result) string {
	for i := range rs {
		if rs[i].Err != "" {
			return rs[i].Err
		}
	}
	return ""
}

// layerMetric is the router's decision counter by scheduling layer.
var layerMetric = []byte(`infera_route_decisions_total{layer="`)

// scrapeLayers reads the router's decision counts by layer from /metrics.
func scrapeLayers(url string) (map[string]int, error) {
	status, body, err := fasthttp.GetTimeout(nil, url, 5*time.Second)
	if err != nil {
		return nil, fmt.Errorf("cannot scrape %s: %w", url, err)
	}
	if status != 200 {
		return nil, fmt.Errorf("cannot scrape %s: status %d", url, status)
	}
	out := map[string]int{}
	for _, line := range bytes.Split(body, []byte("\n")) {
		rest, ok := bytes.CutPrefix(line, layerMetric)
		if !ok {
			continue
		}
		name, val, ok := bytes.Cut(rest, []byte(`"} `))
		if !ok {
			continue
		}
		n, err := strconv.ParseFloat(string(bytes.TrimSpace(val)), 64)
		if err != nil {
			continue
		}
		out[string(name)] = int(n)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no decision counters at %s", url)
	}
	return out, nil
}
