package proxy

import (
	"fmt"
	"strings"
	"testing"

	"github.com/infera/infera/protocol"
)

// A stream's usage is settled (the request's own count, which stands when
// the stream ends early after it) once the engine's final usage object was
// read whole: a chat or completions stream's usage chunk, with no choices
// ([] or null, absent), not the usage so far on a chunk with choices
// (vLLM's continuous_usage_stats) unless it is on the finish_reason
// chunk of a request that generates one sequence (then it counts the whole
// answer), nor a usage object cut by the end of what was read. Wherever reads cut the stream, it is settled exactly
// from the end of that object (or, when no choices precede the usage in
// its chunk, from the end of the chunk's line) on.
func TestAStreamsUsageIsSettledFromItsFinalUsageChunkOn(t *testing.T) {
	const final = `"usage":{"prompt_tokens":1234,"completion_tokens":567,"total_tokens":1801,"prompt_tokens_details":{"cached_tokens":89}}`
	head := "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\","
	text := func(s, usage string) string {
		return head + `"choices":[{"index":0,"delta":{"content":"` + s + `"},"finish_reason":null}]` + usage + "}\n\n"
	}
	soFar := func(n int) string {
		return fmt.Sprintf(`,"usage":{"prompt_tokens":1234,"completion_tokens":%d,"total_tokens":%d}`, n, 1234+n)
	}
	for _, tc := range []struct {
		name   string
		stream string
		// the stream is settled from the end of the first occurrence of
		// this on (never when empty)
		from string
		// once: the request did not ask for continuous usage
		once bool
		// single: the request generates one sequence
		single bool
	}{
		{"include_usage", text("a", "") + text(`the \"choices\":[] of it`, "") + head + `"choices":[],` + final + "}\n\ndata: [DONE]\n\n", final, false, false},
		{"null usage on every chunk (OpenAI)", text("a", `,"usage":null`) + head + `"choices":[],` + final + "}\n\ndata: [DONE]\n\n", final, false, false},
		{"continuous usage", text("a", soFar(1)) + text("b", soFar(2)) + head + `"choices":[],` + final + "}\n\ndata: [DONE]\n\n", final, false, false},
		{"continuous usage, choices spaced", strings.ReplaceAll(text("a", soFar(1))+head+`"choices" : [ ],`+final+"}\n\n", `"choices":[{`, `"choices": [ {`), final, false, false},
		{"null choices", text("a", soFar(1)) + head + `"choices":null,` + final + "}\n\n", final, false, false},
		{"usage before choices", text("a", soFar(1)) + head + final + `,"choices":[]}` + "\n\ndata: [DONE]\n\n", final + `,"choices":[]}` + "\n", false, false},
		{"no choices key", text("a", soFar(1)) + "data: {" + final + "}\r\n\r\ndata: [DONE]\r\n\r\n", final + "}\r", false, false},
		{name: "no continuous usage asked: the usage on the finish_reason chunk", stream: text("a", "") + head + `"choices":[{"index":0,"delta":{},"finish_reason":"stop"}],` + final + "}\n\ndata: [DONE]\n\n", from: final, once: true},
		{name: "no continuous usage asked: the usage before the finish_reason chunk's choices", stream: text("a", `,"usage":null`) + head + final + `,"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}` + "\n\ndata: [DONE]\n\n", from: final, once: true},
		{name: "continuous usage: the usage so far on the finish_reason chunk", stream: text("a", soFar(1)) + head + `"choices":[{"index":0,"delta":{},"finish_reason":"stop"}],` + strings.TrimPrefix(soFar(2), ",") + "}\n\ndata: [DONE]\n\n"},
		{name: "continuous usage, one sequence: the usage on the finish_reason chunk", stream: text("a", soFar(1)) + head + `"choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop","stop_reason":null}],` + final + "}\n\n" + head + `"choices":[],` + final + "}\n\ndata: [DONE]\n\n", from: final, single: true},
		{name: "continuous usage, one sequence, spaced: the usage on the finish_reason chunk", stream: text("a", soFar(1)) + head + `"choices": [{"index": 0, "delta": {}, "finish_reason" : "length"}], ` + final + "}\n\n" + head + `"choices":[],` + final + "}\n\ndata: [DONE]\n\n", from: final, single: true},
		{name: "continuous usage, one sequence: the usage so far before the finish_reason chunk", stream: text("a", soFar(1)) + text("b", soFar(2)) + head + `"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}` + "\n\ndata: [DONE]\n\n", single: true},
		{name: "continuous usage, one sequence: the usage before the finish_reason chunk's choices", stream: text("a", soFar(1)) + head + final + `,"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}` + "\n\ndata: [DONE]\n\n", from: final + `,"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}` + "\n", single: true},
		{name: "continuous usage, several sequences: one's finish_reason chunk", stream: text("a", soFar(1)) + head + `"choices":[{"index":1,"delta":{},"finish_reason":"stop"}],` + strings.TrimPrefix(soFar(2), ",") + "}\n\n" + head + `"choices":[],` + final + "}\n\ndata: [DONE]\n\n", from: final},
		{name: "continuous usage, one legacy completion: the usage on the finish_reason chunk", stream: "data: {\"id\":\"cmpl-1\",\"object\":\"text_completion\",\"choices\":[{\"index\":0,\"text\":\"a\",\"logprobs\":null,\"finish_reason\":null}],\"usage\":{\"prompt_tokens\":1234,\"completion_tokens\":1,\"total_tokens\":1235}}\n\n" +
			"data: {\"id\":\"cmpl-1\",\"object\":\"text_completion\",\"choices\":[{\"index\":0,\"text\":\"b\",\"logprobs\":null,\"finish_reason\":\"length\",\"stop_reason\":null}]," + final + "}\n\ndata: [DONE]\n\n", from: final, single: true},
		{name: "continuous usage, one sequence: a chunk whose text is the word finish_reason", stream: text("finish_reason", soFar(1)) + text("b", soFar(2)) + head + `"choices":[],` + final + "}\n\ndata: [DONE]\n\n", from: final, single: true},
		{name: "a long usage object, every details field", stream: text("a", "") + head + `"choices":[],` + longUsage + "}\n\ndata: [DONE]\n\n", from: longUsage},
		{"legacy completions", "data: {\"id\":\"cmpl-1\",\"object\":\"text_completion\",\"choices\":[{\"index\":0,\"text\":\"a\",\"finish_reason\":\"length\"}]}\n\n" +
			"data: {\"id\":\"cmpl-1\",\"object\":\"text_completion\",\"choices\":[]," + final + "}\n\ndata: [DONE]\n\n", final, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := []byte(tc.stream)
			from := strings.Index(tc.stream, tc.from) + len(tc.from)
			// how and its args say where the stream was cut (formatted
			// only on a failure: this runs for every pair of cuts).
			check := func(u *usage, read int, how string, args ...any) {
				t.Helper()
				want := tc.from != "" && read >= from
				if got := u.settled(true); got != want {
					t.Fatalf("%s: %d of %d bytes read (settled from %d on): settled %v, want %v (%+v)", fmt.Sprintf(how, args...), read, len(b), from, got, want, *u)
				}
				if want && (u.prompt != 1234 || u.completion != 567 || u.cached != 89) {
					t.Fatalf("%s: settled with %d %d %d", fmt.Sprintf(how, args...), u.prompt, u.completion, u.cached)
				}
			}
			for i := 0; i <= len(b); i++ {
				// The first cut's state, scanned once and copied for
				// every second cut.
				first := usage{usageState: usageState{lines: true, once: tc.once, single: tc.single}}
				first.scan(b[:i])
				check(&first, i, "cut at %d", i)
				for j := i; j <= len(b); j++ {
					// Under the race detector (ten times slower) the
					// second cuts past 40 bytes are sampled, every 8th.
					if raceEnabled && j > i+40 && j < len(b) && (j-i)%8 != 0 {
						continue
					}
					u := first.clone()
					u.scan(b[i:j])
					check(&u, j, "cut at %d and %d", i, j)
					if j < i+40 {
						u.scan(b[j:])
						check(&u, len(b), "cut at %d and %d, then the rest", i, j)
					}
				}
			}
			u := usage{usageState: usageState{lines: true, once: tc.once, single: tc.single}}
			for i := range b {
				u.scan(b[i : i+1])
				check(&u, i+1, "byte by byte")
			}
		})
	}
}

