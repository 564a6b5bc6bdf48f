package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/infera/infera/broker"
	"github.com/infera/infera/discovery"
	"github.com/infera/infera/fleet"
	"github.com/infera/infera/internal/logx"
	"github.com/nats-io/nats.go"
)

// Cmd is `infera worker`. Precedence: flag > env > default.
type Cmd struct {
	ID           string   `help:"Worker instance id (default: <hostname>-<engine port>; dots become dashes)." env:"INFERA_WORKER_ID"`
	EngineURL    string   `help:"Engine base URL the sidecar talks to." default:"http://127.0.0.1:8100" env:"INFERA_ENGINE_URL"`
	AdvertiseURL string   `help:"Engine URL the router should use (default: --engine-url)." env:"INFERA_ADVERTISE_URL"`
	Models       []string `help:"Served model names, comma-separated (default: asked from the engine's /v1/models)." env:"INFERA_MODELS" sep:","`
	Role         string   `help:"Worker role: mixed, prefill or decode." default:"mixed" enum:"mixed,prefill,decode" env:"INFERA_ROLE"`
	Service      string   `help:"Service name for model routing (default: the first model)." env:"INFERA_SERVICE"`
	Version      string   `name:"engine-version" help:"Engine version string advertised in the record." env:"INFERA_ENGINE_VERSION"`
	Bootstrap    string   `help:"PD bootstrap data (JSON) advertised in the record." env:"INFERA_BOOTSTRAP"`

	KVEventsEndpoint string `help:"The engine's ZMQ KV-event PUB endpoint (advertised for zmq; relayed for nats), e.g. tcp://127.0.0.1:5557." env:"INFERA_KV_EVENTS_ENDPOINT"`
	KVReplayEndpoint string `help:"The engine's ZMQ KV-event replay endpoint, advertised in the record." env:"INFERA_KV_REPLAY_ENDPOINT"`
	BlockSize        int    `help:"Engine KV block size in tokens (0: unknown, the server's --kv-block-size applies)." default:"0" env:"INFERA_BLOCK_SIZE"`
	DPSize           int    `name:"dp-size" help:"Engine data-parallel size: rank r publishes KV events on the endpoint's port + r." default:"1" env:"INFERA_DP_SIZE"`

	DiscoveryBackend string        `help:"Where to register: kubernetes (annotating this Pod) or etcd (must match the server)." default:"kubernetes" enum:"kubernetes,etcd" env:"INFERA_DISCOVERY_BACKEND"`
	EtcdEndpoint     []string      `help:"etcd endpoint(s), comma-separated host:port." default:"127.0.0.1:2379" env:"INFERA_ETCD_ENDPOINT" sep:","`
	EtcdPrefix       string        `help:"etcd key prefix of worker records." default:"/infera/workers/" env:"INFERA_ETCD_PREFIX"`
	EtcdCAFile       string        `help:"CA file verifying etcd (enables TLS)." env:"INFERA_ETCD_CA_FILE"`
	EtcdCertFile     string        `help:"Client certificate file for etcd." env:"INFERA_ETCD_CERT_FILE"`
	EtcdKeyFile      string        `help:"Client key file for etcd." env:"INFERA_ETCD_KEY_FILE"`
	EtcdUsername     string        `help:"etcd auth user." env:"INFERA_ETCD_USERNAME"`
	EtcdPassword     string        `help:"etcd auth password." env:"INFERA_ETCD_PASSWORD"`
	LeaseTTL         time.Duration `help:"etcd lease TTL; a dead worker disappears within it." default:"10s" env:"INFERA_LEASE_TTL"`
	Kubeconfig       string        `help:"kubeconfig file, or a list of them as in KUBECONFIG (a:b: merged as kubectl merges them, missing files skipped; default: in-cluster service account; a leading ~ of each is the home directory)." env:"INFERA_KUBECONFIG"`
	PodName          string        `help:"This Pod's name (downward API)." env:"POD_NAME"`
	PodNamespace     string        `help:"This Pod's namespace (downward API); empty: the service account's, else the kubeconfig context's, else default." env:"POD_NAMESPACE"`
	PodIP            string        `help:"This Pod's IP (downward API); without --advertise-url the record advertises the engine at this IP." env:"POD_IP"`
	K8sAnnotation    string        `name:"k8s-annotation" help:"Pod annotation holding the worker record." default:"infera.io/worker" env:"INFERA_K8S_ANNOTATION"`

	RequestTransport  string `help:"How the router reaches this worker: nats or http (must match the server)." default:"nats" enum:"nats,http" env:"INFERA_REQUEST_TRANSPORT"`
	KVEventTransport  string `help:"How KV events reach the router: nats or zmq (must match the server)." default:"nats" enum:"nats,zmq" env:"INFERA_KV_EVENT_TRANSPORT"`
	NatsURL           string `help:"NATS broker URL (also NATS_SERVER / NATS_URL)." env:"INFERA_NATS_URL,NATS_SERVER,NATS_URL"`
	NatsCredsFile     string `name:"nats-creds-file" help:"NATS .creds file (user JWT and NKey seed) for a broker in operator (JWT) mode." env:"INFERA_NATS_CREDS_FILE" type:"path"`
	NatsNkeySeedFile  string `name:"nats-nkey-seed-file" help:"File holding a NATS user NKey seed (SU...) the broker knows by its public key." env:"INFERA_NATS_NKEY_SEED_FILE" type:"path"`
	NatsTLSCAFile     string `name:"nats-tls-ca-file" help:"PEM CA verifying the NATS broker's certificate (instead of the system's); requires TLS." env:"INFERA_NATS_TLS_CA_FILE" type:"path"`
	NatsTLSCertFile   string `name:"nats-tls-cert-file" help:"PEM client certificate for the NATS broker (mutual TLS, with --nats-tls-key-file); requires TLS." env:"INFERA_NATS_TLS_CERT_FILE" type:"path"`
	NatsTLSKeyFile    string `name:"nats-tls-key-file" help:"PEM private key of --nats-tls-cert-file." env:"INFERA_NATS_TLS_KEY_FILE" type:"path"`
	NatsReqMaxPending int    `help:"Requests in flight at this worker over NATS before it answers 429; 0 = off." default:"0" env:"INFERA_NATS_REQ_MAX_PENDING"`
	MetricsAddr       string `help:"Address to serve the sidecar's own metrics on (GET /metrics: infera_worker_* and process metrics), e.g. 127.0.0.1:9400; empty: not served." env:"INFERA_WORKER_METRICS_ADDR"`

	DrainTimeout       time.Duration `help:"Longest wait for in-flight requests after SIGTERM." default:"60s" env:"INFERA_DRAIN_TIMEOUT"`
	DrainPropagation   time.Duration `help:"Time for the router to see DRAINING before in-flight requests are counted." default:"1s" env:"INFERA_DRAIN_PROPAGATION"`
	DrainGrace         time.Duration `help:"Wait used instead of counting when in-flight requests cannot be known (http transport, engine without /admin/stats)." default:"5s" env:"INFERA_DRAIN_GRACE"`
	EngineStartTimeout time.Duration `help:"Longest wait for the engine's /health to answer 200." default:"10m" env:"INFERA_ENGINE_START_TIMEOUT"`
	EngineStopTimeout  time.Duration `help:"Wait after SIGTERM to a launched engine before SIGKILL." default:"15s" env:"INFERA_ENGINE_STOP_TIMEOUT"`

	Engine []string `arg:"" optional:"" passthrough:"" help:"Engine command to launch and supervise, after --."`
}

