package engine

import (
	"strings"
	"testing"
)

// A stream's usage chunk is sent for the stream_options vLLM sends it for:
// its StreamOptions model has include_usage: Optional[bool] = True
// (vllm/entrypoints/openai/protocol.py), so an empty object asks for it and
// an explicit null (None) does not; keys are matched exactly (pydantic), so
// "Include_Usage" is an unknown key and the default holds. The engine took
// {} as not asking (Go's zero value) and matched "Include_Usage" as
// include_usage.
func TestStreamOptionsAskForUsageAsVLLMReadsThem(t *testing.T) {
	e := startEngine(t, nil)
	for _, tc := range []struct {
		opts  string
		usage bool
	}{
		{``, false},
		{`,"stream_options":null`, false},
		{`,"stream_options":{}`, true},
		{`,"stream_options":{"continuous_usage_stats":false}`, true},
		{`,"stream_options":{"include_usage":true}`, true},
		{`,"stream_options":{"include_usage":"on"}`, true},
		{`,"stream_options":{"include_usage":null}`, false},
		{`,"stream_options":{"include_usage":false}`, false},
		{`,"stream_options":{"Include_Usage":false}`, true},
		{`,"stream_options":{"include_usage":false,"include_usage":true}`, true},
	} {
		for _, p := range [][2]string{
			{"/v1/chat/completions", `"messages":[{"role":"user","content":"hi"}]`},
			{"/v1/completions", `"prompt":"once upon a time"`},
		} {
			code, b, _ := e.post(t, p[0], `{"model":"sim-model","stream":true,"max_tokens":3,`+p[1]+tc.opts+`}`)
			if code != 200 || !strings.HasSuffix(string(b), "data: [DONE]\n\n") {
				t.Fatalf("%s %s: %d %q", p[0], tc.opts, code, b)
			}
			if got := strings.Count(string(b), `"choices":[],"usage":{`); got != b2i(tc.usage) {
				t.Errorf("%s stream_options %s: %d usage chunks, vLLM sends %d\n%s", p[0], tc.opts, got, b2i(tc.usage), b)
			}
		}
	}
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}
