package bench

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/valyala/fasthttp"
)

// FixedBackend is a fast OpenAI-shaped backend with a fixed response: a
// small JSON completion, or StreamChunks SSE chunks when the request body
// asks for "stream":true. It serves /v1/models and /health for discovery.
type FixedBackend struct {
	Model        string
	StreamChunks int
	srv          *fasthttp.Server
	ln           net.Listener
	URL          string
	plain        []byte
	chunk        []byte
	tail         []byte
	models       []byte
}

var streamTrue = []byte(`"stream":true`)

// StartFixedBackend listens on a free loopback port.
func StartFixedBackend(model string, streamChunks int) (*FixedBackend, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("cannot listen: %w", err)
	}
	b := &FixedBackend{Model: model, StreamChunks: max(1, streamChunks), ln: ln, URL: "http://" + ln.Addr().String()}
	b.plain = []byte(`{"id":"cmpl-1","object":"chat.completion","model":"` + model + `","choices":[{"index":0,"message":{"role":"assistant","content":"hello from the fixed backend"},"finish_reason":"stop"}],"usage":{"prompt_tokens":16,"completion_tokens":8,"total_tokens":24,"prompt_tokens_details":{"cached_tokens":0}}}`)
	b.chunk = []byte(`data: {"id":"cmpl-1","object":"chat.completion.chunk","model":"` + model + `","choices":[{"index":0,"delta":{"content":"tok "},"finish_reason":null}]}` + "\n\n")
	b.tail = []byte(`data: {"id":"cmpl-1","object":"chat.completion.chunk","model":"` + model + `","choices":[],"usage":{"prompt_tokens":16,"completion_tokens":` + strconv.Itoa(b.StreamChunks) + `,"total_tokens":` + strconv.Itoa(16+b.StreamChunks) + `}}` + "\n\ndata: [DONE]\n\n")
	b.models = []byte(`{"object":"list","data":[{"id":"` + model + `","object":"model","owned_by":"bench"}]}`)
	b.srv = &fasthttp.Server{Handler: b.handle, Name: "bench-backend", NoDefaultServerHeader: true, NoDefaultDate: true,
		Concurrency: 1 << 16, ReduceMemoryUsage: false}
	go func() { _ = b.srv.Serve(ln) }()
	return b, nil
}

func (b *FixedBackend) handle(ctx *fasthttp.RequestCtx) {
	ctx.Response.Header.Set("X-Infera-Engine-Id", "fixed")
	switch string(ctx.Path()) {
	case "/v1/models":
		ctx.SetContentType("application/json")
		ctx.SetBody(b.models)
		return
	case "/health":
		ctx.SetBodyString(`{"status":"ok"}`)
		return
	}
	if !bytes.Contains(ctx.PostBody(), streamTrue) {
		ctx.SetContentType("application/json")
		ctx.SetBody(b.plain)
		return
	}
	ctx.SetContentType("text/event-stream")
	ctx.Response.Header.Set("Cache-Control", "no-cache")
	n := b.StreamChunks
	ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
		for range n {
			_, _ = w.Write(b.chunk)
			if w.Flush() != nil {
				return
			}
		}
		_, _ = w.Write(b.tail)
		_ = w.Flush()
	})
}

// Close stops the backend.
func (b *FixedBackend) Close() error { return b.srv.Shutdown() }

// startNginx runs nginx as a child with a temp prefix, proxying to backend
// over an upstream keepalive pool, without buffering (so SSE streams).
func startNginx(nginx, dir, backendAddr string, workers int) (*Proc, string, error) {
	port, err := FreePort()
	if err != nil {
		return nil, "", err
	}
	for _, d := range []string{"tmp", "logs"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return nil, "", fmt.Errorf("cannot create nginx prefix: %w", err)
		}
	}
	conf := fmt.Sprintf(`worker_processes %d;
daemon off;
pid %[2]s/nginx.pid;
error_log %[2]s/logs/error.log warn;
events { worker_connections 8192; }
http {
  access_log off;
  client_body_temp_path %[2]s/tmp/body;
  proxy_temp_path %[2]s/tmp/proxy;
  fastcgi_temp_path %[2]s/tmp/fastcgi;
  uwsgi_temp_path %[2]s/tmp/uwsgi;
  scgi_temp_path %[2]s/tmp/scgi;
  keepalive_requests 1000000;
  upstream backend { server %[3]s; keepalive 512; keepalive_requests 1000000; }
  server {
    listen 127.0.0.1:%[4]d;
    location / {
      proxy_pass http://backend;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
    }
  }
}
`, workers, dir, backendAddr, port)
	cf := filepath.Join(dir, "nginx.conf")
	if err := os.WriteFile(cf, []byte(conf), 0o644); err != nil {
		return nil, "", fmt.Errorf("cannot write nginx config: %w", err)
	}
	p, err := StartProc("nginx", dir, nginx, "-p", dir, "-c", cf, "-e", filepath.Join(dir, "logs", "error.log"))
	if err != nil {
		return nil, "", err
	}
	return p, "http://127.0.0.1:" + strconv.Itoa(port), nil
}