// registrar is what the discovery backends offer a worker.
type registrar interface {
	Register(ctx context.Context, rec fleet.Record) error
	Update(ctx context.Context, rec fleet.Record) error
	Deregister(ctx context.Context) error
}

// Sidecar is a started worker sidecar.
type Sidecar struct {
	c   *Cmd
	hc  *http.Client
	rec fleet.Record
	reg registrar
	// closers run at the end of Drain (etcd client, metrics listener).
	closers     []func()
	metricsAddr string

	nc    *nats.Conn
	srv   *broker.Server
	relay *broker.KVRelay

	engine     *exec.Cmd
	engineDone chan struct{}
	engineErr  error

	drainOnce sync.Once
	drainErr  error
}

// Run starts the sidecar, waits for SIGTERM/SIGINT (or the engine to exit)
// and drains.
func (c *Cmd) Run() error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	s, err := c.Start(ctx)
	if err != nil {
		return err
	}
	var exitErr error
	select {
	case <-ctx.Done():
		slog.Info("worker: signal received, draining", "id", s.rec.ID)
	case <-s.EngineExited():
		exitErr = fmt.Errorf("engine exited: %v", s.engineErr)
		slog.Error("worker: engine exited, deregistering", "id", s.rec.ID, "err", s.engineErr)
	}
	stop()
	if err := s.Drain(context.Background()); err != nil {
		return err
	}
	return exitErr
}

