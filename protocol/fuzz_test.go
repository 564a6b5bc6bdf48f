package protocol

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"testing"
)

// Fuzz targets. Seed corpora live in testdata/fuzz/<Target>/. Properties:
// no panic; a successful conversion is exactly one JSON object an engine
// accepts as a chat request (messages decodable for the tokenizer); a
// stream's output is well-formed client SSE whatever the upstream bytes
// and however they are split, and the same for every split. A converted
// Messages request has no two user messages in a row and no tool message
// after a user message (checkTurnOrder).

func fuzzOptions(sel byte) Options {
	o := DefaultOptions()
	o.PreserveSystemPosition = sel&1 != 0
	o.Reasoning.Mode = ReasoningMode(sel>>1) % 3
	o.Reasoning.Target = ReasoningTarget(sel>>3) % 3
	return o
}

func checkChatRequest(t *testing.T, in, out []byte) {
	t.Helper()
	if !validJSONObject(out) {
		t.Fatalf("output is not a JSON object:\nin:  %q\nout: %q", in, out)
	}
	var req struct {
		Model    json.RawMessage   `json:"model"`
		Messages []json.RawMessage `json:"messages"`
	}
	if err := json.Unmarshal(out, &req); err != nil || len(req.Messages) == 0 || len(req.Model) == 0 {
		t.Fatalf("output is not a chat request (%v):\nin:  %q\nout: %q", err, in, out)
	}
	var arena []byte
	if _, _, err := ChatMessages(nil, out, &arena); err != nil {
		t.Fatalf("ChatMessages refused the converted body: %v\nout: %q", err, out)
	}
}

func FuzzAnthropicToChat(f *testing.F) {
	f.Add([]byte(`{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`), byte(0))
	f.Fuzz(func(t *testing.T, body []byte, sel byte) {
		opt := fuzzOptions(sel)
		var m Meta
		out, err := AnthropicToChat([]byte("prefix"), body, &opt, &m)
		if err != nil {
			if _, ok := err.(*Error); !ok || string(out) != "prefix" {
				t.Fatalf("error %T %v, dst %q", err, err, out)
			}
		} else {
			checkChatRequest(t, body, out[len("prefix"):])
			checkTurnOrder(t, body, out[len("prefix"):])
		}
		out, err = AnthropicCountTokensToChat(nil, body, &opt, &m)
		if err == nil {
			checkChatRequest(t, body, out)
			checkTurnOrder(t, body, out)
		}
	})
}

// checkTurnOrder checks what writing each run of consecutive Messages API
// turns as one turn guarantees: no two user messages in a row, and no
// tool message right after a user message (tool results come before the
// rest of their turn).
func checkTurnOrder(t *testing.T, in, out []byte) {
	t.Helper()
	var req struct {
		Messages []struct {
			Role string `json:"role"`
		} `json:"messages"`
	}
	if err := json.Unmarshal(out, &req); err != nil {
		t.Fatalf("%v\nout: %q", err, out)
	}
	for i := 1; i < len(req.Messages); i++ {
		if prev, cur := req.Messages[i-1].Role, req.Messages[i].Role; prev == "user" && (cur == "user" || cur == "tool") {
			t.Fatalf("messages[%d] is %s after a user message:\nin:  %q\nout: %q", i, cur, in, out)
		}
	}
}

func FuzzResponsesToChat(f *testing.F) {
	f.Add([]byte(`{"model":"m","input":"hi"}`), byte(0))
	f.Fuzz(func(t *testing.T, body []byte, sel byte) {
		opt := fuzzOptions(sel)
		var m Meta
		out, err := ResponsesToChat([]byte("prefix"), body, &opt, &m)
		if err != nil {
			if _, ok := err.(*Error); !ok || string(out) != "prefix" {
				t.Fatalf("error %T %v, dst %q", err, err, out)
			}
			return
		}
		checkChatRequest(t, body, out[len("prefix"):])
	})
}

// fuzzStream converts upstream whole and in random pieces: both outputs
// must pass check and be identical.
func fuzzStream(t *testing.T, api API, upstream []byte, seed uint64, check func([]byte) ([]sseEvent, error)) {
	reseed, restore := deterministicIDs()
	defer restore()
	var m Meta
	opt := DefaultOptions()
	var err error
	if api == Anthropic {
		_, err = AnthropicToChat(nil, []byte(`{"model":"m","max_tokens":9,"stream":true,"stop_sequences":["END","x"],"messages":[{"role":"user","content":"q"}]}`), &opt, &m)
	} else {
		_, err = ResponsesToChat(nil, []byte(`{"model":"m","stream":true,"instructions":"i","tools":[{"type":"function","name":"f"}],"input":"q"}`), &opt, &m)
	}
	if err != nil {
		t.Fatal(err)
	}
	c := AcquireStreamConverter(&m)
	defer ReleaseStreamConverter(c)
	reseed()
	whole := c.Finish(c.Feed(nil, upstream))
	if _, err := check(whole); err != nil {
		t.Fatalf("%v\nupstream: %q\noutput: %s", err, upstream, whole)
	}
	reseed()
	c.Reset(&m)
	split := feedSplit(c, upstream, rand.New(rand.NewPCG(seed, 1)), 1+int(seed%17))
	if !bytes.Equal(whole, split) {
		t.Fatalf("output depends on the split:\nupstream: %q\nwhole: %s\nsplit: %s", upstream, whole, split)
	}
}

