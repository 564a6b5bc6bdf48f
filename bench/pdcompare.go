package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// comparePD runs, for each policy of cc, the workload against a PD fleet
// (P prefill and D decode `infera engine` processes behind one `infera
// serve`) and inserts its summary after the mixed fleet's in res.
//
// The SGLang fleet is wired as SGLang's mini_lb expects a static fleet:
// each prefill engine listens on a loopback address of its own
// (127.0.0.2, 127.0.0.3, ...) with one shared bootstrap port, the router
// sends bootstrap_host (the prefill URL's host) and a null bootstrap_port,
// and every decode engine's --bootstrap-port is that shared port.
func (f *PDFlags) comparePD(ctx context.Context, res *CompareResult, reqs []TraceRequest, cc CompareConfig) (*CompareResult, error) {
	p, d, ok, err := f.pdFleet(cc.Engines)
	if !ok || err != nil {
		return res, err
	}
	if len(cc.EngineURLs) > 0 {
		return res, errPDEngineURLs
	}
	if p > 250 {
		return res, errPDTooManyPrefill
	}
	// The defaults Compare applied to its own copy of cc.
	cc.LogDir = res.LogDir
	if cc.ReadyTimeout <= 0 {
		cc.ReadyTimeout = 20 * time.Second
	}
	if cc.Model == "" {
		cc.Model = "sim-model"
	}
	cc.Load.Model = cc.Model
	var out []Summary
	var runs []*Run
	for i, pol := range cc.Policies {
		if err := ctx.Err(); err != nil {
			return res, err
		}
		s, run, err := f.runPD(ctx, reqs, pol, p, d, cc)
		if err != nil {
			return res, fmt.Errorf("PD fleet, policy %s: %w", pol, err)
		}
		if i < len(res.Summaries) {
			out = append(out, res.Summaries[i])
			runs = append(runs, res.Runs[i])
		}
		out = append(out, s)
		runs = append(runs, run)
	}
	res.Summaries, res.Runs = out, runs
	return res, nil
}

