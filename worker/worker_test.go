package worker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/alecthomas/kong"
	"github.com/infera/infera/broker"
	"github.com/infera/infera/discovery"
	"github.com/infera/infera/fleet"
	"github.com/infera/infera/internal/testsrv"
	"github.com/nats-io/nats.go"
)

// fakeEngine is a loopback engine: /health (200 once healthy), /v1/models,
// /stream?n=&every= (SSE), and /admin/stats {"active": n} when stats is on.
type fakeEngine struct {
	healthy atomic.Bool
	stats   bool
	active  atomic.Int64
}

func (e *fakeEngine) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/health", func(w http.ResponseWriter, r *http.Request) {
		if !e.healthy.Load() {
			w.WriteHeader(503)
			return
		}
		w.Write([]byte("ok"))
	})
	mux.HandleFunc("/v1/models", func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte(`{"object":"list","data":[{"id":"llama-3","object":"model","max_model_len":8192},{"id":"llama-3-lora"}]}`))
	})
	mux.HandleFunc("/admin/stats", func(w http.ResponseWriter, r *http.Request) {
		if !e.stats {
			http.NotFound(w, r)
			return
		}
		fmt.Fprintf(w, `{"active":%d,"queued":0}`, e.active.Load())
	})
	mux.HandleFunc("/stream", func(w http.ResponseWriter, r *http.Request) {
		e.active.Add(1)
		defer e.active.Add(-1)
		n, _ := strconv.Atoi(r.URL.Query().Get("n"))
		every, _ := time.ParseDuration(r.URL.Query().Get("every"))
		w.Header().Set("Content-Type", "text/event-stream")
		for i := 0; i < n; i++ {
			fmt.Fprintf(w, "data: %d\n\n", i)
			w.(http.Flusher).Flush()
			select {
			case <-time.After(every):
			case <-r.Context().Done():
				return
			}
		}
		io.WriteString(w, "data: [DONE]\n\n")
	})
	return mux
}

func serveEngine(t testing.TB, e *fakeEngine) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: e.handler()}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return "http://" + ln.Addr().String()
}

