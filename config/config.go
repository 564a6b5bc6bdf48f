package config

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"strings"

	"github.com/infera/infera/fleet"
)

// Config is the hot-reloadable configuration: one immutable, validated value.
//
// A Config is never mutated after Parse returns it; reloads build a new value
// and swap the pointer in Store. Readers load the pointer once per request.
type Config struct {
	// Workers is the static worker list (used with --discovery-backend static,
	// merged with --workers).
	Workers []WorkerSpec `json:"workers"`

	LoadBalancing   LoadBalancing   `json:"load_balancing"`
	SessionAffinity SessionAffinity `json:"session_affinity"`
	PrefixCache     PrefixCache     `json:"prefix_cache"`
	PrefixIndex     PrefixIndex     `json:"prefix_index"`
	PD              PD              `json:"pd"`
	SchedTimeout    SchedTimeout    `json:"sched_timeout"`
	ModelRouting    ModelRouting    `json:"model_routing"`
	Canary          Canary          `json:"canary"`
	Timeouts        Timeouts        `json:"timeouts"`
	Debug           Debug           `json:"debug"`

	// Gateway sections, each in a file of its own in this package:
	// governance.go, protocol.go, upstreams.go.
	RateLimit           RateLimit           `json:"rate_limit"`
	UserLimit           UserLimit           `json:"user_limit"`
	Users               []User              `json:"users"`
	Protocol            Protocol            `json:"protocol"`
	SplitProxy          SplitProxy          `json:"split_proxy"`
	Mirror              Mirror              `json:"mirror"`
	GlobalScheduling    GlobalScheduling    `json:"global_scheduling"`
	SmartModelSelection SmartModelSelection `json:"smart_model_selection"`

	// Backup is the "Data backup" section (store.go): snapshot frequency
	// and rotation of --persist-snapshot-dir.
	Backup Backup `json:"backup"`

	// LLMGateway and Storage are the configuration center doc's startup
	// configuration of data backup (store.go): the snapshot directory, read
	// once at start as --persist-snapshot-dir, and the platform's storage
	// mounts it lives in (infera mounts nothing; it checks the directory
	// is inside a mount).
	LLMGateway LLMGateway     `json:"llm_gateway"`
	Storage    []StorageMount `json:"storage"`
}

// WorkerSpec describes one worker given statically (config file or --workers).
// Discovery backends produce the same shape (see fleet.Record).
type WorkerSpec struct {
	ID               string   `json:"id"`
	URL              string   `json:"url"`
	Models           []string `json:"models"`
	Service          string   `json:"service"`
	Role             string   `json:"role"`
	KVEventsEndpoint string   `json:"kv_events_endpoint"`
	KVReplayEndpoint string   `json:"kv_replay_endpoint"`
	BlockSize        int      `json:"block_size"`
	DPSize           int      `json:"dp_size"`
	// Bootstrap is a PD prefill worker's bootstrap data, as infera worker
	// --bootstrap advertises it (docs/pd.md).
	Bootstrap *WorkerBootstrap `json:"bootstrap,omitempty"`
}

// Record returns the worker record the static discovery backend gives the
// fleet for w. Validate checks it as the fleet will, so that a reload is
// never accepted with a worker the fleet would then skip.
func (w *WorkerSpec) Record() fleet.Record {
	id := w.ID
	if id == "" {
		id = w.URL
	}
	var bootstrap json.RawMessage
	if w.Bootstrap != nil {
		bootstrap, _ = json.Marshal(w.Bootstrap) // plain strings and ints: cannot fail
	}
	return fleet.Record{
		ID: id, URL: strings.TrimRight(w.URL, "/"), Models: w.Models, Service: w.Service, Role: w.Role,
		KVEventsEndpoint: w.KVEventsEndpoint, KVReplayEndpoint: w.KVReplayEndpoint, BlockSize: w.BlockSize, DPSize: w.DPSize,
		Bootstrap: bootstrap, Status: fleet.StatusActive,
	}
}

