package fleet

import (
	"encoding/json"
	"fmt"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"
)

// Record is the one JSON record a worker instance publishes, the same for
// every discovery backend (etcd value, Pod annotation, static config).
// Unknown fields are ignored.
type Record struct {
	ID     string   `json:"id"`
	URL    string   `json:"url"`
	Models []string `json:"models"`
	// Service groups workers for model routing and canary rules.
	Service string `json:"service,omitempty"`
	// Role is mixed, prefill or decode.
	Role             string `json:"role,omitempty"`
	KVEventsEndpoint string `json:"kv_events_endpoint,omitempty"`
	KVReplayEndpoint string `json:"kv_replay_endpoint,omitempty"`
	BlockSize        int    `json:"block_size,omitempty"`
	// MaxModelLen is the longest sequence (prompt and output) the engine
	// serves, from its /v1/models (vLLM's max_model_len; the largest
	// among its models); 0 when unknown. It bounds what a request without
	// an output limit may generate. A change keeps the Worker.
	MaxModelLen int `json:"max_model_len,omitempty"`
	// DPSize is the engine's data-parallel size: vLLM publishes rank r's KV
	// events on the endpoint's port + r (and replays on the replay port + r).
	DPSize int `json:"dp_size,omitempty"`
	// RequestTransport and KVEventTransport are what the worker speaks
	// (http|nats, zmq|nats); empty means "whatever the server uses".
	RequestTransport string `json:"request_transport,omitempty"`
	KVEventTransport string `json:"kv_event_transport,omitempty"`
	// Bootstrap holds PD bootstrap data (engine specific), opaque here.
	Bootstrap json.RawMessage `json:"bootstrap,omitempty"`
	// Status is ACTIVE or DRAINING.
	Status  string `json:"status,omitempty"`
	Version string `json:"version,omitempty"`
}

// ParseRecord decodes and validates a record.
func ParseRecord(data []byte) (Record, error) {
	var r Record
	if err := json.Unmarshal(data, &r); err != nil {
		return r, fmt.Errorf("cannot parse worker record: %w", err)
	}
	return r, r.Validate()
}

// Validate checks the fields routing needs.
func (r *Record) Validate() error {
	if r.ID == "" {
		return fmt.Errorf("worker record: id is required")
	}
	if len(r.ID) > maxIDLen || strings.IndexFunc(r.ID, func(c rune) bool { return c <= ' ' || c == 0x7f }) >= 0 {
		return fmt.Errorf("worker record %q: id must be 1-%d bytes without spaces or control characters", r.ID, maxIDLen)
	}
	if r.URL == "" {
		return fmt.Errorf("worker record %q: url is required", r.ID)
	}
	u, err := url.Parse(r.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("worker record %q: url must be http(s)://host:port", r.ID)
	}
	if port := u.Port(); strings.HasSuffix(u.Host, ":") || port != "" && !validPort(port) {
		// The worker's address would be host::80 or a port nothing
		// listens on: every request to it fails to connect.
		return fmt.Errorf("worker record %q: url port must be 1-65535", r.ID)
	}
	if u.User != nil { // it would be logged and shown; engine keys go in headers
		return fmt.Errorf("worker record %q: url must not hold credentials", r.ID)
	}
	// The router sends the engine's own paths (/v1/chat/completions,
	// /v1/models) to host:port. A trailing /v1 (an OpenAI base URL) names
	// the engine's root and is dropped (EngineRoot). Another path would be
	// ignored by requests but not by the models lookup, so it is refused,
	// but for a worker reached over NATS, whose sidecar talks to its engine
	// at the URL as given.
	if root := EngineRoot(r.URL); root != r.URL {
		r.URL = root
	} else if p := strings.TrimRight(u.Path, "/"); (p != "" || u.RawQuery != "" || u.Fragment != "") && r.RequestTransport != "nats" {
		return fmt.Errorf("worker record %q: url must be scheme://host:port (the router adds the engine's /v1/... paths), not %q", r.ID, u.Path+queryPart(u))
	}
	if r.DPSize < 0 || r.DPSize > 1024 {
		return fmt.Errorf("worker record %q: dp_size %d out of range", r.ID, r.DPSize)
	}
	if r.BlockSize < 0 || r.BlockSize > maxBlockSize {
		return fmt.Errorf("worker record %q: block_size %d out of range (0-%d)", r.ID, r.BlockSize, maxBlockSize)
	}
	for _, ep := range []string{r.KVEventsEndpoint, r.KVReplayEndpoint} {
		if err := checkZMQEndpoint(ep, r.DPSize); err != nil {
			return fmt.Errorf("worker record %q: %v", r.ID, err)
		}
	}
	if len(r.Models) > maxModels {
		return fmt.Errorf("worker record %q: %d models, at most %d", r.ID, len(r.Models), maxModels)
	}
	for i, m := range r.Models {
		// An empty name would make a worker that serves nothing while its
		// health says ok; a control character would forge log lines.
		if m == "" || len(m) > maxModelLen || strings.IndexFunc(m, func(c rune) bool { return c < ' ' || c == 0x7f }) >= 0 {
			return fmt.Errorf("worker record %q: models[%d]: want a model name of 1-%d bytes without control characters", r.ID, i, maxModelLen)
		}
	}
	r.Models = dedupe(r.Models) // a model listed twice must not count twice
	if _, ok := ParseRole(r.Role); !ok {
		return fmt.Errorf("worker record %q: role %q: want mixed, prefill or decode", r.ID, r.Role)
	}
	switch r.Status {
	case "", StatusActive, StatusDraining:
	default:
		return fmt.Errorf("worker record %q: status %q: want ACTIVE or DRAINING", r.ID, r.Status)
	}
	return nil
}

