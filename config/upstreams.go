package config

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"reflect"
	"strings"
)

// Sections that send traffic somewhere other than a local engine: split
// proxy, traffic mirroring, global scheduling, smart model selection.
// docs/upstreams.md is the reference for every field below.

// SplitStrategy is how the split proxy picks a proxy for a request.
type SplitStrategy string

const (
	// SplitWeight splits requests by the proxies' weights, whatever their
	// model.
	SplitWeight SplitStrategy = "weight"
	// SplitPrefix picks the first proxy (in list order) whose model rules
	// match the request's model; unmatched requests go to the local service.
	SplitPrefix SplitStrategy = "prefix"
)

// ProxyStatus says whether a proxy entry receives requests.
type ProxyStatus string

const (
	// ProxyEnabled (or empty) entries receive requests.
	ProxyEnabled ProxyStatus = "enabled"
	// ProxyDisabled entries receive nothing, not even failover retries.
	ProxyDisabled ProxyStatus = "disabled"
)

// SplitProxy forwards a share of requests to external OpenAI-compatible
// upstream APIs, next to the local fleet, with failover between them.
type SplitProxy struct {
	Enabled bool `json:"enabled"`
	// Strategy is weight (default) or prefix.
	Strategy SplitStrategy `json:"strategy"`
	// Proxies holds at least one local entry (the local fleet) and any
	// number of external upstreams. List order is the order of prefix
	// matching and of failover.
	Proxies []Proxy `json:"proxies"`
	// NonStreamFirstByteMS bounds the wait for an external entry's answer
	// to a non-streamed request (its first byte comes with the whole
	// answer), within timeouts.non_stream_total_s: past it the attempt
	// fails as the entry's timeout and the request fails over. A stream's
	// first packet has timeouts.stream_first_packet_s. 0: only
	// timeouts.non_stream_total_s. Default 300000.
	NonStreamFirstByteMS float64 `json:"non_stream_first_byte_ms"`
	// TimeoutBackoffMS is how long an external entry that timed out before
	// its first byte is left out of the plans (the weighted draw, failover,
	// a session bound to it); then one request tries it: its answer
	// readmits the entry, its failure keeps it out for twice as long, up
	// to TimeoutMaxBackoffMS. 0: only the entry's breaker keeps it out.
	// Defaults 5000 and 60000.
	TimeoutBackoffMS    float64 `json:"timeout_backoff_ms"`
	TimeoutMaxBackoffMS float64 `json:"timeout_max_backoff_ms"`
}

// Proxy is one entry of the split proxy list.
type Proxy struct {
	// Name labels the entry in metrics, logs and the decision header.
	// Default: "local" for the local service, the address's host:port for
	// an external one. Unique within the list.
	Name string `json:"name"`
	// Local marks the "local service" entry: the gateway's own fleet. It
	// takes no address or API key and cannot be a failover target.
	Local bool `json:"local"`
	// Status is enabled (default when empty) or disabled.
	Status ProxyStatus `json:"status"`
	// Address is the external upstream's base URL (http or https), with or
	// without a trailing /v1; the request's path is appended.
	Address string `json:"address"`
	// APIKey is sent upstream as "Authorization: Bearer <key>", replacing
	// the client's credentials. See Secret for the accepted forms.
	APIKey Secret `json:"api_key"`
	// Weight is the entry's share under the weight strategy (0 receives no
	// primary traffic). Ignored under prefix.
	Weight int `json:"weight"`
	// ModelRules are tried against the request's model under the prefix
	// strategy: case-insensitive; a rule containing '*' is an anchored
	// wildcard pattern ('*' matches any run), a rule without '*' matches
	// models that start with it. Ignored under weight.
	ModelRules []string `json:"model_rules"`
	// Failover makes the entry a retry target, in list order, when the
	// chosen proxy is unavailable or fails before the first response byte.
	Failover bool `json:"failover"`
}

// Active reports whether the entry receives requests.
func (p *Proxy) Active() bool { return p.Status != ProxyDisabled }

// Label returns the entry's name for metrics and logs: Name, else "local"
// for the local service, else the address's host:port. It allocates for
// unnamed external entries: call it when a config is compiled, not per
// request.
func (p *Proxy) Label() string {
	switch {
	case p.Name != "":
		return p.Name
	case p.Local:
		return "local"
	}
	if u, err := url.Parse(p.Address); err == nil && u.Host != "" {
		return u.Host
	}
	return p.Address
}