// TestMain doubles as a launchable engine: with INFERA_TEST_ENGINE_ADDR
// set the binary serves a fake engine there (healthy once the file named by
// INFERA_TEST_ENGINE_READY exists) until SIGTERM. With
// INFERA_TEST_ENGINE_ADDR_FILE set it writes the address it bound there
// (for port 0).
func TestMain(m *testing.M) {
	if addr := os.Getenv("INFERA_TEST_ENGINE_ADDR"); addr != "" {
		e := &fakeEngine{}
		ready := os.Getenv("INFERA_TEST_ENGINE_READY")
		go func() {
			for i := 0; i < 6000 && !e.healthy.Load(); i++ {
				if _, err := os.Stat(ready); err == nil {
					e.healthy.Store(true)
				}
				time.Sleep(10 * time.Millisecond)
			}
		}()
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			os.Exit(3)
		}
		if f := os.Getenv("INFERA_TEST_ENGINE_ADDR_FILE"); f != "" {
			// Written whole, then renamed: the test never reads half an
			// address.
			if os.WriteFile(f+".tmp", []byte(ln.Addr().String()), 0o644) != nil || os.Rename(f+".tmp", f) != nil {
				os.Exit(4)
			}
		}
		go http.Serve(ln, e.handler())
		ch := make(chan os.Signal, 1)
		signal.Notify(ch, syscall.SIGTERM)
		select {
		case <-ch:
		case <-time.After(60 * time.Second):
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

type memSink struct {
	mu sync.Mutex
	m  map[string]fleet.Record
}

func (s *memSink) Sync(rs []fleet.Record) []error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.m = map[string]fleet.Record{}
	for _, r := range rs {
		s.m[r.ID] = r
	}
	return nil
}
func (s *memSink) Upsert(r fleet.Record) error {
	s.mu.Lock()
	s.m[r.ID] = r
	s.mu.Unlock()
	return nil
}
func (s *memSink) Remove(id string) { s.mu.Lock(); delete(s.m, id); s.mu.Unlock() }
func (s *memSink) get(id string) (fleet.Record, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.m[id]
	return r, ok
}

func watchEtcd(t *testing.T, ep string) *memSink {
	t.Helper()
	sink := &memSink{m: map[string]fleet.Record{}}
	w, err := discovery.NewEtcdWatcher(discovery.EtcdConfig{Endpoints: []string{ep}}, nil, sink)
	if err != nil {
		t.Fatal(err)
	}
	w.Start()
	t.Cleanup(w.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := w.WaitSynced(ctx); err != nil {
		t.Fatal(err)
	}
	return sink
}

func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// noBroker is the routing doc's no-broker path (etcd + http + zmq), one
// argument per flag and value for parse.
const noBroker = "--discovery-backend=etcd --request-transport=http --kv-event-transport=zmq"

// parse runs kong over args like `infera worker ...` would; an argument
// holding spaces (noBroker) is split.
func parse(t *testing.T, in ...string) *Cmd {
	t.Helper()
	var args []string
	for _, a := range in {
		if strings.HasPrefix(a, "--") && strings.Contains(a, " ") {
			args = append(args, strings.Fields(a)...)
		} else {
			args = append(args, a)
		}
	}
	var c Cmd
	p, err := kong.New(&c, kong.Exit(func(int) { t.Fatal("kong exited") }))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Parse(args); err != nil {
		t.Fatalf("parse %v: %v", args, err)
	}
	return &c
}

func TestFlags(t *testing.T) {
	t.Setenv("NATS_SERVER", "nats://127.0.0.1:1")
	t.Setenv("INFERA_DRAIN_TIMEOUT", "7s")
	c := parse(t, "--id", "w1", "--request-transport", "nats", "--kv-event-transport", "zmq", "--models", "a,b", "--", "python", "-m", "engine", "--port", "30000")
	if c.ID != "w1" || c.RequestTransport != "nats" || c.NatsURL != "nats://127.0.0.1:1" || c.DrainTimeout != 7*time.Second {
		t.Fatalf("parsed %+v", c)
	}
	if err := c.validate(); err != nil {
		t.Fatal(err)
	}
	if len(c.Models) != 2 || len(c.Engine) != 5 || c.Engine[0] != "python" || c.Engine[4] != "30000" {
		t.Fatalf("models %q engine %q", c.Models, c.Engine)
	}
	// The routing doc's defaults: Kubernetes, NATS and NATS.
	d := parse(t)
	if d.EngineURL != "http://127.0.0.1:8100" || d.DiscoveryBackend != "kubernetes" || d.RequestTransport != "nats" || d.KVEventTransport != "nats" || d.LeaseTTL != 10*time.Second || len(d.Engine) != 0 {
		t.Fatalf("defaults %+v", d)
	}
	if err := (&Cmd{EngineURL: "ftp://x"}).validate(); err == nil {
		t.Fatal("want bad engine url error")
	}
	if err := (&Cmd{EngineURL: "http://x:1", RequestTransport: "nats"}).validate(); err == nil {
		t.Fatal("want missing nats url error")
	}
	for _, tc := range [][3]string{
		{"tcp://*:5557", "10.1.2.3", "tcp://10.1.2.3:5557"},
		{"tcp://127.0.0.1:5557", "10.1.2.3", "tcp://127.0.0.1:5557"},
		{"", "h", ""},
	} {
		if got := advertiseEndpoint(tc[0], tc[1]); got != tc[2] {
			t.Fatalf("advertiseEndpoint(%q, %q) = %q, want %q", tc[0], tc[1], got, tc[2])
		}
	}
	if id := DefaultID("http://127.0.0.1:8100"); id == "" || !broker.ValidWorkerID(id) {
		t.Fatalf("default id %q", id)
	}
}

// TestDrainOverNATS: a long stream in flight when DRAINING is set completes,
// the record shows DRAINING meanwhile, and the worker is then deregistered.
// Its record carries the engine's max_model_len from its /v1/models.
func TestDrainOverNATS(t *testing.T) {
	e := testsrv.StartEtcd(t)
	ns := testsrv.StartNATS(t)
	eng := &fakeEngine{}
	eng.healthy.Store(true)
	url := serveEngine(t, eng)
	sink := watchEtcd(t, e.Endpoint)

	c := parse(t, "--id", "wn1", "--engine-url", url, "--discovery-backend", "etcd", "--etcd-endpoint", e.Endpoint,
		"--request-transport", "nats", "--kv-event-transport", "zmq", "--nats-url", ns.URL, "--lease-ttl", "3s",
		"--drain-timeout", "10s", "--drain-propagation", "200ms")
	s, err := c.Start(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "registered", func() bool { _, ok := sink.get("wn1"); return ok })
	r, _ := sink.get("wn1")
	if len(r.Models) != 2 || r.Models[0] != "llama-3" || r.RequestTransport != "nats" || r.Status != fleet.StatusActive {
		t.Fatalf("record %+v", r)
	}
	if r.MaxModelLen != 8192 { // the engine's, through the record in etcd
		t.Fatalf("record's max_model_len %d, want the engine's 8192", r.MaxModelLen)
	}

	nc, err := nats.Connect(ns.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	cli, err := broker.NewClient(broker.ClientConfig{Conn: nc, IdleTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	st, err := cli.Do(context.Background(), "wn1", &broker.Request{Path: "/stream?n=15&every=60ms"})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if _, err := st.Next(); err != nil {
		t.Fatal(err)
	}

	drained := make(chan error, 1)
	go func() { drained <- s.Drain(context.Background()) }()
	waitFor(t, 5*time.Second, "DRAINING", func() bool { r, _ := sink.get("wn1"); return r.Status == fleet.StatusDraining })
	chunks := 1
	var body []byte
	for {
		b, err := st.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("stream broke during drain after %d chunks: %v", chunks, err)
		}
		select {
		case err := <-drained:
			t.Fatalf("drain finished with a stream in flight: %v", err)
		default:
		}
		chunks++
		body = append(body, b...)
	}
	if chunks < 15 || string(body[len(body)-14:]) != "data: [DONE]\n\n" {
		t.Fatalf("stream incomplete: %d chunks, tail %q", chunks, body)
	}
	select {
	case err := <-drained:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("drain did not finish after the stream ended")
	}
	waitFor(t, 5*time.Second, "deregistered", func() bool { _, ok := sink.get("wn1"); return !ok })
	// New requests now find nobody (retryable elsewhere).
	if _, err := cli.Do(context.Background(), "wn1", &broker.Request{Path: "/stream?n=1"}); !errors.Is(err, broker.ErrNoResponders) {
		t.Fatalf("after drain: %v", err)
	}
}

// TestDrainHTTPStats: over HTTP the sidecar polls /admin/stats "active".
func TestDrainHTTPStats(t *testing.T) {
	e := testsrv.StartEtcd(t)
	eng := &fakeEngine{stats: true}
	eng.healthy.Store(true)
	url := serveEngine(t, eng)
	sink := watchEtcd(t, e.Endpoint)
	c := parse(t, "--id", "wh1", "--engine-url", url, "--etcd-endpoint", e.Endpoint, "--models", "m", noBroker,
		"--drain-propagation", "0s", "--drain-timeout", "10s")
	s, err := c.Start(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "registered", func() bool { _, ok := sink.get("wh1"); return ok })
	done := make(chan struct{})
	go func() {
		defer close(done)
		resp, err := http.Get(url + "/stream?n=10&every=50ms")
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}()
	waitFor(t, 5*time.Second, "request active", func() bool { return eng.active.Load() == 1 })
	start := time.Now()
	if err := s.Drain(context.Background()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	default:
		t.Fatal("drain returned before the in-flight request finished")
	}
	if d := time.Since(start); d < 200*time.Millisecond {
		t.Fatalf("drain took only %v", d)
	}
	waitFor(t, 5*time.Second, "deregistered", func() bool { _, ok := sink.get("wh1"); return !ok })
}

// TestLaunchedEngine: the engine command after -- is launched, the worker
// registers only once /health answers 200, and Drain stops the engine.
//
// --engine-url must be known before the engine starts, and a port picked
// free for the engine could be taken before it binds: the worker is given
// a testsrv.Front (a port held for the whole test), and the engine binds
// port 0 and writes the address it got to a file; the front relays to it
// from then on (refusing connections until then, as a port nothing
// listens on yet).
func TestLaunchedEngine(t *testing.T) {
	e := testsrv.StartEtcd(t)
	sink := watchEtcd(t, e.Endpoint)
	front := testsrv.NewFront(t)
	dir := t.TempDir()
	ready, addrFile := filepath.Join(dir, "ready"), filepath.Join(dir, "addr")
	t.Setenv("INFERA_TEST_ENGINE_ADDR", "127.0.0.1:0")
	t.Setenv("INFERA_TEST_ENGINE_ADDR_FILE", addrFile)
	t.Setenv("INFERA_TEST_ENGINE_READY", ready)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	c := parse(t, "--id", "wl1", "--engine-url", "http://"+front.Addr, "--etcd-endpoint", e.Endpoint, noBroker,
		"--drain-propagation", "0s", "--drain-grace", "0s", "--engine-stop-timeout", "5s", "--", self, "-test.run=^$")
	type res struct {
		s   *Sidecar
		err error
	}
	started := make(chan res, 1)
	go func() { s, err := c.Start(context.Background()); started <- res{s, err} }()
	var engineAddr []byte
	waitFor(t, 10*time.Second, "the engine's address", func() bool {
		engineAddr, err = os.ReadFile(addrFile)
		return err == nil
	})
	front.Up(string(engineAddr))
	time.Sleep(700 * time.Millisecond)
	if _, ok := sink.get("wl1"); ok {
		t.Fatal("registered before the engine was healthy")
	}
	select {
	case r := <-started:
		t.Fatalf("Start returned before the engine was healthy: %v", r.err)
	default:
	}
	os.WriteFile(ready, nil, 0o644)
	var r res
	select {
	case r = <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("Start did not return after the engine became healthy")
	}
	if r.err != nil {
		t.Fatal(r.err)
	}
	waitFor(t, 5*time.Second, "registered", func() bool { _, ok := sink.get("wl1"); return ok })
	pid := r.s.engine.Process.Pid
	if err := r.s.Drain(context.Background()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-r.s.EngineExited():
	default:
		t.Fatalf("engine pid %d still running after drain", pid)
	}
	waitFor(t, 5*time.Second, "deregistered", func() bool { _, ok := sink.get("wl1"); return !ok })
}

// TestRegisterWaitsForEtcd: a worker started before etcd registers once
// etcd comes up.
func TestRegisterWaitsForEtcd(t *testing.T) {
	e := testsrv.StartEtcd(t)
	e.Stop()
	eng := &fakeEngine{}
	eng.healthy.Store(true)
	url := serveEngine(t, eng)
	c := parse(t, "--id", "late1", "--engine-url", url, "--etcd-endpoint", e.Endpoint, "--models", "m", noBroker,
		"--drain-propagation", "0s", "--drain-grace", "0s")
	started := make(chan error, 1)
	var s *Sidecar
	go func() {
		var err error
		s, err = c.Start(context.Background())
		started <- err
	}()
	time.Sleep(500 * time.Millisecond)
	e.Start()
	select {
	case err := <-started:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("worker did not register after etcd came up")
	}
	sink := watchEtcd(t, e.Endpoint)
	waitFor(t, 5*time.Second, "registered", func() bool { _, ok := sink.get("late1"); return ok })
	if err := s.Drain(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// A broker that comes up after the worker (both started at boot) is waited
// for, as discovery is: the worker subscribes once it is up, then
// registers, and serves requests over NATS.
func TestStartWaitsForTheBroker(t *testing.T) {
	e := testsrv.StartEtcd(t)
	ns := testsrv.StartNATS(t)
	ns.Stop()
	eng := &fakeEngine{}
	eng.healthy.Store(true)
	url := serveEngine(t, eng)
	sink := watchEtcd(t, e.Endpoint)
	c := parse(t, "--id", "lateb1", "--engine-url", url, "--discovery-backend", "etcd", "--etcd-endpoint", e.Endpoint,
		"--request-transport", "nats", "--kv-event-transport", "zmq", "--nats-url", ns.URL,
		"--drain-propagation", "0s", "--drain-grace", "0s")
	started := make(chan error, 1)
	var s *Sidecar
	go func() {
		var err error
		s, err = c.Start(context.Background())
		started <- err
	}()
	time.Sleep(700 * time.Millisecond)
	if _, ok := sink.get("lateb1"); ok {
		t.Fatal("registered before its broker was up")
	}
	select {
	case err := <-started:
		t.Fatalf("Start returned while the broker was down: %v", err)
	default:
	}
	ns.Start()
	select {
	case err := <-started:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("worker did not start after the broker came up")
	}
	waitFor(t, 5*time.Second, "registered", func() bool { _, ok := sink.get("lateb1"); return ok })
	nc, err := nats.Connect(ns.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	cli, err := broker.NewClient(broker.ClientConfig{Conn: nc, IdleTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	st, err := cli.Do(context.Background(), "lateb1", &broker.Request{Path: "/stream?n=2"})
	if err != nil {
		t.Fatal(err)
	}
	st.Close()
	if err := s.Drain(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// The worker side's metrics (infera_worker_*, docs/fleet.md) are the
// sidecar's: --metrics-addr serves them. The sidecar served nothing, so no
// one could scrape a series the docs list.
func TestTheSidecarServesItsMetrics(t *testing.T) {
	e := testsrv.StartEtcd(t)
	ns := testsrv.StartNATS(t)
	eng := &fakeEngine{}
	eng.healthy.Store(true)
	url := serveEngine(t, eng)
	c := parse(t, "--id", "wm1", "--engine-url", url, "--discovery-backend", "etcd", "--etcd-endpoint", e.Endpoint,
		"--request-transport", "nats", "--kv-event-transport", "zmq", "--nats-url", ns.URL,
		"--drain-propagation", "0s", "--metrics-addr", "127.0.0.1:0")
	s, err := c.Start(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Drain(context.Background())
	nc, err := nats.Connect(ns.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	cli, err := broker.NewClient(broker.ClientConfig{Conn: nc, IdleTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	scrape := func() string {
		t.Helper()
		resp, err := http.Get("http://" + s.MetricsAddr() + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 {
			t.Fatalf("GET /metrics: %d %s", resp.StatusCode, b)
		}
		return string(b)
	}
	count := func(page string) int {
		for _, l := range strings.Split(page, "\n") {
			if v, ok := strings.CutPrefix(l, "infera_worker_nats_requests_total "); ok {
				n, _ := strconv.Atoi(v)
				return n
			}
		}
		t.Fatalf("no infera_worker_nats_requests_total in:\n%s", page)
		return 0
	}
	before := count(scrape())
	st, err := cli.Do(context.Background(), "wm1", &broker.Request{Path: "/stream?n=1&every=1ms"})
	if err != nil {
		t.Fatal(err)
	}
	st.Close()
	if page := scrape(); count(page) != before+1 || !strings.Contains(page, "process_cpu_seconds_total") {
		t.Fatalf("after one request, want infera_worker_nats_requests_total %d and process metrics:\n%s", before+1, page)
	}
	if page := scrape(); strings.Contains(page, "infera_nats_requests_total") {
		t.Fatalf("the sidecar serves the router's series:\n%s", page)
	}
}

// The sidecar reaches a broker in operator (JWT) mode over mutual TLS
// (--nats-creds-file, --nats-tls-*), and reaches it again after the
// broker restarts; a .creds file that is not one refuses the start before
// anything is launched, naming the flag, never the content.
func TestTheSidecarReachesABrokerWithCredsOverMutualTLS(t *testing.T) {
	opConf, creds := testsrv.NATSOperatorConf(t)
	tlsConf, certs := testsrv.NATSTLSConf(t)
	conf := filepath.Join(t.TempDir(), "nats.conf")
	var b []byte
	for _, p := range []string{opConf, tlsConf} {
		c, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		b = append(b, c...)
	}
	if err := os.WriteFile(conf, b, 0o600); err != nil {
		t.Fatal(err)
	}
	e := testsrv.StartEtcd(t)
	ns := testsrv.StartNATSArgs(t, "-c", conf)
	eng := &fakeEngine{}
	eng.healthy.Store(true)
	url := serveEngine(t, eng)
	args := func(credsFile string) []string {
		return []string{"--id", "wsec", "--engine-url", url, "--models", "m", "--discovery-backend", "etcd", "--etcd-endpoint", e.Endpoint,
			"--request-transport", "nats", "--kv-event-transport", "zmq", "--nats-url", ns.URL, "--drain-propagation", "0s",
			"--nats-creds-file", credsFile, "--nats-tls-ca-file", certs.CA, "--nats-tls-cert-file", certs.ClientCert, "--nats-tls-key-file", certs.ClientKey}
	}
	bad := filepath.Join(t.TempDir(), "bad.creds")
	if err := os.WriteFile(bad, []byte("hunter2\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if s, err := parse(t, args(bad)...).Start(context.Background()); err == nil {
		s.Drain(context.Background())
		t.Fatal("the sidecar started with a .creds file that is not one")
	} else if !strings.Contains(err.Error(), "--nats-creds-file") || strings.Contains(err.Error(), "hunter2") {
		t.Fatalf("error %q: want the flag named, never the content", err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := parse(t, args(creds)...).Start(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Drain(context.Background())
	connected := func() {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for !s.nc.IsConnected() {
			if time.Now().After(deadline) {
				t.Fatalf("not connected to the broker: %v, last error %v", s.nc.Status(), s.nc.LastError())
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	connected()
	ns.Restart()
	connected()
}
