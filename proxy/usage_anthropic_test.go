package proxy

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/infera/infera/protocol"
)

// An Anthropic stream cut after its message_start (the engine died, the
// client left: no message_delta) has no known usage, however it was read:
// message_start's usage tells the input alone (vLLM's says output_tokens
// 0), so the request keeps its estimate, as a chat stream without usage
// does. It counted as known usage with no output.
func TestACutAnthropicStreamHasNoKnownUsage(t *testing.T) {
	b := []byte("event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"model\":\"m\",\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{\"input_tokens\":30,\"cache_read_input_tokens\":9,\"output_tokens\":0}}}\n\n" +
		"event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n" +
		"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\" the \\\"message_delta\\\" of it\"}}\n\n")
	scan := func(chunks ...[]byte) usage {
		var u usage
		for _, c := range chunks {
			u.scanProtocol(c, protocol.Anthropic)
		}
		return u
	}
	check := func(u usage, how string) {
		t.Helper()
		if u.seen || u.prompt != 39 {
			t.Fatalf("%s: seen %v prompt %d completion %d, want unseen with prompt 39", how, u.seen, u.prompt, u.completion)
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
		u.scanProtocol(b[i:i+1], protocol.Anthropic)
	}
	check(u, "byte by byte")
	// Its message_delta then makes it known.
	u.scanProtocol([]byte("event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":7}}\n\n"), protocol.Anthropic)
	if !u.seen || u.prompt != 39 || u.completion != 7 || u.cached != 9 {
		t.Fatalf("after message_delta: %+v", u)
	}
}

// An Anthropic stream read in two parts, the first ending inside the
// message_start's type (its opening quote: a key's start, carried) and
// the second ending after message_delta's type but before its usage, has
// no known usage either: message_start's input was taken for the whole
// usage with no output, because the second part was read twice, after the
// carry and alone, and the first reading left the event type it ended in
// (message_delta) as the one the second reading's usage object belonged
// to.
func TestAnAnthropicStreamCutAnywhereBeforeItsMessageDeltaHasNoKnownUsage(t *testing.T) {
	b := []byte("event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"usage\":{\"input_tokens\":30,\"cache_read_input_tokens\":9,\"output_tokens\":0}}}\n\n" +
		"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":7}}\n\n")
	cut := len(b) - len(`"usage":{"output_tokens":7}}`+"\n\n")
	input := bytes.Index(b, []byte(`"output_tokens":0}`)) + len(`"output_tokens":0}`) // message_start's usage read
	for i := 0; i <= cut; i++ {
		var first usage
		first.scanProtocol(b[:i], protocol.Anthropic)
		for j := i; j <= cut; j++ {
			u := first.clone()
			u.scanProtocol(b[i:j], protocol.Anthropic)
			if u.seen || j >= input && u.prompt != 39 {
				t.Fatalf("read up to %d and %d, before message_delta's usage: seen %v prompt %d completion %d", i, j, u.seen, u.prompt, u.completion)
			}
		}
	}
	var u usage
	u.scanProtocol(b[:36], protocol.Anthropic)
	u.scanProtocol(b[36:], protocol.Anthropic)
	if !u.seen || u.prompt != 39 || u.completion != 7 || u.cached != 9 {
		t.Fatalf("the whole stream: %+v", u)
	}
}

// An Anthropic stream's input counts are each kept at their last non-null
// value and summed, as Anthropic's SDKs accumulate them
// (anthropic-sdk-python accumulate_event): a message_delta whose
// input_tokens is set but whose cache counts are null (MessageDeltaUsage
// documents all three as cumulative and nullable) leaves the cache counts
// of message_start, read whole, cut in reads, or byte by byte; a
// message_delta with cache counts set replaces them.
func TestAnthropicInputCountsKeepTheirLastNonNullValues(t *testing.T) {
	start := "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"usage\":{\"input_tokens\":60,\"cache_creation_input_tokens\":900,\"cache_read_input_tokens\":40,\"output_tokens\":1}}}\n\n"
	for _, c := range []struct {
		delta                      string
		prompt, completion, cached int
	}{
		{"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"input_tokens\":60,\"cache_creation_input_tokens\":null,\"cache_read_input_tokens\":null,\"output_tokens\":7}}\n\n", 1000, 7, 40},
		{"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"input_tokens\":null,\"cache_creation_input_tokens\":null,\"cache_read_input_tokens\":50,\"output_tokens\":7}}\n\n", 1010, 7, 50},
		{"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"input_tokens\":70,\"cache_creation_input_tokens\":0,\"cache_read_input_tokens\":930,\"output_tokens\":7}}\n\n", 1000, 7, 930},
	} {
		b := []byte(start + c.delta)
		check := func(u usage, how string) {
			t.Helper()
			if !u.seen || u.prompt != c.prompt || u.completion != c.completion || u.cached != c.cached {
				t.Fatalf("%s (%s): prompt %d completion %d cached %d seen %v, want %d %d %d", c.delta, how, u.prompt, u.completion, u.cached, u.seen, c.prompt, c.completion, c.cached)
			}
		}
		var u usage
		u.scanProtocol(b, protocol.Anthropic)
		check(u, "whole")
		for i := 0; i <= len(b); i++ {
			var u usage
			u.scanProtocol(b[:i], protocol.Anthropic)
			u.scanProtocol(b[i:], protocol.Anthropic)
			check(u, fmt.Sprintf("cut at %d", i))
		}
		u = usage{}
		for i := range b {
			u.scanProtocol(b[i:i+1], protocol.Anthropic)
		}
		check(u, "byte by byte")
	}
}