func (c *Cmd) validate() error {
	// kong's passthrough keeps the "--" separator.
	if len(c.Engine) > 0 && c.Engine[0] == "--" {
		c.Engine = c.Engine[1:]
	}
	u, err := url.Parse(c.EngineURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("--engine-url %q must be http(s)://host:port", c.EngineURL)
	}
	if c.RequestTransport == "nats" || c.KVEventTransport == "nats" {
		if c.NatsURL == "" {
			return fmt.Errorf("--nats-url (or NATS_SERVER / NATS_URL) is required with nats transports")
		}
		if _, err := c.natsSecurity().Options(c.NatsURL); err != nil {
			return err
		}
	}
	if c.KVEventTransport == "nats" && c.KVEventsEndpoint == "" {
		return fmt.Errorf("--kv-event-transport nats needs --kv-events-endpoint (the engine's ZMQ PUB address to relay)")
	}
	if c.Bootstrap != "" && !json.Valid([]byte(c.Bootstrap)) {
		return fmt.Errorf("--bootstrap is not valid JSON")
	}
	if c.NatsReqMaxPending < 0 || c.DrainTimeout < 0 || c.LeaseTTL < 0 {
		return fmt.Errorf("--nats-req-max-pending, --drain-timeout and --lease-ttl must be >= 0")
	}
	return nil
}

// natsSecurity is the broker authentication and TLS of the --nats-* flags.
func (c *Cmd) natsSecurity() broker.Security {
	return broker.Security{CredsFile: c.NatsCredsFile, NkeySeedFile: c.NatsNkeySeedFile,
		CAFile: c.NatsTLSCAFile, CertFile: c.NatsTLSCertFile, KeyFile: c.NatsTLSKeyFile}
}

// DefaultID returns <hostname>-<port of engineURL>, usable as a NATS token.
func DefaultID(engineURL string) string {
	host, _ := os.Hostname()
	if host == "" {
		host = "worker"
	}
	port := "0"
	if u, err := url.Parse(engineURL); err == nil && u.Port() != "" {
		port = u.Port()
	}
	r := strings.NewReplacer(".", "-", "*", "-", ">", "-", " ", "-")
	return r.Replace(host + "-" + port)
}

// Start launches the engine (if a command was given), waits for its
// /health, builds the record, starts the NATS pieces and registers.
func (c *Cmd) Start(ctx context.Context) (*Sidecar, error) {
	if err := c.validate(); err != nil {
		return nil, err
	}
	s := &Sidecar{c: c, hc: &http.Client{Timeout: 5 * time.Second}, engineDone: make(chan struct{})}
	ok := false
	defer func() {
		if !ok {
			s.teardown()
		}
	}()
	if len(c.Engine) > 0 {
		if err := s.launch(); err != nil {
			return nil, err
		}
	}
	if err := s.waitHealthy(ctx); err != nil {
		return nil, err
	}
	if err := s.buildRecord(ctx); err != nil {
		return nil, err
	}
	if err := s.startNATS(ctx); err != nil {
		return nil, err
	}
	if err := s.serveMetrics(); err != nil {
		return nil, err
	}
	if err := s.connectDiscovery(); err != nil {
		return nil, err
	}
	// Discovery may come up after the worker: retry until ctx ends.
	for delay := 250 * time.Millisecond; ; delay = min(2*delay, 5*time.Second) {
		err := s.reg.Register(ctx, s.rec)
		if err == nil {
			break
		}
		slog.Warn("worker: cannot register yet, retrying", "id", s.rec.ID, "err", err, "retry_in", delay)
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("cannot register worker %q: %w", s.rec.ID, err)
		case <-s.engineDone:
			return nil, fmt.Errorf("engine exited before registration: %v", s.engineErr)
		case <-time.After(delay):
		}
	}
	slog.Info("worker registered", "id", s.rec.ID, "url", s.rec.URL, "models", s.rec.Models,
		"discovery", c.DiscoveryBackend, "request_transport", c.RequestTransport, "kv_event_transport", c.KVEventTransport)
	ok = true
	return s, nil
}

// Record returns the advertised record.
func (s *Sidecar) Record() fleet.Record { return s.rec }