// longUsage is a usage object of 1234 prompt tokens (89 cached) and 567
// completion tokens with every details field OpenAI and the engines send,
// spaced as Python's json.dumps spaces it: over 500 bytes.
const longUsage = `"usage": {"prompt_tokens": 1234, "total_tokens": 1801, "completion_tokens": 567, ` +
	`"prompt_tokens_details": {"cached_tokens": 89, "audio_tokens": 0, "text_tokens": 1145, "image_tokens": 0, "video_tokens": 0}, ` +
	`"completion_tokens_details": {"reasoning_tokens": 412, "audio_tokens": 0, "accepted_prediction_tokens": 0, "rejected_prediction_tokens": 0, "text_tokens": 155, "image_tokens": 0}, ` +
	`"server_tool_use": {"web_search_requests": 0}, "cost_details": {"upstream_inference_cost": null}, "num_cached_tokens": 89}`

// A usage object longer than any short bound, cut by a read boundary at
// any position, is read whole: a non-streamed answer's is settled from its
// closing brace on, with its numbers. Past the carry bound (384 bytes) it
// was never read whole, so never settled.
func TestALongUsageObjectCutAnywhereIsReadWhole(t *testing.T) {
	if len(longUsage) < 500 {
		t.Fatalf("the usage object has %d bytes", len(longUsage))
	}
	body := []byte(`{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],` + longUsage + `}`)
	end := len(body) - 1
	for i := 0; i <= len(body); i++ {
		var u usage
		u.scan(body[:i])
		u.scan(body[i:])
		if !u.settled(false) || u.prompt != 1234 || u.completion != 567 || u.cached != 89 {
			t.Fatalf("a plain body cut at %d of %d: settled %v with %d %d %d", i, len(body), u.settled(false), u.prompt, u.completion, u.cached)
		}
		u = usage{}
		u.scan(body[:i])
		if got := u.settled(false); got != (i >= end) {
			t.Fatalf("a plain body read up to %d of %d: settled %v", i, len(body), got)
		}
	}
	// A Responses stream's terminal event, as long.
	resp := []byte("event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"id\":\"r\"," +
		`"usage": {"input_tokens": 1234, "input_tokens_details": {"cached_tokens": 89, "audio_tokens": 0, "text_tokens": 1145, "image_tokens": 0, "video_tokens": 0}, ` +
		`"output_tokens": 567, "output_tokens_details": {"reasoning_tokens": 412, "audio_tokens": 0, "accepted_prediction_tokens": 0, "rejected_prediction_tokens": 0, "text_tokens": 155, "image_tokens": 0}, ` +
		`"total_tokens": 1801, "server_tool_use": {"web_search_requests": 0}, "cost_details": {"upstream_inference_cost": null}}}}` + "\n\n")
	for i := 0; i <= len(resp); i++ {
		var u usage
		u.scanProtocol(resp[:i], protocol.Responses)
		u.scanProtocol(resp[i:], protocol.Responses)
		if !u.settled(true) || u.prompt != 1234 || u.completion != 567 || u.cached != 89 {
			t.Fatalf("a Responses stream cut at %d of %d: settled %v with %d %d %d", i, len(resp), u.settled(true), u.prompt, u.completion, u.cached)
		}
	}
}

