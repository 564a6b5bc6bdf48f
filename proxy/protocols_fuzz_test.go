package proxy

import (
	"encoding/json"
	"testing"

	"github.com/infera/infera/protocol"
)

// FuzzFrontDoorBodies checks what the router derives from protocol bodies:
// a converted body (Anthropic, Responses) always parses as JSON for
// routing, and so does a chat body after EnsureStreamUsage; the passthrough
// routing view is valid JSON and the model span lies on a string; usage
// scanning never panics.
func FuzzFrontDoorBodies(f *testing.F) {
	for _, s := range []string{
		anthropicBody, bench1KMessages, bench1KResponses, chatBody, streamBody,
		`{"model":"m","max_tokens":8,"stream":true,"system":[{"type":"text","text":"s"}],"messages":[{"role":"user","content":[{"type":"text","text":"h\u00e9"},{"type":"image","source":{"type":"url","url":"http://x/y.png"}}]},{"role":"assistant","content":[{"type":"tool_use","id":"t1","name":"f","input":{"a":1}}]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":"ok"}]}],"tools":[{"name":"f","input_schema":{"type":"object"}}]}`,
		`{"model":"m","input":[{"role":"user","content":"hi"},{"type":"function_call","call_id":"c","name":"f","arguments":"{}"},{"type":"function_call_output","call_id":"c","output":"x"}],"stream":true}`,
		`{"model":"m","previous_response_id":"r"}`,
		`{"mod\u0065l":"x","model":"y"}`,
		`event: message_delta\ndata: {"usage":{"input_tokens":3,"cache_read_input_tokens":2,"output_tokens":9}}`,
	} {
		f.Add([]byte(s))
	}
	opt := protocol.DefaultOptions()
	f.Fuzz(func(t *testing.T, data []byte) {
		var m protocol.Meta
		var rb reqBody
		routable := func(what string, body []byte) {
			// The converters write the output limit and the stream flag
			// themselves: the router must read what they wrote (a
			// Responses max_output_tokens of 100.0 was copied as written
			// and refused as no integer).
			if err := rb.parse(body, kindChat); err == errMalformedJSON || err == errNotObject || err == errMaxTokens || err == errStreamType {
				t.Fatalf("%s: the router cannot read %q: %v", what, body, err)
			}
		}
		if chat, err := protocol.AnthropicToChat(nil, data, &opt, &m); err == nil {
			routable("messages", chat)
		}
		if chat, err := protocol.AnthropicCountTokensToChat(nil, data, &opt, &m); err == nil {
			routable("count_tokens", chat)
		}
		if chat, err := protocol.ResponsesToChat(nil, data, &opt, &m); err == nil {
			routable("responses", chat)
		}
		if rb.parse(data, kindChat) == nil {
			if out, _, err := protocol.EnsureStreamUsage(nil, data); err == nil {
				routable("stream usage", out)
			}
		}
		if view, err := routingView(nil, data); err == nil && !json.Valid(view) {
			t.Fatalf("routing view %q of %q is not JSON", view, data)
		}
		if s, e := modelSpan(data); e > s && (e > len(data) || data[s] != '"' || data[e-1] != '"') {
			t.Fatalf("model span [%d,%d) of %q", s, e, data)
		}
		var u usage
		u.scanProtocol(data, protocol.Anthropic)
		u.scanProtocol(data, protocol.Responses)
		if u.prompt < 0 || u.completion < 0 || u.cached < 0 {
			t.Fatalf("negative usage %+v", u)
		}
	})
}
