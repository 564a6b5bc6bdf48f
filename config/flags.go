package config

import (
	"fmt"
	"math"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/infera/infera/internal/realip"
)

// Serve holds the process-level flags of `infera serve`.
// Precedence: flag > env > default. Dynamic settings live in the JSON config.
type Serve struct {
	Host string `help:"Address to listen on." default:"0.0.0.0" env:"INFERA_HOST"`
	Port int    `help:"Port to listen on." default:"8000" env:"INFERA_PORT"`
	// TLS on the front door and the admin listener.
	TLSCertFile string `help:"PEM certificate chain: serve HTTPS (with --tls-key-file) on the front door and the admin listener; reloaded on SIGHUP." env:"INFERA_TLS_CERT_FILE" type:"path"`
	TLSKeyFile  string `help:"PEM private key of --tls-cert-file." env:"INFERA_TLS_KEY_FILE" type:"path"`

	Config       string        `help:"Hot-reloadable JSON config file (reloaded on change and on SIGHUP)." env:"INFERA_CONFIG" type:"path"`
	ConfigPoll   time.Duration `help:"How often the config file is checked for changes." default:"1s" env:"INFERA_CONFIG_POLL"`
	MaxBodyBytes int           `help:"Largest accepted request body; larger bodies get 413." default:"33554432" env:"INFERA_MAX_BODY_BYTES"`
	// MaxHeaderBytes is fasthttp's read buffer: the request line and
	// headers must fit in it, and each open client connection holds one.
	MaxHeaderBytes int    `help:"Largest request line plus headers a client may send (each open client connection holds a buffer of this size); larger get 431." default:"16384" env:"INFERA_MAX_HEADER_BYTES"`
	APIKey         string `help:"If set, clients must send 'Authorization: Bearer <key>'." env:"INFERA_API_KEY"`
	// Wrong keys per client address (internal/lockout), whenever the
	// router authenticates (--api-key or users).
	AuthLockoutFailures int           `help:"Wrong API keys (--api-key or a user's) from one client address within --auth-lockout-window that lock the address out for that window: 429 with Retry-After, whatever key it sends; 0 (the default) turns the lockout off: behind a proxy or NAT every client has one address." default:"0" env:"INFERA_AUTH_LOCKOUT_FAILURES"`
	AuthLockoutWindow   time.Duration `help:"Time within which --auth-lockout-failures wrong keys lock an address out (counted from the first), and how long the lockout lasts (from the last)." default:"1m" env:"INFERA_AUTH_LOCKOUT_WINDOW"`
	// TrustedProxies are the load balancers whose X-Forwarded-For names
	// the client (internal/realip): the address the lockouts count and
	// the access log and audit log report.
	TrustedProxies []string `help:"Load balancers and proxies (comma-separated IP addresses and CIDR networks, IPv4 and IPv6) whose X-Forwarded-For names the client: a request from one of them counts as the rightmost X-Forwarded-For address not itself listed (the wrong-key lockouts, the access log, the admin audit log); empty (the default): every client is its TCP peer and X-Forwarded-For is ignored." env:"INFERA_TRUSTED_PROXIES" sep:","`

	RouterTokenizerPath string `help:"Directory with tokenizer.json and tokenizer_config.json used for KV-aware routing." env:"INFERA_ROUTER_TOKENIZER_PATH"`
	// RouterDefaultChatTemplateKwargs mirrors the engines' vLLM
	// --default-chat-template-kwargs, so that the router renders chats as
	// they do (tokenizer.HF.SetDefaultKwargs).
	RouterDefaultChatTemplateKwargs string `help:"The engines' --default-chat-template-kwargs (a JSON object, vLLM's flag): chats are rendered with these under their own chat_template_kwargs, as the engines render them (e.g. {\"enable_thinking\": false} for a Qwen3 fleet started with thinking off). Needs --router-tokenizer-path." env:"INFERA_ROUTER_DEFAULT_CHAT_TEMPLATE_KWARGS"`
	// RouterTokenizeMaxBytes bounds the router's tokenization work per
	// request: a real tokenizer costs up to about 1 us per byte on text its
	// caches do not know (one long word, random letters).
	RouterTokenizeMaxBytes int `help:"Bytes of each rendered prompt the router tokenizes for kv-aware routing (0: all); a longer prompt is routed on its leading part, cut on a word boundary, and its token count extrapolated." default:"262144" env:"INFERA_ROUTER_TOKENIZE_MAX_BYTES"`

	DiscoveryBackend string   `help:"How workers are discovered: kubernetes, etcd or static. Default kubernetes; static when workers are given (--workers, or workers in the config)." env:"INFERA_DISCOVERY_BACKEND" placeholder:"kubernetes"`
	Workers          []string `help:"Static workers: URL or id=URL, comma-separated (with --discovery-backend static)." env:"INFERA_WORKERS" sep:","`
	WorkerModel      []string `help:"Models served by static workers given by --workers (default: asked from each worker's /v1/models)." env:"INFERA_WORKER_MODEL" sep:","`
	EtcdEndpoint     string   `help:"etcd endpoint(s), comma-separated host:port." default:"127.0.0.1:2379" env:"INFERA_ETCD_ENDPOINT"`
	EtcdPrefix       string   `help:"etcd key prefix of worker records." default:"/infera/workers/" env:"INFERA_ETCD_PREFIX"`
	EtcdCAFile       string   `help:"etcd TLS CA file." env:"INFERA_ETCD_CA_FILE"`
	EtcdCertFile     string   `help:"etcd TLS client certificate." env:"INFERA_ETCD_CERT_FILE"`
	EtcdKeyFile      string   `help:"etcd TLS client key." env:"INFERA_ETCD_KEY_FILE"`
	EtcdUsername     string   `help:"etcd auth user." env:"INFERA_ETCD_USERNAME"`
	EtcdPassword     string   `help:"etcd auth password." env:"INFERA_ETCD_PASSWORD"`
	Kubeconfig       string   `help:"kubeconfig file for --discovery-backend kubernetes, or a list of them as in KUBECONFIG (a:b: merged as kubectl merges them, missing files skipped, a leading ~ of each the home directory; empty: in-cluster service account)." env:"INFERA_KUBECONFIG,KUBECONFIG"`
	K8sNamespace     string   `name:"k8s-namespace" help:"Namespace to watch (empty: the service account's or kubeconfig context's, default when it names none; all: every namespace)." env:"INFERA_K8S_NAMESPACE"`
	K8sAnnotation    string   `name:"k8s-annotation" help:"Pod annotation holding the worker record." default:"infera.io/worker" env:"INFERA_K8S_ANNOTATION"`
	K8sLabelSelector string   `name:"k8s-label-selector" help:"Pod label selector for --discovery-backend kubernetes." default:"app.kubernetes.io/component=infera-worker" env:"INFERA_K8S_LABEL_SELECTOR"`

	RequestTransport string `help:"How requests reach workers: nats or http. Default nats; http with static discovery (engines without a worker sidecar)." env:"INFERA_REQUEST_TRANSPORT" placeholder:"nats"`
	KVEventTransport string `help:"How KV events flow: nats or zmq. Default nats; zmq with static discovery." env:"INFERA_KV_EVENT_TRANSPORT" placeholder:"nats"`
	NatsURL          string `help:"NATS broker URL (also NATS_SERVER / NATS_URL)." env:"INFERA_NATS_URL,NATS_SERVER,NATS_URL"`
	NatsCredsFile    string `name:"nats-creds-file" help:"NATS .creds file (user JWT and NKey seed) for a broker in operator (JWT) mode." env:"INFERA_NATS_CREDS_FILE" type:"path"`
	NatsNkeySeedFile string `name:"nats-nkey-seed-file" help:"File holding a NATS user NKey seed (SU...) the broker knows by its public key." env:"INFERA_NATS_NKEY_SEED_FILE" type:"path"`
	NatsTLSCAFile    string `name:"nats-tls-ca-file" help:"PEM CA verifying the NATS broker's certificate (instead of the system's); requires TLS." env:"INFERA_NATS_TLS_CA_FILE" type:"path"`
	NatsTLSCertFile  string `name:"nats-tls-cert-file" help:"PEM client certificate for the NATS broker (mutual TLS, with --nats-tls-key-file); requires TLS." env:"INFERA_NATS_TLS_CERT_FILE" type:"path"`
	NatsTLSKeyFile   string `name:"nats-tls-key-file" help:"PEM private key of --nats-tls-cert-file." env:"INFERA_NATS_TLS_KEY_FILE" type:"path"`

	RouterMode        string  `help:"auto: select in-process; direct: trust x-worker-instance-id." default:"auto" enum:"auto,direct" env:"INFERA_ROUTER_MODE"`
	RouterPolicy      string  `help:"kv-aware or a load-balancing policy (round-robin, least-requests, least-tokens, config: use the config file's load_balancing)." default:"kv-aware" enum:"kv-aware,round-robin,least-requests,least-tokens,config" env:"INFERA_ROUTER_POLICY"`
	KVOverlapWeight   float64 `help:"kv-aware: weight of the duplicate-prefix cost (each cached token recomputed on another worker costs 7 x this many prefill tokens on a full cache); 0 routes on predicted time to first token alone." default:"1.0" env:"INFERA_KV_OVERLAP_WEIGHT"`
	KVLoadBound       float64 `name:"kv-load-bound" help:"kv-aware bounded load: a worker may carry (1 + this) x the mean requests in flight + 2 before each further request costs a full prefill; < 0 disables." default:"0.2" env:"INFERA_KV_LOAD_BOUND"`
	KVLearnSpeed      bool    `name:"kv-learn-speed" help:"kv-aware learns each worker's prefill speed from first tokens (fleets of unequal engines)." default:"false" env:"INFERA_KV_LEARN_SPEED"`
	KVBlockSize       int     `help:"Engine KV block size in tokens, for workers whose record does not say." default:"16" env:"INFERA_KV_BLOCK_SIZE"`
	RouterTemperature float64 `help:"If > 0, kv-aware samples from a softmax over normalised costs." default:"0" env:"INFERA_ROUTER_TEMPERATURE"`

	NatsReqIdleTimeout      time.Duration `help:"Max wait for the next reply chunk over NATS (reset per chunk); 0 = forever." default:"900s" env:"INFERA_NATS_REQ_IDLE_TIMEOUT"`
	NatsReqMaxDuration      time.Duration `help:"Hard wall-clock cap on a NATS request; 0 = off." default:"0" env:"INFERA_NATS_REQ_MAX_DURATION"`
	NatsReqMaxPending       int           `help:"Per-worker admission limit over NATS; backlog at the cap gives 429; 0 = off." default:"0" env:"INFERA_NATS_REQ_MAX_PENDING"`
	RequestMaxRetries       int           `help:"Retries on an alternate worker before the first response byte; 0 = fail fast." default:"1" env:"INFERA_REQUEST_MAX_RETRIES"`
	BreakerFailureThreshold int           `help:"Consecutive faults before a worker is removed from candidates; 0 disables." default:"3" env:"INFERA_BREAKER_FAILURE_THRESHOLD"`
	BreakerCooldownS        float64       `help:"Exclusion window before a probe, seconds." default:"5" env:"INFERA_BREAKER_COOLDOWN_S"`
	BreakerMaxCooldownS     float64       `help:"Cap on the doubling cooldown, seconds." default:"60" env:"INFERA_BREAKER_MAX_COOLDOWN_S"`

	MaxConnsPerWorker int           `help:"Max upstream connections per worker (each live stream holds one)." default:"4096" env:"INFERA_MAX_CONNS_PER_WORKER"`
	ConnectTimeout    time.Duration `help:"Upstream dial timeout." default:"3s" env:"INFERA_CONNECT_TIMEOUT"`
	LogLevel          string        `help:"debug, info, warn, error." default:"info" enum:"debug,info,warn,error" env:"INFERA_LOG_LEVEL"`
	CORSAllowOrigins  []string      `help:"Origins whose browser pages may call the API (CORS), comma-separated: 'https://app.example.com' or '*' for any; empty: no CORS headers." env:"INFERA_CORS_ALLOW_ORIGINS" sep:","`
	AccessLog         string        `help:"Write one JSON line per inference request to this file ('-': standard output; empty: off). Reopened on SIGHUP (log rotation)." env:"INFERA_ACCESS_LOG"`

	// Client-side limits (hardening).
	MaxConns             int           `help:"Max concurrent client connections; 0 = half the open-file limit (at most 262144); beyond it 503." default:"0" env:"INFERA_MAX_CONNS"`
	HeaderTimeout        time.Duration `help:"Time a client has to send its request headers (slowloris bound)." default:"10s" env:"INFERA_HEADER_TIMEOUT"`
	BodyTimeout          time.Duration `help:"Time a client has to send its request body once headers are in." default:"60s" env:"INFERA_BODY_TIMEOUT"`
	ClientIdleTimeout    time.Duration `help:"Idle keep-alive client connections are closed after this." default:"60s" env:"INFERA_CLIENT_IDLE_TIMEOUT"`
	ClientWriteTimeout   time.Duration `help:"A client that accepts no response bytes for this long is disconnected (not the worker's fault)." default:"60s" env:"INFERA_CLIENT_WRITE_TIMEOUT"`
	MaxInflightBodyBytes int64         `help:"Bound on request body memory held by all requests at once; beyond it requests get 503." default:"268435456" env:"INFERA_MAX_INFLIGHT_BODY_BYTES"`
	ShutdownTimeout      time.Duration `help:"On SIGTERM, how long in-flight requests and streams may take to finish." default:"30s" env:"INFERA_SHUTDOWN_TIMEOUT"`

	// Gateway state and administration.
	State              string        `help:"Where counters and management data live: empty for in-process, or redis://[:password@]host:port[/db]." env:"INFERA_STATE"`
	StateEndDelay      time.Duration `help:"With --state redis: how long a finished request's counter updates (reconciliation, seats given back) may wait in this router to ride in the next admission's round trip before they are sent alone; other routers see them at most this (plus a round trip) late. 0 sends them as soon as the connection is free; at most 1s." default:"2ms" env:"INFERA_STATE_END_DELAY"`
	AdminHost          string        `help:"Admin API and console listen address (loopback by default)." default:"127.0.0.1" env:"INFERA_ADMIN_HOST"`
	AdminPort          int           `help:"Admin API and console port; 0 disables the admin listener; --admin-port=-1 binds a free port the kernel picks (the startup log line 'admin API and console listening' gives the address)." default:"8081" env:"INFERA_ADMIN_PORT"`
	AdminAllowedHosts  []string      `help:"Host names the admin API answers for besides IP addresses, localhost, this machine's name and --admin-host (a leading dot allows subdomains, * any name); an API request naming another Host is refused (DNS rebinding)." env:"INFERA_ADMIN_ALLOWED_HOSTS" sep:","`
	AdminKey           string        `help:"Key for the admin API ('Authorization: Bearer <key>'); defaults to --api-key. Without either the admin listener stays off." env:"INFERA_ADMIN_KEY"`
	AdminSealKey       string        `help:"Key that seals upstream secrets in snapshots, exports and Redis; defaults to the admin key. Set it apart so that holders of the admin key cannot open exports; secrets the admin key sealed are still read." env:"INFERA_ADMIN_SEAL_KEY"`
	PersistSnapshotDir string        `help:"Directory for periodic snapshots of management data (config, users, templates); restored on start. Not used with --state redis." env:"INFERA_PERSIST_SNAPSHOT_DIR" type:"path"`
}

