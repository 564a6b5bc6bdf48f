package config

import (
	"errors"
	"strings"
	"testing"
)

func TestPDSectionValidates(t *testing.T) {
	parse := func(in string) (*Config, error) { return Parse([]byte(`{"pd":` + in + `}`)) }
	ok := func(in string, check func(p PD) bool) {
		t.Helper()
		c, err := parse(in)
		if err != nil {
			t.Fatalf("%s: %v", in, err)
		}
		if !check(c.PD) {
			t.Fatalf("%s: got %+v", in, c.PD)
		}
	}
	bad := func(in, path, want string) {
		t.Helper()
		_, err := parse(in)
		var fe *FieldError
		if !errors.As(err, &fe) || fe.Path != path || !strings.Contains(fe.Msg, want) {
			t.Fatalf("%s: err %v, want %s: ...%s...", in, err, path, want)
		}
	}
	ok(`{"mode":"sglang","decode_policy":"least-tokens","sglang_independent_pairing":true,"prefill_timeout_s":30}`, func(p PD) bool {
		return p.Mode == PDModeSGLang && p.DecodePolicy == "least-tokens" && p.SGLangIndependentPairing && p.PrefillTimeoutSeconds == 30
	})
	ok(`{"mode":"vllm","decode_policy":"round-robin"}`, func(p PD) bool { return p.Mode == PDModeVLLM && p.DecodePolicy == "round-robin" })
	ok(`{"mode":"","prefill_timeout_s":0}`, func(p PD) bool { return p.Mode == PDModeAuto && p.PrefillTimeoutSeconds == 0 })
	bad(`{"mode":"mooncake"}`, "pd.mode", "not supported")
	bad(`{"mode":"SGLang"}`, "pd.mode", "want sglang, vllm")
	bad(`{"decode_policy":"random"}`, "pd.decode_policy", "want round-robin")
	bad(`{"mode":"vllm","sglang_independent_pairing":true}`, "pd.sglang_independent_pairing", "SGLang pairs only")
	ok(`{"sglang_independent_pairing":true}`, func(p PD) bool { return p.Mode == PDModeAuto && p.SGLangIndependentPairing })
	bad(`{"prefill_timeout_s":-1}`, "pd.prefill_timeout_s", ">= 0")
	bad(`{"prefill_timeout_s":1e300}`, "pd.prefill_timeout_s", "too large")
	bad(`{"bootstrap_room":1}`, "pd.bootstrap_room", "unknown field")
}

func TestPDDefaults(t *testing.T) {
	p := defaultPD()
	if p.Mode != PDModeAuto || p.DecodePolicy != "least-requests" || p.SGLangIndependentPairing || p.PrefillTimeoutSeconds != 300 {
		t.Fatalf("defaults %+v", p)
	}
	if err := p.validate(); err != nil {
		t.Fatal(err)
	}
}