// A usage object cut by the end of what was read is not settled, in any
// protocol, nor an Anthropic message_start's (the input alone); a whole
// non-streamed answer's usage is.
func TestAUsageObjectCutOrPartialIsNotSettled(t *testing.T) {
	body := []byte(`{"id":"x","choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":1234,"completion_tokens":567,"total_tokens":1801}}`)
	end := len(body) - 1 // the usage object's closing brace is the last but one byte
	for i := 0; i <= len(body); i++ {
		var u usage
		u.scan(body[:i])
		if got := u.settled(false); got != (i >= end) {
			t.Fatalf("a plain body read up to %d of %d: settled %v", i, len(body), got)
		}
	}
	for _, c := range []struct {
		api    protocol.API
		stream string
		from   string
	}{
		{protocol.Anthropic, "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"usage\":{\"input_tokens\":30,\"cache_read_input_tokens\":9,\"output_tokens\":0}}}\n\n" +
			"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":7}}\n\n" +
			"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n", `"usage":{"output_tokens":7}`},
		{protocol.Responses, "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"r\",\"usage\":null}}\n\n" +
			"event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"id\":\"r\",\"usage\":{\"input_tokens\":39,\"input_tokens_details\":{\"cached_tokens\":9},\"output_tokens\":7,\"total_tokens\":46}}}\n\n",
			`"total_tokens":46}`},
	} {
		b := []byte(c.stream)
		from := strings.Index(c.stream, c.from) + len(c.from)
		for i := 0; i <= len(b); i++ {
			var first usage
			first.scanProtocol(b[:i], c.api)
			for j := i; j <= len(b); j++ {
				u := first.clone()
				u.scanProtocol(b[i:j], c.api)
				if got := u.settled(true); got != (j >= from) {
					t.Fatalf("%v stream cut at %d and %d (settled from %d on): settled %v (%+v)", c.api, i, j, from, got, u)
				}
			}
		}
	}
}

// clone is a copy of u that shares no memory with it: scanning one leaves
// the other as it was (big, the one reference, is copied whole, to its
// capacity, as scan reads it).
func (u *usage) clone() usage {
	c := *u
	if u.big != nil {
		c.big = append(make([]byte, 0, cap(u.big)), u.big[:cap(u.big)]...)[:len(u.big)]
	}
	return c
}