func FuzzAnthropicStream(f *testing.F) {
	f.Add([]byte("data: {\"choices\":[{\"delta\":{\"content\":\"hi\"},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n"), uint64(3))
	f.Add([]byte("data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"a\",\"function\":{\"name\":\"g\",\"arguments\":\"\"}}]},\"finish_reason\":null}]}\n\ndata: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":1,\"id\":\"b\",\"function\":{\"name\":\"p\",\"arguments\":\"\"}}]},\"finish_reason\":null}]}\n\ndata: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"{}\"}}]},\"finish_reason\":\"tool_calls\"}]}\n\ndata: [DONE]\n\n"), uint64(5))
	f.Fuzz(func(t *testing.T, upstream []byte, seed uint64) {
		fuzzStream(t, Anthropic, upstream, seed, checkAnthropicSSE)
	})
}

func FuzzResponsesStream(f *testing.F) {
	f.Add([]byte("data: {\"choices\":[{\"delta\":{\"content\":\"hi\"},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n"), uint64(3))
	f.Add([]byte("data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"a\",\"function\":{\"name\":\"g\",\"arguments\":\"\"}}]},\"finish_reason\":null}]}\n\ndata: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":1,\"id\":\"b\",\"function\":{\"name\":\"p\",\"arguments\":\"\"}}]},\"finish_reason\":null}]}\n\ndata: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"{}\"}}]},\"finish_reason\":\"tool_calls\"}]}\n\ndata: [DONE]\n\n"), uint64(5))
	f.Fuzz(func(t *testing.T, upstream []byte, seed uint64) {
		fuzzStream(t, Responses, upstream, seed, checkResponsesSSE)
	})
}

// FuzzChatAnswer converts engine answers (non-streaming) and error bodies.
func FuzzChatAnswer(f *testing.F) {
	f.Add([]byte(`{"choices":[{"message":{"content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1}}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		var m Meta
		opt := DefaultOptions()
		AnthropicToChat(nil, []byte(`{"model":"m","max_tokens":9,"stop_sequences":["END"],"messages":[{"role":"user","content":"q"}]}`), &opt, &m)
		if out, err := ChatToAnthropic(nil, body, &m); err == nil && !validJSONObject(out) {
			t.Fatalf("anthropic answer is not a JSON object: %q -> %q", body, out)
		}
		ResponsesToChat(nil, []byte(`{"model":"m","input":"q","tools":[{"type":"function","name":"f"}]}`), &opt, &m)
		if out, err := ChatToResponses(nil, body, &m); err == nil && !validJSONObject(out) {
			t.Fatalf("responses answer is not a JSON object: %q -> %q", body, out)
		}
		for _, api := range []API{Anthropic, Responses} {
			if out := ConvertError(nil, api, 500, body); !validJSONObject(out) {
				t.Fatalf("error body is not a JSON object: %q -> %q", body, out)
			}
		}
	})
}

// FuzzChatStreamUsage checks EnsureStreamUsage and UsageFilter: the
// rewritten body stays one JSON object asking for usage, and the filter
// relays exactly the input minus usage-only events, for any split.
func FuzzChatStreamUsage(f *testing.F) {
	f.Add([]byte(`{"model":"m","stream":true,"messages":[]}`), []byte("data: {\"choices\":[],\"usage\":{\"prompt_tokens\":1}}\n\ndata: [DONE]\n\n"), uint64(1))
	f.Add([]byte(`{"model":"m","stream":true,"stream_options":{ },"messages":[]}`), []byte("data: [DONE]\n\n"), uint64(2))
	f.Fuzz(func(t *testing.T, body, stream []byte, seed uint64) {
		out, _, err := EnsureStreamUsage(nil, body)
		if err == nil && !bytes.Equal(out, body) {
			var v struct {
				StreamOptions struct {
					IncludeUsage bool `json:"include_usage"`
				} `json:"stream_options"`
			}
			if !validJSONObject(out) || json.Unmarshal(out, &v) != nil || !v.StreamOptions.IncludeUsage {
				t.Fatalf("rewritten body does not ask for usage: %q -> %q", body, out)
			}
		}
		var whole, split UsageFilter
		a := whole.Flush(whole.Filter(nil, stream))
		var b []byte
		for _, p := range splitRandom(rand.New(rand.NewPCG(seed, 2)), stream, 1+int(seed%23)) {
			b = split.Filter(b, p)
		}
		b = split.Flush(b)
		if !bytes.Equal(a, b) {
			t.Fatalf("filter output depends on the split:\nin: %q\nwhole: %q\nsplit: %q", stream, a, b)
		}
		if len(a) > len(stream) {
			t.Fatalf("filter output longer than its input")
		}
	})
}

// FuzzUsageFilterMatchesEventByEvent checks that the filter, which looks
// only at events holding the usage key, relays the same bytes as walking
// the stream event by event.
func FuzzUsageFilterMatchesEventByEvent(f *testing.F) {
	f.Add([]byte("data: {\"choices\":[{}]}\n\n\n\r\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":1}}\n\ndata: [DONE]\n\n"))
	f.Add([]byte("data: \"usage\"\n\ndata: {\"choices\":[],\"usage\":{}}\r\n\r\n\n\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		b = b[:lastEventEnd(b)]
		var got, want UsageFilter
		g := got.events(nil, b)
		var w []byte
		for rest := b; len(rest) > 0; {
			n := nextEventEnd(rest)
			if n == 0 {
				n = len(rest)
			}
			w = want.event(w, rest[:n])
			rest = rest[n:]
		}
		if !bytes.Equal(g, w) || got.Usage != want.Usage {
			t.Fatalf("in: %q\nfilter: %q %+v\nevent by event: %q %+v", b, g, got.Usage, w, want.Usage)
		}
	})
}
