package protocol

import (
	"math/rand/v2"
	"strings"
	"testing"
)

func TestEnsureStreamUsageAsksTheEngine(t *testing.T) {
	f := func(in, want string, asked bool) {
		t.Helper()
		out, gotAsked, err := EnsureStreamUsage(make([]byte, 0, 256), []byte(in))
		if err != nil || string(out) != want || gotAsked != asked {
			t.Errorf("%s:\n got %s asked=%v err=%v\nwant %s asked=%v", in, out, gotAsked, err, want, asked)
		}
	}
	f(`{"model":"m","messages":[]}`, `{"model":"m","messages":[]}`, false)
	f(`{"stream":false,"messages":[]}`, `{"stream":false,"messages":[]}`, false)
	f(`{"stream":true,"messages":[]}`, `{"stream_options":{"include_usage":true},"stream":true,"messages":[]}`, false)
	f(`{"stream":true,"stream_options":null}`, `{"stream":true,"stream_options":{"include_usage":true}}`, false)
	// include_usage defaults to true in vLLM's StreamOptions: written in, the client asked
	f(`{"stream":true,"stream_options":{}}`, `{"stream":true,"stream_options":{"include_usage":true}}`, true)
	f(`{"stream":true,"stream_options":{ }}`, `{"stream":true,"stream_options":{"include_usage":true }}`, true)
	f(`{"stream":true,"stream_options":{"continuous_usage_stats":false}}`, `{"stream":true,"stream_options":{"include_usage":true,"continuous_usage_stats":false}}`, true)
	f(`{"stream":true,"stream_options":{"include_usage":null}}`, `{"stream":true,"stream_options":{"include_usage":true}}`, false)
	f(`{"stream":true,"stream_options":{"include_usage":"maybe"}}`, `{"stream":true,"stream_options":{"include_usage":"maybe"}}`, false)
	f(`{"stream":true,"stream_options":{"include_usage":false}}`, `{"stream":true,"stream_options":{"include_usage":true}}`, false)
	f(`{"stream":true,"stream_options":{"include_usage":true}}`, `{"stream":true,"stream_options":{"include_usage":true}}`, true)
	// continuous usage stats come only with include_usage (vLLM): off unless the client asked for usage
	f(`{"stream":true,"stream_options":{"continuous_usage_stats":true}}`, `{"stream":true,"stream_options":{"include_usage":true,"continuous_usage_stats":true}}`, true)
	f(`{"stream":true,"stream_options":{"include_usage":null,"continuous_usage_stats":true}}`, `{"stream":true,"stream_options":{"include_usage":true,"continuous_usage_stats":false}}`, false)
	f(`{"stream":true,"stream_options":{"include_usage":false,"continuous_usage_stats":true}}`, `{"stream":true,"stream_options":{"include_usage":true,"continuous_usage_stats":false}}`, false)
	f(`{"stream":true,"stream_options":{"continuous_usage_stats":true,"include_usage":false}}`, `{"stream":true,"stream_options":{"continuous_usage_stats":false,"include_usage":true}}`, false)
	f(`{"stream":true,"stream_options":{"include_usage":true,"continuous_usage_stats":true}}`, `{"stream":true,"stream_options":{"include_usage":true,"continuous_usage_stats":true}}`, true)
	// the engine reads the last duplicate: so do we
	f(`{"stream":true,"stream_options":{"include_usage":true,"include_usage":false}}`, `{"stream":true,"stream_options":{"include_usage":true,"include_usage":true}}`, false)
	f(`{"stream":false,"stream":true}`, `{"stream_options":{"include_usage":true},"stream":false,"stream":true}`, false)
	if _, _, err := EnsureStreamUsage(nil, []byte(`{"stream":true`)); err == nil {
		t.Error("malformed body accepted")
	}
}

// Forced (force_stream_usage, vLLM's --enable-force-include-usage), the
// client gets the usage, and continuous usage stats with it when it set
// them: they are left as the client sent them.
func TestForcedStreamUsageKeepsContinuousUsageStats(t *testing.T) {
	f := func(in, want string, asked bool) {
		t.Helper()
		out, gotAsked, err := EnsureStreamUsageForced(make([]byte, 0, 256), []byte(in), true)
		if err != nil || string(out) != want || gotAsked != asked {
			t.Errorf("%s:\n got %s asked=%v err=%v\nwant %s asked=%v", in, out, gotAsked, err, want, asked)
		}
	}
	f(`{"stream":true,"stream_options":{"include_usage":false,"continuous_usage_stats":true}}`, `{"stream":true,"stream_options":{"include_usage":true,"continuous_usage_stats":true}}`, false)
	f(`{"stream":true,"stream_options":{"continuous_usage_stats":"yes","include_usage":null}}`, `{"stream":true,"stream_options":{"continuous_usage_stats":"yes","include_usage":true}}`, false)
	f(`{"stream":true,"stream_options":{"include_usage":false}}`, `{"stream":true,"stream_options":{"include_usage":true}}`, false)
	f(`{"stream":true,"messages":[]}`, `{"stream_options":{"include_usage":true},"stream":true,"messages":[]}`, false)
	f(`{"stream":true,"stream_options":{"continuous_usage_stats":true}}`, `{"stream":true,"stream_options":{"include_usage":true,"continuous_usage_stats":true}}`, true)
}

