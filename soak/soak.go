// Package soak is `infera soak`: a long run of mixed streaming and
// non-streaming load through a real router, over NATS with etcd
// discovery, while chaos is applied to the fleet: engines killed and
// restarted, engines hung (SIGSTOP), 500 storms, streams cut mid-way,
// config reloads, and a NATS broker restart. It reports every request's
// outcome (none may be lost or duplicated: each must end in a complete
// answer or a clean error), and the router's memory and goroutines at the
// start and the end (they must be flat).
package soak

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/infera/infera/bench"
	"github.com/infera/infera/internal/tcpfront"
)

// Cmd is `infera soak`.
type Cmd struct {
	Duration    time.Duration `help:"Length of the run." default:"30m" env:"INFERA_SOAK_DURATION"`
	Engines     int           `help:"Simulated engines (each behind an infera worker sidecar)." default:"4" env:"INFERA_SOAK_ENGINES"`
	Clients     int           `help:"Concurrent clients (closed loop)." default:"24" env:"INFERA_SOAK_CLIENTS"`
	StreamPct   int           `help:"Share of streaming requests, percent." default:"70" env:"INFERA_SOAK_STREAM_PCT"`
	ChaosEvery  time.Duration `help:"Time between chaos events." default:"40s" env:"INFERA_SOAK_CHAOS_EVERY"`
	ReloadEvery time.Duration `help:"Time between config reloads." default:"15s" env:"INFERA_SOAK_RELOAD_EVERY"`
	InferaBin   string        `name:"infera-bin" help:"infera binary (default: this executable)." default:"" env:"INFERA_SOAK_INFERA_BIN"`
	Etcd        string        `help:"etcd binary." default:"/usr/bin/etcd" env:"INFERA_ETCD_BIN"`
	NATS        string        `name:"nats-server" help:"nats-server binary." default:"/usr/sbin/nats-server" env:"INFERA_NATS_SERVER_BIN"`
	JSON        string        `name:"json" help:"Write the report as JSON to this file." default:"" env:"INFERA_SOAK_JSON"`
	Seed        uint64        `help:"Seed of the chaos schedule and the request mix." default:"1" env:"INFERA_SOAK_SEED"`
}

// Report is the soak's result.
type Report struct {
	Duration float64 `json:"duration_s"`
	Requests int64   `json:"requests"`
	// OK: complete answers. CleanErrors: an error answer (HTTP error in the
	// OpenAI shape, or a stream ending with an error event and [DONE]).
	OK          int64 `json:"ok"`
	CleanErrors int64 `json:"clean_errors"`
	// Lost: no complete answer and no error (connection cut, truncated or
	// malformed body, client timeout). Duplicated: an answer that carries
	// more than one [DONE] or more than one response.
	Lost       int64            `json:"lost"`
	Duplicated int64            `json:"duplicated"`
	Statuses   map[string]int64 `json:"statuses"`
	Chaos      []string         `json:"chaos"`
	// Router memory (RSS, MB) and goroutines after warm-up and at the end.
	RSSStartMB  float64 `json:"rss_start_mb"`
	RSSEndMB    float64 `json:"rss_end_mb"`
	GoroutStart int     `json:"goroutines_start"`
	GoroutEnd   int     `json:"goroutines_end"`
	Flat        bool    `json:"memory_flat"`
	Pass        bool    `json:"pass"`
}

// Run implements the command.
func (c *Cmd) Run() error {
	rep, err := c.run(context.Background(), os.Stderr)
	if rep != nil {
		b, _ := json.MarshalIndent(rep, "", "  ")
		fmt.Println(string(b))
		if c.JSON != "" {
			os.WriteFile(c.JSON, b, 0o644)
		}
	}
	if err != nil {
		return err
	}
	if !rep.Pass {
		return errors.New("soak failed: requests lost or duplicated, or memory not flat")
	}
	return nil
}

// engineProc is one engine and its worker sidecar. The engine listens on
// a port of its own (--port 0, a fresh one at each start) behind front,
// whose address the worker and the fault calls use: a restart keeps it,
// and no other process can take it while the engine is down.
type engineProc struct {
	id    string
	front *tcpfront.Front
	url   string // http://front.Addr

	// mu guards eng, worker and down: a restart replaces the processes
	// while the chaos loop picks its next victim.
	mu     sync.Mutex
	eng    *bench.Proc
	worker *bench.Proc
	down   bool // killed, not yet restarted: no chaos event picks it
}