// Mirror copies sampled requests to a target address, asynchronously, for
// canary validation and performance comparison (package mirror).
type Mirror struct {
	Enabled bool `json:"enabled"`
	// TargetAddress is the base URL (http or https) receiving mirrored
	// requests; the request's path is appended.
	TargetAddress string `json:"target_address"`
	// TargetModel replaces the model of mirrored requests; empty keeps the
	// client's model.
	TargetModel string `json:"target_model"`
	// SamplingRatio is the percentage (0-100, fractions allowed) of
	// requests mirrored.
	SamplingRatio float64 `json:"sampling_ratio"`
	// AuthToken is sent to the target as "Authorization: Bearer <token>".
	// The client's own credentials never reach the target.
	AuthToken Secret `json:"auth_token"`
	// TimeoutMS bounds a mirrored request from the moment it is sampled,
	// queueing included; an expired one is dropped. Default 60000.
	TimeoutMS float64 `json:"timeout_ms"`
	// LogRecording writes one structured log line per mirrored request
	// (status, latency, token counts).
	LogRecording bool `json:"log_recording"`
	// QueueSize bounds sampled requests waiting for a sender; beyond it they
	// are dropped and counted. Default 1024, at most MaxMirrorQueue.
	QueueSize int `json:"queue_size"`
	// Concurrency bounds mirrored requests in flight. Default 64, at most
	// MaxMirrorConcurrency.
	Concurrency int `json:"concurrency"`
	// MaxBufferBytes bounds the bytes the mirror holds: request copies
	// (queued and in flight, with the target_model copy of one being
	// sent) and the kept parts of the answers being read;
	// a sampled request that would exceed it is dropped as for a full
	// queue, an answer is read on without being kept. 0 means the default, 268435456
	// (256 MiB); see BufferBytes.
	MaxBufferBytes int64 `json:"max_buffer_bytes"`
}

// DefaultMirrorBufferBytes is mirror.max_buffer_bytes when 0.
const DefaultMirrorBufferBytes = 256 << 20

// BufferBytes returns MaxBufferBytes, or its default when 0.
func (m *Mirror) BufferBytes() int64 {
	if m.MaxBufferBytes <= 0 {
		return DefaultMirrorBufferBytes
	}
	return m.MaxBufferBytes
}

// Bounds of the mirror's queue and concurrency (the queue's buffer is
// allocated once at its maximum so that queue_size is hot-reloadable).
const (
	MaxMirrorQueue       = 65536
	MaxMirrorConcurrency = 4096
)

// GlobalScheduling forwards requests to other regions' gateways when the
// local fleet is saturated (package upstream: Poller).
type GlobalScheduling struct {
	Enabled bool `json:"enabled"`
	// Members are infera gateways in other regions.
	Members []Member `json:"members"`
	// PollIntervalMS is how often each member's capacity is polled.
	// Default 1000.
	PollIntervalMS float64 `json:"poll_interval_ms"`
	// PollTimeoutMS bounds one capacity poll. Default 500.
	PollTimeoutMS float64 `json:"poll_timeout_ms"`
	// StaleAfterMS: a member whose last good report is older is not a
	// candidate. Default 5000; at least poll_interval_ms.
	StaleAfterMS float64 `json:"stale_after_ms"`
	// MinFree is the free capacity a member must report (less what was
	// forwarded to it since) to be a candidate. Default 1.
	MinFree int `json:"min_free"`
	// ForwardStreamFirstPacketMS bounds the wait for a forwarded stream's
	// first event (the member's time to first token): past it the forward
	// fails over and the member is marked failed, as a failed poll marks
	// it. 0: only timeouts.stream_first_packet_s. Default 30000.
	ForwardStreamFirstPacketMS float64 `json:"forward_stream_first_packet_ms"`
	// ForwardNonStreamFirstByteMS is the same bound for a forwarded
	// non-streamed request, whose first byte comes with the whole answer.
	// 0: only timeouts.non_stream_total_s. Default 300000.
	ForwardNonStreamFirstByteMS float64 `json:"forward_non_stream_first_byte_ms"`
	// ForwardFailureBackoffMS is how long a member whose forward failed as
	// its fault (unreachable, a timeout, an invalid answer, 5xx, the
	// gateway's key refused) takes no forward, whatever its capacity
	// polls say; then one forward tries it: its success readmits the
	// member, its failure keeps it out for twice as long, up to
	// ForwardFailureMaxBackoffMS. 0: a failed forward drops the member
	// until its next good poll only. Defaults 5000 and 60000.
	ForwardFailureBackoffMS    float64 `json:"forward_failure_backoff_ms"`
	ForwardFailureMaxBackoffMS float64 `json:"forward_failure_max_backoff_ms"`
	// ForwardStallMS: a member that has had a forward waiting for its
	// first byte this long, and answered no forward meanwhile, takes no
	// new forward until it answers one (or its waiting forwards end).
	// The waiting forwards keep their own bounds. A member that is slow
	// but answers keeps its requests. 0 turns it off. Default 10000.
	ForwardStallMS float64 `json:"forward_stall_ms"`
}

// Member is one gateway of another region.
type Member struct {
	// Name labels the member in metrics and logs; unique.
	Name string `json:"name"`
	// URL is the member's base URL (http or https).
	URL string `json:"url"`
	// APIKey authenticates this gateway to the member, for capacity polls
	// and forwarded requests ("Authorization: Bearer <key>").
	APIKey Secret `json:"api_key"`
}