func TestUsageFilterRemovesOnlyTheUsageChunk(t *testing.T) {
	content := chunkLine(`{"content":"the \"usage\": is"}`, "null") + "data: {\"choices\":[{\"delta\":{}}],\"usage\":null}\n\n" + chunkLine(`{}`, `"stop"`)
	in := content + usageLine + "data: [DONE]\n\n"
	want := content + "data: [DONE]\n\n"
	for seed := uint64(0); seed < 50; seed++ {
		var f UsageFilter
		var out []byte
		for _, p := range splitRandom(rand.New(rand.NewPCG(seed, 9)), []byte(in), 1+int(seed)) {
			out = f.Filter(out, p)
		}
		out = f.Flush(out)
		if string(out) != want {
			t.Fatalf("split %d:\n got %q\nwant %q", seed, out, want)
		}
		if u := f.Usage; !u.Seen || u.PromptTokens != 12 || u.CompletionTokens != 7 || u.CachedTokens != 4 {
			t.Fatalf("usage %+v", u)
		}
	}
	// CRLF framing and a usage chunk carrying choices (continuous usage) stay
	var f UsageFilter
	crlf := strings.ReplaceAll(usageLine, "\n", "\r\n")
	keep := "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}],\"usage\":{\"prompt_tokens\":1}}\n\n"
	if out := f.Flush(f.Filter(nil, []byte(keep+crlf+"data: [DONE]\r\n\r\n"))); string(out) != keep+"data: [DONE]\r\n\r\n" {
		t.Errorf("crlf: %q", out)
	}
	f.Reset()
	if f.Usage.Seen {
		t.Error("Reset keeps usage")
	}
}

// An engine whose lines end in a bare CR (as the SSE specification
// allows) gets its usage chunk removed, and each event is relayed when it
// arrives: the filter found no event end in such a stream, so it held the
// whole stream back (up to 8 MiB) and relayed it with the usage chunk.
func TestUsageFilterReadsBareCRFraming(t *testing.T) {
	cr := func(s string) string { return strings.ReplaceAll(s, "\n", "\r") }
	first := cr(chunkLine(`{"content":"a"}`, "null"))
	content := first + cr(chunkLine(`{}`, `"stop"`))
	in := content + cr(usageLine) + "data: [DONE]\r\r"
	want := content + "data: [DONE]\r\r"
	for seed := uint64(0); seed < 50; seed++ {
		var f UsageFilter
		var out []byte
		for _, p := range splitRandom(rand.New(rand.NewPCG(seed, 9)), []byte(in), 1+int(seed)) {
			out = f.Filter(out, p)
		}
		out = f.Flush(out)
		if string(out) != want {
			t.Fatalf("split %d:\n got %q\nwant %q", seed, out, want)
		}
		if u := f.Usage; !u.Seen || u.PromptTokens != 12 || u.CompletionTokens != 7 {
			t.Fatalf("usage %+v", u)
		}
	}
	var f UsageFilter
	if out := f.Filter(nil, []byte(first)); string(out) != first {
		t.Fatalf("a whole event is held back: %q", out)
	}
}

// An extra blank line before the usage chunk reaches the client whichever
// read it arrived in: the client gets the same bytes for every split of
// the stream (the fuzzer found it dropped with the usage chunk when both
// came in one read, and relayed when a read ended right after it).
func TestUsageFilterRelaysAStrayBlankLineForAnySplit(t *testing.T) {
	content := chunkLine(`{"content":"a"}`, "null")
	for _, gap := range []string{"\n", "\r\n", "\n\n"} {
		in := content + gap + usageLine + "data: [DONE]\n\n"
		want := content + gap + "data: [DONE]\n\n"
		for cut := 1; cut < len(in); cut++ {
			var f UsageFilter
			out := f.Filter(nil, []byte(in[:cut]))
			out = f.Flush(f.Filter(out, []byte(in[cut:])))
			if string(out) != want {
				t.Fatalf("gap %q, cut at %d:\n got %q\nwant %q", gap, cut, out, want)
			}
		}
	}
}

// A usage chunk whose choices are null or absent (not the empty array
// vLLM, SGLang and llama.cpp send) is a usage chunk too: it reached the
// client that did not ask for it, and the OpenAI SDK's stream helper
// threw on it (chunk.choices is not iterable). A chunk with usage null and
// no choices is relayed, as any chunk without a usage object is.
func TestUsageFilterRemovesAUsageChunkWithoutChoices(t *testing.T) {
	for _, ev := range []string{
		"data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":2,\"total_tokens\":5}}\n\n",
		"data: {\"id\":\"c\",\"choices\":null,\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":2,\"total_tokens\":5}}\n\n",
	} {
		var f UsageFilter
		out := f.Flush(f.Filter(nil, []byte(ev+"data: [DONE]\n\n")))
		if string(out) != "data: [DONE]\n\n" || !f.Usage.Seen || f.Usage.PromptTokens != 3 || f.Usage.CompletionTokens != 2 {
			t.Errorf("%q: relayed %q, usage %+v", ev, out, f.Usage)
		}
	}
	var f UsageFilter
	keep := "data: {\"id\":\"c\",\"usage\":null}\n\n"
	if out := f.Flush(f.Filter(nil, []byte(keep))); string(out) != keep {
		t.Errorf("a chunk without a usage object: %q", out)
	}
}
