//go:build !race

package protocol

import "testing"

// The conversion paths allocate nothing in steady state: the Meta, the
// converter and the caller's buffers are reused.
func TestConversionAllocatesNothingInSteadyState(t *testing.T) {
	opt := DefaultOptions()
	var m Meta
	var req, dst []byte
	var err error
	chunks := splitEvents(chatStream)
	c := AcquireStreamConverter(&m)
	defer ReleaseStreamConverter(c)
	body := []byte(`{"model":"qwen3","stream":true,"messages":[{"role":"user","content":"hi"}]}`)
	rb := []byte(`{"model":"qwen3","reasoning_effort":"low","messages":[{"role":"user","content":"hi"}]}`)
	mapOpt := opt.Reasoning
	mapOpt.Mode = ReasoningMap
	var f UsageFilter
	for name, fn := range map[string]func(){
		"anthropic round trip": func() { anthropicRoundTrip(t, &opt, &m, &req, &dst) },
		"responses round trip": func() { responsesRoundTrip(t, &opt, &m, &req, &dst) },
		"anthropic stream":     func() { streamRoundTrip(t, Anthropic, anthropicStreamReq, &opt, &m, c, &req, &dst, chunks) },
		"responses stream":     func() { streamRoundTrip(t, Responses, responsesStreamReq, &opt, &m, c, &req, &dst, chunks) },
		"anthropic agent turns": func() {
			if req, err = AnthropicToChat(req[:0], anthropicAgentReq, &opt, &m); err != nil {
				t.Fatal(err)
			}
		},
		"ensure stream usage": func() { req, _, _ = EnsureStreamUsage(req[:0], body) },
		"reasoning map":       func() { req, _ = RewriteChatReasoning(req[:0], rb, &mapOpt) },
		"usage filter": func() {
			f.Reset()
			for _, ch := range chunks {
				dst = f.Filter(dst[:0], ch)
			}
		},
	} {
		fn() // warm the buffers
		if n := testing.AllocsPerRun(20, fn); n != 0 {
			t.Errorf("%s: %v allocs per run", name, n)
		}
	}
}
