package tokenizer

import (
	"strings"
	"testing"
)

// prompt4K is a deterministic ~4 KB prompt mixing prose, code, CJK and
// chat markup, like a real system prompt plus a user turn.
func prompt4K() []byte {
	parts := []string{
		"<|im_start|>system\nYou are a helpful assistant. Answer concisely and cite sources when you can.<|im_end|>\n",
		"<|im_start|>user\nCan you review this Go function and explain what it does?\n",
		"```go\nfunc (c *Cache) Get(key string) (Value, bool) {\n\tc.mu.RLock()\n\tdefer c.mu.RUnlock()\n\tv, ok := c.items[key]\n\treturn v, ok\n}\n```\n",
		"It's used in our router, which handles about 12,000 requests per second at peak. ",
		"我们还需要支持中文用户，请用中文和英文回答。 ",
		"The quick brown fox jumps over the lazy dog; don't worry, we'll test it.\n\n",
		"    indented line with trailing spaces   \n\tand a tab-indented one\n",
	}
	var b strings.Builder
	for i := 0; b.Len() < 4096; i++ {
		b.WriteString(parts[i%len(parts)])
	}
	return []byte(b.String()[:4096])
}

func BenchmarkEncode4K(b *testing.B) {
	h := loadQwen3(b)
	text := prompt4K()
	dst := h.Encode(nil, text) // warm the word cache: steady state
	b.SetBytes(int64(len(text)))
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		dst = h.Encode(dst[:0], text)
	}
	b.ReportMetric(float64(len(dst)), "tokens/op")
}

func BenchmarkEncode4KColdCache(b *testing.B) {
	h := loadQwen3(b)
	text := prompt4K()
	var dst []uint32
	b.SetBytes(int64(len(text)))
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		h.model.cache.reset()
		b.StartTimer()
		dst = h.Encode(dst[:0], text)
	}
}

func BenchmarkEncode4KParallel(b *testing.B) {
	h := loadQwen3(b)
	text := prompt4K()
	h.Encode(nil, text)
	b.SetBytes(int64(len(text)))
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		var dst []uint32
		for pb.Next() {
			dst = h.Encode(dst[:0], text)
		}
	})
}

func fiveMessages() []Message {
	msgs := []Message{
		{Role: "system", Content: "You are a helpful assistant."},
		{Role: "user", Content: "What's the weather in Paris?"},
		{Role: "assistant", Content: "Let me check.", ToolCalls: []ToolCall{{ID: "call_0", Type: "function"}}},
		{Role: "tool", Content: `{"temp": 21, "unit": "celsius"}`, ToolCallID: "call_0"},
		{Role: "user", Content: "Thanks! And tomorrow?"},
	}
	msgs[2].ToolCalls[0].Function.Name = "get_weather"
	msgs[2].ToolCalls[0].Function.Arguments = `{"city": "Paris"}`
	return msgs
}

func BenchmarkRenderChat5(b *testing.B) {
	h := loadQwen3(b)
	msgs := fiveMessages()
	var dst []byte
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		var err error
		if dst, err = h.RenderChat(dst[:0], msgs, nil, true); err != nil {
			b.Fatal(err)
		}
	}
	b.SetBytes(int64(len(dst)))
}

func BenchmarkRenderAndEncodeChat5(b *testing.B) {
	h := loadQwen3(b)
	msgs := fiveMessages()
	var text []byte
	var ids []uint32
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		var err error
		if text, err = h.RenderChat(text[:0], msgs, nil, true); err != nil {
			b.Fatal(err)
		}
		ids = h.Encode(ids[:0], text)
	}
}

func BenchmarkLoad(b *testing.B) {
	loadQwen3(b)
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		if _, err := Load(qwen3Dir); err != nil {
			b.Fatal(err)
		}
	}
}
