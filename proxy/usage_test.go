package proxy

import (
	"bytes"
	"fmt"
	"reflect"
	"testing"

	"github.com/infera/infera/protocol"
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

// lastKeyRef is lastIndex by bytes.LastIndex, stepping back over
// occurrences a colon (after JSON white space) does not follow.
func lastKeyRef(b, key []byte) int {
	for end := len(b); ; {
		i := bytes.LastIndex(b[:end], key)
		if i < 0 {
			return -1
		}
		if rest := bytes.TrimLeft(b[i+len(key):], " \t\r\n"); len(rest) == 0 || rest[0] == ':' {
			return i
		}
		end = i + len(key) - 1
	}
}

func FuzzLastIndexIsTheLastKeyOccurrence(f *testing.F) {
	f.Add([]byte(`{"usage":{},"usage":{}}`), []byte(`"usage"`))
	f.Add([]byte(`{"usage":{},"x":["usage"]}`), []byte(`"usage"`))
	f.Add([]byte(`{"usage" :{},"usage"`), []byte(`"usage"`))
	f.Add([]byte("aaaa"), []byte("aa"))
	f.Add([]byte(""), []byte("x"))
	f.Fuzz(func(t *testing.T, b, key []byte) {
		if len(key) == 0 {
			return
		}
		if got, want := lastIndex(b, key), lastKeyRef(b, key); got != want {
			t.Fatalf("lastIndex(%q, %q) = %d, the reference says %d", b, key, got, want)
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

// TestProtocolUsageReadInPartsAndAcrossReadBoundaries: an Anthropic stream
// carries its input in message_start and its output in message_delta, a
// Responses stream its usage in response.completed after a null one; read
// whole (one read, as a short answer comes), cut anywhere in two or three
// reads, or byte by byte, the totals are the same.
func TestProtocolUsageReadInPartsAndAcrossReadBoundaries(t *testing.T) {
	cases := []struct {
		api                        protocol.API
		body                       string
		prompt, completion, cached int
	}{
		{protocol.Anthropic, "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"model\":\"m\",\"stop_reason\":null,\"usage\":{\"input_tokens\":30,\"cache_creation_input_tokens\":0,\"cache_read_input_tokens\":9,\"cache_creation\":{\"ephemeral_5m_input_tokens\":0},\"output_tokens\":0,\"service_tier\":\"standard\"}}}\n\n" +
			"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"hi\"}}\n\n" +
			"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"max_tokens\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":700}}\n\n" +
			"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n", 39, 700, 9},
		{protocol.Anthropic, `{"id":"msg_1","type":"message","content":[{"type":"text","text":"the \"usage\" of words"}],"usage":{"input_tokens":30,"cache_read_input_tokens":9,"output_tokens":700}}`, 39, 700, 9},
		{protocol.Responses, "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"r\",\"status\":\"in_progress\",\"usage\":null}}\n\n" +
			"event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"hi\"}\n\n" +
			"event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"id\":\"r\",\"status\":\"completed\",\"usage\":{\"input_tokens\":39,\"input_tokens_details\":{\"cached_tokens\":9},\"output_tokens\":700,\"output_tokens_details\":{\"reasoning_tokens\":0},\"total_tokens\":739}}}\n\n", 39, 700, 9},
	}
	for ci, c := range cases {
		b := []byte(c.body)
		scan := func(chunks ...[]byte) usage {
			var u usage
			for _, ch := range chunks {
				u.scanProtocol(ch, c.api)
			}
			return u
		}
		check := func(u usage, how string) {
			t.Helper()
			if !u.seen || u.prompt != c.prompt || u.completion != c.completion || u.cached != c.cached {
				t.Fatalf("case %d %s: prompt %d completion %d cached %d seen %v", ci, how, u.prompt, u.completion, u.cached, u.seen)
			}
		}
		check(scan(b), "whole")
		for i := 0; i <= len(b); i++ {
			check(scan(b[:i], b[i:]), fmt.Sprintf("cut at %d", i))
			for j := i; j <= len(b) && j < i+40; j++ {
				check(scan(b[:i], b[i:j], b[j:]), fmt.Sprintf("cut at %d and %d", i, j))
			}
		}
		var u usage
		for i := range b {
			u.scanProtocol(b[i:i+1], c.api)
		}
		check(u, "byte by byte")
	}
}

// TestAnthropicCacheWritesCountAsPromptTokens: Anthropic's input_tokens
// leaves out the prompt tokens read from and written to its cache; the
// written ones were computed like any input (a prompt of 1000 tokens, 900
// of them written to the cache, was charged 100 against the user's TPM
// and token quotas).
func TestAnthropicCacheWritesCountAsPromptTokens(t *testing.T) {
	for _, c := range []struct {
		body   string
		cached int
	}{
		{`{"id":"msg_1","type":"message","content":[],"usage":{"input_tokens":100,"cache_creation_input_tokens":900,"cache_read_input_tokens":0,"cache_creation":{"ephemeral_5m_input_tokens":900,"ephemeral_1h_input_tokens":0},"output_tokens":7}}`, 0},
		{"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":60,\"cache_creation_input_tokens\":900,\"cache_read_input_tokens\":40,\"output_tokens\":1}}}\n\n" +
			"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":7}}\n\n", 40},
	} {
		var u usage
		u.scanProtocol([]byte(c.body), protocol.Anthropic)
		if !u.seen || u.prompt != 1000 || u.cached != c.cached || u.completion != 7 {
			t.Fatalf("%s: prompt %d cached %d completion %d, want 1000 %d 7", c.body, u.prompt, u.cached, u.completion, c.cached)
		}
	}
}

// BenchmarkEngineErrorCheckSSEEvent checks one streamed event for the
// engine's error event, as every chunk of a relayed stream is.
func BenchmarkEngineErrorCheckSSEEvent(b *testing.B) {
	ev := []byte("data: {\"id\":\"chatcmpl-b3f1c0a2d4e5\",\"object\":\"chat.completion.chunk\",\"created\":1733450000,\"model\":\"Qwen/Qwen3-8B\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\" your request regarding\"},\"logprobs\":null,\"finish_reason\":null}]}\n\n")
	b.ReportAllocs()
	b.SetBytes(int64(len(ev)))
	for b.Loop() {
		if chatCarriesError(ev) {
			b.Fatal("a healthy event taken for an error")
		}
	}
}

// An older vLLM rerank's usage, {"total_tokens":N} alone, is N prompt
// tokens, however the body is cut.
func TestUsageWithOnlyTotalTokensIsPromptTokens(t *testing.T) {
	b := []byte(`{"id":"rerank-1","model":"m","usage":{"total_tokens":1234},"results":[{"index":0,"document":{"text":"total_tokens"},"relevance_score":0.5}]}`)
	check := func(u usage, how string) {
		t.Helper()
		if !u.seen || u.prompt != 1234 || u.completion != 0 {
			t.Fatalf("%s: %+v", how, u)
		}
	}
	check(scanChunks(b), "whole")
	for i := 0; i <= len(b); i++ {
		check(scanChunks(b[:i], b[i:]), fmt.Sprintf("cut at %d", i))
	}
}

// TestUsageResetForgetsACutUsageObject: a pooled request state's usage
// keeps its carry array from answer to answer (reset clears usageState
// only), so a usage object the last answer left cut must not reach the
// next answer's scan; and every field of usage but that array is in the
// state reset clears.
func TestUsageResetForgetsACutUsageObject(t *testing.T) {
	var u usage
	u.scan([]byte(`{"id":"a","usage":{"prompt_tokens":1234,"completion_tok`))
	if u.ncarry == 0 {
		t.Fatal("the cut usage object was not carried")
	}
	u.reset()
	u.scan([]byte(`ens":567}}`))
	if u.seen || u.prompt != 0 || u.completion != 0 || u.ncarry != 0 {
		t.Fatalf("the last answer's cut usage object reached the next one: %+v", u.usageState)
	}
	u.scan([]byte(`{"id":"b","usage":{"prompt_tokens":7,"completion_tokens":1}}`))
	if !u.seen || u.prompt != 7 || u.completion != 1 {
		t.Fatalf("the next answer's usage: %+v", u.usageState)
	}

	ut := reflect.TypeOf(usage{})
	if ut.NumField() != 2 || ut.Field(0).Name != "usageState" || ut.Field(1).Name != "carry" {
		t.Fatalf("usage has fields outside usageState that reset would not clear: %v", ut)
	}
}

// objectEndWalk is objectEnd written as a walk over every byte: the
// reference objectEnd's vectorised search must agree with.
func objectEndWalk(b []byte) int {
	i := 0
	for i < len(b) && (b[i] == ' ' || b[i] == ':' || b[i] == '\t' || b[i] == '\r' || b[i] == '\n') {
		i++
	}
	if i == len(b) {
		return -1
	}
	if b[i] != '{' {
		if i+4 > len(b) {
			return -1
		}
		return i + 4
	}
	depth := 0
	for ; i < len(b); i++ {
		switch b[i] {
		case '{':
			depth++
		case '}':
			depth--
			if depth == 0 {
				return i + 1
			}
		}
	}
	return -1
}

// TestTheUsageObjectEndsWhereItsBracesClose: objectEnd finds the end of
// the value after a usage key as a walk over every byte does, for whole,
// nested, cut and null values.
func TestTheUsageObjectEndsWhereItsBracesClose(t *testing.T) {
	f := func(in string, want int) {
		t.Helper()
		if got := objectEnd([]byte(in)); got != want {
			t.Fatalf("objectEnd(%q) = %d, want %d", in, got, want)
		}
		if ref := objectEndWalk([]byte(in)); ref != want {
			t.Fatalf("walk(%q) = %d, want %d", in, ref, want)
		}
	}
	f(`:{"prompt_tokens":7}`, 20)
	f(`: {"a":1,"d":{"c":3}},"x":{}`, 21)
	f(`:{"a":{"b":{"c":{}}}}}`, 21)
	f(`:{"a":{"b":1}`, -1)
	f(`:{`, -1)
	f(`:null,`, 5)
	f(`:nu`, -1)
	f(` : `, -1)
	f(``, -1)
	// Every cut of a body with nested objects, against the walk.
	body := []byte(`:{"prompt_tokens":7,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":3,"x":{}},"total_tokens":8}}]}` + "\n\n")
	for i := 0; i <= len(body); i++ {
		for j := i; j <= len(body); j++ {
			if got, ref := objectEnd(body[i:j]), objectEndWalk(body[i:j]); got != ref {
				t.Fatalf("objectEnd(%q) = %d, walk %d", body[i:j], got, ref)
			}
		}
	}
}

// vLLM's chat answer puts prompt_logprobs after its usage object, each
// prompt token with its decoded_token: a prompt token "usage" (a client
// writes the word) is a string "usage" after the usage object. It is a
// value, not a key (no colon follows it), and must not hide the usage
// before it: the request was charged its estimate instead of its usage,
// so a client without max_tokens asking for prompt_logprobs generated up
// to the context and was charged default_output_tokens.
func TestAUsageStringAfterTheUsageObjectDoesNotHideIt(t *testing.T) {
	bodies := []string{
		`{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1234,"total_tokens":1801,"completion_tokens":567,"prompt_tokens_details":{"cached_tokens":89}},"prompt_logprobs":[null,{"31507":{"logprob":-1.5,"rank":1,"decoded_token":"usage"}},{"11":{"logprob":-0.1,"rank":1,"decoded_token":"usage" }}]}`,
		`{"id":"x","choices":[],"usage" : {"prompt_tokens":1234,"completion_tokens":567,"prompt_tokens_details":{"cached_tokens":89}},"prompt_logprobs":[{"1":{"decoded_token":"usage"}}],"kv_transfer_params":null}`,
	}
	for bi, body := range bodies {
		b := []byte(body)
		check := func(u usage, how string) {
			t.Helper()
			if !u.seen || u.prompt != 1234 || u.completion != 567 || u.cached != 89 {
				t.Fatalf("body %d %s: %+v", bi, how, u.usageState)
			}
		}
		check(scanChunks(b), "whole")
		for i := 0; i <= len(b); i++ {
			check(scanChunks(b[:i], b[i:]), fmt.Sprintf("cut at %d", i))
			for j := i; j <= len(b) && j < i+40; j++ {
				check(scanChunks(b[:i], b[i:j], b[j:]), fmt.Sprintf("cut at %d and %d", i, j))
			}
		}
	}
}