// newEngineProc returns engine id, not started, with the front that
// holds its address.
func newEngineProc(id string) (*engineProc, error) {
	f, err := tcpfront.New()
	if err != nil {
		return nil, err
	}
	return &engineProc{id: id, front: f, url: "http://" + f.Addr}, nil
}

// startEngine starts e's engine on a fresh port of its own and, once it
// answers, puts it behind e's front.
func (e *engineProc) startEngine(ctx context.Context, dir, bin string) (*bench.Proc, error) {
	p, err := bench.StartProc(e.id, dir, bin, "engine", "--port", "0", "--id", e.id, "--speedup", "20")
	if err != nil {
		return nil, err
	}
	addr, err := p.WaitListenAddr(ctx, "infera engine listening", 20*time.Second)
	if err == nil {
		err = bench.WaitHTTP(ctx, p, "http://"+addr+"/health", 20*time.Second, nil)
	}
	if err == nil {
		err = e.front.Up(addr)
	}
	if err != nil {
		p.Stop()
		return nil, err
	}
	return p, nil
}

// kill kills e's engine and worker (SIGKILL) and takes its front down,
// as the engine's own port goes: connections cut, connecting refused.
func (e *engineProc) kill(eng, w *bench.Proc) {
	eng.Signal(syscall.SIGKILL)
	if w != nil {
		w.Signal(syscall.SIGKILL)
	}
	e.front.Down()
}

// procs returns e's processes, or nils while it is down.
func (e *engineProc) procs() (eng, worker *bench.Proc) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.down {
		return nil, nil
	}
	return e.eng, e.worker
}

