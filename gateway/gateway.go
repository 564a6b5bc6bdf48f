package gateway

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"

	"github.com/infera/infera/admin"
	"github.com/infera/infera/broker"
	"github.com/infera/infera/classify"
	"github.com/infera/infera/config"
	"github.com/infera/infera/discovery"
	"github.com/infera/infera/fleet"
	"github.com/infera/infera/govern"
	"github.com/infera/infera/internal/certs"
	"github.com/infera/infera/internal/holdhup"
	"github.com/infera/infera/internal/logx"
	"github.com/infera/infera/internal/realip"
	"github.com/infera/infera/kv"
	"github.com/infera/infera/kvroute"
	"github.com/infera/infera/mirror"
	"github.com/infera/infera/proxy"
	"github.com/infera/infera/radix"
	"github.com/infera/infera/sched"
	"github.com/infera/infera/tokenizer"
	"github.com/infera/infera/upstream"
	"github.com/nats-io/nats.go"
	"github.com/redis/go-redis/v9"
)

// Gateway is everything `infera serve` runs, wired together.
type Gateway struct {
	flags *config.Serve
	store *config.Store
	fleet *fleet.Fleet
	sched *sched.Scheduler
	srv   *proxy.Server
	// access is the access log (--access-log); nil: off.
	access *proxy.AccessLog
	// certs is the TLS certificate (--tls-cert-file); nil: plain HTTP.
	certs *certs.Reloader
	stop  chan struct{}

	discovery  discovery.Backend
	nc         *nats.Conn
	natsClient *broker.Client
	health     map[string]proxy.HealthCheck
	ctx        context.Context
	cancel     context.CancelFunc

	// natsLate: the broker was not reachable when nc was made.
	// natsConnected, once set, is called when nc connects for the first
	// time after such a start (nats.go's connected callback, on its own
	// goroutine).
	natsLate      bool
	natsConnected atomic.Pointer[func()]

	tok     tokenizer.Tokenizer
	kvm     *kv.Manager
	kvSub   *nats.Subscription
	kvAware *kvroute.KVAware
	kvIndex *radix.Index

	// Beyond the local fleet (docs/upstreams.md).
	mirror     *mirror.Mirror
	classifier *classify.Client
	poller     *upstream.Poller

	gov *govern.Governor // govern.go

	admin *admin.Admin // the configuration center (admin.go)
}

