package protocol

import (
	"strings"
	"testing"
)

// A 1 KB prompt: system text and a user turn of ~1 KB, plus a tool.
var (
	prompt1K      = strings.Repeat("The quick brown fox jumps over the lazy dog. ", 23) // 1035 bytes
	anthropicReq1 = []byte(`{"model":"claude-sonnet-4","max_tokens":256,"system":[{"type":"text","text":"You are a helpful assistant.","cache_control":{"type":"ephemeral"}}],` +
		`"messages":[{"role":"user","content":[{"type":"text","text":"` + prompt1K + `"}]}],` +
		`"tools":[{"name":"get_weather","description":"Weather of a city","input_schema":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}],` +
		`"temperature":0.7,"metadata":{"user_id":"user-123"}}`)
	anthropicStreamReq = []byte(strings.Replace(string(anthropicReq1), `"max_tokens":256`, `"max_tokens":256,"stream":true`, 1))
	responsesReq1      = []byte(`{"model":"gpt-4.1","instructions":"You are a helpful assistant.","input":[{"role":"user","content":[{"type":"input_text","text":"` + prompt1K + `"}]}],` +
		`"tools":[{"type":"function","name":"get_weather","description":"Weather of a city","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}],` +
		`"temperature":0.7,"max_output_tokens":256}`)
	responsesStreamReq = []byte(strings.Replace(string(responsesReq1), `"max_output_tokens":256`, `"max_output_tokens":256,"stream":true`, 1))
	chatAnswer         = []byte(`{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"qwen3","choices":[{"index":0,"message":{"role":"assistant","content":"` +
		strings.Repeat("Sure, here is a short answer. ", 10) + `","reasoning_content":null,"tool_calls":[]},"logprobs":null,"finish_reason":"stop","stop_reason":null}],` +
		`"usage":{"prompt_tokens":260,"total_tokens":330,"completion_tokens":70,"prompt_tokens_details":{"cached_tokens":128}}}`)
	chatStream = func() []byte {
		var b strings.Builder
		b.WriteString(chunkLine(`{"role":"assistant","content":""}`, "null"))
		for i := 0; i < 50; i++ {
			b.WriteString(chunkLine(`{"content":" word"}`, "null"))
		}
		b.WriteString(chunkLine(`{}`, `"stop"`))
		b.WriteString(usageLine)
		b.WriteString("data: [DONE]\n\n")
		return []byte(b.String())
	}()
)

// anthropicAgentReq is an agent's conversation: the 1 KB prompt with an
// image, then eight rounds of an assistant run (text, thinking and a call
// in two turns) and a user run (the result, then a note with a screenshot).
var anthropicAgentReq = func() []byte {
	var b strings.Builder
	b.WriteString(`{"model":"claude-sonnet-4","max_tokens":256,"system":"You are a helpful assistant.","messages":[` +
		`{"role":"user","content":"` + prompt1K + `"},{"role":"user","content":[{"type":"image","source":{"type":"base64","media_type":"image/png","data":"iVBORw0KGgo="}}]}`)
	for i := 0; i < 8; i++ {
		b.WriteString(`,{"role":"assistant","content":"Let me look that up."},` +
			`{"role":"assistant","content":[{"type":"thinking","thinking":"The user wants the weather.","signature":"sig"},{"type":"tool_use","id":"toolu_0` + string(rune('0'+i)) + `","name":"get_weather","input":{"city":"Paris"}}]},` +
			`{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_0` + string(rune('0'+i)) + `","content":"sunny, 21 C"}]},` +
			`{"role":"user","content":[{"type":"text","text":"Here is what I see now."},{"type":"image","source":{"type":"url","url":"https://example.com/s.png"}}]}`)
	}
	b.WriteString(`],"tools":[{"name":"get_weather","description":"Weather of a city","input_schema":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}]}`)
	return []byte(b.String())
}()

// roundTrip converts a request and its answer, reusing m and the buffers.
func anthropicRoundTrip(b testing.TB, opt *Options, m *Meta, req, dst *[]byte) {
	var err error
	if *req, err = AnthropicToChat((*req)[:0], anthropicReq1, opt, m); err != nil {
		b.Fatal(err)
	}
	if *dst, err = ChatToAnthropic((*dst)[:0], chatAnswer, m); err != nil {
		b.Fatal(err)
	}
}

