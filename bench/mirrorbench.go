package bench

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/valyala/fasthttp"
)

// MirrorCmd is `infera bench mirror`: what traffic mirroring costs the
// router, as CPU time of the router process (utime+stime from
// /proc/<pid>/stat) per 10k requests, in three modes side by side in one
// run, in the same router process (the config is reloaded between phases):
//
//   - off: mirroring disabled;
//   - copy: 100% sampling, but every copy expires in the mirror's queue
//     (timeout_ms 0.001) and is never sent: the request path's part
//     (sampling, the copy of path and body, the enqueue) plus a
//     sender goroutine dropping the job;
//   - on: 100% sampling, every copy sent to a target and its answer read
//     (the asynchronous sender's part on top).
//
// Phases alternate (off, copy, on) for --rounds rounds; the report gives the
// median of each mode and its ratio to off.
type MirrorCmd struct {
	Requests    int    `help:"Requests measured per phase." default:"10000" env:"INFERA_BENCH_REQUESTS"`
	Warmup      int    `help:"Requests sent before each phase's measurement." default:"500" env:"INFERA_BENCH_WARMUP_REQUESTS"`
	Rounds      int    `help:"Rounds of the three phases." default:"3" env:"INFERA_BENCH_ROUNDS"`
	Concurrency int    `help:"Closed-loop requests in flight." default:"16" env:"INFERA_BENCH_CONCURRENCY"`
	BodyBytes   int    `name:"body-bytes" help:"Approximate request body size." default:"1024" env:"INFERA_BENCH_BODY_BYTES"`
	InferaBin   string `name:"infera-bin" help:"infera binary for 'infera serve' (default: this executable)." default:"" env:"INFERA_BENCH_INFERA_BIN"`
	OutputFlags
}

// MirrorPhase is one measured phase.
type MirrorPhase struct {
	Mode     string  `json:"mode"`
	Round    int     `json:"round"`
	Requests int     `json:"requests"`
	Errors   int     `json:"errors"`
	CPUms    float64 `json:"router_cpu_ms"`
	SysMS    float64 `json:"router_sys_ms"`
	Per10k   float64 `json:"router_cpu_ms_per_10k"`
	RPS      float64 `json:"rps"`
	P50      float64 `json:"p50_ms"`
	P99      float64 `json:"p99_ms"`
	Sampled  int64   `json:"mirror_sampled"`
	Sent     int64   `json:"mirror_sent"`
	Expired  int64   `json:"mirror_expired"`
	Dropped  int64   `json:"mirror_dropped_queue_full"`
	Received int64   `json:"target_received"`
}

// MirrorReport is the mirror benchmark's output.
type MirrorReport struct {
	BodyBytes   int           `json:"body_bytes"`
	Concurrency int           `json:"concurrency"`
	Phases      []MirrorPhase `json:"phases"`
	// Median router CPU ms per 10k requests, per mode.
	Median map[string]float64 `json:"median_cpu_ms_per_10k"`
}

var mirrorModes = []string{"off", "copy", "on"}

// Run implements the command.
func (c *MirrorCmd) Run() error {
	ctx, cancel := signalContext()
	defer cancel()
	rep, err := RunMirrorBench(ctx, c, os.Stderr)
	if rep != nil {
		_ = WriteMirrorTable(os.Stdout, rep)
	}
	if err != nil {
		return err
	}
	return writeJSONFile(c.JSON, rep)
}