// New builds the gateway from flags: config store, fleet and its
// transports, discovery (synced, or serving the last known list with a
// warning), scheduler and the HTTP front door. Serve or Run it next.
func New(f *config.Serve) (*Gateway, error) {
	holdhup.Hold()                   // for an embedding caller; `infera serve` holds it from its first init on
	redis.SetLogger(logx.NewRedis()) // the Redis client's own lines go through slog
	if err := f.Validate(); err != nil {
		return nil, err
	}
	if p, _ := realip.Parse(f.TrustedProxies); p != nil {
		slog.Info("clients behind trusted proxies are the address their X-Forwarded-For names", "trusted_proxies", p.String())
	}
	policy, ok := sched.ParsePolicy(f.RouterPolicy)
	if !ok {
		return nil, fmt.Errorf("--router-policy %q: want kv-aware, round-robin, least-requests, least-tokens or config", f.RouterPolicy)
	}
	mode, ok := sched.ParseMode(f.RouterMode)
	if !ok {
		return nil, fmt.Errorf("--router-mode %q: want auto or direct", f.RouterMode)
	}
	store, err := config.OpenWith(f.Config, admin.FileSecretCodec(f))
	if err != nil {
		return nil, fmt.Errorf("--config %s: %w", f.Config, err)
	}
	g := &Gateway{flags: f, store: store, stop: make(chan struct{}), health: map[string]proxy.HealthCheck{}}
	g.ctx, g.cancel = context.WithCancel(context.Background())
	ok = false
	defer func() {
		if !ok {
			g.Close()
		}
	}()
	if f.TLSCertFile != "" {
		if g.certs, err = certs.Load(f.TLSCertFile, f.TLSKeyFile); err != nil {
			return nil, err
		}
		tlsExpiry(g.certs)
	}
	startupBackup(f, store)
	if f.State == "" {
		// What these flags refuse, already while a snapshot is restored
		// into the config file: a snapshot they refuse replaced the file,
		// then the start was refused, and so was every later one (the
		// file, now newer, holds it). The backends are resolved as they
		// will be for that config; the resolved check replaces this one.
		store.SetCheck(func(c *config.Config) error {
			ff := *f
			ff.ResolveBackends(len(f.Workers) > 0 || len(c.Workers) > 0)
			return flagCheck(&ff, c)
		})
	}
	// Before anything reads the store: it may restore a snapshot or load
	// the config from Redis.
	if err := g.openAdmin(); err != nil {
		return nil, err
	}
	if note := f.ResolveBackends(len(f.Workers) > 0 || len(store.Load().Workers) > 0); note != "" {
		slog.Info("backends chosen: "+note, "discovery", f.DiscoveryBackend, "request_transport", f.RequestTransport, "kv_event_transport", f.KVEventTransport)
	}
	if err := checkBackends(f); err != nil {
		return nil, err
	}
	g.fleet = fleet.NewFleet(fleet.BreakerConfig{
		Threshold:   f.BreakerFailureThreshold,
		Cooldown:    f.BreakerCooldown(),
		MaxCooldown: f.BreakerMaxCooldown(),
	})
	if f.RequestTransport == "http" {
		// A url is where the router reaches the engine: one engine, one
		// worker, whatever discovery says (over NATS a url is a sidecar's
		// view of its engine, the same on every host).
		g.fleet.OneWorkerPerEngine()
	}
	g.fleet.AddHook(&discovery.AgreementHook{RequestTransport: f.RequestTransport, KVTransport: f.KVEventTransport,
		KVAware: policy == sched.PolicyKVAware, BlockSize: f.KVBlockSize})
	if f.RequestTransport == "nats" || f.KVEventTransport == "nats" {
		if err := g.connectNATS(); err != nil {
			return nil, err
		}
	}
	if f.RequestTransport == "http" {
		g.fleet.AddHook(proxy.HTTPHook(f))
	} else {
		g.fleet.AddHook(&forgetHook{bc: g.natsClient})
	}
	g.sched = sched.NewScheduler(g.fleet, policy)
	g.sched.Mode = mode
	g.sched.BlockSize = f.KVBlockSize
	g.sched.Latest = store.Load
	go g.sched.Run(g.ctx, store.Load)
	if f.RouterDefaultChatTemplateKwargs != "" && f.RouterTokenizerPath == "" {
		return nil, errors.New("--router-default-chat-template-kwargs needs --router-tokenizer-path: the built-in tokenizer has no chat template")
	}
	if policy == sched.PolicyKVAware {
		if err := g.setupKV(); err != nil {
			return nil, err
		}
	} else if f.RouterTokenizerPath != "" {
		// Without kv-aware routing the tokenizer still serves /tokenize.
		t, err := loadTokenizer(f)
		if err != nil {
			return nil, err
		}
		g.tok = t
		slog.Info("tokenizer loaded for /tokenize; prompts are not hashed (--router-policy is not kv-aware)")
	}
	if f.KVEventTransport == "nats" && policy != sched.PolicyKVAware {
		slog.Warn("--kv-event-transport nats has no effect without --router-policy kv-aware")
	}

	switch f.DiscoveryBackend {
	case discovery.BackendStatic:
		if err := discovery.CheckWorkerFlag(f.Workers); err != nil {
			return nil, err
		}
		if err := discovery.CheckSameEngine(f.Workers, &config.Config{}, f.RequestTransport); err != nil {
			return nil, err
		}
		check := func(c *config.Config) error { return flagCheck(f, c) }
		if err := startCheck(f, check(store.Load())); err != nil {
			return nil, err
		}
		store.SetCheck(check)
		st := discovery.NewStatic(g.fleet, f.Workers, f.WorkerModel)
		st.ConnectTimeout = f.ConnectTimeout
		st.Apply(store.Load())
		store.OnChange(func(old, cur *config.Config) { st.Changed(cur) })
		go st.Run(store.Load)
		g.discovery = st
	default:
		// The config's workers are static discovery's; with etcd or
		// Kubernetes they would be ignored without a word (as --workers,
		// which checkBackends refuses).
		check := func(c *config.Config) error { return flagCheck(f, c) }
		if err := startCheck(f, check(store.Load())); err != nil {
			return nil, err
		}
		store.SetCheck(check)
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
		}, g.fleet, 10*time.Second)
		if b == nil {
			return nil, fmt.Errorf("cannot start %s discovery: %w", f.DiscoveryBackend, err)
		}
		g.discovery = b
		g.health["discovery"] = b.Health
		if err != nil {
			slog.Warn("discovery not synced yet; serving and retrying", "backend", f.DiscoveryBackend, "err", err)
		}
	}
	if err := g.setupUpstreams(); err != nil {
		return nil, err
	}
	// A change since Open: a SIGHUP sent for it found no handler yet, and
	// with --config-poll 0 nothing else would see it.
	store.Reload()
	go store.Watch(f.ConfigPoll, g.stop)

	if err := g.setupGovern(); err != nil { // govern.go
		return nil, err
	}

	if f.AccessLog != "" {
		if g.access, err = proxy.OpenAccessLog(f.AccessLog); err != nil {
			return nil, err
		}
	}
	opts := proxy.Options{
		AccessLog: g.access,
		TLS:       g.tlsConfig(),
		Flags:     f,
		Store:     store,
		Sched:     g.sched,
		BlockSize: f.KVBlockSize,
		NATS:      g.natsClient,
		Health:    g.health,
		Tokenizer: g.tok,

		Mirror:     g.mirror,
		Classifier: g.classifier,
		Poller:     g.poller,

		Governor: g.gov,
	}
	if g.natsClient != nil {
		// Every request goes through the broker: without it none can
		// reach a worker, and a load balancer should look elsewhere.
		opts.HealthRequired = []string{"nats"}
	}
	if g.nc != nil {
		opts.NATSConnected = g.nc.IsConnected
	}
	if g.kvAware != nil {
		opts.HashBlocks = kv.HashBlocks
		if g.kvm != nil {
			opts.IsLora = g.kvm.IsLora
		}
		opts.Explain = func(cands []*fleet.Worker, r *sched.Request) any { return g.kvAware.Explain(cands, r) }
	}
	g.srv = proxy.New(opts)
	if g.nc != nil {
		g.nc.SetReconnectHandler(func(*nats.Conn) { g.srv.BrokerReconnected() })
		// A router started while the broker was down connects for the
		// first time through the connected callback, not the reconnected
		// one; the workers' sidecars are reconnecting too, so their "no
		// responders" until they subscribe again is the broker's fault
		// then as after any reconnect.
		connected := func() { g.srv.BrokerReconnected() }
		g.natsConnected.Store(&connected)
		if g.natsLate && g.nc.IsConnected() {
			g.srv.BrokerReconnected() // it came before the handler was set
		}
	}
	if err := g.startAdmin(); err != nil {
		return nil, err
	}
	ok = true
	return g, nil
}

