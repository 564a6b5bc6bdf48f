package engine

import (
	"encoding/json"
	"slices"
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

// With continuous_usage_stats (and include_usage, its default) every chunk
// carries the usage so far, as vLLM's stream generators put it
// (serving_chat.py, serving_completion.py): the prompt tokens, and the
// choice's tokens so far (0 on the role chunk), prompt_tokens,
// total_tokens, completion_tokens; the final usage chunk is unchanged.
// Without include_usage there is none. The engine ignored the option.
func TestContinuousUsageStatsPutTheUsageSoFarOnEveryChunk(t *testing.T) {
	plain := startEngine(t, nil)
	reasoning := startEngine(t, func(c *Config) { c.Reasoning = true })
	type usage struct {
		Prompt     *int `json:"prompt_tokens"`
		Total      *int `json:"total_tokens"`
		Completion *int `json:"completion_tokens"`
	}
	for _, tc := range []struct {
		e           *testEngine
		path, rest  string
		completions []int // per chunk before the usage chunk
	}{
		{plain, "/v1/chat/completions", `"messages":[{"role":"user","content":"hi"}]`, []int{0, 1, 2, 3, 3}},
		{plain, "/v1/completions", `"prompt":"once upon a time"`, []int{1, 2, 3, 3}},
		{reasoning, "/v1/chat/completions", `"reasoning_effort":"high","messages":[{"role":"user","content":"hi"}]`, []int{0, 1, 2, 3, 3}},
	} {
		for _, opts := range []string{`{"continuous_usage_stats":true}`, `{"include_usage":"yes","continuous_usage_stats":1}`} {
			code, b, _ := tc.e.post(t, tc.path, `{"model":"sim-model","stream":true,"max_tokens":3,"stream_options":`+opts+`,`+tc.rest+`}`)
			if code != 200 {
				t.Fatalf("%s %s: %d %s", tc.path, opts, code, b)
			}
			var got []int
			prompt := -1
			events := strings.Split(strings.TrimSuffix(string(b), "\n\n"), "\n\n")
			for _, ev := range events[:len(events)-2] { // the usage chunk, [DONE]
				var c struct {
					Usage *usage `json:"usage"`
				}
				if err := json.Unmarshal([]byte(strings.TrimPrefix(ev, "data: ")), &c); err != nil || c.Usage == nil ||
					c.Usage.Prompt == nil || c.Usage.Total == nil || c.Usage.Completion == nil || *c.Usage.Total != *c.Usage.Prompt+*c.Usage.Completion {
					t.Fatalf("%s %s: chunk without its usage so far: %s", tc.path, opts, ev)
				}
				if prompt >= 0 && *c.Usage.Prompt != prompt {
					t.Fatalf("%s %s: prompt tokens change: %s", tc.path, opts, b)
				}
				prompt = *c.Usage.Prompt
				got = append(got, *c.Usage.Completion)
			}
			if !slices.Equal(got, tc.completions) {
				t.Errorf("%s %s: completion tokens per chunk %v, want %v\n%s", tc.path, opts, got, tc.completions, b)
			}
			last := events[len(events)-2]
			var u struct {
				Choices []any `json:"choices"`
				Usage   usage `json:"usage"`
			}
			if json.Unmarshal([]byte(strings.TrimPrefix(last, "data: ")), &u) != nil || len(u.Choices) != 0 || *u.Usage.Prompt != prompt || *u.Usage.Completion != 3 {
				t.Errorf("%s %s: usage chunk %s", tc.path, opts, last)
			}
		}
		// continuous usage needs include_usage
		code, b, _ := tc.e.post(t, tc.path, `{"model":"sim-model","stream":true,"max_tokens":3,"stream_options":{"include_usage":false,"continuous_usage_stats":true},`+tc.rest+`}`)
		if code != 200 || strings.Contains(string(b), "usage") {
			t.Errorf("%s without include_usage: %d %s", tc.path, code, b)
		}
	}
}

// stream_options on a request that does not stream is refused, as vLLM's
// validate_stream_options refuses it ("Stream options can only be defined
// when `stream=True`."): a "before" validator testing the raw values'
// Python truthiness (data.get("stream_options") and not
// data.get("stream")), so an empty object passes and so does the string
// "false" as stream. The engine answered such a request with 200.
func TestStreamOptionsWithoutAStreamAreRefusedAsVLLMRefusesThem(t *testing.T) {
	e := startEngine(t, nil)
	for _, tc := range []struct {
		fields string
		code   int
	}{
		{`"stream_options":{"include_usage":true}`, 400},
		{`"stream":false,"stream_options":{"include_usage":true}`, 400},
		{`"stream":null,"stream_options":{"continuous_usage_stats":false}`, 400},
		{`"stream":0,"stream_options":{"include_usage":false}`, 400},
		{`"stream_options":{}`, 200},
		{`"stream_options":null`, 200},
		{`"stream":false,"stream_options":{}`, 200},
		{`"stream":"false","stream_options":{"include_usage":true}`, 200}, // truthy raw, then not a stream
		{`"stream":true,"stream_options":{"include_usage":true}`, 200},
	} {
		for _, p := range [][2]string{
			{"/v1/chat/completions", `"messages":[{"role":"user","content":"hi"}]`},
			{"/v1/completions", `"prompt":"once upon a time"`},
		} {
			code, b, _ := e.post(t, p[0], `{"model":"sim-model","max_tokens":2,`+p[1]+`,`+tc.fields+`}`)
			if code != tc.code || code == 400 && !strings.Contains(string(b), "Stream options can only be defined when `stream=True`.") {
				t.Errorf("%s %s: %d %s, want %d", p[0], tc.fields, code, b, tc.code)
			}
		}
	}
}