// SmartModelSelection asks a classifier for a tier (L1/L2/L3) per request
// and rewrites the request's model to the tier's model (package classify).
type SmartModelSelection struct {
	Enabled bool `json:"enabled"`
	// ClassifierURL is the classifier's endpoint (http or https), POSTed
	// {"model","text","text_bytes"}, answering {"tier":"L1"|"L2"|"L3"}.
	ClassifierURL string `json:"classifier_url"`
	// ClassifierAPIKey, when set, is sent as "Authorization: Bearer <key>".
	ClassifierAPIKey Secret `json:"classifier_api_key"`
	// TimeoutMS bounds the classifier call; on expiry the fallback tier is
	// used. Default 300.
	TimeoutMS float64 `json:"timeout_ms"`
	// FallbackTier is used when the classifier fails, times out or answers
	// something else than a tier. Default L2.
	FallbackTier string `json:"fallback_tier"`
	// Tiers maps each tier to the model requests of that tier are sent to.
	Tiers TierModels `json:"tiers"`
	// MatchModels restricts the feature to requests whose model matches one
	// of these patterns (as model_routing: anchored, case-insensitive, '*'
	// wildcard); empty applies it to every request.
	MatchModels []string `json:"match_models"`
	// MaxTextBytes caps the conversation text sent to the classifier (its
	// last bytes are kept; the full length is sent as text_bytes).
	// Default 8192.
	MaxTextBytes int `json:"max_text_bytes"`
	// BreakerFailureThreshold is the number of classifier calls in a row
	// that fail (timeout, error, a status other than 200, an answer that
	// is no tier) before the classifier is skipped: requests take the
	// fallback tier at once for the cooldown, then one request probes it.
	// 0 disables the breaker. Default 3.
	BreakerFailureThreshold int `json:"breaker_failure_threshold"`
	// BreakerCooldownMS is how long the classifier is skipped once the
	// breaker opens; it doubles after each failed probe, up to
	// BreakerMaxCooldownMS. Defaults 5000 and 60000.
	BreakerCooldownMS    float64 `json:"breaker_cooldown_ms"`
	BreakerMaxCooldownMS float64 `json:"breaker_max_cooldown_ms"`
}

// TierModels maps the L1/L2/L3 tiers to model names.
type TierModels struct {
	L1 string `json:"L1"`
	L2 string `json:"L2"`
	L3 string `json:"L3"`
}

// Model returns the model of tier "L1", "L2" or "L3", else "".
func (t *TierModels) Model(tier string) string {
	switch tier {
	case "L1":
		return t.L1
	case "L2":
		return t.L2
	case "L3":
		return t.L3
	}
	return ""
}

// SecretSlot is one secret of a config with the upstream it is sent to.
type SecretSlot struct {
	// Path is the setting's JSON path, as EncodeJSON names it
	// (split_proxy.proxies[1].api_key).
	Path string
	// Owner names the upstream entry across versions of the config: the
	// section, and in a list the entry's name (a proxy's Label, a member's
	// Name), so an entry that moves in its list keeps its owner.
	Owner string
	// Address is where the secret is sent (the entry's base URL).
	Address string
	// Secret points into the config.
	Secret *Secret
}

// AppendSecretSlots appends every secret setting of c (set or not) to dst.
func (c *Config) AppendSecretSlots(dst []SecretSlot) []SecretSlot {
	for i := range c.SplitProxy.Proxies {
		p := &c.SplitProxy.Proxies[i]
		dst = append(dst, SecretSlot{Path: fmt.Sprintf("split_proxy.proxies[%d].api_key", i),
			Owner: "split_proxy.proxies/" + p.Label(), Address: p.Address, Secret: &p.APIKey})
	}
	dst = append(dst, SecretSlot{Path: "mirror.auth_token", Owner: "mirror",
		Address: c.Mirror.TargetAddress, Secret: &c.Mirror.AuthToken})
	for i := range c.GlobalScheduling.Members {
		m := &c.GlobalScheduling.Members[i]
		dst = append(dst, SecretSlot{Path: fmt.Sprintf("global_scheduling.members[%d].api_key", i),
			Owner: "global_scheduling.members/" + m.Name, Address: m.URL, Secret: &m.APIKey})
	}
	return append(dst, SecretSlot{Path: "smart_model_selection.classifier_api_key", Owner: "smart_model_selection",
		Address: c.SmartModelSelection.ClassifierURL, Secret: &c.SmartModelSelection.ClassifierAPIKey})
}

// Default values of the four sections; config.Default() uses them.
func defaultSplitProxy() SplitProxy {
	return SplitProxy{Strategy: SplitWeight, NonStreamFirstByteMS: 300000, TimeoutBackoffMS: 5000, TimeoutMaxBackoffMS: 60000}
}

func defaultMirror() Mirror {
	return Mirror{TimeoutMS: 60000, QueueSize: 1024, Concurrency: 64, MaxBufferBytes: DefaultMirrorBufferBytes}
}

func defaultGlobalScheduling() GlobalScheduling {
	return GlobalScheduling{PollIntervalMS: 1000, PollTimeoutMS: 500, StaleAfterMS: 5000, MinFree: 1,
		ForwardStreamFirstPacketMS: 30000, ForwardNonStreamFirstByteMS: 300000,
		ForwardFailureBackoffMS: 5000, ForwardFailureMaxBackoffMS: 60000, ForwardStallMS: 10000}
}