// EngineExited is closed when a launched engine exits (never otherwise).
func (s *Sidecar) EngineExited() <-chan struct{} { return s.engineDone }

// InFlight returns requests in flight over NATS, or -1 when unknown.
func (s *Sidecar) InFlight() int {
	if s.srv != nil {
		return s.srv.InFlight()
	}
	return -1
}

func (s *Sidecar) launch() error {
	cmd := exec.Command(s.c.Engine[0], s.c.Engine[1:]...)
	cmd.Stdout, cmd.Stderr, cmd.Stdin = os.Stdout, os.Stderr, nil
	// Own process group (so the whole engine tree is signalled), and die
	// with the sidecar.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("cannot launch engine %q: %w", s.c.Engine[0], err)
	}
	s.engine = cmd
	slog.Info("worker: engine launched", "cmd", strings.Join(s.c.Engine, " "), "pid", cmd.Process.Pid)
	go func() {
		s.engineErr = cmd.Wait()
		close(s.engineDone)
	}()
	return nil
}

func (s *Sidecar) waitHealthy(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, s.c.EngineStartTimeout)
	defer cancel()
	u := strings.TrimRight(s.c.EngineURL, "/") + "/health"
	t := time.NewTicker(250 * time.Millisecond)
	defer t.Stop()
	var last error
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
		resp, err := s.hc.Do(req)
		if err == nil {
			io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = fmt.Errorf("status %s", resp.Status)
		}
		last = err
		select {
		case <-ctx.Done():
			return fmt.Errorf("engine %s not healthy: %v (%w)", u, last, ctx.Err())
		case <-s.engineDone:
			return fmt.Errorf("engine exited before it was healthy: %v", s.engineErr)
		case <-t.C:
		}
	}
}

func (s *Sidecar) buildRecord(ctx context.Context) error {
	c := s.c
	id := c.ID
	if id == "" {
		id = DefaultID(c.EngineURL)
	}
	adv := c.AdvertiseURL
	if adv == "" {
		adv = c.EngineURL
		if c.PodIP != "" {
			if u, err := url.Parse(c.EngineURL); err == nil {
				u.Host = net.JoinHostPort(c.PodIP, u.Port())
				adv = u.String()
			}
		}
	}
	advHost := "127.0.0.1"
	if u, err := url.Parse(adv); err == nil && u.Hostname() != "" {
		advHost = u.Hostname()
	}
	models, maxLen := c.Models, 0
	if len(models) == 0 {
		var err error
		if models, maxLen, err = s.engineModels(ctx); err != nil {
			return err
		}
	}
	s.rec = fleet.Record{
		ID: id, URL: strings.TrimRight(adv, "/"), Models: models, MaxModelLen: maxLen, Service: c.Service, Role: c.Role,
		KVEventsEndpoint: advertiseEndpoint(c.KVEventsEndpoint, advHost),
		KVReplayEndpoint: advertiseEndpoint(c.KVReplayEndpoint, advHost), BlockSize: c.BlockSize, DPSize: c.DPSize,
		RequestTransport: c.RequestTransport, KVEventTransport: c.KVEventTransport,
		Status: fleet.StatusActive, Version: c.Version,
	}
	if c.Bootstrap != "" {
		s.rec.Bootstrap = json.RawMessage(c.Bootstrap)
	}
	if c.RequestTransport == "nats" && !broker.ValidWorkerID(id) {
		return fmt.Errorf("worker id %q cannot be a NATS subject token (no dots, spaces, * or >)", id)
	}
	return s.rec.Validate()
}

// advertiseEndpoint turns an engine bind address like tcp://*:5557 into one
// the router can connect to (the advertised engine host).
func advertiseEndpoint(ep, host string) string {
	if i := strings.Index(ep, "://*:"); i >= 0 {
		return ep[:i] + "://" + net.JoinHostPort(host, ep[i+5:])
	}
	return ep
}