func (c *Cmd) run(ctx context.Context, log io.Writer) (*Report, error) {
	if c.Engines < 2 || c.Clients < 1 || c.Duration <= 0 {
		return nil, fmt.Errorf("need at least 2 engines, 1 client and a positive duration")
	}
	bin, err := bench.ResolveBin(c.InferaBin)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "infera-soak-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	var g bench.Group
	defer g.StopAll()

	// etcd (never restarted: on free ports, other ones if another process
	// took one before it bound them) and NATS.
	var etcdEP string
	for attempt := 1; ; attempt++ {
		cport, err := bench.FreePort()
		if err != nil {
			return nil, err
		}
		pport, err := bench.FreePort()
		if err != nil {
			return nil, err
		}
		etcdEP = "127.0.0.1:" + strconv.Itoa(cport)
		etcdURL, peerURL := "http://"+etcdEP, "http://127.0.0.1:"+strconv.Itoa(pport)
		etcd, err := bench.StartProc("etcd", dir, c.Etcd, "--name", "soak", "--data-dir", filepath.Join(dir, "etcd"),
			"--listen-client-urls", etcdURL, "--advertise-client-urls", etcdURL,
			"--listen-peer-urls", peerURL, "--initial-advertise-peer-urls", peerURL,
			"--initial-cluster", "soak="+peerURL, "--log-level", "warn")
		if err != nil {
			return nil, err
		}
		g.Add(etcd)
		err = bench.WaitHTTP(ctx, etcd, etcdURL+"/health", 20*time.Second, nil)
		if err == nil {
			break
		}
		if !etcd.Exited() || attempt == 5 {
			return nil, err
		}
		os.RemoveAll(filepath.Join(dir, "etcd"))
	}
	// NATS behind a front, which keeps the broker's address across its
	// restart: it starts on a fresh port each time (another one if another
	// process took it first) and advertises the front's.
	nfront, err := tcpfront.New()
	if err != nil {
		return nil, err
	}
	defer nfront.Close()
	natsURL := "nats://" + nfront.Addr
	startNATS := func() (*bench.Proc, error) {
		for attempt := 1; ; attempt++ {
			port, err := bench.FreePort()
			if err != nil {
				return nil, err
			}
			backend := "127.0.0.1:" + strconv.Itoa(port)
			p, err := bench.StartProc("nats", dir, c.NATS, "-a", "127.0.0.1", "-p", strconv.Itoa(port), "--client_advertise", nfront.Addr)
			if err != nil {
				return nil, err
			}
			if err = waitNATS(ctx, p, backend, 20*time.Second); err == nil {
				if err = nfront.Up(backend); err == nil {
					return p, nil
				}
			}
			exited := p.Exited() // it could not bind: another process took the port
			p.Stop()
			if !exited || attempt == 5 {
				return nil, err
			}
		}
	}
	nats, err := startNATS()
	if err != nil {
		return nil, err
	}
	var natsMu sync.Mutex
	common := []string{"--discovery-backend", "etcd", "--etcd-endpoint", etcdEP, "--request-transport", "nats",
		"--kv-event-transport", "zmq", "--nats-url", natsURL}

	// Engines, each behind a worker sidecar.
	engines := make([]*engineProc, c.Engines)
	startEngine := func(i int) error {
		e := engines[i]
		p, err := e.startEngine(ctx, dir, bin)
		if err != nil {
			return err
		}
		w, err := bench.StartProc(e.id+"-worker", dir, bin, append([]string{"worker", "--id", e.id,
			"--engine-url", e.url, "--lease-ttl", "3s"}, common...)...)
		if err != nil {
			e.front.Down()
			p.Stop()
			return err
		}
		e.mu.Lock()
		e.eng, e.worker, e.down = p, w, false
		e.mu.Unlock()
		return nil
	}
	for i := range engines {
		e, err := newEngineProc("soak-" + strconv.Itoa(i))
		if err != nil {
			return nil, err
		}
		defer e.front.Close()
		engines[i] = e
		if err := startEngine(i); err != nil {
			return nil, err
		}
	}
	defer func() {
		for _, e := range engines {
			e.mu.Lock()
			eng, w := e.eng, e.worker
			e.mu.Unlock()
			w.Stop()
			eng.Stop()
		}
		natsMu.Lock()
		nats.Stop()
		natsMu.Unlock()
	}()

	// The router, with a config file the soak rewrites.
	cfgPath := filepath.Join(dir, "infera.json")
	writeCfg := func(i int) {
		cfg := fmt.Sprintf(`{"timeouts":{"stream_first_packet_s":%d,"stream_idle_s":%d,"non_stream_total_s":60},"debug":{"decision_header":%v}}`,
			20+i%3, 10+i%2, i%2 == 0)
		tmp := cfgPath + ".tmp"
		os.WriteFile(tmp, []byte(cfg), 0o644)
		os.Rename(tmp, cfgPath)
	}
	writeCfg(0)
	router, err := bench.StartProc("router", dir, bin, append([]string{"serve", "--host", "127.0.0.1", "--port", "0",
		"--config", cfgPath, "--config-poll", "500ms", "--admin-port", "0", "--router-policy", "kv-aware",
		"--breaker-cooldown-s", "2", "--request-max-retries", "2", "--nats-req-idle-timeout", "15s"}, common...)...)
	if err != nil {
		return nil, err
	}
	g.Add(router)
	raddr, err := router.WaitListenAddr(ctx, "infera serving", 30*time.Second)
	if err != nil {
		return nil, err
	}
	routerURL := "http://" + raddr
	deadline := time.Now().Add(30 * time.Second)
	for {
		var h struct {
			Workers struct {
				Routable int `json:"routable"`
			} `json:"workers"`
		}
		resp, err := http.Get(routerURL + "/health")
		if err == nil {
			json.NewDecoder(resp.Body).Decode(&h)
			resp.Body.Close()
			if h.Workers.Routable == c.Engines {
				break
			}
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("router never saw %d routable workers: %s", c.Engines, router.LogTail(2000))
		}
		time.Sleep(200 * time.Millisecond)
	}

	rep := &Report{Statuses: map[string]int64{}}
	var mu sync.Mutex
	note := func(s string) {
		mu.Lock()
		rep.Chaos = append(rep.Chaos, time.Now().Format("15:04:05")+" "+s)
		mu.Unlock()
		fmt.Fprintln(log, "chaos:", s)
	}
	runCtx, stop := context.WithTimeout(ctx, c.Duration)
	defer stop()
	var wg sync.WaitGroup
	var seq atomic.Int64
	hc := &http.Client{Timeout: 120 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: c.Clients}}
	for i := 0; i < c.Clients; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(c.Seed, uint64(i)))
			for runCtx.Err() == nil {
				n := seq.Add(1)
				stream := rng.IntN(100) < c.StreamPct
				outcome, status := oneRequest(hc, routerURL, n, stream, 4+rng.IntN(40))
				mu.Lock()
				rep.Requests++
				rep.Statuses[status]++
				switch outcome {
				case outOK:
					rep.OK++
				case outCleanError:
					rep.CleanErrors++
				case outDuplicated:
					rep.Duplicated++
				default:
					rep.Lost++
				}
				mu.Unlock()
			}
		}(i)
	}

	// Memory after warm-up.
	time.Sleep(min(c.Duration/10, 60*time.Second))
	rep.RSSStartMB, rep.GoroutStart = routerMemory(router.Pid(), routerURL)

	// Chaos and reloads.
	rng := rand.New(rand.NewPCG(c.Seed, 99))
	chaos := time.NewTicker(c.ChaosEvery)
	reload := time.NewTicker(c.ReloadEvery)
	defer chaos.Stop()
	defer reload.Stop()
	natsRestarted := false
	half := time.Now().Add(c.Duration / 2)
	for k, r := 0, 1; runCtx.Err() == nil; {
		select {
		case <-runCtx.Done():
		case <-reload.C:
			writeCfg(r)
			r++
		case <-chaos.C:
			if !natsRestarted && time.Now().After(half) {
				natsRestarted = true
				note("NATS broker restart")
				natsMu.Lock()
				nfront.Down() // the broker's connections end, and connecting is refused
				nats.Stop()
				time.Sleep(2 * time.Second)
				nats, err = startNATS()
				natsMu.Unlock()
				if err != nil {
					return rep, err
				}
				continue
			}
			// The drawn engine, or the next one up: one killed and not yet
			// restarted is never picked (its pid may be another process's).
			i := rng.IntN(len(engines))
			var e *engineProc
			var eng, w *bench.Proc
			for j := range engines {
				if e = engines[(i+j)%len(engines)]; e != nil {
					if eng, w = e.procs(); eng != nil {
						i = (i + j) % len(engines)
						break
					}
				}
			}
			if eng == nil {
				continue // every engine is down
			}
			switch k % 4 {
			case 0:
				note("kill -9 " + e.id + ", restart in 8 s")
				e.mu.Lock()
				e.down = true
				e.mu.Unlock()
				e.kill(eng, w)
				go func(i int) {
					time.Sleep(8 * time.Second)
					if err := startEngine(i); err != nil {
						fmt.Fprintln(log, "restart failed:", err)
					}
				}(i)
			case 1:
				note("hang " + e.id + " (SIGSTOP) for 15 s")
				eng.Signal(syscall.SIGSTOP)
				go func() { time.Sleep(15 * time.Second); eng.Signal(syscall.SIGCONT) }()
			case 2:
				note("500 storm on " + e.id + " for 20 s")
				setFault(e.url, `{"mode":"error","status":500,"rate":0.7}`)
				go func(url string) { time.Sleep(20 * time.Second); setFault(url, `{"mode":"none"}`) }(e.url)
			case 3:
				note("streams cut mid-way on " + e.id + " for 20 s")
				setFault(e.url, `{"mode":"close-mid-stream","after_tokens":3,"rate":0.5}`)
				go func(url string) { time.Sleep(20 * time.Second); setFault(url, `{"mode":"none"}`) }(e.url)
			}
			k++
		}
	}
	wg.Wait()
	// Let the router settle (streams end, idle connections expire).
	time.Sleep(5 * time.Second)
	rep.RSSEndMB, rep.GoroutEnd = routerMemory(router.Pid(), routerURL)
	rep.Duration = c.Duration.Seconds()
	rep.Flat = rep.RSSEndMB <= rep.RSSStartMB*1.25+16 && rep.GoroutEnd <= rep.GoroutStart+64
	rep.Pass = rep.Lost == 0 && rep.Duplicated == 0 && rep.Flat && rep.OK > 0
	if router.Exited() {
		rep.Pass = false
		return rep, fmt.Errorf("the router exited: %s", router.LogTail(2000))
	}
	return rep, nil
}