// ProxyCmd is `infera bench proxy`: the cost of the proxy hop, measured
// side by side in one run against nginx and the direct path, as CPU per
// request of the proxy process (utime+stime from /proc, the fairest figure
// on a shared machine) and as throughput.
type ProxyCmd struct {
	Concurrency   int           `help:"Connections held by the load generator." default:"64" env:"INFERA_BENCH_CONCURRENCY"`
	Duration      time.Duration `help:"Measurement time per target and round." default:"8s" env:"INFERA_BENCH_DURATION"`
	Rounds        int           `help:"Interleaved rounds over all targets; medians are reported." default:"3" env:"INFERA_BENCH_ROUNDS"`
	Warmup        time.Duration `help:"Warm-up per target before the first round (not measured)." default:"1s" env:"INFERA_BENCH_WARMUP"`
	StreamChunks  int           `help:"SSE events per streaming response (each flushed on its own), plus [DONE]." default:"20" env:"INFERA_BENCH_STREAM_CHUNKS"`
	PromptBytes   int           `help:"Size of the chat request body." default:"1024" env:"INFERA_BENCH_PROMPT_BYTES"`
	InferaBin     string        `name:"infera-bin" help:"infera binary for 'infera serve' (default: this executable)." default:"" env:"INFERA_BENCH_INFERA_BIN"`
	GoMaxProcs    int           `help:"GOMAXPROCS of the infera processes (0: Go's default)." default:"2" env:"INFERA_BENCH_GOMAXPROCS"`
	Nginx         string        `help:"nginx binary (empty: skip nginx)." default:"/usr/sbin/nginx" env:"INFERA_BENCH_NGINX"`
	NginxWorkers  int           `help:"nginx worker processes." default:"1" env:"INFERA_BENCH_NGINX_WORKERS"`
	Wrk           string        `help:"wrk binary (the load generator)." default:"/usr/bin/wrk" env:"INFERA_BENCH_WRK"`
	WrkThreads    int           `help:"wrk threads." default:"2" env:"INFERA_BENCH_WRK_THREADS"`
	TokenizerPath string        `help:"Also measure kv-aware with this tokenizer and chat template (e.g. testdata/tokenizers/qwen3)." default:"" env:"INFERA_BENCH_TOKENIZER_PATH"`
	Kinds         []string      `help:"Upstream answer kinds: json, sse." default:"json,sse" env:"INFERA_BENCH_KINDS"`
	ServeArg      []string      `name:"serve-arg" help:"Extra flag for every infera serve (repeatable)." env:"INFERA_BENCH_SERVE_ARG"`
	APIKey        string        `name:"api-key" help:"API key the infera targets take (with --serve-arg=--api-key=<key>), sent as 'Authorization: Bearer <key>' to them only (readiness check and wrk) and never printed (empty: none)." default:"" env:"INFERA_BENCH_API_KEY"`
	BaselineBin   string        `name:"baseline-bin" help:"Also measure round-robin through this other infera binary (an earlier build, say), side by side in the same run." default:"" env:"INFERA_BENCH_BASELINE_BIN"`
	Naive         bool          `help:"Also measure the thinnest fasthttp reverse proxy (HostClient.Do, body streamed back; nothing else) as a reference, with the same GOMAXPROCS." default:"true" negatable:"" env:"INFERA_BENCH_NAIVE"`
	Floors        bool          `help:"Also measure the floors of a Go proxy: two byte-for-byte relays with no HTTP library, one goroutine per connection (go goroutine floor) and one epoll event loop per nginx worker (go epoll floor, Linux), and fasthttp's server in front of the first one's upstream side (fasthttp server floor)." default:"true" negatable:"" env:"INFERA_BENCH_FLOORS"`
	OutputFlags
}