// Serve serves the front door on ln until Shutdown.
func (g *Gateway) Serve(ln net.Listener) error { return g.srv.Serve(ln) }

// Shutdown stops accepting and waits for in-flight requests and streams
// until ctx ends.
func (g *Gateway) Shutdown(ctx context.Context) error { return g.srv.ShutdownContext(ctx) }

// Store returns the config store.
func (g *Gateway) Store() *config.Store { return g.store }

// Fleet returns the worker fleet.
func (g *Gateway) Fleet() *fleet.Fleet { return g.fleet }

// Workers returns the number of workers known (for the startup log).
func (g *Gateway) Workers() int { return len(g.fleet.View().All) }

// loadTokenizer loads --router-tokenizer-path with the engines' default
// chat_template_kwargs (--router-default-chat-template-kwargs).
func loadTokenizer(f *config.Serve) (*tokenizer.HF, error) {
	t, err := tokenizer.Load(f.RouterTokenizerPath)
	if err != nil {
		return nil, fmt.Errorf("--router-tokenizer-path: %w", err)
	}
	if err := t.SetDefaultKwargs([]byte(f.RouterDefaultChatTemplateKwargs)); err != nil {
		return nil, fmt.Errorf("--router-default-chat-template-kwargs: %w", err)
	}
	return t, nil
}

