package config

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"strings"
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
}

// WorkerSpec describes one worker given statically (config file or --workers).
// Discovery backends produce the same shape (see sched.Record).
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

// PD configures prefill/decode disaggregation scheduling.
type PD struct {
	Mode                     string `json:"mode"`
	DecodePolicy             string `json:"decode_policy"`
	SGLangIndependentPairing bool   `json:"sglang_independent_pairing"`
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
		PD: PD{DecodePolicy: "least-requests"},
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
	}
}

// Parse decodes data over the defaults and validates the result.
// Unknown fields are rejected so that a typo never silently does nothing.
func Parse(data []byte) (*Config, error) {
	c := Default()
	data = bytes.TrimSpace(data)
	if len(data) > 0 {
		dec := json.NewDecoder(bytes.NewReader(data))
		dec.DisallowUnknownFields()
		if err := dec.Decode(c); err != nil {
			return nil, fmt.Errorf("cannot parse config: %w", err)
		}
	}
	c.normalize()
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

// Validate reports the first invalid setting.
func (c *Config) Validate() error {
	switch c.LoadBalancing.Algorithm {
	case "round-robin", "least-requests", "least-tokens":
	default:
		return fmt.Errorf("load_balancing.algorithm %q: want round-robin, least-requests or least-tokens", c.LoadBalancing.Algorithm)
	}
	sa := c.SessionAffinity
	if sa.Mode != "strong" && sa.Mode != "soft" {
		return fmt.Errorf("session_affinity.mode %q: want strong or soft", sa.Mode)
	}
	if sa.Header == "" {
		return fmt.Errorf("session_affinity.header must not be empty")
	}
	for i := 0; i < len(sa.Header); i++ {
		if c := sa.Header[i]; c <= ' ' || c >= 0x7f || strings.IndexByte("()<>@,;:\\\"/[]?={}", c) >= 0 {
			return fmt.Errorf("session_affinity.header %q is not a valid header name", sa.Header)
		}
	}
	if sa.TTLSeconds <= 0 || sa.MaxEntries <= 0 || sa.SoftMaxLoadRatio <= 0 {
		return fmt.Errorf("session_affinity: ttl_s, max_entries and soft_max_load_ratio must be positive")
	}
	pc := c.PrefixCache
	if pc.LoadToleranceFactor < 0 || pc.PendingRequestThreshold < 0 || pc.HitRateThreshold < 0 || pc.HitRateThreshold > 1 {
		return fmt.Errorf("prefix_cache: load_tolerance_factor and pending_request_threshold must be >= 0, hit_rate_threshold in [0,1]")
	}
	pi := c.PrefixIndex
	if pi.TTLSeconds <= 0 || pi.MaintenanceIntervalSeconds <= 0 {
		return fmt.Errorf("prefix_index: ttl_s and maintenance_interval_s must be positive")
	}
	if pi.MemoryThresholdRatio <= 0 || pi.MemoryThresholdRatio > 1 || pi.ReservedMemoryGB < 0 {
		return fmt.Errorf("prefix_index: memory_threshold_ratio must be in (0,1], reserved_memory_gb >= 0")
	}
	if pi.BlockSize < 1 || pi.BlockSize > 1<<20 {
		return fmt.Errorf("prefix_index.block_size %d: want 1..1048576", pi.BlockSize)
	}
	if c.PD.Mode != "" || c.PD.SGLangIndependentPairing {
		// Refuse rather than accept a setting that would do nothing.
		return fmt.Errorf("pd: PD disaggregation is not supported by this build yet; remove pd.mode and pd.sglang_independent_pairing (workers with role prefill/decode are routed as mixed)")
	}
	switch c.PD.DecodePolicy {
	case "round-robin", "least-requests", "least-tokens":
	default:
		return fmt.Errorf("pd.decode_policy %q: want round-robin, least-requests or least-tokens", c.PD.DecodePolicy)
	}
	st := c.SchedTimeout
	if st.WaitTimeoutMS < 0 || st.CooldownSeconds < 0 || st.ProbeWaitMS < 0 || st.TripFailureRatio <= 0 || st.TripFailureRatio > 1 {
		return fmt.Errorf("sched_timeout: wait_timeout_ms, cooldown_s, probe_wait_ms must be >= 0 and trip_failure_ratio in (0,1]")
	}
	for i, m := range c.ModelRouting.Mappings {
		if m.Pattern == "" || len(m.Services) == 0 {
			return fmt.Errorf("model_routing.mappings[%d]: pattern and services are required", i)
		}
		for j, svc := range m.Services {
			if svc == "" {
				return fmt.Errorf("model_routing.mappings[%d].services[%d] is empty", i, j)
			}
		}
	}
	for i, r := range c.Canary.Rules {
		if r.Model == "" || len(r.Targets) == 0 {
			return fmt.Errorf("canary.rules[%d]: model and targets are required", i)
		}
		sum := 0
		for j, t := range r.Targets {
			if t.Service == "" || t.Weight < 0 {
				return fmt.Errorf("canary.rules[%d].targets[%d]: service required and weight >= 0", i, j)
			}
			sum += t.Weight
		}
		if sum == 0 {
			return fmt.Errorf("canary.rules[%d]: weights sum to 0", i)
		}
	}
	t := c.Timeouts
	if t.StreamFirstPacketSeconds < 0 || t.StreamIdleSeconds < 0 || t.StreamTotalSeconds < 0 || t.NonStreamTotalSeconds < 0 {
		return fmt.Errorf("timeouts must be >= 0")
	}
	seen := map[string]bool{}
	for i, w := range c.Workers {
		if w.URL == "" {
			return fmt.Errorf("workers[%d]: url is required", i)
		}
		if !strings.HasPrefix(w.URL, "http://") && !strings.HasPrefix(w.URL, "https://") {
			return fmt.Errorf("workers[%d]: url %q must start with http:// or https://", i, w.URL)
		}
		switch w.Role {
		case "mixed", "prefill", "decode":
		default:
			return fmt.Errorf("workers[%d]: role %q: want mixed, prefill or decode", i, w.Role)
		}
		id := w.ID
		if id == "" {
			id = w.URL
		}
		if seen[id] {
			return fmt.Errorf("workers[%d]: duplicate id %q", i, id)
		}
		seen[id] = true
	}
	return nil
}