// ProxyTarget is one (target, upstream kind) measurement: medians over the
// rounds.
type ProxyTarget struct {
	Target string `json:"target"`
	Kind   string `json:"kind"`
	// RPS is requests per second (wrk).
	RPS float64 `json:"rps"`
	// CPUPer10k is the proxy process's CPU seconds (user+system) per 10,000
	// requests completed; 0 for the direct path.
	CPUPer10k float64 `json:"cpu_s_per_10k"`
	// UserPer10k and SysPer10k split it into user and system time (each
	// the median of its own, so they need not add up to CPUPer10k).
	UserPer10k float64 `json:"user_s_per_10k"`
	SysPer10k  float64 `json:"sys_s_per_10k"`
	P50        float64 `json:"p50_ms"`
	P99        float64 `json:"p99_ms"`
	Requests   int     `json:"requests"`
	Errors     int     `json:"errors"`
	// Runs holds every round's CPU per 10k and req/s.
	Runs [][2]float64 `json:"runs"`
}

// ProxyReport is the proxy benchmark's output.
type ProxyReport struct {
	Concurrency int           `json:"concurrency"`
	Duration    float64       `json:"duration_s"`
	Rounds      int           `json:"rounds"`
	Targets     []ProxyTarget `json:"targets"`
}

// Run implements the command.
func (c *ProxyCmd) Run() error {
	ctx, cancel := signalContext()
	defer cancel()
	rep, err := RunProxyBench(ctx, c, os.Stderr)
	if rep != nil {
		_ = WriteProxyTable(os.Stdout, rep)
	}
	if err != nil {
		return err
	}
	return writeJSONFile(c.JSON, rep)
}

type proxyTarget struct {
	name string
	url  string
	pid  int    // 0: not measured (the direct path)
	key  string // API key sent to it (the infera targets with --api-key)
}

// chatBody returns a chat request of about n bytes.
func chatBody(n int, stream bool) []byte {
	head := `{"model":"sim-model","max_tokens":32,`
	if stream {
		head += `"stream":true,"stream_options":{"include_usage":true},`
	}
	head += `"messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"`
	tail := `"}]}`
	fill := max(0, n-len(head)-len(tail))
	words := "Summarise the following notes about the routing of inference requests across a fleet of engines. "
	var b strings.Builder
	b.WriteString(head)
	for b.Len() < len(head)+fill {
		b.WriteString(words)
	}
	s := b.String()[:len(head)+fill]
	return []byte(s + tail)
}

