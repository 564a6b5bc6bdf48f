package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/infera/infera/broker"
	"github.com/infera/infera/config"
	"github.com/infera/infera/discovery"
	"github.com/infera/infera/fleet"
	"github.com/infera/infera/kv"
	"github.com/infera/infera/kvroute"
	"github.com/infera/infera/proxy"
	"github.com/infera/infera/radix"
	"github.com/infera/infera/sched"
	"github.com/infera/infera/tokenizer"
	"github.com/nats-io/nats.go"
	"github.com/valyala/fasthttp"
)

type serveCmd struct {
	config.Serve
}

func setupLogging(level string) {
	var l slog.Level
	l.UnmarshalText([]byte(level))
	slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: l})))
}

func (c *serveCmd) Run() error {
	f := &c.Serve
	setupLogging(f.LogLevel)
	rt, err := newRouter(f)
	if err != nil {
		return err
	}
	defer rt.close()
	addr := net.JoinHostPort(f.Host, strconv.Itoa(f.Port))
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("cannot listen on %s: %w", addr, err)
	}
	slog.Info("infera serving", "addr", ln.Addr().String(), "workers", len(rt.fleet.View().All),
		"policy", f.RouterPolicy, "mode", f.RouterMode, "discovery", f.DiscoveryBackend,
		"request_transport", f.RequestTransport, "kv_event_transport", f.KVEventTransport)

	errc := make(chan error, 1)
	go func() { errc <- rt.srv.Serve(ln) }()
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sig)
	select {
	case err := <-errc:
		return err
	case s := <-sig:
		slog.Info("shutting down", "signal", s.String())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- rt.srv.Shutdown() }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return fmt.Errorf("shutdown: requests still open after 30s; exiting anyway")
	}
}

// router is everything `infera serve` runs, wired together.
type router struct {
	flags *config.Serve
	store *config.Store
	fleet *fleet.Fleet
	sched *sched.Scheduler
	srv   *proxy.Server
	stop  chan struct{}

	discovery  discovery.Backend
	nc         *nats.Conn
	natsClient *broker.Client
	health     map[string]proxy.HealthCheck
	ctx        context.Context
	cancel     context.CancelFunc

	tok     tokenizer.Tokenizer
	kvm     *kv.Manager
	kvSub   *nats.Subscription
	kvAware *kvroute.KVAware
}

