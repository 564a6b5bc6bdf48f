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
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
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

// ProxyPathResult is one path's measurement.
type ProxyPathResult struct {
	Name        string  `json:"name"`
	Stream      bool    `json:"stream"`
	Concurrency int     `json:"concurrency"`
	Requests    int     `json:"requests"`
	Errors      int     `json:"errors"`
	RPS         float64 `json:"rps"`
	P50         float64 `json:"p50_ms"`
	P99         float64 `json:"p99_ms"`
	TTFTP50     float64 `json:"ttft_p50_ms,omitempty"`
	Generator   string  `json:"generator"`
}

// hammer runs a closed loop of conc clients against url for d and returns
// the measurement (after a short warm-up).
func hammer(url string, body []byte, stream bool, conc int, d, warm time.Duration) (ProxyPathResult, error) {
	cl, err := NewClient(url, conc*2, false)
	if err != nil {
		return ProxyPathResult{}, err
	}
	defer cl.CloseIdle()
	cl.Timeout = 30 * time.Second
	path := "/v1/chat/completions"
	var (
		wg        sync.WaitGroup
		mu        sync.Mutex
		lat, ttft []float64
		errs      atomic.Int64
		n         atomic.Int64
	)
	start := time.Now()
	measureFrom := start.Add(warm)
	stop := measureFrom.Add(d)
	for range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var l, t []float64
			for {
				now := time.Now()
				if now.After(stop) {
					break
				}
				var res Result
				cl.Do(path, body, stream, &res)
				if now.Before(measureFrom) {
					continue
				}
				if !res.OK() {
					errs.Add(1)
					continue
				}
				n.Add(1)
				l = append(l, ms(res.E2E))
				t = append(t, ms(res.TTFT))
			}
			mu.Lock()
			lat = append(lat, l...)
			ttft = append(ttft, t...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	sort.Float64s(lat)
	sort.Float64s(ttft)
	r := ProxyPathResult{Stream: stream, Concurrency: conc, Requests: int(n.Load()), Errors: int(errs.Load()),
		RPS: float64(n.Load()) / d.Seconds(), P50: Percentile(lat, 0.5), P99: Percentile(lat, 0.99), Generator: "fasthttp"}
	if stream {
		r.TTFTP50 = Percentile(ttft, 0.5)
	}
	return r, nil
}

var (
	wrkRPS = regexp.MustCompile(`Requests/sec:\s+([0-9.]+)`)
	wrkPct = regexp.MustCompile(`(?m)^\s+(50|99)(?:\.000)?%\s+([0-9.]+)(us|ms|s)`)
	wrkReq = regexp.MustCompile(`(\d+) requests in`)
)

// wrkRun runs wrk with a POST Lua script and parses throughput and latency.
func wrkRun(wrk, url string, body []byte, conc int, d time.Duration, dir string) (ProxyPathResult, error) {
	script := filepath.Join(dir, "post.lua")
	lua := "wrk.method = \"POST\"\nwrk.headers[\"Content-Type\"] = \"application/json\"\nwrk.body = " + strconv.Quote(string(body)) + "\n"
	if err := os.WriteFile(script, []byte(lua), 0o644); err != nil {
		return ProxyPathResult{}, fmt.Errorf("cannot write wrk script: %w", err)
	}
	secs := max(1, int(d.Seconds()))
	out, err := exec.Command(wrk, "-t", "1", "-c", strconv.Itoa(conc), "-d", strconv.Itoa(secs)+"s", "--latency", "-s", script, url+"/v1/chat/completions").CombinedOutput()
	if err != nil {
		return ProxyPathResult{}, fmt.Errorf("wrk failed: %w: %s", err, out)
	}
	r := ProxyPathResult{Concurrency: conc, Generator: "wrk"}
	if m := wrkRPS.FindSubmatch(out); m != nil {
		r.RPS, _ = strconv.ParseFloat(string(m[1]), 64)
	}
	if m := wrkReq.FindSubmatch(out); m != nil {
		r.Requests, _ = strconv.Atoi(string(m[1]))
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
			r.P50 = v
		} else {
			r.P99 = v
		}
	}
	if r.RPS == 0 {
		return r, fmt.Errorf("cannot parse wrk output: %s", out)
	}
	return r, nil
}

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

// ProxyCmd is `infera bench proxy`.
type ProxyCmd struct {
	Concurrency  int           `help:"Closed-loop connections/requests in flight." default:"64" env:"INFERA_BENCH_CONCURRENCY"`
	Duration     time.Duration `help:"Measurement time per path." default:"4s" env:"INFERA_BENCH_DURATION"`
	Warmup       time.Duration `help:"Warm-up time per path (not measured)." default:"500ms" env:"INFERA_BENCH_WARMUP"`
	StreamChunks int           `help:"SSE chunks per streaming response." default:"16" env:"INFERA_BENCH_STREAM_CHUNKS"`
	InferaBin    string        `name:"infera-bin" help:"infera binary for 'infera serve' (default: this executable)." default:"" env:"INFERA_BENCH_INFERA_BIN"`
	Nginx        string        `help:"nginx binary (empty: skip nginx)." default:"/usr/sbin/nginx" env:"INFERA_BENCH_NGINX"`
	NginxWorkers int           `help:"nginx worker processes." default:"2" env:"INFERA_BENCH_NGINX_WORKERS"`
	Generator    string        `help:"Load generator: fasthttp (ours) or wrk (non-streaming paths only)." default:"fasthttp" enum:"fasthttp,wrk" env:"INFERA_BENCH_GENERATOR"`
	Wrk          string        `help:"wrk binary for --generator wrk." default:"/usr/bin/wrk" env:"INFERA_BENCH_WRK"`
	ServeArg     []string      `name:"serve-arg" help:"Extra flag for infera serve (repeatable)." env:"INFERA_BENCH_SERVE_ARG"`
	OutputFlags
}

