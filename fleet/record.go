package fleet

import (
	"encoding/json"
	"fmt"
	"net/url"
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
	if r.URL == "" {
		return fmt.Errorf("worker record %q: url is required", r.ID)
	}
	u, err := url.Parse(r.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("worker record %q: url %q must be http(s)://host:port", r.ID, r.URL)
	}
	if r.DPSize < 0 || r.DPSize > 1024 {
		return fmt.Errorf("worker record %q: dp_size %d out of range", r.ID, r.DPSize)
	}
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