// newRouter builds the router from flags: config store, fleet and its
// transports, discovery, scheduler and the HTTP front door.
func newRouter(f *config.Serve) (*router, error) {
	if err := f.Validate(); err != nil {
		return nil, err
	}
	store, err := config.Open(f.Config)
	if err != nil {
		return nil, err
	}
	if err := checkBackends(f); err != nil {
		return nil, err
	}
	rt := &router{flags: f, store: store, stop: make(chan struct{}), health: map[string]proxy.HealthCheck{}}
	rt.ctx, rt.cancel = context.WithCancel(context.Background())
	ok := false
	defer func() {
		if !ok {
			rt.close()
		}
	}()
	rt.fleet = fleet.NewFleet(fleet.BreakerConfig{
		Threshold:   f.BreakerFailureThreshold,
		Cooldown:    f.BreakerCooldown(),
		MaxCooldown: f.BreakerMaxCooldown(),
	})
	rt.fleet.AddHook(&agreement{requestTransport: f.RequestTransport, kvTransport: f.KVEventTransport,
		kvAware: f.RouterPolicy == "kv-aware", blockSize: f.KVBlockSize, logged: map[string]bool{}})
	if f.RequestTransport == "nats" || f.KVEventTransport == "nats" {
		if err := rt.connectNATS(); err != nil {
			return nil, err
		}
	}
	if f.RequestTransport == "http" {
		rt.fleet.AddHook(proxy.HTTPHook(f))
	} else {
		rt.fleet.AddHook(forgetHook{rt.natsClient})
	}
	rt.sched = sched.NewScheduler(rt.fleet, f.RouterPolicy)
	rt.sched.Mode = f.RouterMode
	go rt.sched.Run(rt.ctx, store.Load)
	if f.RouterPolicy == "kv-aware" {
		if err := rt.setupKV(); err != nil {
			return nil, err
		}
	} else if f.RouterTokenizerPath != "" {
		// Without kv-aware routing the tokenizer still serves /tokenize.
		t, err := tokenizer.Load(f.RouterTokenizerPath)
		if err != nil {
			return nil, fmt.Errorf("--router-tokenizer-path: %w", err)
		}
		rt.tok = t
		slog.Info("tokenizer loaded for /tokenize; prompts are not hashed (--router-policy is not kv-aware)")
	}
	if f.KVEventTransport == "nats" && f.RouterPolicy != "kv-aware" {
		slog.Warn("--kv-event-transport nats has no effect without --router-policy kv-aware")
	}

	switch f.DiscoveryBackend {
	case "static":
		syncStatic(rt.fleet, f, store.Load())
		store.OnChange(func(old, cur *config.Config) { syncStatic(rt.fleet, f, cur) })
		go resyncStatic(rt.fleet, f, store, rt.stop)
	default:
		b, err := discovery.StartSynced(discovery.Options{
			Backend:          f.DiscoveryBackend,
			EtcdEndpoints:    []string{f.EtcdEndpoint},
			EtcdPrefix:       f.EtcdPrefix,
			EtcdCAFile:       f.EtcdCAFile,
			EtcdCertFile:     f.EtcdCertFile,
			EtcdKeyFile:      f.EtcdKeyFile,
			EtcdUsername:     f.EtcdUsername,
			EtcdPassword:     f.EtcdPassword,
			Kubeconfig:       f.Kubeconfig,
			K8sNamespace:     f.K8sNamespace,
			K8sLabelSelector: f.K8sLabelSelector,
			K8sAnnotation:    f.K8sAnnotation,
		}, rt.fleet, 10*time.Second)
		if b == nil {
			return nil, fmt.Errorf("cannot start %s discovery: %w", f.DiscoveryBackend, err)
		}
		rt.discovery = b
		rt.health["discovery"] = b.Health
		if err != nil {
			slog.Warn("discovery not synced yet; serving and retrying", "backend", f.DiscoveryBackend, "err", err)
		}
	}
	go store.Watch(f.ConfigPoll, rt.stop)

	opts := proxy.Options{
		Flags:     f,
		Store:     store,
		Sched:     rt.sched,
		BlockSize: f.KVBlockSize,
		NATS:      rt.natsClient,
		Health:    rt.health,
		Tokenizer: rt.tok,
	}
	if rt.kvAware != nil {
		opts.HashBlocks = kv.HashBlocks
		opts.Explain = func(cands []*fleet.Worker, r *sched.Request) any { return rt.kvAware.Explain(cands, r) }
	}
	rt.srv = proxy.New(opts)
	ok = true
	return rt, nil
}

// setupKV builds the KV-aware path: the router's tokenizer, the radix index
// fed by KV events (ZMQ per worker, or one NATS subscription), and the cost
// function. It must run before workers are added (the manager is a hook).
func (rt *router) setupKV() error {
	f := rt.flags
	if f.RouterTokenizerPath != "" {
		t, err := tokenizer.Load(f.RouterTokenizerPath)
		if err != nil {
			return fmt.Errorf("--router-tokenizer-path: %w", err)
		}
		rt.tok = t
	} else {
		rt.tok = tokenizer.Simple{}
		slog.Info("kv-aware routing tokenizes with the built-in Simple tokenizer (as infera engine does); " +
			"in front of vLLM or SGLang pass --router-tokenizer-path <model dir>, or prompts will never match their KV events")
	}
	idx := radix.New()
	m, err := kv.NewManager(kv.ManagerConfig{Index: idx, Transport: f.KVEventTransport, BlockSize: f.KVBlockSize})
	if err != nil {
		return err
	}
	rt.kvm = m
	rt.fleet.AddHook(m)
	if f.KVEventTransport == "nats" {
		sub, err := broker.SubscribeKVEvents(rt.nc, func(id string, topic []byte, seq uint64, payload []byte) {
			m.Feed(id, topic, seq, payload)
		})
		if err != nil {
			return fmt.Errorf("cannot subscribe to KV events on NATS: %w", err)
		}
		rt.kvSub = sub
	}
	rt.kvAware = kvroute.NewKVAware(kvroute.KVAwareConfig{
		Index:         idx,
		OverlapWeight: f.KVOverlapWeight,
		BlockSize:     f.KVBlockSize,
		Temperature:   f.RouterTemperature,
		Seed:          uint64(time.Now().UnixNano()),
	})
	rt.sched.KV = rt.kvAware
	return nil
}

