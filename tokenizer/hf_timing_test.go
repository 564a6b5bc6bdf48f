package tokenizer

import (
	"strconv"
	"strings"
	"testing"
	"time"
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
	cpu0 := processCPU()
	for i := 0; i < b.N; i++ {
		dst = h.Encode(dst[:0], text)
	}
	reportCPU(b, cpu0)
	b.ReportMetric(float64(len(dst)), "tokens/op")
}

// BenchmarkEncode4KNewSections is BenchmarkEncode4K with sections never
// seen before (the section cache off): a prompt whose words are all known.
func BenchmarkEncode4KNewSections(b *testing.B) {
	h := loadQwen3(b)
	slots := h.sections.slots
	h.sections.slots = nil
	defer func() { h.sections.slots = slots }()
	text := prompt4K()
	dst := h.Encode(nil, text)
	b.SetBytes(int64(len(text)))
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		dst = h.Encode(dst[:0], text)
	}
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
		h.sections.reset()
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
	b.ResetTimer()
	cpu0 := processCPU()
	b.RunParallel(func(pb *testing.PB) {
		var dst []uint32
		for pb.Next() {
			dst = h.Encode(dst[:0], text)
		}
	})
	reportCPU(b, cpu0)
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

func BenchmarkRenderChat5(b *testing.B) { benchRender(b, loadQwen3(b), fiveMessages()) }

// benchRender renders msgs b.N times, reporting allocations, process CPU
// per render and the rendered bytes.
func benchRender(b *testing.B, h *HF, msgs []Message) {
	var dst []byte
	b.ReportAllocs()
	cpu0 := processCPU()
	for i := 0; i < b.N; i++ {
		var err error
		if dst, err = h.RenderChat(dst[:0], msgs, nil, true); err != nil {
			b.Fatal(err)
		}
	}
	reportCPU(b, cpu0)
	b.SetBytes(int64(len(dst)))
}

// BenchmarkRenderChatLong renders agent-length histories (a system prompt
// and n alternating turns of ~200 bytes): the template's cost grows with
// the number of messages, which is what long conversations pay per request.
func BenchmarkRenderChatLong(b *testing.B) {
	h := loadQwen3(b)
	for _, n := range []int{50, 200} {
		msgs := []Message{{Role: "system", Content: "You are a helpful assistant."}}
		for i := 0; i < n; i++ {
			role := "user"
			if i%2 == 1 {
				role = "assistant"
			}
			msgs = append(msgs, Message{Role: role, Content: strings.Repeat("turn "+strconv.Itoa(i)+" says something about the plan. ", 6)})
		}
		b.Run(strconv.Itoa(n), func(b *testing.B) { benchRender(b, h, msgs) })
	}
}

func BenchmarkRenderAndEncodeChat5(b *testing.B) {
	h := loadQwen3(b)
	msgs := fiveMessages()
	var text []byte
	var ids []uint32
	b.ReportAllocs()
	cpu0 := processCPU()
	for i := 0; i < b.N; i++ {
		var err error
		if text, err = h.RenderChat(text[:0], msgs, nil, true); err != nil {
			b.Fatal(err)
		}
		ids = h.Encode(ids[:0], text)
	}
	reportCPU(b, cpu0)
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

type chatCase struct {
	name  string
	msgs  []Message
	tools []byte
}

// chats1K are ~1 KB conversations like the ones the router renders and
// encodes for every kv-aware request: "mixed" (system, user, assistant,
// user, assistant with a tool call), "plain" (the same turns without the
// call) and "tools" (mixed plus a tools array, as agent clients send).
func chats1K() []chatCase {
	sys := "You are a careful assistant for a travel agency. Answer in the language of the user, keep answers short, and never invent prices or schedules: call a tool when you need facts."
	u1 := "Hi! I'm planning a trip to Paris in early June with my partner. We like museums, long walks and good bakeries. Could you suggest a three-day plan that isn't too packed?"
	a1 := "Happily. Day 1: the Louvre in the morning, lunch near Palais-Royal, a walk along the Seine to Notre-Dame. Day 2: Musée d'Orsay, then Saint-Germain's bakeries and the Luxembourg Garden. Day 3: Montmartre early, Sacré-Cœur, and an evening cruise."
	u2 := "That sounds lovely. What will the weather be like on June 3rd, and should we book the Orsay tickets in advance?"
	a2 := "Let me check the forecast first."
	mixed := []Message{
		{Role: "system", Content: sys},
		{Role: "user", Content: u1},
		{Role: "assistant", Content: a1},
		{Role: "user", Content: u2},
		{Role: "assistant", Content: a2, ToolCalls: []ToolCall{{ID: "call_7", Type: "function"}}},
	}
	mixed[4].ToolCalls[0].Function.Name = "get_weather"
	mixed[4].ToolCalls[0].Function.Arguments = `{"city": "Paris", "date": "2026-06-03", "unit": "celsius"}`
	plain := []Message{
		{Role: "system", Content: sys},
		{Role: "user", Content: u1},
		{Role: "assistant", Content: a1},
		{Role: "user", Content: u2},
		{Role: "assistant", Content: "Early June in Paris is usually mild, 15-24 °C with occasional showers. Yes: book the Orsay online, time slots sell out on weekends."},
	}
	tools := []byte(`[{"type": "function", "function": {"name": "get_weather", "description": "Weather forecast for a city and a date.", "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "date": {"type": "string", "description": "YYYY-MM-DD"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city", "date"]}}}]`)
	return []chatCase{{"mixed", mixed, nil}, {"plain", plain, nil}, {"tools", mixed, tools}}
}

// BenchmarkRenderAndEncodeChat1K is what the router does per kv-aware chat
// request (proxy tokenize): render the chat template, then encode the text.
// cpu-ns/op is process CPU time per operation (steadier than wall time on a
// shared machine).
func BenchmarkRenderAndEncodeChat1K(b *testing.B) {
	h := loadQwen3(b)
	for _, c := range chats1K() {
		b.Run(c.name, func(b *testing.B) {
			text, err := h.RenderChat(nil, c.msgs, c.tools, true)
			if err != nil {
				b.Fatal(err)
			}
			ids := h.Encode(nil, text)
			b.ReportAllocs()
			b.ResetTimer()
			cpu0 := processCPU()
			for i := 0; i < b.N; i++ {
				if text, err = h.RenderChat(text[:0], c.msgs, c.tools, true); err != nil {
					b.Fatal(err)
				}
				ids = h.Encode(ids[:0], text)
			}
			reportCPU(b, cpu0)
			b.ReportMetric(float64(len(text)), "bytes")
			b.ReportMetric(float64(len(ids)), "tokens")
		})
	}
}

// reportCPU reports the process CPU time per operation since cpu0.
func reportCPU(b *testing.B, cpu0 time.Duration) {
	if d := processCPU() - cpu0; cpu0 > 0 && d > 0 {
		b.ReportMetric(float64(d.Nanoseconds())/float64(b.N), "cpu-ns/op")
	}
}