// RunProxyBench starts the upstream, nginx and the infera targets, then
// runs every (target, kind) for each round, interleaved.
func RunProxyBench(ctx context.Context, c *ProxyCmd, log io.Writer) (*ProxyReport, error) {
	if c.Concurrency <= 0 || c.Duration <= 0 || c.Rounds <= 0 {
		return nil, fmt.Errorf("concurrency, duration and rounds must be positive")
	}
	if _, err := os.Stat(c.Wrk); err != nil {
		return nil, fmt.Errorf("wrk not found at %s (make deps installs it): %w", c.Wrk, err)
	}
	dir, err := os.MkdirTemp("", "infera-bench-proxy-")
	if err != nil {
		return nil, fmt.Errorf("cannot create temp dir: %w", err)
	}
	defer os.RemoveAll(dir)
	be, err := StartFixedBackend("sim-model", c.StreamChunks)
	if err != nil {
		return nil, err
	}
	defer be.Close()
	var g Group
	defer g.StopAll()
	bin, err := ResolveBin(c.InferaBin)
	if err != nil {
		return nil, err
	}
	targets := []proxyTarget{{name: "direct", url: be.URL}}
	if c.Nginx != "" {
		np, u, err := startNginx(c.Nginx, filepath.Join(dir, "nginx"), strings.TrimPrefix(be.URL, "http://"), c.NginxWorkers)
		if err != nil {
			return nil, err
		}
		g.Add(np)
		if err := WaitHTTP(ctx, np, u+"/health", 10*time.Second, nil); err != nil {
			return nil, err
		}
		targets = append(targets, proxyTarget{name: "nginx", url: u, pid: np.Pid()})
	}
	var env []string
	if c.GoMaxProcs > 0 {
		env = append(env, "GOMAXPROCS="+strconv.Itoa(c.GoMaxProcs))
	}
	// start runs one Go proxy (this binary with args, given its port) and
	// waits until it answers /v1/models as ready says.
	// key is the API key it takes (empty: none).
	start := func(name, bin, key string, ready func([]byte) bool, args func(port string) []string) error {
		port, err := FreePort()
		if err != nil {
			return err
		}
		u := "http://127.0.0.1:" + strconv.Itoa(port)
		p, err := StartProcEnv(name, dir, env, bin, args(strconv.Itoa(port))...)
		if err != nil {
			return err
		}
		g.Add(p)
		if err := waitHTTPKey(ctx, p, u+"/v1/models", key, 20*time.Second, ready); err != nil {
			return err
		}
		targets = append(targets, proxyTarget{name: name, url: u, pid: p.Pid(), key: key})
		return nil
	}
	serveBin := func(name, bin string, extra ...string) error {
		return start(name, bin, c.APIKey, func(b []byte) bool { return bytes.Contains(b, []byte("sim-model")) }, func(port string) []string {
			args := append([]string{"serve", "--host", "127.0.0.1", "--port", port, "--discovery-backend", "static",
				"--workers", "fixed=" + be.URL, "--worker-model", "sim-model", "--admin-port", "0", "--log-level", "warn"}, extra...)
			return append(args, c.ServeArg...)
		})
	}
	serve := func(name string, extra ...string) error { return serveBin(name, bin, extra...) }
	if c.Naive {
		if err := start("naive fasthttp", bin, "", nil, func(port string) []string {
			return []string{"bench", "naive-proxy", "--listen", "127.0.0.1:" + port, "--upstream", strings.TrimPrefix(be.URL, "http://")}
		}); err != nil {
			return nil, err
		}
	}
	if c.Floors {
		up := strings.TrimPrefix(be.URL, "http://")
		if err := start("go goroutine floor", bin, "", nil, func(port string) []string {
			return []string{"bench", "naive-proxy", "--lean", "--listen", "127.0.0.1:" + port, "--upstream", up}
		}); err != nil {
			return nil, err
		}
		if err := start("fasthttp server floor", bin, "", nil, func(port string) []string {
			return []string{"bench", "naive-proxy", "--server-floor", "--listen", "127.0.0.1:" + port, "--upstream", up}
		}); err != nil {
			return nil, err
		}
		if runtime.GOOS == "linux" {
			if err := start("go epoll floor", bin, "", nil, func(port string) []string {
				return []string{"bench", "naive-proxy", "--loops", strconv.Itoa(max(c.NginxWorkers, 1)), "--listen", "127.0.0.1:" + port, "--upstream", up}
			}); err != nil {
				return nil, err
			}
		}
	}
	if err := serve("infera round-robin", "--router-policy", "round-robin"); err != nil {
		return nil, err
	}
	if c.BaselineBin != "" {
		if err := serveBin("baseline round-robin", c.BaselineBin, "--router-policy", "round-robin"); err != nil {
			return nil, err
		}
	}
	if err := serve("infera kv-aware", "--router-policy", "kv-aware"); err != nil {
		return nil, err
	}
	if c.TokenizerPath != "" {
		if err := serve("infera kv-aware qwen3", "--router-policy", "kv-aware", "--router-tokenizer-path", c.TokenizerPath); err != nil {
			return nil, err
		}
	}
	rep := &ProxyReport{Concurrency: c.Concurrency, Duration: c.Duration.Seconds(), Rounds: c.Rounds}
	type key struct{ target, kind string }
	runs := map[key][]proxyRun{}
	var order []key
	for _, kind := range c.Kinds {
		if kind != "json" && kind != "sse" {
			return nil, fmt.Errorf("--kinds: %q: want json or sse", kind)
		}
		body := chatBody(c.PromptBytes, kind == "sse")
		for _, t := range targets {
			order = append(order, key{t.name, kind})
			if c.Warmup > 0 {
				if _, err := wrkCPU(ctx, c, t, body, c.Warmup, dir); err != nil {
					return rep, fmt.Errorf("%s (%s) warm-up: %w", t.name, kind, err)
				}
			}
		}
		for round := 0; round < c.Rounds; round++ {
			for _, t := range targets {
				r, err := wrkCPU(ctx, c, t, body, c.Duration, dir)
				if err != nil {
					return rep, fmt.Errorf("%s (%s): %w", t.name, kind, err)
				}
				fmt.Fprintf(log, "round %d %-22s %-4s %9.0f req/s  cpu %.3f s/10k (user %.3f sys %.3f)  p50 %.3f ms  p99 %.3f ms  errors %d\n",
					round+1, t.name, kind, r.rps, r.cpu10k, r.user10k, r.sys10k, r.p50, r.p99, r.errors)
				runs[key{t.name, kind}] = append(runs[key{t.name, kind}], r)
			}
		}
	}
	for _, k := range order {
		rs := runs[k]
		pt := ProxyTarget{Target: k.target, Kind: k.kind}
		var rps, cpu, user, sys, p50, p99 []float64
		for _, r := range rs {
			rps, cpu, p50, p99 = append(rps, r.rps), append(cpu, r.cpu10k), append(p50, r.p50), append(p99, r.p99)
			user, sys = append(user, r.user10k), append(sys, r.sys10k)
			pt.Requests += r.requests
			pt.Errors += r.errors
			pt.Runs = append(pt.Runs, [2]float64{r.cpu10k, r.rps})
		}
		pt.RPS, pt.CPUPer10k, pt.P50, pt.P99 = median(rps), median(cpu), median(p50), median(p99)
		pt.UserPer10k, pt.SysPer10k = median(user), median(sys)
		rep.Targets = append(rep.Targets, pt)
	}
	return rep, nil
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

type proxyRun struct {
	rps, cpu10k, p50, p99 float64
	user10k, sys10k       float64
	requests, errors      int
}

var (
	wrkRPS    = regexp.MustCompile(`Requests/sec:\s+([0-9.]+)`)
	wrkPct    = regexp.MustCompile(`(?m)^\s+(50|99)(?:\.000)?%\s+([0-9.]+)(us|ms|s)`)
	wrkReq    = regexp.MustCompile(`(\d+) requests in`)
	wrkErrors = regexp.MustCompile(`Non-2xx or 3xx responses: (\d+)|Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)`)
)

// wrkScript is the wrk script POSTing body, with "Authorization: Bearer key"
// when key is not empty (the key is in the script, not on wrk's command
// line, so it is not in the process list).
func wrkScript(body []byte, key string) string {
	lua := "wrk.method = \"POST\"\nwrk.headers[\"Content-Type\"] = \"application/json\"\n"
	if key != "" {
		lua += "wrk.headers[\"Authorization\"] = " + strconv.Quote("Bearer "+key) + "\n"
	}
	return lua + "wrk.body = " + strconv.Quote(string(body)) + "\n"
}

// wrkCPU runs wrk against t for d and measures the target's CPU time. A
// cancelled ctx (Ctrl-C) kills wrk, so the caller returns and its deferred
// cleanup stops nginx and the proxies and removes the temp dir.
func wrkCPU(ctx context.Context, c *ProxyCmd, t proxyTarget, body []byte, d time.Duration, dir string) (proxyRun, error) {
	script := filepath.Join(dir, "post.lua")
	lua := wrkScript(body, t.key)
	if err := os.WriteFile(script, []byte(lua), 0o644); err != nil {
		return proxyRun{}, fmt.Errorf("cannot write wrk script: %w", err)
	}
	var user0, sys0 float64
	if t.pid != 0 {
		var err error
		if user0, sys0, err = procCPUSplit(t.pid); err != nil {
			return proxyRun{}, err
		}
	}
	secs := max(1, int(d.Round(time.Second).Seconds()))
	cmd := exec.CommandContext(ctx, c.Wrk, "-t", strconv.Itoa(c.WrkThreads), "-c", strconv.Itoa(c.Concurrency), "-d", strconv.Itoa(secs)+"s",
		"--latency", "-s", script, t.url+"/v1/chat/completions")
	cmd.SysProcAttr = procAttr()
	out, err := cmd.CombinedOutput()
	if cerr := ctx.Err(); cerr != nil {
		return proxyRun{}, cerr
	}
	if err != nil {
		return proxyRun{}, fmt.Errorf("wrk failed: %w: %s", err, out)
	}
	var r proxyRun
	if t.pid != 0 {
		user1, sys1, err := procCPUSplit(t.pid)
		if err != nil {
			return proxyRun{}, err
		}
		if m := wrkReq.FindSubmatch(out); m != nil {
			r.requests, _ = strconv.Atoi(string(m[1]))
		}
		if r.requests > 0 {
			per := 10000 / float64(r.requests)
			r.user10k, r.sys10k = (user1-user0)*per, (sys1-sys0)*per
			r.cpu10k = r.user10k + r.sys10k
		}
	} else if m := wrkReq.FindSubmatch(out); m != nil {
		r.requests, _ = strconv.Atoi(string(m[1]))
	}
	if m := wrkRPS.FindSubmatch(out); m != nil {
		r.rps, _ = strconv.ParseFloat(string(m[1]), 64)
	}
	for _, m := range wrkPct.FindAllSubmatch(out, -1) {
		v, _ := strconv.ParseFloat(string(m[2]), 64)
		switch string(m[3]) {
		case "us":
			v /= 1000
		case "s":
			v *= 1000
		}
		if string(m[1]) == "50" {
			r.p50 = v
		} else {
			r.p99 = v
		}
	}
	for _, m := range wrkErrors.FindAllSubmatch(out, -1) {
		for _, g := range m[1:] {
			if n, err := strconv.Atoi(string(g)); err == nil {
				r.errors += n
			}
		}
	}
	if r.rps == 0 {
		return r, fmt.Errorf("cannot parse wrk output: %s", out)
	}
	return r, nil
}

// WriteProxyTable prints the medians with ratios against nginx.
func WriteProxyTable(w io.Writer, rep *ProxyReport) error {
	// The title goes around the tabwriter: a line without cells would
	// widen its first column.
	if _, err := fmt.Fprintf(w, "medians of %d interleaved %.0f s runs, %d connections\n", rep.Rounds, rep.Duration, rep.Concurrency); err != nil {
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "kind\ttarget\treq/s\treq/s vs nginx\tCPU-s per 10k\tuser / sys\tCPU vs nginx\tsame round (median, range)\tp50 ms\tp99 ms\terrors\t")
	nginx := map[string]ProxyTarget{}
	for _, t := range rep.Targets {
		if t.Target == "nginx" {
			nginx[t.Kind] = t
		}
	}
	ratio := func(a, b float64) string {
		if b <= 0 || a <= 0 {
			return "-"
		}
		return strconv.FormatFloat(a/b, 'f', 2, 64) + "x"
	}
	for _, t := range rep.Targets {
		n := nginx[t.Kind]
		cpu, split := "-", "-"
		if t.CPUPer10k > 0 {
			cpu = strconv.FormatFloat(t.CPUPer10k, 'f', 3, 64)
			split = strconv.FormatFloat(t.UserPer10k, 'f', 3, 64) + " / " + strconv.FormatFloat(t.SysPer10k, 'f', 3, 64)
		}
		fmt.Fprintf(tw, "%s\t%s\t%.0f\t%s\t%s\t%s\t%s\t%s\t%.3f\t%.3f\t%d\t\n", t.Kind, t.Target, t.RPS, ratio(t.RPS, n.RPS),
			cpu, split, ratio(t.CPUPer10k, n.CPUPer10k), pairedCPU(t, n), t.P50, t.P99, t.Errors)
	}
	return tw.Flush()
}

// pairedCPU compares t's CPU per request with nginx's round by round:
// each round measures every target back to back, so a round's ratio
// cancels the machine's drift between rounds, which the ratio of the two
// medians does not (nginx's own figure moved by a third between rounds in
// some runs). It prints the median of the rounds' ratios and their range,
// or "-" when there is nothing to compare.
func pairedCPU(t, nginx ProxyTarget) string {
	var rs []float64
	for i := 0; i < len(t.Runs) && i < len(nginx.Runs); i++ {
		if a, b := t.Runs[i][0], nginx.Runs[i][0]; a > 0 && b > 0 {
			rs = append(rs, a/b)
		}
	}
	if len(rs) == 0 {
		return "-"
	}
	sort.Float64s(rs)
	return fmt.Sprintf("%.2fx (%.2f-%.2f)", median(rs), rs[0], rs[len(rs)-1])
}