type outcome int

const (
	outOK outcome = iota
	outCleanError
	outLost
	outDuplicated
)

// oneRequest sends request n and classifies its answer.
func oneRequest(hc *http.Client, url string, n int64, stream bool, maxTokens int) (outcome, string) {
	body := fmt.Sprintf(`{"model":"sim-model","max_tokens":%d,"stream":%v,"messages":[{"role":"system","content":"soak %d"},{"role":"user","content":"request %d: tell me about routing"}]}`,
		maxTokens, stream, n%7, n)
	resp, err := hc.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		return outLost, "transport-error"
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	status := strconv.Itoa(resp.StatusCode)
	if err != nil {
		return outLost, status + "-truncated"
	}
	if resp.StatusCode != 200 {
		var e struct {
			Error struct {
				Message string  `json:"message"`
				Code    *string `json:"code"`
			} `json:"error"`
		}
		if json.Unmarshal(b, &e) == nil && e.Error.Message != "" {
			if e.Error.Code != nil && *e.Error.Code != "" {
				status += " " + *e.Error.Code // the statuses break clean errors down by code
			}
			return outCleanError, status
		}
		return outLost, status + "-malformed"
	}
	if !stream {
		var r answerChoices
		if json.Unmarshal(b, &r) != nil || len(r.Choices) == 0 {
			return outLost, status + "-malformed"
		}
		if !r.finished() {
			return outLost, status + "-no-finish"
		}
		return outOK, status
	}
	done := bytes.Count(b, []byte("data: [DONE]"))
	switch {
	case done > 1:
		return outDuplicated, status
	case done == 0 || !bytes.HasSuffix(b, []byte("data: [DONE]\n\n")):
		return outLost, status + "-stream-cut"
	}
	// Every event must be a complete JSON object, and a complete answer
	// carries its finish_reason (as the engine's last chunk does, before
	// usage and [DONE]): a stream cut and then closed with [DONE] and no
	// error event is not one.
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 1<<16), 1<<20)
	errEvent, finished := false, false
	for sc.Scan() {
		line := sc.Bytes()
		if !bytes.HasPrefix(line, []byte("data: ")) || bytes.Equal(line, []byte("data: [DONE]")) {
			continue
		}
		if !json.Valid(line[6:]) {
			return outLost, status + "-bad-event"
		}
		if bytes.HasPrefix(line, []byte(`data: {"error"`)) {
			errEvent = true
		}
		var ev answerChoices
		if json.Unmarshal(line[6:], &ev) == nil && ev.finished() {
			finished = true
		}
	}
	switch {
	case errEvent:
		return outCleanError, status + "-error-event"
	case !finished:
		return outLost, status + "-no-finish"
	}
	return outOK, status
}

