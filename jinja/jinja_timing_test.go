package jinja

import (
	"os"
	"strings"
	"testing"
)

// qwen3Vars returns the variables of a 5-message conversation with a tool
// call, as the router passes them to the Qwen3 chat template.
func qwen3Vars(tb testing.TB) *Object {
	tb.Helper()
	msgs, err := FromJSON([]byte(`[{"role": "system", "content": "You are a helpful assistant."},
		{"role": "user", "content": "What's the weather in Paris?"},
		{"role": "assistant", "content": "<think>\nNeed the tool.\n</think>\n\nLet me check.", "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
		{"role": "tool", "content": "{\"temp\": 21}"},
		{"role": "user", "content": "Thanks! And tomorrow?"}]`))
	if err != nil {
		tb.Fatal(err)
	}
	vars := NewObject(2)
	vars.Set("messages", msgs)
	vars.Set("add_generation_prompt", Bool(true))
	return vars
}

func BenchmarkRenderQwen3(b *testing.B) {
	src, err := os.ReadFile("testdata/qwen3.jinja")
	if err != nil {
		b.Fatal(err)
	}
	tpl, err := Parse(string(src))
	if err != nil {
		b.Fatal(err)
	}
	vars := qwen3Vars(b)
	var out []byte
	b.ReportAllocs()
	cpu0 := processCPU()
	for i := 0; i < b.N; i++ {
		if out, err = tpl.Render(out[:0], vars); err != nil {
			b.Fatal(err)
		}
	}
	if d := processCPU() - cpu0; cpu0 > 0 && d > 0 {
		b.ReportMetric(float64(d.Nanoseconds())/float64(b.N), "cpu-ns/op")
	}
	b.SetBytes(int64(len(out)))
}

// BenchmarkRenderQwen3ThinkSplit renders an 8 MB assistant message of
// "</think>" repeated, which the template splits twice.
func BenchmarkRenderQwen3ThinkSplit(b *testing.B) {
	src, err := os.ReadFile("testdata/qwen3.jinja")
	if err != nil {
		b.Fatal(err)
	}
	tpl, err := Parse(string(src))
	if err != nil {
		b.Fatal(err)
	}
	vars, err := FromJSON([]byte(`{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": ""}]}`))
	if err != nil {
		b.Fatal(err)
	}
	content := strings.Repeat("</think>", 1<<20)
	m, _ := vars.Object().Get("messages")
	m.arr.items[1].Object().Set("content", String(content))
	var out []byte
	b.SetBytes(int64(len(content)))
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		if out, err = tpl.Render(out[:0], vars.Object()); err != nil {
			b.Fatal(err)
		}
	}
}
