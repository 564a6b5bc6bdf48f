package engine

import (
	"bytes"
	"encoding/json"
	"math"
	"net"
)

// pdFields are the disaggregation fields of a request body, as SGLang's
// protocol.py (CompletionRequest, ChatCompletionRequest: bootstrap_host,
// bootstrap_port, bootstrap_room) and vLLM's OpenAI server
// (kv_transfer_params, passed to the KV connector as a dict) read them.
type pdFields struct {
	// SGLang. hasRoom etc. say whether the field was present and not null.
	host                      string
	port                      int // 0 when absent or null
	room                      int64
	hasHost, hasPort, hasRoom bool

	// vLLM: kv is nil when kv_transfer_params is absent or null.
	kv *kvParams
}

// kvParams is vLLM's kv_transfer_params (NixlConnector): what the proxy
// sends the prefill leg ({"do_remote_decode": true, ...}) and what the
// prefill engine returns for the decode leg.
type kvParams struct {
	doRemoteDecode, doRemotePrefill bool
	engineID, requestID, host       string
	port                            int
	blockIDs                        []int
	hasBlockIDs                     bool
}

// parsePDFields reads the fields of mode from a request body. Keys match
// exactly and the last duplicate wins, as Python's json reads them. Errors
// name the field, never its value.
func parsePDFields(body []byte, mode PDMode) (pdFields, error) {
	var f pdFields
	var top map[string]json.RawMessage
	if err := json.Unmarshal(body, &top); err != nil {
		return f, badRequest("cannot parse request body as a JSON object")
	}
	switch mode {
	case PDSGLang:
		if raw := one(top["bootstrap_room"]); !isNull(raw) {
			var v int64
			if json.Unmarshal(raw, &v) != nil || v < 0 {
				return f, badRequest("bootstrap_room must be an integer in [0, 2^63-1] (or a one-element list of one)")
			}
			f.room, f.hasRoom = v, true
		}
		if raw := one(top["bootstrap_host"]); !isNull(raw) {
			if json.Unmarshal(raw, &f.host) != nil || !validHost(f.host) {
				return f, badRequest("bootstrap_host must be a host name or an IP address (or a one-element list of one)")
			}
			f.hasHost = true
		}
		if raw, ok := top["bootstrap_port"]; ok {
			f.hasPort = true
			if raw = one(raw); !isNull(raw) {
				var v int64
				if json.Unmarshal(raw, &v) != nil || v < 1 || v > math.MaxUint16 {
					return f, badRequest("bootstrap_port must be an integer in [1, 65535] or null (or a one-element list of one)")
				}
				f.port = int(v)
			}
		}
	case PDVLLM:
		raw := top["kv_transfer_params"]
		if isNull(raw) {
			return f, nil
		}
		var m map[string]json.RawMessage
		if json.Unmarshal(raw, &m) != nil {
			return f, badRequest("kv_transfer_params must be an object or null")
		}
		kv := &kvParams{}
		for _, b := range [...]struct {
			name string
			dst  *bool
		}{{"do_remote_decode", &kv.doRemoteDecode}, {"do_remote_prefill", &kv.doRemotePrefill}} {
			if v := m[b.name]; !isNull(v) && json.Unmarshal(v, b.dst) != nil {
				return f, badRequest("kv_transfer_params.%s must be a boolean or null", b.name)
			}
		}
		for _, s := range [...]struct {
			name string
			dst  *string
		}{{"remote_engine_id", &kv.engineID}, {"remote_request_id", &kv.requestID}, {"remote_host", &kv.host}} {
			if v := m[s.name]; !isNull(v) && json.Unmarshal(v, s.dst) != nil {
				return f, badRequest("kv_transfer_params.%s must be a string or null", s.name)
			}
		}
		if kv.host != "" && !validHost(kv.host) {
			return f, badRequest("kv_transfer_params.remote_host must be a host name or an IP address")
		}
		if v := m["remote_port"]; !isNull(v) {
			var p int64
			if json.Unmarshal(v, &p) != nil || p < 1 || p > math.MaxUint16 {
				return f, badRequest("kv_transfer_params.remote_port must be an integer in [1, 65535] or null")
			}
			kv.port = int(p)
		}
		if v := m["remote_block_ids"]; !isNull(v) {
			ids, err := parseBlockIDs(v)
			if err != nil {
				return f, err
			}
			kv.blockIDs, kv.hasBlockIDs = ids, true
		}
		f.kv = kv
	}
	return f, nil
}

// one unwraps a one-element JSON list (SGLang's batch form of a field, as
// routers send it for a request of one sequence).
func one(raw json.RawMessage) json.RawMessage {
	b := bytes.TrimSpace(raw)
	if len(b) == 0 || b[0] != '[' {
		return raw
	}
	var items []json.RawMessage
	if json.Unmarshal(b, &items) != nil || len(items) != 1 {
		return json.RawMessage(`{}`) // neither null nor the scalar: refused by the caller
	}
	return items[0]
}

// parseBlockIDs reads remote_block_ids: one list of block ids per KV cache
// group, as vLLM's BlockIds (tuple[list[int], ...]) serializes, or the flat
// list older vLLM releases sent. The simulated cache has one group.
func parseBlockIDs(raw json.RawMessage) ([]int, error) {
	var groups [][]int
	if json.Unmarshal(raw, &groups) == nil {
		if len(groups) != 1 {
			return nil, badRequest("kv_transfer_params.remote_block_ids must hold one KV cache group (the simulated cache has one)")
		}
		return checkIDs(groups[0])
	}
	var flat []int
	if json.Unmarshal(raw, &flat) != nil {
		return nil, badRequest("kv_transfer_params.remote_block_ids must be a list of block ids, or a list of one such list")
	}
	return checkIDs(flat)
}

func checkIDs(ids []int) ([]int, error) {
	for _, id := range ids {
		if id < 0 || id > math.MaxInt32 {
			return nil, badRequest("kv_transfer_params.remote_block_ids must hold block ids in [0, 2^31-1]")
		}
	}
	if ids == nil {
		ids = []int{}
	}
	return ids, nil
}

// validHost accepts an IP address (IPv6 optionally in brackets, as SGLang's
// maybe_wrap_ipv6_address writes it) or a DNS host name, so that an address
// that reaches an error message is a host, not arbitrary request bytes.
func validHost(h string) bool {
	if ip := net.ParseIP(trimBrackets(h)); ip != nil {
		return true
	}
	if h == "" || len(h) > 253 {
		return false
	}
	for i := 0; i < len(h); i++ {
		c := h[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '.' || c == '_') {
			return false
		}
	}
	return true
}