// BreakerCooldown returns the cooldown as a Duration.
func (s *Serve) BreakerCooldown() time.Duration {
	return time.Duration(s.BreakerCooldownS * float64(time.Second))
}

// BreakerMaxCooldown returns the max cooldown as a Duration.
func (s *Serve) BreakerMaxCooldown() time.Duration {
	return time.Duration(s.BreakerMaxCooldownS * float64(time.Second))
}

// AdminPortAny is the --admin-port that binds the admin listener to a free
// port the kernel picks (0 already turns the listener off). Several
// routers on one host, and tests that start routers as processes, use it
// instead of a port picked free beforehand, which another process may
// take before the router binds it; the router logs the address it bound.
const AdminPortAny = -1

// MaxStateEndDelay bounds --state-end-delay: ends (and, riding with them,
// lease renewals) wait at most this in the router.
const MaxStateEndDelay = time.Second

// Validate checks cross-flag consistency.
func (s *Serve) Validate() error {
	if s.Port < 0 || s.Port > 65535 {
		return fmt.Errorf("--port %d out of range", s.Port)
	}
	if s.MaxBodyBytes <= 0 {
		return fmt.Errorf("--max-body-bytes must be positive")
	}
	if s.MaxHeaderBytes < 0 || (s.MaxHeaderBytes > 0 && s.MaxHeaderBytes < 1024) || s.MaxHeaderBytes > 1<<20 {
		return fmt.Errorf("--max-header-bytes %d: want 1024 to 1048576", s.MaxHeaderBytes)
	}
	for _, o := range s.CORSAllowOrigins {
		if o != "*" && !validOrigin(o) {
			return fmt.Errorf("--cors-allow-origins: %q is not an origin (scheme://host[:port], or *)", o)
		}
	}
	if (s.TLSCertFile == "") != (s.TLSKeyFile == "") {
		return fmt.Errorf("--tls-cert-file and --tls-key-file go together")
	}
	for _, k := range []struct{ flag, v string }{{"--api-key", s.APIKey}, {"--admin-key", s.AdminKey}, {"--admin-seal-key", s.AdminSealKey}} {
		// No client can present a key that starts or ends with spaces or
		// a newline (header values lose them): every request got 401.
		if k.v != strings.TrimSpace(k.v) {
			return fmt.Errorf("%s starts or ends with white space (a newline from a secret file?): no client could present it; remove it", k.flag)
		}
	}
	if s.AuthLockoutFailures < 0 {
		return fmt.Errorf("--auth-lockout-failures %d: want 0 (off) or more", s.AuthLockoutFailures)
	}
	if s.AuthLockoutFailures > 0 && (s.AuthLockoutWindow < time.Second || s.AuthLockoutWindow > 24*time.Hour) {
		// Retry-After is whole seconds; a lockout of days would let one
		// guesser behind a NAT shut its neighbours out for as long.
		return fmt.Errorf("--auth-lockout-window %v: want 1s to 24h", s.AuthLockoutWindow)
	}
	if _, err := realip.Parse(s.TrustedProxies); err != nil {
		return fmt.Errorf("--trusted-proxies: %w", err)
	}
	if s.StateEndDelay < 0 || s.StateEndDelay > MaxStateEndDelay {
		// Lease renewals ride with the ends (govern): a delay near the
		// lease TTL (15 s, renewed every 5 s) would let held seats lapse.
		return fmt.Errorf("--state-end-delay %v: want 0 to %v", s.StateEndDelay, MaxStateEndDelay)
	}
	if s.RequestMaxRetries < 0 {
		return fmt.Errorf("--request-max-retries must be >= 0")
	}
	if s.NatsReqMaxPending < 0 || s.NatsReqIdleTimeout < 0 || s.NatsReqMaxDuration < 0 {
		return fmt.Errorf("--nats-req-max-pending, --nats-req-idle-timeout and --nats-req-max-duration must be >= 0 (0: off)")
	}
	for _, v := range []struct {
		flag string
		v    float64
	}{{"--kv-overlap-weight", s.KVOverlapWeight}, {"--kv-load-bound", s.KVLoadBound}, {"--router-temperature", s.RouterTemperature},
		{"--breaker-cooldown-s", s.BreakerCooldownS}, {"--breaker-max-cooldown-s", s.BreakerMaxCooldownS}} {
		if math.IsNaN(v.v) || math.IsInf(v.v, 0) {
			return fmt.Errorf("%s %v: want a finite number", v.flag, v.v)
		}
	}
	if s.BreakerFailureThreshold < 0 || s.BreakerCooldownS < 0 || s.BreakerMaxCooldownS < s.BreakerCooldownS {
		return fmt.Errorf("breaker: threshold >= 0 and 0 <= cooldown <= max cooldown")
	}
	if s.KVOverlapWeight < 0 {
		return fmt.Errorf("--kv-overlap-weight must be >= 0")
	}
	if s.KVBlockSize <= 0 || s.KVBlockSize > 1<<16 {
		return fmt.Errorf("--kv-block-size %d: want 1 to 65536 tokens", s.KVBlockSize)
	}
	if s.MaxConns < 0 || s.MaxInflightBodyBytes <= 0 {
		return fmt.Errorf("--max-conns must be >= 0 and --max-inflight-body-bytes positive")
	}
	if s.MaxInflightBodyBytes < int64(s.MaxBodyBytes) {
		// The budget holds every request's body at once: a body larger than
		// all of it is never read, and would get a 503 "retry later" on
		// every try, not the 413 it deserves.
		return fmt.Errorf("--max-inflight-body-bytes %d is below --max-body-bytes %d: a body between them could never be read; raise the first or lower the second",
			s.MaxInflightBodyBytes, s.MaxBodyBytes)
	}
	if s.AdminPort < AdminPortAny || s.AdminPort > 65535 {
		return fmt.Errorf("--admin-port %d out of range (0: off, -1: a free port)", s.AdminPort)
	}
	for _, k := range []struct{ flag, v, allowed string }{
		{"--discovery-backend", s.DiscoveryBackend, "kubernetes, etcd, static"},
		{"--request-transport", s.RequestTransport, "nats, http"},
		{"--kv-event-transport", s.KVEventTransport, "nats, zmq"},
	} {
		if k.v != "" && !slices.Contains(strings.Split(k.allowed, ", "), k.v) {
			return fmt.Errorf("%s must be one of %s but got %q", k.flag, k.allowed, k.v)
		}
	}
	return nil
}