func defaultSmartModelSelection() SmartModelSelection {
	return SmartModelSelection{TimeoutMS: 300, FallbackTier: "L2", MaxTextBytes: 8192,
		BreakerFailureThreshold: 3, BreakerCooldownMS: 5000, BreakerMaxCooldownMS: 60000}
}

// validateUpstreams validates the four sections and their interplay. The
// zero value of each section (disabled, empty) is valid.
func (c *Config) validateUpstreams() error {
	if err := c.SplitProxy.validate(); err != nil {
		return err
	}
	if err := c.Mirror.validate(); err != nil {
		return err
	}
	if err := c.GlobalScheduling.validate(); err != nil {
		return err
	}
	if err := c.SmartModelSelection.validate(); err != nil {
		return err
	}
	if c.SmartModelSelection.Enabled && c.SplitProxy.Enabled && c.SplitProxy.Strategy == SplitWeight {
		return fieldErr("smart_model_selection.enabled",
			"smart model selection cannot be used with split_proxy.strategy %q: weight-based splitting does not distinguish models, so the tier's model would be ignored; switch split_proxy.strategy to %q or disable split_proxy",
			SplitWeight, SplitPrefix)
	}
	return nil
}

func (s *SplitProxy) validate() error {
	switch s.Strategy {
	case SplitWeight, SplitPrefix:
	case "":
		if s.Enabled {
			return fieldErr("split_proxy.strategy", "is required: weight or prefix")
		}
	default:
		return fieldErr("split_proxy.strategy", "%q: want weight or prefix", s.Strategy)
	}
	for _, f := range []struct {
		path string
		v    float64
	}{
		{"split_proxy.non_stream_first_byte_ms", s.NonStreamFirstByteMS},
		{"split_proxy.timeout_backoff_ms", s.TimeoutBackoffMS},
		{"split_proxy.timeout_max_backoff_ms", s.TimeoutMaxBackoffMS},
	} {
		if err := millis(f.path, f.v); err != nil {
			return err
		}
	}
	if s.TimeoutMaxBackoffMS < s.TimeoutBackoffMS {
		return fieldErr("split_proxy.timeout_max_backoff_ms", "%g is below timeout_backoff_ms (%g)", s.TimeoutMaxBackoffMS, s.TimeoutBackoffMS)
	}
	if !s.Enabled && len(s.Proxies) == 0 {
		return nil
	}
	locals, weights := 0, 0
	labels := make(map[string]int, len(s.Proxies))
	for i := range s.Proxies {
		p := &s.Proxies[i]
		path := fmt.Sprintf("split_proxy.proxies[%d]", i)
		switch p.Status {
		case "", ProxyEnabled, ProxyDisabled:
		default:
			return fieldErr(path+".status", "%q: want enabled or disabled", p.Status)
		}
		if p.Local {
			locals++
			if p.Address != "" {
				return fieldErr(path+".address", "the local service takes no address (it is this gateway's fleet)")
			}
			if p.APIKey.IsSet() || p.APIKey.err != "" {
				return fieldErr(path+".api_key", "the local service takes no API key")
			}
			if p.Failover {
				return fieldErr(path+".failover", "the local service cannot be a failover target")
			}
		} else {
			if p.Address == "" {
				return fieldErr(path+".address", "is required for an external proxy")
			}
			if err := checkBaseURL(path+".address", p.Address); err != nil {
				return err
			}
			if err := p.APIKey.check(path + ".api_key"); err != nil {
				return err
			}
		}
		if p.Name != "" && !validLabel(p.Name) {
			return fieldErr(path+".name", "must be 1-64 characters of letters, digits, '.', '_', '-', ':'")
		}
		if j, dup := labels[p.Label()]; dup {
			return fieldErr(path+".name", "duplicate name %q (also entry %d); set distinct names", p.Label(), j)
		}
		labels[p.Label()] = i
		if p.Weight < 0 || p.Weight > 1<<20 {
			return fieldErr(path+".weight", "must be in [0, 1048576]")
		}
		if p.Active() {
			weights += p.Weight
		}
		for j, r := range p.ModelRules {
			if strings.TrimSpace(r) == "" {
				return fieldErr(fmt.Sprintf("%s.model_rules[%d]", path, j), "is empty")
			}
			if len(r) > 256 {
				return fieldErr(fmt.Sprintf("%s.model_rules[%d]", path, j), "longer than 256 bytes")
			}
		}
	}
	if locals == 0 {
		return fieldErr("split_proxy.proxies", "must contain at least one local service entry ({\"local\": true}) for this gateway's own fleet")
	}
	if s.Enabled && s.Strategy == SplitWeight && weights == 0 {
		return fieldErr("split_proxy.proxies", "the weights of the enabled proxies sum to 0: under the weight strategy no proxy would receive requests")
	}
	return nil
}