func responsesRoundTrip(b testing.TB, opt *Options, m *Meta, req, dst *[]byte) {
	var err error
	if *req, err = ResponsesToChat((*req)[:0], responsesReq1, opt, m); err != nil {
		b.Fatal(err)
	}
	if *dst, err = ChatToResponses((*dst)[:0], chatAnswer, m); err != nil {
		b.Fatal(err)
	}
}

// streamRoundTrip converts a streaming request and feeds its 50-chunk
// answer one upstream chunk (one event) at a time.
func streamRoundTrip(b testing.TB, api API, body []byte, opt *Options, m *Meta, c *StreamConverter, req, dst *[]byte, chunks [][]byte) {
	var err error
	if api == Anthropic {
		*req, err = AnthropicToChat((*req)[:0], body, opt, m)
	} else {
		*req, err = ResponsesToChat((*req)[:0], body, opt, m)
	}
	if err != nil {
		b.Fatal(err)
	}
	c.Reset(m)
	for _, ch := range chunks {
		*dst = c.Feed((*dst)[:0], ch)
	}
	*dst = c.Finish((*dst)[:0])
}

func splitEvents(s []byte) [][]byte {
	var out [][]byte
	for len(s) > 0 {
		n := nextEventEnd(s)
		if n == 0 {
			n = len(s)
		}
		out = append(out, s[:n])
		s = s[n:]
	}
	return out
}

func BenchmarkConvert1KPrompt(b *testing.B) {
	opt := DefaultOptions()
	var m Meta
	var req, dst []byte
	chunks := splitEvents(chatStream)
	c := AcquireStreamConverter(&m)
	b.Run("anthropic", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(anthropicReq1)))
		for i := 0; i < b.N; i++ {
			anthropicRoundTrip(b, &opt, &m, &req, &dst)
		}
	})
	b.Run("anthropic-agent-turns-request", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(anthropicAgentReq)))
		for i := 0; i < b.N; i++ {
			var err error
			if req, err = AnthropicToChat(req[:0], anthropicAgentReq, &opt, &m); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("responses", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(responsesReq1)))
		for i := 0; i < b.N; i++ {
			responsesRoundTrip(b, &opt, &m, &req, &dst)
		}
	})
	b.Run("anthropic-stream-50-chunks", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			streamRoundTrip(b, Anthropic, anthropicStreamReq, &opt, &m, c, &req, &dst, chunks)
		}
	})
	b.Run("responses-stream-50-chunks", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			streamRoundTrip(b, Responses, responsesStreamReq, &opt, &m, c, &req, &dst, chunks)
		}
	})
}

func BenchmarkChatStreamUsage(b *testing.B) {
	body := []byte(`{"model":"qwen3","stream":true,"messages":[{"role":"user","content":"` + prompt1K + `"}]}`)
	chunks := splitEvents(chatStream)
	b.Run("ensure-usage", func(b *testing.B) {
		b.ReportAllocs()
		dst := make([]byte, 0, 2*len(body))
		for i := 0; i < b.N; i++ {
			EnsureStreamUsage(dst[:0], body)
		}
	})
	b.Run("filter-per-chunk", func(b *testing.B) {
		b.ReportAllocs()
		var f UsageFilter
		var dst []byte
		for i := 0; i < b.N; i++ {
			if i%len(chunks) == 0 {
				f.Reset()
			}
			dst = f.Filter(dst[:0], chunks[i%len(chunks)])
		}
	})
	r := NewOptions(nilProtocol()).Reasoning
	r.Mode = ReasoningMap
	rb := []byte(`{"model":"qwen3","reasoning_effort":"low","messages":[{"role":"user","content":"` + prompt1K + `"}]}`)
	b.Run("reasoning-map", func(b *testing.B) {
		b.ReportAllocs()
		dst := make([]byte, 0, 2*len(rb))
		for i := 0; i < b.N; i++ {
			RewriteChatReasoning(dst[:0], rb, &r)
		}
	})
}
