package jinja

import (
	"os"
	"testing"
)

func BenchmarkRenderQwen3(b *testing.B) {
	src, err := os.ReadFile("testdata/qwen3.jinja")
	if err != nil {
		b.Fatal(err)
	}
	tpl, err := Parse(string(src))
	if err != nil {
		b.Fatal(err)
	}
	msgs, err := FromJSON([]byte(`[{"role": "system", "content": "You are a helpful assistant."},
		{"role": "user", "content": "What's the weather in Paris?"},
		{"role": "assistant", "content": "<think>\nNeed the tool.\n</think>\n\nLet me check.", "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
		{"role": "tool", "content": "{\"temp\": 21}"},
		{"role": "user", "content": "Thanks! And tomorrow?"}]`))
	if err != nil {
		b.Fatal(err)
	}
	vars := NewObject(2)
	vars.Set("messages", msgs)
	vars.Set("add_generation_prompt", Bool(true))
	var out []byte
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		if out, err = tpl.Render(out[:0], vars); err != nil {
			b.Fatal(err)
		}
	}
	b.SetBytes(int64(len(out)))
}