func (m *Mirror) validate() error {
	if m.TargetAddress != "" {
		if err := checkBaseURL("mirror.target_address", m.TargetAddress); err != nil {
			return err
		}
	} else if m.Enabled {
		return fieldErr("mirror.target_address", "is required when mirroring is enabled")
	}
	if len(m.TargetModel) > 256 {
		return fieldErr("mirror.target_model", "longer than 256 bytes")
	}
	if !(m.SamplingRatio >= 0 && m.SamplingRatio <= 100) {
		return fieldErr("mirror.sampling_ratio", "must be a percentage in [0, 100]")
	}
	if err := m.AuthToken.check("mirror.auth_token"); err != nil {
		return err
	}
	if err := millis("mirror.timeout_ms", m.TimeoutMS); err != nil {
		return err
	}
	if m.QueueSize < 0 || m.QueueSize > MaxMirrorQueue {
		return fieldErr("mirror.queue_size", "must be in [1, %d]", MaxMirrorQueue)
	}
	if m.Concurrency < 0 || m.Concurrency > MaxMirrorConcurrency {
		return fieldErr("mirror.concurrency", "must be in [1, %d]", MaxMirrorConcurrency)
	}
	if m.MaxBufferBytes < 0 || m.MaxBufferBytes > 1<<40 {
		return fieldErr("mirror.max_buffer_bytes", "must be in [0, %d] (0: the default)", int64(1)<<40)
	}
	if m.Enabled {
		if m.TimeoutMS == 0 {
			return fieldErr("mirror.timeout_ms", "must be positive")
		}
		if m.QueueSize == 0 {
			return fieldErr("mirror.queue_size", "must be in [1, %d]", MaxMirrorQueue)
		}
		if m.Concurrency == 0 {
			return fieldErr("mirror.concurrency", "must be in [1, %d]", MaxMirrorConcurrency)
		}
	}
	return nil
}

func (g *GlobalScheduling) validate() error {
	if g.Enabled && len(g.Members) == 0 {
		return fieldErr("global_scheduling.members", "at least one member is required when global scheduling is enabled")
	}
	names := make(map[string]int, len(g.Members))
	for i := range g.Members {
		m := &g.Members[i]
		path := fmt.Sprintf("global_scheduling.members[%d]", i)
		if m.Name == "" {
			return fieldErr(path+".name", "is required")
		}
		if !validLabel(m.Name) {
			return fieldErr(path+".name", "must be 1-64 characters of letters, digits, '.', '_', '-', ':'")
		}
		if j, dup := names[m.Name]; dup {
			return fieldErr(path+".name", "duplicate name %q (also member %d)", m.Name, j)
		}
		names[m.Name] = i
		if m.URL == "" {
			return fieldErr(path+".url", "is required")
		}
		if err := checkBaseURL(path+".url", m.URL); err != nil {
			return err
		}
		if err := m.APIKey.check(path + ".api_key"); err != nil {
			return err
		}
	}
	for _, f := range []struct {
		path string
		v    float64
	}{
		{"global_scheduling.poll_interval_ms", g.PollIntervalMS},
		{"global_scheduling.poll_timeout_ms", g.PollTimeoutMS},
		{"global_scheduling.stale_after_ms", g.StaleAfterMS},
	} {
		if err := millis(f.path, f.v); err != nil {
			return err
		}
		if g.Enabled && f.v == 0 {
			return fieldErr(f.path, "must be positive")
		}
	}
	if g.Enabled && g.PollIntervalMS < 10 {
		return fieldErr("global_scheduling.poll_interval_ms", "must be at least 10")
	}
	if g.StaleAfterMS < g.PollIntervalMS {
		return fieldErr("global_scheduling.stale_after_ms", "%g is below poll_interval_ms (%g): every report would be stale before the next poll", g.StaleAfterMS, g.PollIntervalMS)
	}
	if g.MinFree < 0 {
		return fieldErr("global_scheduling.min_free", "must be >= 0")
	}
	if err := millis("global_scheduling.forward_stream_first_packet_ms", g.ForwardStreamFirstPacketMS); err != nil {
		return err
	}
	if err := millis("global_scheduling.forward_non_stream_first_byte_ms", g.ForwardNonStreamFirstByteMS); err != nil {
		return err
	}
	if err := millis("global_scheduling.forward_failure_backoff_ms", g.ForwardFailureBackoffMS); err != nil {
		return err
	}
	if err := millis("global_scheduling.forward_failure_max_backoff_ms", g.ForwardFailureMaxBackoffMS); err != nil {
		return err
	}
	if g.ForwardFailureMaxBackoffMS < g.ForwardFailureBackoffMS {
		return fieldErr("global_scheduling.forward_failure_max_backoff_ms", "%g is below forward_failure_backoff_ms (%g)", g.ForwardFailureMaxBackoffMS, g.ForwardFailureBackoffMS)
	}
	if err := millis("global_scheduling.forward_stall_ms", g.ForwardStallMS); err != nil {
		return err
	}
	return nil
}