// WorkerBootstrap is where a PD prefill engine serves its KV transfers.
type WorkerBootstrap struct {
	// PDMode is sglang or vllm.
	PDMode string `json:"pd_mode,omitempty"`
	// BootstrapHost defaults to the worker URL's host.
	BootstrapHost string `json:"bootstrap_host,omitempty"`
	// BootstrapPort is the engine's bootstrap (SGLang) or side-channel
	// (vLLM) port.
	BootstrapPort int `json:"bootstrap_port,omitempty"`
}

// LoadBalancing is layer 3 of the primary scheduling policy.
type LoadBalancing struct {
	// Algorithm is one of round-robin, least-requests, least-tokens.
	Algorithm string `json:"algorithm"`
}

// SessionAffinity is layer 1 of the primary scheduling policy: requests
// carrying the same session header value go to the same worker.
type SessionAffinity struct {
	Enabled bool `json:"enabled"`
	// Mode is strong (always the bound worker while it is routable) or soft
	// (skip it while its load exceeds the average x SoftMaxLoadRatio).
	// Default soft.
	Mode string `json:"mode"`
	// Header names the request header holding the session id. Default
	// X-Session-Id. Claude Code sends X-Claude-Code-Session-Id (one per
	// session) on its own; other clients must inject a header explicitly.
	Header string `json:"header"`
	// TTLSeconds is how long an unused binding lives. Default 1800.
	TTLSeconds float64 `json:"ttl_s"`
	// MaxEntries bounds the bindings; the least recently used go first.
	// Default 100000.
	MaxEntries int `json:"max_entries"`
	// SoftMaxLoadRatio applies in soft mode. Default 1.5.
	SoftMaxLoadRatio float64 `json:"soft_max_load_ratio"`
	// RequireSessionID rejects requests without the header with 400 before
	// they are queued (only when Enabled).
	RequireSessionID bool `json:"require_session_id"`
}

// PrefixCache is layer 2 of the primary scheduling policy: prefer the worker
// that has already seen the longest prefix of the prompt (prefix index).
type PrefixCache struct {
	Enabled bool `json:"enabled"`
	// LoadToleranceFactor: a hit worker whose load exceeds the average x
	// (1 + factor) is skipped. Default 0.3.
	LoadToleranceFactor float64 `json:"load_tolerance_factor"`
	// PendingRequestThreshold: a hit worker with more requests waiting for
	// their first token is skipped. Default 2.
	PendingRequestThreshold int `json:"pending_request_threshold"`
	// HitRateThreshold: a match shorter than this share of the prompt is a
	// miss. Default 0.50.
	HitRateThreshold float64 `json:"hit_rate_threshold"`
}

// PrefixIndex bounds the persistent prompt-prefix index (always fed; it
// also yields the theoretical hit-rate ceiling metric).
type PrefixIndex struct {
	// TTLSeconds is how long an unused block stays indexed. Default 259200.
	TTLSeconds float64 `json:"ttl_s"`
	// MaintenanceIntervalSeconds is the sweep period. Default 60.
	MaintenanceIntervalSeconds float64 `json:"maintenance_interval_s"`
	// MemoryThresholdRatio: evict (LRU) when process memory exceeds the
	// container memory x ratio. 0 means the default 0.70.
	MemoryThresholdRatio float64 `json:"memory_threshold_ratio"`
	// ReservedMemoryGB: evict when process memory exceeds the container
	// memory minus this. 0 means the default 1.5. The lower trigger wins.
	ReservedMemoryGB float64 `json:"reserved_memory_gb"`
	// BlockSize is the block length in bytes (default 128). Changing it
	// starts a fresh index; prompts shorter than a block are not indexed.
	BlockSize int `json:"block_size"`
}