// The routing doc's defaults of the discovery and transport knobs.
const (
	DefaultDiscoveryBackend = "kubernetes"
	DefaultRequestTransport = "nats"
	DefaultKVEventTransport = "nats"
)

// ResolveBackends fills the discovery and transport knobs left unset (no
// flag, no environment variable) with the routing doc's defaults:
// kubernetes discovery, requests and KV events over NATS. Static workers
// (staticWorkers: --workers, or workers in the config) are plain engines
// without a worker sidecar: with them the unset knobs are static
// discovery, http requests and zmq KV events. It returns a note on what it
// chose, for the startup log ("" when everything was set).
func (s *Serve) ResolveBackends(staticWorkers bool) string {
	var chose []string
	if s.DiscoveryBackend == "" {
		s.DiscoveryBackend = DefaultDiscoveryBackend
		if staticWorkers {
			s.DiscoveryBackend = "static"
		}
		chose = append(chose, "discovery "+s.DiscoveryBackend)
	}
	static := s.DiscoveryBackend == "static"
	if s.RequestTransport == "" {
		s.RequestTransport = DefaultRequestTransport
		if static {
			s.RequestTransport = "http"
		}
		chose = append(chose, "request transport "+s.RequestTransport)
	}
	if s.KVEventTransport == "" {
		s.KVEventTransport = DefaultKVEventTransport
		if static {
			s.KVEventTransport = "zmq"
		}
		chose = append(chose, "kv event transport "+s.KVEventTransport)
	}
	if len(chose) == 0 {
		return ""
	}
	why := "the defaults"
	if staticWorkers {
		why = "static workers given"
	}
	return strings.Join(chose, ", ") + " (" + why + ")"
}

// validOrigin reports a serialized origin: http or https, a host, an
// optional port, nothing else (RFC 6454).
func validOrigin(o string) bool {
	u, err := url.Parse(o)
	return err == nil && (u.Scheme == "http" || u.Scheme == "https") && u.Host != "" &&
		u.Path == "" && u.RawQuery == "" && u.Fragment == "" && u.User == nil && u.Opaque == "" &&
		o == u.Scheme+"://"+u.Host
}