func (s *SmartModelSelection) validate() error {
	if s.ClassifierURL != "" {
		if err := checkURL("smart_model_selection.classifier_url", s.ClassifierURL); err != nil {
			return err
		}
	} else if s.Enabled {
		return fieldErr("smart_model_selection.classifier_url", "is required when smart model selection is enabled")
	}
	if err := s.ClassifierAPIKey.check("smart_model_selection.classifier_api_key"); err != nil {
		return err
	}
	if err := millis("smart_model_selection.timeout_ms", s.TimeoutMS); err != nil {
		return err
	}
	switch s.FallbackTier {
	case "L1", "L2", "L3":
	case "":
		if s.Enabled {
			return fieldErr("smart_model_selection.fallback_tier", "is required: L1, L2 or L3")
		}
	default:
		return fieldErr("smart_model_selection.fallback_tier", "%s: want L1, L2 or L3", quotedKey(s.FallbackTier))
	}
	if s.BreakerFailureThreshold < 0 || s.BreakerFailureThreshold > 1<<20 {
		return fieldErr("smart_model_selection.breaker_failure_threshold", "must be in [0, %d] (0: no breaker)", 1<<20)
	}
	if err := millis("smart_model_selection.breaker_cooldown_ms", s.BreakerCooldownMS); err != nil {
		return err
	}
	if err := millis("smart_model_selection.breaker_max_cooldown_ms", s.BreakerMaxCooldownMS); err != nil {
		return err
	}
	if s.BreakerMaxCooldownMS < s.BreakerCooldownMS {
		return fieldErr("smart_model_selection.breaker_max_cooldown_ms", "%g is below breaker_cooldown_ms (%g)", s.BreakerMaxCooldownMS, s.BreakerCooldownMS)
	}
	if s.MaxTextBytes < 0 || s.MaxTextBytes > 1<<24 {
		return fieldErr("smart_model_selection.max_text_bytes", "must be in [1, %d]", 1<<24)
	}
	for i, p := range s.MatchModels {
		if strings.TrimSpace(p) == "" {
			return fieldErr(fmt.Sprintf("smart_model_selection.match_models[%d]", i), "is empty")
		}
		if strings.TrimSpace(p) != p {
			// Model names are matched as written: it would never match.
			return fieldErr(fmt.Sprintf("smart_model_selection.match_models[%d]", i), "%s has leading or trailing spaces", quotedKey(p))
		}
	}
	for _, t := range []struct{ path, model string }{
		{"smart_model_selection.tiers.L1", s.Tiers.L1},
		{"smart_model_selection.tiers.L2", s.Tiers.L2},
		{"smart_model_selection.tiers.L3", s.Tiers.L3},
	} {
		if len(t.model) > 256 {
			return fieldErr(t.path, "longer than 256 bytes")
		}
		if s.Enabled && strings.TrimSpace(t.model) == "" {
			return fieldErr(t.path, "a model is required for every tier when smart model selection is enabled")
		}
		if strings.TrimSpace(t.model) != t.model {
			// The request is forwarded as this name: no worker serves it.
			return fieldErr(t.path, "%s has leading or trailing spaces", quotedKey(t.model))
		}
	}
	if s.Enabled {
		if s.TimeoutMS == 0 {
			return fieldErr("smart_model_selection.timeout_ms", "must be positive")
		}
		if s.MaxTextBytes == 0 {
			return fieldErr("smart_model_selection.max_text_bytes", "must be in [1, %d]", 1<<24)
		}
	}
	return nil
}

// checkBaseURL validates an upstream base URL: http or https, a host, and
// nothing a request path could not be appended to.
func checkBaseURL(path, raw string) error {
	if err := checkURL(path, raw); err != nil {
		return err
	}
	u, _ := url.Parse(raw)
	if u.RawQuery != "" || u.Fragment != "" || strings.HasSuffix(raw, "?") || strings.HasSuffix(raw, "#") {
		return fieldErr(path, "a base URL takes no query or fragment")
	}
	return nil
}

// checkURL validates an http(s) URL with a host and no user info (a
// password in a URL ends up in logs and error messages: use the api_key
// settings). The URL itself is not echoed, in case it carries a secret.
func checkURL(path, raw string) error {
	u, err := url.Parse(raw)
	if err != nil {
		return fieldErr(path, "is not a valid URL")
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return fieldErr(path, "must start with http:// or https://")
	}
	if u.Host == "" || u.Hostname() == "" {
		return fieldErr(path, "has no host")
	}
	if u.User != nil {
		return fieldErr(path, "must not carry user info (user:password@); give credentials in the api_key setting")
	}
	for i := 0; i < len(raw); i++ {
		if raw[i] <= ' ' || raw[i] >= 0x7f {
			return fieldErr(path, "contains spaces, control or non-ASCII characters (percent-encode them)")
		}
	}
	return nil
}

// validLabel reports whether s can serve as a metric label and log field:
// 1-64 characters of [A-Za-z0-9._:-].
func validLabel(s string) bool {
	if len(s) == 0 || len(s) > 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-' || c == ':') {
			return false
		}
	}
	return true
}