// answerChoices is the part of an answer or a stream chunk the soak checks.
type answerChoices struct {
	Choices []struct {
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
}

// finished reports whether a choice carries a finish_reason.
func (a *answerChoices) finished() bool {
	for _, c := range a.Choices {
		if c.FinishReason != nil && *c.FinishReason != "" {
			return true
		}
	}
	return false
}

// setFault sets the fault of the engine at url (its front).
func setFault(url string, f string) {
	resp, err := http.Post(url+"/admin/fault", "application/json", strings.NewReader(f))
	if err == nil {
		resp.Body.Close()
	}
}

// routerMemory returns the router's RSS in MB (from /proc) and its
// goroutine count (from /metrics).
func routerMemory(pid int, url string) (float64, int) {
	var rss float64
	if b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmRSS:" {
				kb, _ := strconv.ParseFloat(f[1], 64)
				rss = kb / 1024
			}
		}
	}
	g := 0
	if resp, err := http.Get(url + "/metrics"); err == nil {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		for _, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(l, "go_goroutines ") {
				g, _ = strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(l, "go_goroutines ")))
			}
		}
	}
	return rss, g
}

// waitNATS waits until the broker p at addr greets a connection with its
// INFO line, or p exits, or timeout passes.
func waitNATS(ctx context.Context, p *bench.Proc, addr string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
			c.SetReadDeadline(time.Now().Add(time.Second))
			line, _ := bufio.NewReader(c).ReadString('\n')
			c.Close()
			if strings.HasPrefix(line, "INFO ") {
				return nil
			}
		}
		if p.Exited() {
			return fmt.Errorf("nats-server exited before it answered on %s: %s", addr, p.LogTail(2000))
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("nats-server not answering on %s after %v: %s", addr, timeout, p.LogTail(2000))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}
