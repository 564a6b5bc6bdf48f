package config

// PD configures prefill/decode disaggregation scheduling.
type PD struct {
	Mode                     string `json:"mode"`
	DecodePolicy             string `json:"decode_policy"`
	SGLangIndependentPairing bool   `json:"sglang_independent_pairing"`
}

// PD validation until PD disaggregation lands.
func (p *PD) validate() error {
	if p.Mode != "" || p.SGLangIndependentPairing {
		// Refuse rather than accept a setting that would do nothing.
		return fieldErr("pd.mode", "PD disaggregation is not supported by this build yet; remove pd.mode and pd.sglang_independent_pairing (workers with role prefill/decode are routed as mixed)")
	}
	switch p.DecodePolicy {
	case "round-robin", "least-requests", "least-tokens":
	default:
		return fieldErr("pd.decode_policy", "%q: want round-robin, least-requests or least-tokens", p.DecodePolicy)
	}
	return nil
}