// Bounds of a record's fields.
const (
	maxIDLen     = 253
	maxModels    = 1024
	maxModelLen  = 512
	maxBlockSize = 1 << 20 // as in KV events
)

// checkZMQEndpoint accepts "" or a ZMQ tcp:// (with a port that leaves
// room for dp_size ranks) or ipc:// endpoint.
func checkZMQEndpoint(ep string, dpSize int) error {
	switch {
	case ep == "", strings.HasPrefix(ep, "ipc://"):
		return nil
	case !strings.HasPrefix(ep, "tcp://"):
		return fmt.Errorf("kv endpoint %q: want tcp:// or ipc://", ep)
	}
	i := strings.LastIndexByte(ep, ':')
	port, err := strconv.Atoi(ep[i+1:])
	if i < len("tcp://") || err != nil || port < 1 || port+max(dpSize, 1)-1 > 65535 {
		return fmt.Errorf("kv endpoint %q: want tcp://host:port with port + dp_size - 1 <= 65535", ep)
	}
	return nil
}

// EngineKey returns what names the engine a worker url reaches, for
// telling whether two workers name one engine: scheme and host lower-case,
// the default port spelt out, a trailing slash and an OpenAI base URL's
// /v1 dropped (http://H:80/v1/ and http://h are one engine). A url that
// does not parse is its own key.
func EngineKey(raw string) string {
	u, err := url.Parse(strings.TrimRight(EngineRoot(strings.TrimSpace(raw)), "/"))
	if err != nil || u.Host == "" {
		return raw
	}
	scheme := strings.ToLower(u.Scheme)
	port := u.Port()
	if port == "" {
		port = "80"
		if scheme == "https" {
			port = "443"
		}
	}
	return scheme + "://" + net.JoinHostPort(strings.ToLower(u.Hostname()), port) + u.EscapedPath()
}

// EngineRoot returns a worker url given as an OpenAI base URL
// (http://host:8000/v1) as its engine's root (http://host:8000): the
// router adds the /v1/... paths itself. Other urls come back unchanged.
func EngineRoot(raw string) string {
	t := strings.TrimRight(raw, "/")
	if !strings.HasSuffix(t, "/v1") {
		return raw
	}
	u, err := url.Parse(t)
	if err != nil || u.Path != "/v1" || u.RawQuery != "" || u.Fragment != "" || u.Host == "" {
		return raw
	}
	u.Path, u.RawPath = "", ""
	return u.String()
}

func queryPart(u *url.URL) string {
	if u.RawQuery == "" {
		return ""
	}
	return "?" + u.RawQuery
}

// validPort reports whether p (digits, as url.Parse leaves it) is a TCP
// port a worker can listen on.
func validPort(p string) bool {
	n, err := strconv.Atoi(p)
	return err == nil && n >= 1 && n <= 65535
}

// dedupe drops repeated entries of ms, keeping the first of each.
func dedupe(ms []string) []string {
	for i := 1; i < len(ms); i++ {
		if slices.Contains(ms[:i], ms[i]) {
			out := slices.Clone(ms[:i])
			for _, m := range ms[i+1:] {
				if !slices.Contains(out, m) {
					out = append(out, m)
				}
			}
			return out
		}
	}
	return ms
}

// sameEndpoint reports whether a and b describe the same worker process
// (changes to status alone do not need a new Worker).
func sameEndpoint(a, b *Record) bool {
	if a.URL != b.URL || a.Service != b.Service || a.Role != b.Role ||
		a.KVEventsEndpoint != b.KVEventsEndpoint || a.KVReplayEndpoint != b.KVReplayEndpoint ||
		a.BlockSize != b.BlockSize || a.DPSize != b.DPSize || len(a.Models) != len(b.Models) ||
		a.RequestTransport != b.RequestTransport || a.KVEventTransport != b.KVEventTransport ||
		string(a.Bootstrap) != string(b.Bootstrap) {
		return false
	}
	for i := range a.Models {
		if a.Models[i] != b.Models[i] {
			return false
		}
	}
	return true
}