// connectNATS connects to the broker (--nats-url, NATS_SERVER, NATS_URL).
func (rt *router) connectNATS() error {
	f := rt.flags
	if f.NatsURL == "" {
		return fmt.Errorf("--request-transport nats / --kv-event-transport nats need a broker: set --nats-url (or NATS_SERVER / NATS_URL), or use --request-transport http --kv-event-transport zmq")
	}
	nc, err := nats.Connect(f.NatsURL, nats.Name("infera-serve"), nats.MaxReconnects(-1))
	if err != nil {
		return fmt.Errorf("cannot connect to NATS at %s: %w", f.NatsURL, err)
	}
	rt.nc = nc
	rt.health["nats"] = func() (bool, string) { return nc.IsConnected(), nc.Status().String() }
	if f.RequestTransport == "nats" {
		bc, err := broker.NewClient(broker.ClientConfig{Conn: nc, IdleTimeout: f.NatsReqIdleTimeout,
			MaxDuration: f.NatsReqMaxDuration, MaxPending: f.NatsReqMaxPending})
		if err != nil {
			return err
		}
		rt.natsClient = bc
		// Fail open streams at once when the broker connection drops,
		// instead of waiting for their idle timeout.
		nc.SetDisconnectErrHandler(func(_ *nats.Conn, err error) { bc.Disconnected(err) })
	}
	return nil
}

// agreement excludes workers whose record advertises a transport this
// server does not use (logged once per worker): they would be unreachable.
type agreement struct {
	requestTransport, kvTransport string
	kvAware                       bool
	blockSize                     int
	logged                        map[string]bool // under the fleet lock
}

func (a *agreement) WorkerAdded(w *fleet.Worker) error {
	if ok, reason := discovery.Agrees(w.Record, a.requestTransport, a.kvTransport); !ok {
		if !a.logged[w.ID] {
			a.logged[w.ID] = true
			slog.Error("worker excluded: transports disagree with this server (match the flags fleet-wide)", "worker", w.ID, "reason", reason)
		}
		return fmt.Errorf("transport mismatch: %s", reason)
	}
	if a.kvAware && w.BlockSize > 0 && w.BlockSize != a.blockSize && !a.logged[w.ID+"/bs"] {
		// Still routable; its KV events just cannot match prompt hashes.
		a.logged[w.ID+"/bs"] = true
		slog.Warn("worker's KV block size differs from --kv-block-size: its cache will never match prompts",
			"worker", w.ID, "worker_block_size", w.BlockSize, "kv_block_size", a.blockSize)
	}
	return nil
}

func (a *agreement) WorkerRemoved(w *fleet.Worker) {}

// forgetHook drops a removed worker's NATS admission counter.
type forgetHook struct{ bc *broker.Client }

func (h forgetHook) WorkerAdded(w *fleet.Worker) error { return nil }
func (h forgetHook) WorkerRemoved(w *fleet.Worker) {
	if h.bc != nil {
		h.bc.Forget(w.ID)
	}
}

func (rt *router) close() {
	close(rt.stop)
	rt.cancel()
	if rt.sched != nil {
		rt.sched.Close()
	}
	if rt.discovery != nil {
		rt.discovery.Close()
	}
	if rt.kvSub != nil {
		rt.kvSub.Unsubscribe()
	}
	if rt.kvm != nil {
		rt.kvm.Close()
	}
	if rt.natsClient != nil {
		rt.natsClient.Close()
	}
	if rt.nc != nil {
		rt.nc.Close()
	}
	if rt.fleet != nil {
		rt.fleet.Close()
	}
}

