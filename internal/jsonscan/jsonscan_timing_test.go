package jsonscan

import (
	"strings"
	"testing"
)

// benchBody is a chat request with a 1K-token prompt, a system message,
// and a tool (what the proxy validates on every request).
var benchBody = `{"model":"qwen3","stream":true,"max_tokens":256,"temperature":0.7,` +
	`"messages":[{"role":"system","content":"You are a helpful assistant.\nAnswer briefly."},` +
	`{"role":"user","content":"` + strings.Repeat(`Tell me about caf\u00e9s in Paris, \"the best\" ones. `, 80) + `"}],` +
	`"tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object",` +
	`"properties":{"city":{"type":"string"},"days":{"type":"integer","minimum":1}},"required":["city"]}}}]}`

func BenchmarkSkipValue(b *testing.B) {
	d := []byte(benchBody)
	b.SetBytes(int64(len(d)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := SkipValue(d, 0, 256); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkWalkObject(b *testing.B) {
	d := []byte(benchBody)
	b.SetBytes(int64(len(d)))
	b.ReportAllocs()
	for b.Loop() {
		n := 0
		if _, err := WalkObject(d, 0, 256, func(key []byte, vs, ve int) error {
			n++
			return nil
		}); err != nil || n != 6 {
			b.Fatal(err, n)
		}
	}
}

func BenchmarkUnescape(b *testing.B) {
	raw, _, err := ScanString([]byte(`"`+strings.Repeat(`caf\u00e9 \"x\"\n `, 100)+`"`), 0)
	if err != nil {
		b.Fatal(err)
	}
	buf := make([]byte, 0, 4096)
	b.SetBytes(int64(len(raw)))
	b.ReportAllocs()
	for b.Loop() {
		buf = Unescape(buf[:0], raw)
	}
}

func BenchmarkAppendString(b *testing.B) {
	s := strings.Repeat("Tell me about cafés in Paris, \"the best\" ones.\n", 80)
	buf := make([]byte, 0, 8192)
	b.SetBytes(int64(len(s)))
	b.ReportAllocs()
	for b.Loop() {
		buf = AppendString(buf[:0], s)
	}
}

func BenchmarkLaxBool(b *testing.B) {
	vals := [][]byte{[]byte(`true`), []byte(`"True"`), []byte(`"\u0074rue"`), []byte(`1.0`)}
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		LaxBool(vals[i&3])
	}
}