// SchedTimeout is the scheduling wait timeout and scheduling circuit breaker.
type SchedTimeout struct {
	// BreakerEnabled: off keeps only the wait timeout. Default true.
	BreakerEnabled bool `json:"breaker_enabled"`
	// WaitTimeoutMS: a decision taking longer falls back to local
	// round-robin; 0 means no limit. Default 50.
	WaitTimeoutMS float64 `json:"wait_timeout_ms"`
	// TripFailureRatio: timeouts / decisions over a 10 s rolling window (at
	// least 10 samples) at or above it open the breaker. Default 0.5.
	TripFailureRatio float64 `json:"trip_failure_ratio"`
	// CooldownSeconds the breaker stays open before a probe. Default 10.
	CooldownSeconds float64 `json:"cooldown_s"`
	// ProbeWaitMS is the probe decision's time limit. Default 100.
	ProbeWaitMS float64 `json:"probe_wait_ms"`
}

// ModelRouting routes by the request's model field. Disabled, a request
// goes to the workers serving exactly its model.
type ModelRouting struct {
	Enabled bool `json:"enabled"`
	// DefaultModel serves requests without a model or with an unmatched one.
	DefaultModel string `json:"default_model"`
	// FuzzyMatch: org prefix ignored, abbreviations and '*' wildcards match
	// served models. Off (strict), only case and separator variants of the
	// exact name match. Default true.
	FuzzyMatch bool `json:"fuzzy_match"`
	// Mappings are tried top to bottom before model matching; the first
	// match routes only to its services.
	Mappings []ModelMapping `json:"mappings"`
}

// ModelMapping maps a model name pattern to services. The pattern is
// anchored and case-insensitive; '*' matches any run of characters, a plain
// string is an exact name.
type ModelMapping struct {
	Pattern  string   `json:"pattern"`
	Services []string `json:"services"`
}

// Canary distributes traffic across services by weight: rules are tried
// top to bottom, the first whose model pattern matches picks a service by
// deterministic smooth weighted round-robin (exact over every
// sum(weights)/gcd requests).
type Canary struct {
	Enabled bool         `json:"enabled"`
	Rules   []CanaryRule `json:"rules"`
}

// CanaryRule is one rule of the canary: first match wins.
type CanaryRule struct {
	Model   string         `json:"model"`
	Targets []CanaryTarget `json:"targets"`
}

// CanaryTarget is a weighted service.
type CanaryTarget struct {
	Service string `json:"service"`
	Weight  int    `json:"weight"`
}

// Timeouts are the request timeouts from the gateway to engines, in seconds;
// 0 means no limit.
type Timeouts struct {
	StreamFirstPacketSeconds float64 `json:"stream_first_packet_s"`
	StreamIdleSeconds        float64 `json:"stream_idle_s"`
	StreamTotalSeconds       float64 `json:"stream_total_s"`
	NonStreamTotalSeconds    float64 `json:"non_stream_total_s"`
}

// Debug holds opt-in observability switches.
type Debug struct {
	// DecisionHeader adds X-Infera-Worker and X-Infera-Route headers to responses.
	DecisionHeader bool `json:"decision_header"`
}

