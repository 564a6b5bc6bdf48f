package config

// PD configures prefill/decode disaggregation: how the router talks to a
// prefill+decode pair and how it picks the decode worker. The topology is
// automatic (a model whose candidate workers include prefill and decode
// workers is served by a pair, otherwise by one mixed worker); these
// settings only shape PD dispatches. docs/pd.md is the reference.
type PD struct {
	// Mode is the KV connector the engines speak, and so the request bodies
	// the router builds: "sglang" (push: both legs concurrently with
	// bootstrap_host/bootstrap_port/bootstrap_room) or "vllm" (pull: the
	// prefill leg with kv_transfer_params.do_remote_decode and max_tokens 1,
	// then the decode leg with the kv_transfer_params it answered). Empty
	// (the default) takes the mode from the prefill worker's record
	// (bootstrap.pd_mode, which `infera engine` advertises); a PD request
	// whose prefill worker does not say fails with 503.
	Mode string `json:"mode"`
	// DecodePolicy picks the decode worker of a pair: least-requests
	// (default), least-tokens or round-robin. The prefill worker is picked
	// by the primary pipeline (session affinity, prefix cache or KV, load
	// balancing).
	DecodePolicy string `json:"decode_policy"`
	// SGLangIndependentPairing (SGLang pairs only: mode sglang, or empty
	// with workers whose records say sglang) lets any prefill worker
	// pair with any decode worker. Off, prefill and decode workers are
	// paired by aligned index (docs/pd.md, "Pairing"). vLLM pairs freely
	// regardless.
	SGLangIndependentPairing bool `json:"sglang_independent_pairing"`
	// PrefillTimeoutSeconds bounds a prefill leg from its dispatch to its
	// complete answer (vLLM: the kv_transfer_params answer; SGLang: the
	// prefill response, which the engine sends after the transfer). On
	// expiry the prefill worker is blamed (a breaker fault) and, before the
	// client got a byte, the request goes to another prefill worker. 0 means
	// no limit beyond the request's own timeouts. Default 300.
	PrefillTimeoutSeconds float64 `json:"prefill_timeout_s"`
}

// PD modes (the values of pd.mode).
const (
	PDModeAuto   = ""
	PDModeSGLang = "sglang"
	PDModeVLLM   = "vllm"
)

// defaultPD is the pd section's defaults (config.Default uses it).
func defaultPD() PD {
	return PD{DecodePolicy: "least-requests", PrefillTimeoutSeconds: 300}
}

func (p *PD) validate() error {
	switch p.Mode {
	case PDModeAuto, PDModeSGLang, PDModeVLLM:
	default:
		return fieldErr("pd.mode", "%q is not supported: want sglang, vllm or empty (the prefill worker's record says)", p.Mode)
	}
	switch p.DecodePolicy {
	case "round-robin", "least-requests", "least-tokens":
	default:
		return fieldErr("pd.decode_policy", "%q: want round-robin, least-requests or least-tokens", p.DecodePolicy)
	}
	if p.SGLangIndependentPairing && p.Mode == PDModeVLLM {
		// Refuse rather than accept a setting that would do nothing. With
		// the mode from the workers' records (empty) it applies to the
		// SGLang pairs.
		return fieldErr("pd.sglang_independent_pairing", "applies to SGLang pairs only (vLLM pairs any prefill with any decode worker); set pd.mode to sglang or empty, or remove it")
	}
	return seconds("pd.prefill_timeout_s", p.PrefillTimeoutSeconds, false)
}