// setupKV builds the KV-aware path: the router's tokenizer, the radix index
// fed by KV events (ZMQ per worker, or one NATS subscription), and the cost
// function. It must run before workers are added (the manager is a hook).
func (g *Gateway) setupKV() error {
	f := g.flags
	if f.RouterTokenizerPath != "" {
		t, err := loadTokenizer(f)
		if err != nil {
			return err
		}
		g.tok = t
	} else {
		g.tok = tokenizer.Simple{}
		slog.Info("kv-aware routing tokenizes with the built-in Simple tokenizer (as infera engine does); " +
			"in front of vLLM or SGLang pass --router-tokenizer-path <model dir>, or prompts will never match their KV events")
	}
	idx := radix.New()
	g.kvIndex = idx
	m, err := kv.NewManager(kv.ManagerConfig{Index: idx, Transport: f.KVEventTransport, BlockSize: f.KVBlockSize})
	if err != nil {
		return err
	}
	g.kvm = m
	g.fleet.AddHook(m)
	if f.KVEventTransport == "nats" {
		sub, err := broker.SubscribeKVEvents(g.nc, func(id string, instance uint64, topic []byte, seq uint64, payload []byte) {
			m.Feed(id, instance, topic, seq, payload)
		})
		if err != nil {
			return fmt.Errorf("cannot subscribe to KV events on NATS: %w", err)
		}
		g.kvSub = sub
	}
	g.kvAware = kvroute.NewKVAware(kvroute.KVAwareConfig{
		Index:         idx,
		OverlapWeight: f.KVOverlapWeight,
		BlockSize:     f.KVBlockSize,
		Temperature:   f.RouterTemperature,
		Seed:          uint64(time.Now().UnixNano()),
		LoadBound:     kvroute.LoadBoundFromFlag(f.KVLoadBound),
		LearnSpeed:    f.KVLearnSpeed,
	})
	g.sched.KV = g.kvAware
	return nil
}

// setupUpstreams builds what the request path needs beyond the local
// fleet: the traffic mirror, the smart model selection classifier client,
// and the global scheduling poller, which follows every config change.
func (g *Gateway) setupUpstreams() error {
	// The mirror dials its target within --connect-timeout, as the
	// router dials workers and external endpoints (and within the
	// request's mirror.timeout_ms when that is shorter).
	g.mirror = mirror.New(mirror.Options{ConnectTimeout: g.flags.ConnectTimeout})
	g.classifier = &classify.Client{Current: func() *config.SmartModelSelection { return &g.store.Load().SmartModelSelection }}
	g.poller = upstream.NewPoller()
	if err := g.poller.Update(&g.store.Load().GlobalScheduling); err != nil {
		return fmt.Errorf("global_scheduling: %w", err)
	}
	g.mirror.Update(&g.store.Load().Mirror)
	g.store.OnChange(func(_, cur *config.Config) {
		g.mirror.Update(&cur.Mirror)
		if err := g.poller.Update(&cur.GlobalScheduling); err != nil {
			slog.Warn("global scheduling: members not updated", "err", err)
		}
	})
	return nil
}

// connectNATS connects to the broker (--nats-url, NATS_SERVER, NATS_URL).
func (g *Gateway) connectNATS() error {
	f := g.flags
	if f.NatsURL == "" {
		return fmt.Errorf("--request-transport nats / --kv-event-transport nats need a broker: set --nats-url (or NATS_SERVER / NATS_URL), or use --request-transport http --kv-event-transport zmq")
	}
	// A broker down at start is retried as one lost later is: the router
	// starts and serves what it can, /health says what is missing (503
	// with --request-transport nats, degraded with KV events alone),
	// instead of a crash loop for as long as the broker is away.
	connected := nats.ConnectHandler(func(*nats.Conn) {
		if h := g.natsConnected.Load(); h != nil {
			(*h)()
		}
	})
	sec, err := broker.Security{CredsFile: f.NatsCredsFile, NkeySeedFile: f.NatsNkeySeedFile,
		CAFile: f.NatsTLSCAFile, CertFile: f.NatsTLSCertFile, KeyFile: f.NatsTLSKeyFile}.Options(f.NatsURL)
	if err != nil {
		return err
	}
	nc, err := nats.Connect(f.NatsURL, append(append(broker.Reconnect(), sec...), nats.Name("infera-serve"), nats.RetryOnFailedConnect(true), connected)...)
	if err != nil {
		return fmt.Errorf("cannot connect to NATS: %w", logx.StripURL(err)) // url errors quote the URL, password included
	}
	if !nc.IsConnected() {
		g.natsLate = true
		slog.Warn("NATS broker not reachable at start; retrying while the router serves", "url", logx.RedactNATSURL(f.NatsURL))
	}
	g.nc = nc
	g.health["nats"] = func() (bool, string) { return nc.IsConnected(), nc.Status().String() }
	if f.RequestTransport == "nats" {
		bc, err := broker.NewClient(broker.ClientConfig{Conn: nc, IdleTimeout: f.NatsReqIdleTimeout,
			MaxDuration: f.NatsReqMaxDuration, MaxPending: f.NatsReqMaxPending})
		if err != nil {
			return err
		}
		g.natsClient = bc
		// Fail open streams at once when the broker connection drops,
		// instead of waiting for their idle timeout.
		nc.SetDisconnectErrHandler(func(_ *nats.Conn, err error) { bc.Disconnected(err) })
	}
	return nil
}

