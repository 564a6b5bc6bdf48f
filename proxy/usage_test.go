package proxy

import (
	"bytes"
	"fmt"
	"testing"
)

func scanChunks(chunks ...[]byte) usage {
	var u usage
	for _, c := range chunks {
		u.scan(c)
	}
	return u
}

func TestUsageReadAcrossReadBoundaries(t *testing.T) {
	bodies := []string{
		`{"id":"x","choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":1234,"completion_tokens":567,"total_tokens":1801,"prompt_tokens_details":{"cached_tokens":89}}}`,
		"data: {\"choices\":[{\"delta\":{\"content\":\" a\"}}],\"usage\":null}\n\n" +
			"data: {\"choices\":[],\"usage\":{\"prompt_tokens\": 1234, \"completion_tokens\": 567, \"prompt_tokens_details\": {\"cached_tokens\": 89}}}\n\ndata: [DONE]\n\n",
		// Usage in every event (continuous usage stats): the last one counts.
		"data: {\"usage\":{\"prompt_tokens\":1234,\"completion_tokens\":1}}\n\ndata: {\"usage\":{\"prompt_tokens\":1234,\"completion_tokens\":567,\"prompt_tokens_details\":{\"cached_tokens\":89}}}\n\n",
	}
	for bi, body := range bodies {
		b := []byte(body)
		check := func(u usage, how string) {
			t.Helper()
			if !u.seen || u.prompt != 1234 || u.completion != 567 || u.cached != 89 {
				t.Fatalf("body %d %s: %+v", bi, how, u)
			}
		}
		check(scanChunks(b), "whole")
		for i := 0; i <= len(b); i++ {
			check(scanChunks(b[:i], b[i:]), fmt.Sprintf("cut at %d", i))
			for j := i; j <= len(b) && j < i+40; j++ {
				check(scanChunks(b[:i], b[i:j], b[j:]), fmt.Sprintf("cut at %d and %d", i, j))
			}
		}
		// One byte at a time.
		var u usage
		for i := range b {
			u.scan(b[i : i+1])
		}
		check(u, "byte by byte")
	}
}

func TestUsageWithoutUsageIsUnseen(t *testing.T) {
	u := scanChunks([]byte(`{"choices":[{"message":{"content":"the \"usage\" of words"}}]}`), []byte(`{"usage":null}`))
	if u.seen {
		t.Fatalf("%+v", u)
	}
}

// FuzzUsageChunks: a usage object anywhere in a body, the body cut in three
// reads anywhere, reads the same numbers as the whole body; and any bytes
// cut anywhere never panic.
func FuzzUsageChunks(f *testing.F) {
	f.Add([]byte(`{"id":"x","choices":[],`), uint32(12), uint32(34), uint32(5), []byte(`}`), uint16(10), uint16(30))
	f.Add([]byte("data: {\"choices\":[],"), uint32(0), uint32(1<<20), uint32(0), []byte("}\n\ndata: [DONE]\n\n"), uint16(0), uint16(1))
	f.Fuzz(func(t *testing.T, prefix []byte, p, c, k uint32, suffix []byte, cut1, cut2 uint16) {
		cuts := func(b []byte) [][]byte {
			i := min(int(cut1), len(b))
			j := min(i+int(cut2), len(b))
			return [][]byte{b[:i], b[i:j], b[j:]}
		}
		junk := append(append(append([]byte{}, prefix...), 0), suffix...)
		scanChunks(cuts(junk)...) // never panics
		if bytes.Contains(prefix, []byte("usage")) || bytes.Contains(suffix, []byte("usage")) {
			return
		}
		body := fmt.Appendf(nil, `%s"usage":{"prompt_tokens":%d,"completion_tokens":%d,"prompt_tokens_details":{"cached_tokens":%d}}%s`, prefix, p, c, k, suffix)
		u := scanChunks(cuts(body)...)
		if !u.seen || u.prompt != int(p) || u.completion != int(c) || u.cached != int(k) {
			t.Fatalf("%q cut at %d,%d: %+v", body, cut1, cut2, u)
		}
	})
}

func FuzzLastIndexIsBytesLastIndex(f *testing.F) {
	f.Add([]byte(`{"usage":{},"usage":{}}`), []byte(`"usage"`))
	f.Add([]byte("aaaa"), []byte("aa"))
	f.Add([]byte(""), []byte("x"))
	f.Fuzz(func(t *testing.T, b, key []byte) {
		if len(key) == 0 {
			return
		}
		if got, want := lastIndex(b, key), bytes.LastIndex(b, key); got != want {
			t.Fatalf("lastIndex(%q, %q) = %d, bytes.LastIndex says %d", b, key, got, want)
		}
	})
}

// BenchmarkUsageScanJSON scans one chat completion answer, as a
// non-streaming request does.
func BenchmarkUsageScanJSON(b *testing.B) {
	body := []byte(`{"id":"cmpl-1","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"hello from the fixed backend"},"finish_reason":"stop"}],"usage":{"prompt_tokens":16,"completion_tokens":8,"total_tokens":24,"prompt_tokens_details":{"cached_tokens":0}}}`)
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		var u usage
		u.scan(body)
		if !u.seen {
			b.Fatal("usage not seen")
		}
	}
}

// BenchmarkUsageScanSSEEvent scans one streamed event without usage, as
// every relayed chunk of a stream is.
func BenchmarkUsageScanSSEEvent(b *testing.B) {
	ev := []byte("data: {\"id\":\"cmpl-1\",\"object\":\"chat.completion.chunk\",\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"tok \"},\"finish_reason\":null}]}\n\n")
	b.ReportAllocs()
	b.SetBytes(int64(len(ev)))
	var u usage
	for b.Loop() {
		u.scan(ev)
	}
}