// Secret is a credential from the config: an upstream API key, a mirror
// token, a member's key. Its value is reachable only through Reveal and
// AppendBearer; every other rendering of it (fmt verbs, log/slog, JSON
// encoding) prints a redacted form, so a config dump, a log line or an
// error message never carries it.
//
// In the JSON config a secret is a string in one of three forms:
//
//	"sk-..."            the key itself (then the config file holds it in
//	                    clear: restrict the file's permissions)
//	"env:NAME"          the value of environment variable NAME
//	"file:/run/key"     the content of a file (trailing newline trimmed),
//	                    e.g. a mounted Kubernetes secret
//
// References are resolved each time the config is parsed (start, every
// reload), so rotating a key is: update the variable's source or the file,
// then reload (SIGHUP or a config change). Encoded back to JSON, a
// reference stays a reference and a literal key becomes "***", which is
// refused when parsed back, so a redacted dump can never silently replace a
// key.
type Secret struct {
	value string // the credential; "" when unset
	ref   string // "env:NAME" or "file:PATH" when given by reference
	err   string // why the secret is invalid (reported with its path by validation)
	// sealed is the sealed form read from a config file (enc:...), until
	// ParseWith's codec opens it.
	sealed string
}

// SecretCodec seals the literal secrets Store.Apply writes to the config
// file and opens them when the file is read back (package admin's sealer:
// AES-256-GCM under the seal key, bound to the secret's entry and
// address), so that keys entered through the admin API are never stored
// in clear.
type SecretCodec interface {
	// Seal returns the sealed form of key, the secret of entry owner at
	// address.
	Seal(owner, address, key string) (string, error)
	// Open returns the key sealed (Seal's result) for entry owner at
	// address; its error says why not, never the key.
	Open(sealed, owner, address string) (string, error)
}

// msgSealed is the problem of a sealed secret nothing opened.
const msgSealed = "is sealed (enc:...): only a gateway started with the seal key it was sealed with (--admin-seal-key, else --admin-key or --api-key) opens it; re-enter the key otherwise"

// openSealed opens c's sealed secrets with codec, each at its entry and
// address; a secret it cannot open keeps the reason, reported at its path
// by validation.
func (c *Config) openSealed(codec SecretCodec) {
	for _, sl := range c.AppendSecretSlots(nil) {
		sec := sl.Secret
		if sec.sealed == "" {
			continue
		}
		key, err := codec.Open(sec.sealed, sl.Owner, sl.Address)
		if err != nil {
			sec.err = err.Error()
			continue
		}
		*sec = Secret{value: key}
		sec.checkValue()
	}
}

// MaxNamedUnopened bounds how many other settings the error of a sealed
// secret that cannot be opened names (UnopenedSecrets).
const MaxNamedUnopened = 16

// UnopenedSecrets is the error of sealed secrets that cannot be opened:
// the first one's path and reason, and the paths of the others (at most
// MaxNamedUnopened, then how many more), so an operator who started with
// the wrong seal key learns every setting to fix from one attempt.
func UnopenedSecrets(path, msg string, others []string) *FieldError {
	if len(others) == 0 {
		return &FieldError{Path: path, Msg: msg}
	}
	named := others
	if len(named) > MaxNamedUnopened {
		named = named[:MaxNamedUnopened]
	}
	msg = fmt.Sprintf("%s; %d more sealed secret(s) cannot be opened either: %s", msg, len(others), strings.Join(named, ", "))
	if n := len(others) - len(named); n > 0 {
		msg += fmt.Sprintf(" and %d more", n)
	}
	return &FieldError{Path: path, Msg: msg}
}

// unopenedSealed reports every sealed secret of c left unopened (no codec,
// or one that could not open it) at once; nil when there is none.
func (c *Config) unopenedSealed() error {
	var first *SecretSlot
	var others []string
	for _, sl := range c.AppendSecretSlots(nil) {
		if sl.Secret.sealed == "" || sl.Secret.err == "" {
			continue
		}
		if first == nil {
			first = &sl
			continue
		}
		others = append(others, sl.Path)
	}
	if first == nil {
		return nil
	}
	return UnopenedSecrets(first.Path, first.Secret.err, others)
}

// RedactedSecret is how a literal secret is rendered everywhere.
const RedactedSecret = "***"

// maxSecretBytes bounds a secret (and a secret file's size).
const maxSecretBytes = 4096

// NewSecret returns a secret holding v (for tests and programmatic configs).
func NewSecret(v string) Secret {
	s := Secret{value: v}
	s.checkValue()
	return s
}

// IsSet reports whether the secret holds a value.
func (s Secret) IsSet() bool { return s.value != "" }

// Ref returns the reference ("env:NAME" or "file:PATH") the secret was
// given by, or "" for a literal key.
func (s Secret) Ref() string { return s.ref }

// Reveal returns the credential. Call it only to put it on the wire.
func (s Secret) Reveal() string { return s.value }

// AppendBearer appends "Bearer <secret>" (an Authorization header value).
func (s Secret) AppendBearer(dst []byte) []byte {
	return append(append(dst, "Bearer "...), s.value...)
}