// forgetHook drops a removed worker's NATS admission counter, and those of
// other workers no longer in the fleet (a request dispatched to a worker
// as it was removed re-creates its counter after Forget).
type forgetHook struct {
	bc   *broker.Client
	live map[string]bool // under the fleet lock
}

func (h *forgetHook) WorkerAdded(w *fleet.Worker) error {
	if h.live == nil {
		h.live = map[string]bool{}
	}
	h.live[w.ID] = true
	return nil
}

func (h *forgetHook) WorkerRemoved(w *fleet.Worker) {
	delete(h.live, w.ID)
	if h.bc != nil {
		h.bc.Forget(w.ID)
		// Only when some worker not live must hold one: a mass removal
		// (a relist) then does not walk the counters once per worker.
		// Stale counters stay fewer than the live workers.
		if h.bc.Counters() > len(h.live) {
			h.bc.Retain(func(id string) bool { return h.live[id] })
		}
	}
}

// Close releases everything New built (after Shutdown).
func (g *Gateway) Close() {
	select {
	case <-g.stop:
		return
	default:
	}
	close(g.stop)
	g.cancel()
	if g.admin != nil {
		g.admin.Close()
	}
	if g.sched != nil {
		g.sched.Close()
	}
	if g.discovery != nil {
		g.discovery.Close()
	}
	if g.kvSub != nil {
		g.kvSub.Unsubscribe()
	}
	if g.kvm != nil {
		g.kvm.Close()
	}
	if g.natsClient != nil {
		g.natsClient.Close()
	}
	if g.nc != nil {
		g.nc.Close()
	}
	if g.fleet != nil {
		g.fleet.Close()
	}
	if g.mirror != nil {
		g.mirror.Close()
	}
	if g.poller != nil {
		g.poller.Close()
	}
	if g.classifier != nil {
		g.classifier.Close()
	}
	if g.gov != nil {
		g.gov.Close()
	}
	if g.access != nil {
		g.access.Close() // after Shutdown: the last requests' lines are written
	}
}

// startupBackup applies the config file's startup configuration of data
// backup (llm_gateway.persist_snapshot_dir, storage: the configuration
// center doc's): the snapshot directory when --persist-snapshot-dir is not
// given. It is read once: a later change is logged and waits for a restart.
func startupBackup(f *config.Serve, store *config.Store) {
	c := store.Load()
	dir := c.LLMGateway.PersistSnapshotDir
	switch {
	case dir == "":
	case f.PersistSnapshotDir == "":
		f.PersistSnapshotDir = dir
		slog.Info("snapshots in llm_gateway.persist_snapshot_dir", "dir", dir)
	case filepath.Clean(dir) != filepath.Clean(f.PersistSnapshotDir):
		slog.Warn("--persist-snapshot-dir wins over llm_gateway.persist_snapshot_dir", "flag", f.PersistSnapshotDir, "config", dir)
	}
	for _, m := range c.Storage {
		if st, err := os.Stat(m.MountPath); err != nil || !st.IsDir() {
			slog.Warn("storage mount path is not a directory: the platform mounts it, infera does not", "mount_path", m.MountPath)
		}
	}
	store.OnChange(func(old, cur *config.Config) {
		if old.LLMGateway.PersistSnapshotDir != cur.LLMGateway.PersistSnapshotDir {
			slog.Warn("llm_gateway.persist_snapshot_dir changed: it takes effect at the next start", "now", f.PersistSnapshotDir)
		}
	})
}