// engineModels asks the engine for its model ids and the largest
// max_model_len among them (vLLM's ModelCard; 0 when none says).
func (s *Sidecar) engineModels(ctx context.Context) ([]string, int, error) {
	u := strings.TrimRight(s.c.EngineURL, "/") + "/v1/models"
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	resp, err := s.hc.Do(req)
	if err != nil {
		return nil, 0, fmt.Errorf("cannot ask the engine for its models (set --models): %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, 0, fmt.Errorf("engine %s answered %s (set --models)", u, resp.Status)
	}
	var ml struct {
		Data []struct {
			ID     string `json:"id"`
			MaxLen int    `json:"max_model_len"`
		} `json:"data"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 4<<20)).Decode(&ml); err != nil {
		return nil, 0, fmt.Errorf("cannot decode %s: %w", u, err)
	}
	var out []string
	maxLen := 0
	for _, m := range ml.Data {
		if m.ID != "" {
			out = append(out, m.ID)
			maxLen = max(maxLen, m.MaxLen)
		}
	}
	if len(out) == 0 {
		return nil, 0, fmt.Errorf("engine %s lists no models (set --models)", u)
	}
	return out, maxLen, nil
}

func (s *Sidecar) startNATS(ctx context.Context) error {
	c := s.c
	if c.RequestTransport != "nats" && c.KVEventTransport != "nats" {
		return nil
	}
	// The broker may come up after the worker (both started by systemd at
	// boot): retry until ctx ends, as registration does. Nothing is
	// registered before the subscriptions are in.
	sec, err := c.natsSecurity().Options(c.NatsURL)
	if err != nil {
		return err
	}
	opts := append(append(broker.Reconnect(), sec...), nats.Name("infera-worker-"+s.rec.ID))
	var nc *nats.Conn
	for delay := 250 * time.Millisecond; ; delay = min(2*delay, 5*time.Second) {
		var err error
		nc, err = nats.Connect(c.NatsURL, opts...)
		if err == nil {
			break
		}
		err = fmt.Errorf("cannot connect to NATS %s: %w", logx.RedactNATSURL(c.NatsURL), logx.StripURL(err))
		slog.Warn("worker: cannot connect to the broker yet, retrying", "id", s.rec.ID, "err", err, "retry_in", delay)
		select {
		case <-ctx.Done():
			return err
		case <-s.engineDone:
			return fmt.Errorf("engine exited before the broker was reachable: %v", s.engineErr)
		case <-time.After(delay):
		}
	}
	s.nc = nc
	if c.RequestTransport == "nats" {
		srv, err := broker.NewServer(broker.ServerConfig{Conn: nc, WorkerID: s.rec.ID, EngineURL: c.EngineURL, MaxPending: c.NatsReqMaxPending})
		if err != nil {
			return err
		}
		if err := srv.Start(); err != nil {
			return err
		}
		s.srv = srv
	}
	if c.KVEventTransport == "nats" {
		relay, err := broker.StartKVRelay(broker.KVRelayConfig{Conn: nc, WorkerID: s.rec.ID, Endpoint: c.KVEventsEndpoint, DPSize: c.DPSize})
		if err != nil {
			return err
		}
		s.relay = relay
	}
	return nil
}

// serveMetrics serves GET /metrics on --metrics-addr until teardown.
func (s *Sidecar) serveMetrics() error {
	if s.c.MetricsAddr == "" {
		return nil
	}
	ln, err := net.Listen("tcp", s.c.MetricsAddr)
	if err != nil {
		return fmt.Errorf("cannot listen on --metrics-addr %s: %w", s.c.MetricsAddr, err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		broker.WorkerMetrics.WritePrometheus(w)
		metrics.WriteProcessMetrics(w)
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(ln)
	s.metricsAddr = ln.Addr().String()
	s.closers = append(s.closers, func() { srv.Close() })
	return nil
}

// MetricsAddr returns the address GET /metrics is served on ("" for none).
func (s *Sidecar) MetricsAddr() string { return s.metricsAddr }

func (s *Sidecar) connectDiscovery() error {
	c := s.c
	switch c.DiscoveryBackend {
	case "etcd":
		cli, err := discovery.NewEtcdClient(discovery.EtcdConfig{
			Endpoints: c.EtcdEndpoint, Prefix: c.EtcdPrefix,
			CAFile: c.EtcdCAFile, CertFile: c.EtcdCertFile, KeyFile: c.EtcdKeyFile,
			Username: c.EtcdUsername, Password: c.EtcdPassword,
		})
		if err != nil {
			return err
		}
		s.closers = append(s.closers, func() { cli.Close() })
		s.reg = discovery.NewEtcdRegistrar(cli, c.EtcdPrefix, c.LeaseTTL)
	case "kubernetes":
		var kc *discovery.KubeConfig
		var err error
		if c.Kubeconfig != "" {
			kc, err = discovery.LoadKubeconfig(c.Kubeconfig)
		} else {
			kc, err = discovery.InClusterConfig()
		}
		if err != nil {
			return err
		}
		ns := c.PodNamespace
		if ns == "" {
			// As the router reads it, and kubectl: the service account's
			// namespace, else the context's, else "default". A context
			// naming none was refused, asking for POD_NAMESPACE.
			ns = kc.NamespaceOrDefault()
		}
		if s.reg, err = discovery.NewKubeRegistrar(kc, ns, c.PodName, c.K8sAnnotation); err != nil {
			return err
		}
	default:
		return fmt.Errorf("unknown --discovery-backend %q", c.DiscoveryBackend)
	}
	return nil
}

// Drain marks the worker DRAINING, waits for in-flight requests (up to
// --drain-timeout), deregisters, stops the NATS pieces and the launched
// engine. It is what SIGTERM does; calling it twice returns the first
// result.
func (s *Sidecar) Drain(ctx context.Context) error {
	s.drainOnce.Do(func() { s.drainErr = s.drain(ctx) })
	return s.drainErr
}

func (s *Sidecar) drain(ctx context.Context) error {
	var errs []error
	start := time.Now()
	rec := s.rec
	rec.Status = fleet.StatusDraining
	if err := s.reg.Update(ctx, rec); err != nil {
		errs = append(errs, fmt.Errorf("cannot mark DRAINING: %w", err))
	} else {
		s.rec = rec
		slog.Info("worker: DRAINING", "id", rec.ID)
	}
	dctx, cancel := context.WithTimeout(ctx, s.c.DrainTimeout)
	defer cancel()
	sleepCtx(dctx, s.c.DrainPropagation)
	if s.srv != nil {
		// Late requests from a router that has not seen DRAINING yet now
		// get "no responders", which the router retries elsewhere.
		s.srv.StopAccepting()
	}
	if err := s.waitIdle(dctx); err != nil {
		args := []any{"id", rec.ID, "err", err}
		if n := s.InFlight(); n >= 0 { // known over NATS only
			args = append(args, "in_flight", n)
		}
		slog.Warn("worker: drain timeout, requests still in flight", args...)
	}
	if err := s.reg.Deregister(ctx); err != nil {
		errs = append(errs, fmt.Errorf("cannot deregister: %w", err))
	}
	slog.Info("worker: deregistered", "id", rec.ID, "drain", time.Since(start).Round(time.Millisecond))
	s.teardown()
	return errors.Join(errs...)
}

// waitIdle waits until no request is in flight: counted over NATS, polled
// from the engine's /admin/stats "active" over HTTP, or a grace period.
func (s *Sidecar) waitIdle(ctx context.Context) error {
	if s.srv != nil {
		return s.srv.Wait(ctx)
	}
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		n, ok := s.engineActive(ctx)
		if !ok {
			sleepCtx(ctx, s.c.DrainGrace)
			return ctx.Err()
		}
		if n == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}

func (s *Sidecar) engineActive(ctx context.Context) (int, bool) {
	u := strings.TrimRight(s.c.EngineURL, "/") + "/admin/stats"
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	resp, err := s.hc.Do(req)
	if err != nil {
		return 0, false
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, false
	}
	var st struct {
		Active *int `json:"active"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&st); err != nil || st.Active == nil {
		return 0, false
	}
	return *st.Active, true
}

func sleepCtx(ctx context.Context, d time.Duration) {
	if d <= 0 {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// teardown stops everything the sidecar started.
func (s *Sidecar) teardown() {
	if s.relay != nil {
		s.relay.Close()
	}
	if s.srv != nil {
		s.srv.Close()
	}
	if s.nc != nil {
		s.nc.Close()
	}
	for _, f := range s.closers {
		f()
	}
	s.closers = nil
	s.stopEngine()
}

func (s *Sidecar) stopEngine() {
	if s.engine == nil {
		return
	}
	select {
	case <-s.engineDone:
		return
	default:
	}
	pgid := s.engine.Process.Pid
	syscall.Kill(-pgid, syscall.SIGTERM)
	select {
	case <-s.engineDone:
	case <-time.After(s.c.EngineStopTimeout):
		slog.Warn("worker: engine ignored SIGTERM, killing it", "pid", pgid)
		syscall.Kill(-pgid, syscall.SIGKILL)
		<-s.engineDone
	}
}