// String implements fmt.Stringer with the redacted form.
func (s Secret) String() string {
	switch {
	case s.ref != "":
		return s.ref
	case s.value != "":
		return RedactedSecret
	}
	return ""
}

// GoString implements fmt.GoStringer with the redacted form.
func (s Secret) GoString() string { return fmt.Sprintf("config.Secret(%q)", s.String()) }

// Format implements fmt.Formatter: every verb prints the redacted form.
func (s Secret) Format(f fmt.State, verb rune) {
	if verb == 'q' {
		fmt.Fprintf(f, "%q", s.String())
		return
	}
	_, _ = f.Write([]byte(s.String()))
}

// LogValue implements slog.LogValuer with the redacted form.
func (s Secret) LogValue() slog.Value { return slog.StringValue(s.String()) }

// MarshalJSON writes the reference of a referenced secret and "***" for a
// literal one.
func (s Secret) MarshalJSON() ([]byte, error) { return json.Marshal(s.String()) }

// UnmarshalJSON reads a secret in one of its three forms. A reference that
// cannot be resolved is recorded and reported by validation with the
// setting's path.
func (s *Secret) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		*s = Secret{}
		return nil
	}
	var v string
	if err := json.Unmarshal(b, &v); err != nil {
		return &json.UnmarshalTypeError{Value: "non-string", Type: reflect.TypeOf(""), Offset: 0}
	}
	*s = Secret{}
	switch {
	case strings.HasPrefix(v, RedactedSecret):
		// The bare placeholder, or the fingerprinted form the admin API
		// and the audit log show (***1a2b3c4d): a pasted dump must never
		// become the key sent upstream.
		s.err = "is a redacted form (\"***\", \"***<fingerprint>\") of a secret: give the key itself, env:NAME or file:PATH"
	case strings.HasPrefix(v, "enc:"):
		// Sealed by an admin API write to the file: opened by ParseWith's
		// codec, never taken as the key itself.
		s.sealed, s.err = v, msgSealed
	case strings.HasPrefix(v, "env:"):
		name := v[len("env:"):]
		s.ref = v
		if !validEnvName(name) {
			s.err = "env: must name an environment variable ([A-Za-z_][A-Za-z0-9_]*)"
			return nil
		}
		val, ok := os.LookupEnv(name)
		if !ok || val == "" {
			s.err = fmt.Sprintf("environment variable %s is not set or empty", name)
			return nil
		}
		s.value = val
		s.checkValue()
	case strings.HasPrefix(v, "file:"):
		s.ref = v
		s.value, s.err = readSecretFile(v[len("file:"):])
		if s.err == "" {
			s.checkValue()
		}
	default:
		s.value = v
		s.checkValue()
	}
	return nil
}

// Check reports a secret's problem (a key that cannot travel in a header,
// a reference that did not resolve) at path, as validation does.
func (s Secret) Check(path string) error { return s.check(path) }

// check reports a secret's recorded problem at path.
func (s *Secret) check(path string) error {
	if s.err != "" {
		return fieldErr(path, "%s", s.err)
	}
	return nil
}

// checkValue refuses values that cannot travel in an HTTP header (no
// header injection through a key) without echoing them. The position of
// the character is told only for a literal key: the content of a file or
// variable is not the config's to describe.
func (s *Secret) checkValue() {
	if len(s.value) > maxSecretBytes {
		s.err = fmt.Sprintf("longer than %d bytes", maxSecretBytes)
		return
	}
	for i := 0; i < len(s.value); i++ {
		if c := s.value[i]; c <= ' ' || c >= 0x7f {
			if s.ref != "" {
				s.err = fmt.Sprintf("%s holds a character not allowed in a bearer token (spaces, control and non-ASCII characters are refused)", s.ref)
			} else {
				s.err = fmt.Sprintf("contains a character not allowed in a bearer token (byte %d: spaces, control and non-ASCII characters are refused)", i)
			}
			return
		}
	}
}

// readSecretFile reads a file: reference. Its problems name the file and
// the system's reason (or its size bound, or that it is empty), never its
// content. References are read from the config file only: the admin API
// refuses them (package admin), so these messages answer the operator.
func readSecretFile(path string) (value, problem string) {
	if path == "" {
		return "", "file: must name a file"
	}
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Sprintf("cannot read secret file %q: %v", path, unwrapPathErr(err))
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxSecretBytes+2))
	if err != nil {
		return "", fmt.Sprintf("cannot read secret file %q: %v", path, unwrapPathErr(err))
	}
	if len(data) > maxSecretBytes+1 {
		return "", fmt.Sprintf("secret file %q is larger than %d bytes", path, maxSecretBytes)
	}
	v := strings.TrimRight(string(data), "\r\n")
	if v == "" {
		return "", fmt.Sprintf("secret file %q is empty", path)
	}
	return v, ""
}

func unwrapPathErr(err error) error {
	if pe, ok := err.(*os.PathError); ok {
		return pe.Err
	}
	return err
}

func validEnvName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c == '_' || c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || i > 0 && c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}