// RunMirrorBench runs the three modes in one router process.
func RunMirrorBench(ctx context.Context, c *MirrorCmd, log io.Writer) (*MirrorReport, error) {
	if c.Requests <= 0 || c.Rounds <= 0 || c.Concurrency <= 0 {
		return nil, fmt.Errorf("requests, rounds and concurrency must be positive")
	}
	dir, err := os.MkdirTemp("", "infera-bench-mirror-")
	if err != nil {
		return nil, fmt.Errorf("cannot create temp dir: %w", err)
	}
	defer os.RemoveAll(dir)
	be, err := StartFixedBackend("sim-model", 1)
	if err != nil {
		return nil, err
	}
	defer be.Close()
	sink, err := startMirrorSink()
	if err != nil {
		return nil, err
	}
	defer sink.srv.Shutdown()
	bin, err := ResolveBin(c.InferaBin)
	if err != nil {
		return nil, err
	}
	port, err := FreePort()
	if err != nil {
		return nil, err
	}
	cfgPath := filepath.Join(dir, "infera.json")
	if err := writeMirrorMode(cfgPath, "off", sink.url); err != nil {
		return nil, err
	}
	url := "http://127.0.0.1:" + strconv.Itoa(port)
	rp, err := StartProc("infera-serve", dir, bin, "serve", "--host", "127.0.0.1", "--port", strconv.Itoa(port),
		"--discovery-backend", "static", "--workers", "fixed="+be.URL, "--worker-model", "sim-model",
		"--router-policy", "round-robin", "--config", cfgPath, "--config-poll", "0s", "--log-level", "warn")
	if err != nil {
		return nil, err
	}
	defer rp.Stop()
	if err := WaitHTTP(ctx, rp, url+"/v1/models", 20*time.Second, func(b []byte) bool { return bytes.Contains(b, []byte("sim-model")) }); err != nil {
		return nil, err
	}
	pid := rp.cmd.Process.Pid
	body := mirrorBody(c.BodyBytes)
	cl, err := NewClient(url, 2*c.Concurrency, false)
	if err != nil {
		return nil, err
	}
	defer cl.CloseIdle()
	cl.Timeout = 30 * time.Second
	rep := &MirrorReport{BodyBytes: len(body), Concurrency: c.Concurrency, Median: map[string]float64{}}
	for round := 1; round <= c.Rounds; round++ {
		for _, mode := range mirrorModes {
			if err := writeMirrorMode(cfgPath, mode, sink.url); err != nil {
				return rep, err
			}
			if err := rp.cmd.Process.Signal(syscall.SIGHUP); err != nil {
				return rep, fmt.Errorf("cannot signal the router: %w", err)
			}
			if err := waitMirrorMode(ctx, url, cl, body, mode); err != nil {
				return rep, err
			}
			ph, err := mirrorPhase(ctx, c, url, cl, body, pid, sink, mode)
			if err != nil {
				return rep, err
			}
			ph.Round = round
			fmt.Fprintf(log, "round %d %-4s %6d req  router CPU %7.1f ms (sys %6.1f, %7.1f ms/10k)  %7.0f req/s  p50 %.3f ms  p99 %.3f ms  sampled %d sent %d expired %d target %d\n",
				round, mode, ph.Requests, ph.CPUms, ph.SysMS, ph.Per10k, ph.RPS, ph.P50, ph.P99, ph.Sampled, ph.Sent, ph.Expired, ph.Received)
			rep.Phases = append(rep.Phases, ph)
		}
	}
	for _, mode := range mirrorModes {
		var v []float64
		for _, p := range rep.Phases {
			if p.Mode == mode {
				v = append(v, p.Per10k)
			}
		}
		sort.Float64s(v)
		rep.Median[mode] = v[len(v)/2]
	}
	return rep, nil
}

// writeMirrorMode writes the router config of a mode.
func writeMirrorMode(path, mode, target string) error {
	var s string
	switch mode {
	case "off":
		s = `{"mirror":{"enabled":false}}`
	case "copy":
		s = fmt.Sprintf(`{"mirror":{"enabled":true,"target_address":%q,"sampling_ratio":100,"timeout_ms":0.001,"queue_size":65536,"concurrency":64}}`, target)
	default:
		s = fmt.Sprintf(`{"mirror":{"enabled":true,"target_address":%q,"sampling_ratio":100,"timeout_ms":30000,"queue_size":65536,"concurrency":64}}`, target)
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(s), 0o600); err != nil {
		return fmt.Errorf("cannot write config: %w", err)
	}
	return os.Rename(tmp, path)
}