// Default returns the configuration with every documented default.
func Default() *Config {
	return &Config{
		LoadBalancing: LoadBalancing{Algorithm: "least-requests"},
		SessionAffinity: SessionAffinity{
			Mode:             "soft",
			Header:           "X-Session-Id",
			TTLSeconds:       1800,
			MaxEntries:       100000,
			SoftMaxLoadRatio: 1.5,
		},
		PrefixCache: PrefixCache{
			LoadToleranceFactor:     0.3,
			PendingRequestThreshold: 2,
			HitRateThreshold:        0.50,
		},
		PrefixIndex: PrefixIndex{
			TTLSeconds:                 259200,
			MaintenanceIntervalSeconds: 60,
			MemoryThresholdRatio:       0.70,
			ReservedMemoryGB:           1.5,
			BlockSize:                  128,
		},
		PD: defaultPD(),
		SchedTimeout: SchedTimeout{
			BreakerEnabled:   true,
			WaitTimeoutMS:    50,
			TripFailureRatio: 0.5,
			CooldownSeconds:  10,
			ProbeWaitMS:      100,
		},
		ModelRouting: ModelRouting{FuzzyMatch: true},
		Timeouts: Timeouts{
			StreamFirstPacketSeconds: 300,
			StreamIdleSeconds:        300,
			StreamTotalSeconds:       0,
			NonStreamTotalSeconds:    900,
		},
		RateLimit:           DefaultRateLimit(),
		UserLimit:           DefaultUserLimit(),
		Protocol:            defaultProtocol(),
		SplitProxy:          defaultSplitProxy(),
		Mirror:              defaultMirror(),
		GlobalScheduling:    defaultGlobalScheduling(),
		SmartModelSelection: defaultSmartModelSelection(),
		Backup:              DefaultBackup(),
	}
}

// Parse decodes data over the defaults and validates the result.
// Unknown fields and a key repeated in one object are rejected so that a
// typo or a pasted duplicate never silently does nothing.
// The document must be exactly one JSON object: an empty file (as a
// non-atomic writer leaves it mid-write), null, another type, or anything
// after the object is refused, so a reload never silently empties the fleet.
func Parse(data []byte) (*Config, error) { return ParseWith(data, nil) }

// ParseWith is Parse for a config file whose literal secrets may be
// sealed (enc:v2:..., written by an admin API write through Store.Apply):
// codec opens each at its entry and address. Without a codec, or where it
// cannot open one, a sealed secret is refused at its path.
func ParseWith(data []byte, codec SecretCodec) (*Config, error) {
	// A UTF-8 byte order mark (some Windows editors write one) is ignored,
	// as RFC 8259 section 8.1 allows.
	data = bytes.TrimSpace(bytes.TrimPrefix(data, []byte("\xef\xbb\xbf")))
	if len(data) == 0 {
		return nil, &FieldError{Msg: "config is empty (an interrupted write?): want a JSON object, {} for all defaults"}
	}
	if data[0] != '{' {
		return nil, &FieldError{Msg: "config must be a JSON object"}
	}
	c, err := decodeConfig(data, Default)
	if err != nil {
		return nil, err
	}
	if err := RepeatedKey(data, ""); err != nil {
		return nil, err
	}
	c.normalize()
	if codec != nil {
		c.openSealed(codec)
	}
	if err := c.unopenedSealed(); err != nil {
		return nil, err
	}
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return c, nil
}

// ReadFile reads and parses a config file.
func ReadFile(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("cannot read config %q: %w", path, err)
	}
	c, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("config %q: %w", path, err)
	}
	return c, nil
}

func (c *Config) normalize() {
	if c.PrefixIndex.MemoryThresholdRatio == 0 {
		c.PrefixIndex.MemoryThresholdRatio = 0.70
	}
	if c.PrefixIndex.ReservedMemoryGB == 0 {
		c.PrefixIndex.ReservedMemoryGB = 1.5
	}
	c.LoadBalancing.Algorithm = strings.ToLower(c.LoadBalancing.Algorithm)
	c.SessionAffinity.Mode = strings.ToLower(c.SessionAffinity.Mode)
	for i := range c.Workers {
		w := &c.Workers[i]
		if w.Role == "" {
			w.Role = "mixed"
		}
	}
}