func (f *PDFlags) runPD(ctx context.Context, reqs []TraceRequest, pol string, p, d int, c CompareConfig) (Summary, *Run, error) {
	routerPolicy, prefixOn, err := ParsePolicy(pol)
	if err != nil {
		return Summary{}, nil, err
	}
	kvEvents := c.KVEvents && routerPolicy == "kv-aware"
	name := f.pdName(p, d, pol)
	tag := strings.ReplaceAll(name, " ", "-")
	var g Group
	defer g.StopAll()
	bport, err := FreePort()
	if err != nil {
		return Summary{}, nil, err
	}
	type wspec struct {
		ID               string   `json:"id"`
		URL              string   `json:"url"`
		Models           []string `json:"models"`
		Role             string   `json:"role"`
		KVEventsEndpoint string   `json:"kv_events_endpoint,omitempty"`
		BlockSize        int      `json:"block_size,omitempty"`
	}
	var workers []wspec
	for i := 0; i < p+d; i++ {
		host, role, id := "127.0.0.1", "decode", "pd-d-"+strconv.Itoa(i-p)
		if i < p {
			host, role, id = "127.0.0."+strconv.Itoa(2+i), "prefill", "pd-p-"+strconv.Itoa(i)
		}
		port, err := freePortOn(host)
		if err != nil {
			return Summary{}, nil, err
		}
		w := wspec{ID: id, URL: "http://" + net.JoinHostPort(host, strconv.Itoa(port)), Models: []string{c.Model}, Role: role, BlockSize: c.Engine.BlockSize}
		args := []string{"engine", "--host", host, "--port", strconv.Itoa(port), "--id", id,
			"--model", c.Model, "--block-size", strconv.Itoa(c.Engine.BlockSize),
			"--kv-capacity-blocks", strconv.Itoa(c.Engine.KVCapacityBlocks),
			"--max-batch", strconv.Itoa(c.Engine.MaxBatch),
			"--max-prefill-tokens", strconv.Itoa(c.Engine.MaxPrefillTokens),
			"--speedup", strconv.FormatFloat(c.Engine.Speedup, 'g', -1, 64),
			"--role", role, "--pd-mode", f.PDMode, "--bootstrap-port", strconv.Itoa(bport),
			"--transfer-base", f.PDTransferBase.String(), "--transfer-per-block", f.PDTransferPerBlock.String()}
		if kvEvents && role == "prefill" {
			kp, err := freePortOn(host)
			if err != nil {
				return Summary{}, nil, err
			}
			w.KVEventsEndpoint = "tcp://" + net.JoinHostPort(host, strconv.Itoa(kp))
			args = append(args, "--kv-events-endpoint", w.KVEventsEndpoint)
		}
		args = append(args, c.Engine.Extra...)
		proc, err := StartProc(tag+"-"+id, c.LogDir, c.Bin, args...)
		if err != nil {
			return Summary{}, nil, err
		}
		g.Add(proc)
		proc.URL = w.URL
		workers = append(workers, w)
	}
	for _, proc := range g.procs {
		if err := WaitHTTP(ctx, proc, proc.URL+"/health", c.ReadyTimeout, nil); err != nil {
			return Summary{}, nil, err
		}
	}
	type prefixCache struct {
		Enabled bool `json:"enabled"`
	}
	type pd struct {
		Mode                     string `json:"mode"`
		DecodePolicy             string `json:"decode_policy"`
		SGLangIndependentPairing bool   `json:"sglang_independent_pairing,omitempty"`
	}
	cfgFile := struct {
		Workers     []wspec      `json:"workers"`
		PrefixCache *prefixCache `json:"prefix_cache,omitempty"`
		PD          pd           `json:"pd"`
	}{Workers: workers, PD: pd{Mode: f.PDMode, DecodePolicy: f.PDDecodePolicy,
		SGLangIndependentPairing: f.PDIndependentPairing && f.PDMode == "sglang"}}
	if prefixOn {
		cfgFile.PrefixCache = &prefixCache{Enabled: true}
	}
	cfgPath := filepath.Join(c.LogDir, tag+"-router.json")
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
	rp, err := StartProc(tag+"-router", c.LogDir, c.Bin, args...)
	if err != nil {
		return Summary{}, nil, err
	}
	g.Add(rp)
	model := []byte(`"` + c.Model + `"`)
	if err := waitHTTPKey(ctx, rp, routerURL+"/v1/models", c.APIKey, c.ReadyTimeout, func(b []byte) bool { return bytes.Contains(b, model) }); err != nil {
		return Summary{}, nil, err
	}
	c.logf("%s: router %s, %d prefill and %d decode engines ready; sending %d requests", name, routerURL, p, d, len(reqs))
	cl, err := NewClient(routerURL, c.Load.InFlight(), true)
	if err != nil {
		return Summary{}, nil, err
	}
	cl.SetAPIKey(c.APIKey)
	defer cl.CloseIdle()
	run, err := RunLoad(ctx, cl, reqs, c.Load)
	if err != nil {
		return Summary{}, nil, err
	}
	if w := run.behindWarning(); w != "" {
		c.logf("WARNING: %s: %s", name, w)
	}
	s := Summarize(name, run.Results, run.ITLs, run.Wall, c.SLO, d)
	if layers, err := scrapeLayers(routerURL + "/metrics"); err == nil {
		s.Layers = layers
	}
	c.logf("%s done in %.1fs: %d ok, %d errors, TTFT p50 %.1f ms, TPOT p50 %.2f ms", name, run.Wall.Seconds(), s.OK, s.Errors, s.TTFT.P50, s.TPOT.P50)
	if s.OK == 0 && s.Requests > 0 {
		return s, run, fmt.Errorf("every request failed (first error: %s); router log tail:\n%s", firstErr(run.Results), rp.LogTail(1500))
	}
	return s, run, nil
}

// freePortOn returns a currently free TCP port on the loopback address host.
func freePortOn(host string) (int, error) {
	ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return 0, fmt.Errorf("cannot find a free port on %s: %w", host, err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}