// checkBackends refuses flag combinations that cannot work, naming the
// alternative, so that a flag never silently does nothing.
func checkBackends(f *config.Serve) error {
	if f.DiscoveryBackend == "static" && len(f.Workers) == 0 && f.Config == "" {
		slog.Warn("no workers: pass --workers URL,... or a config file with workers, or use --discovery-backend etcd|kubernetes")
	}
	if f.DiscoveryBackend != "static" && len(f.Workers) > 0 {
		return fmt.Errorf("--workers is for --discovery-backend static; with %s workers register themselves (infera worker)", f.DiscoveryBackend)
	}
	return nil
}

// staticRecords builds worker records from --workers and the config file.
func staticRecords(f *config.Serve, cfg *config.Config) []fleet.Record {
	var rs []fleet.Record
	seen := map[string]bool{}
	for _, spec := range f.Workers {
		spec = strings.TrimSpace(spec)
		if spec == "" {
			continue
		}
		id, u := spec, spec
		if i := strings.Index(spec, "="); i > 0 && !strings.Contains(spec[:i], "/") {
			id, u = spec[:i], spec[i+1:]
		}
		if !strings.Contains(u, "://") {
			u = "http://" + u
		}
		if seen[id] {
			continue
		}
		seen[id] = true
		rs = append(rs, fleet.Record{ID: id, URL: strings.TrimRight(u, "/"), Models: f.WorkerModel, Status: fleet.StatusActive})
	}
	for _, w := range cfg.Workers {
		id := w.ID
		if id == "" {
			id = w.URL
		}
		if seen[id] {
			continue
		}
		seen[id] = true
		rs = append(rs, fleet.Record{
			ID: id, URL: strings.TrimRight(w.URL, "/"), Models: w.Models, Service: w.Service, Role: w.Role,
			KVEventsEndpoint: w.KVEventsEndpoint, KVReplayEndpoint: w.KVReplayEndpoint, BlockSize: w.BlockSize, DPSize: w.DPSize,
			Status: fleet.StatusActive,
		})
	}
	return rs
}

// syncStatic applies the static worker list. Workers without a model list
// are asked for their /v1/models.
func syncStatic(fleet *fleet.Fleet, f *config.Serve, cfg *config.Config) {
	rs := staticRecords(f, cfg)
	for i := range rs {
		if len(rs[i].Models) == 0 {
			// Keep what a live worker already learned: a transient /v1/models
			// failure must not replace a routable worker.
			if w := fleet.Get(rs[i].ID); w != nil && w.URL == rs[i].URL && len(w.Models) > 0 {
				rs[i].Models = w.Models
				continue
			}
			rs[i].Models = fetchModels(rs[i].URL)
		}
	}
	for _, err := range fleet.Sync(rs) {
		slog.Error("static worker skipped", "err", err)
	}
}

// fetchModels asks a worker for its model ids (empty on failure).
func fetchModels(base string) []string {
	req := fasthttp.AcquireRequest()
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI(base + "/v1/models")
	if err := fasthttp.DoTimeout(req, resp, 3*time.Second); err != nil || resp.StatusCode() != 200 {
		slog.Warn("cannot list worker models; pass --worker-model", "url", base, "err", err)
		return nil
	}
	return parseModelList(resp.Body())
}

func parseModelList(b []byte) []string {
	var v struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if err := json.Unmarshal(b, &v); err != nil {
		return nil
	}
	var out []string
	for _, m := range v.Data {
		if m.ID != "" {
			out = append(out, m.ID)
		}
	}
	return out
}

// resyncStatic retries static workers whose models could not be listed.
func resyncStatic(fleet *fleet.Fleet, f *config.Serve, store *config.Store, stop <-chan struct{}) {
	t := time.NewTicker(5 * time.Second)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		missing := false
		for _, w := range fleet.View().All {
			if len(w.Models) == 0 {
				missing = true
			}
		}
		if missing {
			syncStatic(fleet, f, store.Load())
		}
	}
}