// waitMirrorMode sends probe requests until the router's mirror counters
// show the mode applied: sampled moves (copy, on) or not (off).
func waitMirrorMode(ctx context.Context, url string, cl *Client, body []byte, mode string) error {
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		before, err := scrapeMirror(url)
		if err != nil {
			return err
		}
		var res Result
		cl.Do("/v1/chat/completions", body, false, &res)
		if !res.OK() {
			return fmt.Errorf("probe request failed: %s (status %d)", res.Err, res.Status)
		}
		after, err := scrapeMirror(url)
		if err != nil {
			return err
		}
		if (after.sampled > before.sampled) == (mode != "off") {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	return fmt.Errorf("the router never applied mirror mode %s", mode)
}

// mirrorPhase warms up, then sends c.Requests requests and measures the
// router's CPU until the mirror has nothing queued or in flight.
func mirrorPhase(ctx context.Context, c *MirrorCmd, url string, cl *Client, body []byte, pid int, sink *mirrorSink, mode string) (MirrorPhase, error) {
	ph := MirrorPhase{Mode: mode}
	if _, _, err := closedLoop(ctx, cl, body, c.Warmup, c.Concurrency); err != nil {
		return ph, err
	}
	if err := waitMirrorIdle(ctx, url); err != nil {
		return ph, err
	}
	m0, err := scrapeMirror(url)
	if err != nil {
		return ph, err
	}
	recv0 := sink.n.Load()
	u0, s0, err := procTimes(pid)
	if err != nil {
		return ph, err
	}
	t0 := time.Now()
	lat, errs, err := closedLoop(ctx, cl, body, c.Requests, c.Concurrency)
	if err != nil {
		return ph, err
	}
	el := time.Since(t0)
	if err := waitMirrorIdle(ctx, url); err != nil {
		return ph, err
	}
	u1, s1, err := procTimes(pid)
	if err != nil {
		return ph, err
	}
	m1, err := scrapeMirror(url)
	if err != nil {
		return ph, err
	}
	sort.Float64s(lat)
	ph.Requests, ph.Errors = c.Requests, errs
	ph.CPUms = float64(u1-u0+s1-s0) * 1000 / clkTck
	ph.SysMS = float64(s1-s0) * 1000 / clkTck
	ph.Per10k = ph.CPUms * 10000 / float64(c.Requests)
	ph.RPS = float64(c.Requests) / el.Seconds()
	ph.P50, ph.P99 = Percentile(lat, 0.5), Percentile(lat, 0.99)
	ph.Sampled, ph.Sent, ph.Expired, ph.Dropped = m1.sampled-m0.sampled, m1.sent-m0.sent, m1.expired-m0.expired, m1.full-m0.full
	ph.Received = sink.n.Load() - recv0
	return ph, nil
}

// closedLoop sends n requests with conc in flight and returns their
// latencies (ms) and the number of failed ones; a cancelled ctx (Ctrl-C)
// stops it with ctx's error.
func closedLoop(ctx context.Context, cl *Client, body []byte, n, conc int) ([]float64, int, error) {
	var (
		next atomic.Int64
		errs atomic.Int64
		mu   sync.Mutex
		lat  = make([]float64, 0, n)
		wg   sync.WaitGroup
	)
	for range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var l []float64
			for ctx.Err() == nil && next.Add(1) <= int64(n) {
				var res Result
				cl.Do("/v1/chat/completions", body, false, &res)
				if !res.OK() {
					errs.Add(1)
					continue
				}
				l = append(l, ms(res.E2E))
			}
			mu.Lock()
			lat = append(lat, l...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return lat, int(errs.Load()), err
	}
	if e := int(errs.Load()); e > n/100 {
		return lat, e, fmt.Errorf("%d of %d requests failed", e, n)
	}
	return lat, int(errs.Load()), nil
}

type mirrorCounters struct {
	sampled, sent, expired, full, queued, inflight int64
}

// scrapeMirror reads the router's mirror metrics.
func scrapeMirror(url string) (mirrorCounters, error) {
	var m mirrorCounters
	status, body, err := fasthttp.GetTimeout(nil, url+"/metrics", 5*time.Second)
	if err != nil || status != 200 {
		return m, fmt.Errorf("cannot read the router's metrics: %v (status %d)", err, status)
	}
	for _, line := range strings.Split(string(body), "\n") {
		name, v, ok := strings.Cut(line, " ")
		if !ok {
			continue
		}
		n, _ := strconv.ParseFloat(v, 64)
		switch {
		case name == "infera_mirror_sampled_total":
			m.sampled = int64(n)
		case strings.HasPrefix(name, "infera_mirror_requests_total{"):
			m.sent += int64(n)
		case name == `infera_mirror_dropped_total{reason="expired"}`:
			m.expired = int64(n)
		case name == `infera_mirror_dropped_total{reason="queue_full"}`:
			m.full = int64(n)
		case name == "infera_mirror_queue_length":
			m.queued = int64(n)
		case name == "infera_mirror_inflight":
			m.inflight = int64(n)
		}
	}
	return m, nil
}

// waitMirrorIdle waits until the mirror has nothing queued or in flight.
func waitMirrorIdle(ctx context.Context, url string) error {
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		m, err := scrapeMirror(url)
		if err != nil {
			return err
		}
		if m.queued == 0 && m.inflight == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	return fmt.Errorf("the mirror did not drain")
}

// mirrorBody is a chat request of about n bytes.
func mirrorBody(n int) []byte {
	head := `{"model":"sim-model","max_tokens":8,"messages":[{"role":"user","content":"`
	tail := `"}]}`
	fill := max(1, n-len(head)-len(tail))
	return []byte(head + strings.Repeat("mirror ", fill/7+1)[:fill] + tail)
}

// mirrorSink is the mirror target: it counts requests and answers a small
// completion with usage.
type mirrorSink struct {
	srv *fasthttp.Server
	url string
	n   atomic.Int64
}

func startMirrorSink() (*mirrorSink, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("cannot listen: %w", err)
	}
	s := &mirrorSink{url: "http://" + ln.Addr().String()}
	answer := []byte(`{"id":"m","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":16,"completion_tokens":1,"total_tokens":17}}`)
	s.srv = &fasthttp.Server{Name: "mirror-sink", Concurrency: 1 << 16, Handler: func(ctx *fasthttp.RequestCtx) {
		s.n.Add(1)
		ctx.SetContentType("application/json")
		ctx.SetBody(answer)
	}}
	go func() { _ = s.srv.Serve(ln) }()
	return s, nil
}

// WriteMirrorTable prints the phases and each mode's median against off.
func WriteMirrorTable(w io.Writer, rep *MirrorReport) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "round\tmode\trequests\trouter CPU ms\tof which sys\tms per 10k\treq/s\tp50 ms\tp99 ms\tsampled\tsent\texpired\ttarget got\t")
	for _, p := range rep.Phases {
		fmt.Fprintf(tw, "%d\t%s\t%d\t%.0f\t%.0f\t%.0f\t%.0f\t%.3f\t%.3f\t%d\t%d\t%d\t%d\t\n", p.Round, p.Mode, p.Requests, p.CPUms, p.SysMS, p.Per10k,
			p.RPS, p.P50, p.P99, p.Sampled, p.Sent, p.Expired, p.Received)
	}
	off := rep.Median["off"]
	for _, mode := range mirrorModes {
		ratio := "-"
		if off > 0 {
			ratio = strconv.FormatFloat(rep.Median[mode]/off, 'f', 3, 64)
		}
		fmt.Fprintf(tw, "median %s: %.0f ms CPU per 10k requests (x%s vs off)\n", mode, rep.Median[mode], ratio)
	}
	return tw.Flush()
}