// Validate reports the first invalid setting as a *FieldError naming its
// JSON path (for example session_affinity.ttl_s).
func (c *Config) Validate() error {
	switch c.LoadBalancing.Algorithm {
	case "round-robin", "least-requests", "least-tokens":
	default:
		return fieldErr("load_balancing.algorithm", "%q: want round-robin, least-requests or least-tokens", c.LoadBalancing.Algorithm)
	}
	sa := c.SessionAffinity
	if sa.Mode != "strong" && sa.Mode != "soft" {
		return fieldErr("session_affinity.mode", "%q: want strong or soft", sa.Mode)
	}
	if sa.Header == "" {
		return fieldErr("session_affinity.header", "must not be empty")
	}
	if !ValidHeaderName(sa.Header) {
		return fieldErr("session_affinity.header", "%s is not a valid header name", quotedKey(sa.Header))
	}
	if credentialHeader(sa.Header) {
		// Sessions would be keyed by the client's key: the affinity table
		// would hold it, and every request of one key would be one session.
		return fieldErr("session_affinity.header", "%q carries the client's credentials, not a session id", sa.Header)
	}
	if err := seconds("session_affinity.ttl_s", sa.TTLSeconds, true); err != nil {
		return err
	}
	if sa.MaxEntries <= 0 {
		return fieldErr("session_affinity.max_entries", "must be positive")
	}
	if sa.SoftMaxLoadRatio <= 0 || sa.SoftMaxLoadRatio > 1e6 {
		return fieldErr("session_affinity.soft_max_load_ratio", "must be in (0, 1e6]")
	}
	pc := c.PrefixCache
	if pc.LoadToleranceFactor < 0 || pc.LoadToleranceFactor > 1e6 {
		return fieldErr("prefix_cache.load_tolerance_factor", "must be in [0, 1e6]")
	}
	if pc.PendingRequestThreshold < 0 {
		return fieldErr("prefix_cache.pending_request_threshold", "must be >= 0")
	}
	if pc.HitRateThreshold < 0 || pc.HitRateThreshold > 1 {
		return fieldErr("prefix_cache.hit_rate_threshold", "must be in [0, 1]")
	}
	pi := c.PrefixIndex
	if err := seconds("prefix_index.ttl_s", pi.TTLSeconds, true); err != nil {
		return err
	}
	if err := seconds("prefix_index.maintenance_interval_s", pi.MaintenanceIntervalSeconds, true); err != nil {
		return err
	}
	if pi.MaintenanceIntervalSeconds < 0.01 {
		// Each sweep walks the index: at 1e-6 s an empty index cost 14%
		// of a core.
		return fieldErr("prefix_index.maintenance_interval_s", "%g s is too short (at least 0.01 s)", pi.MaintenanceIntervalSeconds)
	}
	if pi.MemoryThresholdRatio <= 0 || pi.MemoryThresholdRatio > 1 {
		return fieldErr("prefix_index.memory_threshold_ratio", "must be in (0, 1]")
	}
	if pi.ReservedMemoryGB < 0 || pi.ReservedMemoryGB > 1<<20 {
		return fieldErr("prefix_index.reserved_memory_gb", "must be in [0, 1048576]")
	}
	if pi.BlockSize < 1 || pi.BlockSize > 1<<20 {
		return fieldErr("prefix_index.block_size", "%d: want 1..1048576", pi.BlockSize)
	}
	if err := c.PD.validate(); err != nil {
		return err
	}
	st := c.SchedTimeout
	if err := millis("sched_timeout.wait_timeout_ms", st.WaitTimeoutMS); err != nil {
		return err
	}
	if err := millis("sched_timeout.probe_wait_ms", st.ProbeWaitMS); err != nil {
		return err
	}
	if err := seconds("sched_timeout.cooldown_s", st.CooldownSeconds, false); err != nil {
		return err
	}
	if st.TripFailureRatio <= 0 || st.TripFailureRatio > 1 {
		return fieldErr("sched_timeout.trip_failure_ratio", "must be in (0, 1]")
	}
	for i, m := range c.ModelRouting.Mappings {
		p := fmt.Sprintf("model_routing.mappings[%d]", i)
		if m.Pattern == "" {
			return fieldErr(p+".pattern", "is required")
		}
		if strings.TrimSpace(m.Pattern) != m.Pattern {
			// Model names are matched as written: it would never match.
			return fieldErr(p+".pattern", "%q has leading or trailing spaces", m.Pattern)
		}
		if len(m.Services) == 0 {
			return fieldErr(p+".services", "at least one service is required")
		}
		for j, svc := range m.Services {
			if svc == "" {
				return fieldErr(fmt.Sprintf("%s.services[%d]", p, j), "is empty")
			}
		}
	}
	for i, r := range c.Canary.Rules {
		p := fmt.Sprintf("canary.rules[%d]", i)
		if r.Model == "" {
			return fieldErr(p+".model", "is required")
		}
		if len(r.Targets) == 0 {
			return fieldErr(p+".targets", "at least one target is required")
		}
		sum := 0
		for j, t := range r.Targets {
			tp := fmt.Sprintf("%s.targets[%d]", p, j)
			if t.Service == "" {
				return fieldErr(tp+".service", "is required")
			}
			if t.Weight < 0 || t.Weight > 1<<20 {
				return fieldErr(tp+".weight", "must be in [0, 1048576]")
			}
			sum += t.Weight
		}
		if sum == 0 {
			return fieldErr(p+".targets", "weights sum to 0")
		}
	}
	t := c.Timeouts
	for _, f := range []struct {
		path string
		v    float64
	}{
		{"timeouts.stream_first_packet_s", t.StreamFirstPacketSeconds},
		{"timeouts.stream_idle_s", t.StreamIdleSeconds},
		{"timeouts.stream_total_s", t.StreamTotalSeconds},
		{"timeouts.non_stream_total_s", t.NonStreamTotalSeconds},
	} {
		if err := seconds(f.path, f.v, false); err != nil {
			return err
		}
	}
	seen := map[string]bool{}
	for i, w := range c.Workers {
		p := fmt.Sprintf("workers[%d]", i)
		if w.URL == "" {
			return fieldErr(p+".url", "is required")
		}
		if !strings.HasPrefix(w.URL, "http://") && !strings.HasPrefix(w.URL, "https://") {
			return fieldErr(p+".url", "%q must start with http:// or https://", w.URL)
		}
		switch w.Role {
		case "mixed", "prefill", "decode":
		default:
			return fieldErr(p+".role", "%q: want mixed, prefill or decode", w.Role)
		}
		if b := w.Bootstrap; b != nil {
			if b.PDMode != "" && b.PDMode != "sglang" && b.PDMode != "vllm" {
				return fieldErr(p+".bootstrap.pd_mode", "%q: want sglang or vllm", b.PDMode)
			}
			if b.BootstrapPort < 0 || b.BootstrapPort > 65535 {
				return fieldErr(p+".bootstrap.bootstrap_port", "%d out of range", b.BootstrapPort)
			}
		}
		r := w.Record()
		if err := r.Validate(); err != nil {
			// The fleet's reason names the field and never the url.
			return fieldErr(p, "%v", err)
		}
		if seen[r.ID] {
			return fieldErr(p+".id", "duplicate id %q", r.ID)
		}
		seen[r.ID] = true
	}
	if err := c.RateLimit.validate(); err != nil {
		return err
	}
	if err := c.UserLimit.validate(c); err != nil {
		return err
	}
	if err := c.Protocol.validate(); err != nil {
		return err
	}
	if err := c.validateUpstreams(); err != nil {
		return err
	}
	if err := c.Backup.Validate(); err != nil {
		return err
	}
	return c.validateStartup()
}

// credentialHeader reports whether name is a header that carries a
// client's credentials (compared case-insensitively).
func credentialHeader(name string) bool {
	for _, h := range [...]string{"Authorization", "Proxy-Authorization", "X-Api-Key", "Api-Key", "Cookie"} {
		if strings.EqualFold(name, h) {
			return true
		}
	}
	return false
}