// ProxyReport is the proxy benchmark's output.
type ProxyReport struct {
	Paths []ProxyPathResult `json:"paths"`
	// Saturation is direct-path throughput at 2x concurrency divided by the
	// throughput at 1x: near 1 means the direct path is saturated.
	Saturation float64 `json:"direct_saturation_ratio"`
}

// Run implements the command.
func (c *ProxyCmd) Run() error {
	rep, err := RunProxyBench(context.Background(), c, os.Stderr)
	if rep != nil {
		_ = WriteProxyTable(os.Stdout, rep)
	}
	if err != nil {
		return err
	}
	return writeJSONFile(c.JSON, rep)
}

// RunProxyBench runs every path in one process run.
func RunProxyBench(ctx context.Context, c *ProxyCmd, log io.Writer) (*ProxyReport, error) {
	if c.Concurrency <= 0 || c.Duration <= 0 {
		return nil, fmt.Errorf("concurrency and duration must be positive")
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
	port, err := FreePort()
	if err != nil {
		return nil, err
	}
	inferaURL := "http://127.0.0.1:" + strconv.Itoa(port)
	args := append([]string{"serve", "--host", "127.0.0.1", "--port", strconv.Itoa(port), "--discovery-backend", "static",
		"--workers", "fixed=" + be.URL, "--worker-model", "sim-model", "--router-policy", "round-robin"}, c.ServeArg...)
	rp, err := StartProc("infera-serve", dir, bin, args...)
	if err != nil {
		return nil, err
	}
	g.Add(rp)
	if err := WaitHTTP(ctx, rp, inferaURL+"/v1/models", 20*time.Second, func(b []byte) bool { return bytes.Contains(b, []byte("sim-model")) }); err != nil {
		return nil, err
	}
	var nginxURL string
	if c.Nginx != "" {
		np, u, err := startNginx(c.Nginx, filepath.Join(dir, "nginx"), strings.TrimPrefix(be.URL, "http://"), c.NginxWorkers)
		if err != nil {
			return nil, err
		}
		g.Add(np)
		if err := WaitHTTP(ctx, np, u+"/health", 10*time.Second, nil); err != nil {
			return nil, err
		}
		nginxURL = u
	}
	plain := []byte(`{"model":"sim-model","messages":[{"role":"user","content":"hello"}],"max_tokens":8}`)
	streamBody := []byte(`{"model":"sim-model","messages":[{"role":"user","content":"hello"}],"max_tokens":8,"stream":true,"stream_options":{"include_usage":true}}`)
	rep := &ProxyReport{}
	run := func(name, url string, stream bool, conc int) error {
		var r ProxyPathResult
		var err error
		if c.Generator == "wrk" && !stream {
			r, err = wrkRun(c.Wrk, url, plain, conc, c.Duration, dir)
		} else {
			body := plain
			if stream {
				body = streamBody
			}
			r, err = hammer(url, body, stream, conc, c.Duration, c.Warmup)
		}
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		r.Name, r.Stream = name, stream
		fmt.Fprintf(log, "%-22s c=%-4d %9.0f req/s  p50 %.3f ms  p99 %.3f ms  errors %d\n", name, conc, r.RPS, r.P50, r.P99, r.Errors)
		rep.Paths = append(rep.Paths, r)
		return nil
	}
	if err := run("direct", be.URL, false, c.Concurrency); err != nil {
		return rep, err
	}
	if err := run("direct (2x conc)", be.URL, false, 2*c.Concurrency); err != nil {
		return rep, err
	}
	if rep.Paths[0].RPS > 0 {
		rep.Saturation = rep.Paths[1].RPS / rep.Paths[0].RPS
	}
	if err := run("infera", inferaURL, false, c.Concurrency); err != nil {
		return rep, err
	}
	if nginxURL != "" {
		if err := run("nginx", nginxURL, false, c.Concurrency); err != nil {
			return rep, err
		}
	}
	if err := run("direct stream", be.URL, true, c.Concurrency); err != nil {
		return rep, err
	}
	if err := run("infera stream", inferaURL, true, c.Concurrency); err != nil {
		return rep, err
	}
	if nginxURL != "" {
		if err := run("nginx stream", nginxURL, true, c.Concurrency); err != nil {
			return rep, err
		}
	}
	return rep, nil
}

// WriteProxyTable prints each path with ratios against its direct baseline.
func WriteProxyTable(w io.Writer, rep *ProxyReport) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "path\tconc\treq/s\tvs direct\tp50 ms\tp99 ms\tadded p50 ms\tadded p99 ms\tp50 ratio\tp99 ratio\terrors\t")
	var base ProxyPathResult
	for _, p := range rep.Paths {
		if p.Name == "direct" || p.Name == "direct stream" {
			base = p
		}
		ratio := func(a, b float64) string {
			if b <= 0 {
				return "-"
			}
			return strconv.FormatFloat(a/b, 'f', 2, 64)
		}
		fmt.Fprintf(tw, "%s\t%d\t%.0f\t%s\t%.3f\t%.3f\t%.3f\t%.3f\t%s\t%s\t%d\t\n", p.Name, p.Concurrency, p.RPS, ratio(p.RPS, base.RPS),
			p.P50, p.P99, p.P50-base.P50, p.P99-base.P99, ratio(p.P50, base.P50), ratio(p.P99, base.P99), p.Errors)
	}
	fmt.Fprintf(tw, "direct saturation (req/s at 2x conc / at 1x): %.2f\n", rep.Saturation)
	return tw.Flush()
}