// flagCheck refuses what the flags f (their backends resolved) make
// unusable in c: with static discovery a worker id --workers also gives
// and workers the transports cannot reach; with etcd or Kubernetes any
// static worker (the config's workers are static discovery's: they would
// be ignored without a word, as --workers, which checkBackends refuses).
func flagCheck(f *config.Serve, c *config.Config) error {
	if f.DiscoveryBackend == discovery.BackendStatic {
		if err := discovery.CheckConfigAgainstFlag(c, f.Workers); err != nil {
			return err
		}
		if err := discovery.CheckSameEngine(f.Workers, c, f.RequestTransport); err != nil {
			return err
		}
		return discovery.CheckStaticWorkers(c, f.RequestTransport, f.KVEventTransport)
	}
	if len(c.Workers) > 0 {
		return &config.FieldError{Path: "workers", Msg: "static workers are for --discovery-backend static; with " + f.DiscoveryBackend +
			" workers register themselves (infera worker): remove them"}
	}
	return nil
}

// startCheck judges the failed check err (a setting this router's flags
// make unusable) of the config it starts with: a file's refuses the start,
// naming it; the shared config of --state redis, which other routers with
// other flags may use, is logged and served without that setting (this
// router's writes of it are refused).
func startCheck(f *config.Serve, err error) error {
	if err == nil {
		return nil
	}
	if f.State != "" {
		slog.Warn("the shared config holds a setting this router cannot use; it is ignored here", "err", err)
		return nil
	}
	if f.Config == "" {
		// Without a file the config was restored from a snapshot (the
		// defaults pass every check): name it, and the way out.
		return fmt.Errorf("the config restored from the newest snapshot in --persist-snapshot-dir %q: %w (start with the flags it was taken under, or move the snapshots out of the directory to start without them)", f.PersistSnapshotDir, err)
	}
	return fmt.Errorf("config %q: %w", f.Config, err)
}

// checkBackends refuses flag combinations that cannot work, naming the
// alternative, so that a flag never silently does nothing.
func checkBackends(f *config.Serve) error {
	if f.DiscoveryBackend == discovery.BackendStatic && len(f.Workers) == 0 && f.Config == "" {
		slog.Warn("no workers: pass --workers URL,... or a config file with workers, or use --discovery-backend etcd|kubernetes")
	}
	if f.DiscoveryBackend != discovery.BackendStatic && len(f.Workers) > 0 {
		return fmt.Errorf("--workers is for --discovery-backend static; with %s workers register themselves (infera worker)", f.DiscoveryBackend)
	}
	if f.RequestTransport != "nats" && f.KVEventTransport != "nats" {
		// The broker's credentials and TLS files would be neither read
		// nor used: a router believed to authenticate (or to verify the
		// broker) would not even check the files.
		for _, fl := range [...]struct{ name, v string }{{"--nats-creds-file", f.NatsCredsFile}, {"--nats-nkey-seed-file", f.NatsNkeySeedFile},
			{"--nats-tls-ca-file", f.NatsTLSCAFile}, {"--nats-tls-cert-file", f.NatsTLSCertFile}, {"--nats-tls-key-file", f.NatsTLSKeyFile}} {
			if fl.v != "" {
				return fmt.Errorf("%s is for the NATS broker, which this router does not use (--request-transport %s, --kv-event-transport %s): set --request-transport nats or --kv-event-transport nats, or drop it",
					fl.name, f.RequestTransport, f.KVEventTransport)
			}
		}
	}
	return nil
}

// tlsConfig is the front door's TLS configuration (nil: plain HTTP).
func (g *Gateway) tlsConfig() *tls.Config {
	if g.certs == nil {
		return nil
	}
	return g.certs.Config()
}

// tlsExpiry exports the certificate's expiry (infera_tls_certificate_expiry_timestamp_seconds)
// for an alert before it lapses; it follows reloads.
func tlsExpiry(r *certs.Reloader) {
	metrics.GetOrCreateGauge(`infera_tls_certificate_expiry_timestamp_seconds`, func() float64 {
		return float64(r.NotAfter().Unix())
	})
}

// reloadTLS reads the certificate files again (SIGHUP).
func (g *Gateway) reloadTLS() {
	if g.certs == nil {
		return
	}
	if err := g.certs.Reload(); err != nil {
		slog.Warn("TLS certificate not reloaded; the previous one keeps serving", "err", err)
		return
	}
	slog.Info("TLS certificate reloaded", "not_after", g.certs.NotAfter().UTC().Format(time.RFC3339))
}
