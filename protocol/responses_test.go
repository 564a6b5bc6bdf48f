package protocol

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestResponsesRequestFieldsConvertToChat(t *testing.T) {
	opt := DefaultOptions()
	f := func(name, in, want string) {
		t.Helper()
		var m Meta
		got, err := ResponsesToChat(nil, []byte(in), &opt, &m)
		if err != nil {
			t.Errorf("%s: %v", name, err)
			return
		}
		if !jsonEqual(got, []byte(want)) {
			t.Errorf("%s:\n got %s\nwant %s", name, got, want)
		}
	}
	f("string input", `{"model":"gpt","input":"hi"}`, `{"model":"gpt","messages":[{"role":"user","content":"hi"}]}`)
	f("instructions first, developer as system", `{"model":"g","instructions":"be nice","input":[{"role":"developer","content":"dev"},{"role":"user","content":"hi"}]}`,
		`{"model":"g","messages":[{"role":"system","content":"be nice"},{"role":"system","content":"dev"},{"role":"user","content":"hi"}]}`)
	f("parts and images", `{"model":"g","input":[{"type":"message","role":"user","content":[{"type":"input_text","text":"look"},{"type":"input_image","image_url":"https://e.x/i.png","detail":"high"}]}]}`,
		`{"model":"g","messages":[{"role":"user","content":[{"type":"text","text":"look"},{"type":"image_url","image_url":{"url":"https://e.x/i.png","detail":"high"}}]}]}`)
	f("function calls join the assistant message; outputs become tool messages; a reasoning item starts the assistant message", `{"model":"g","input":[
		{"role":"user","content":"weather?"},
		{"type":"reasoning","id":"rs_1","summary":[]},
		{"type":"message","role":"assistant","content":[{"type":"output_text","text":"checking","annotations":[]}]},
		{"type":"function_call","call_id":"c1","name":"w","arguments":"{\"city\":\"Paris\"}"},
		{"type":"function_call","call_id":"c2","name":"w","arguments":"{}"},
		{"type":"function_call_output","call_id":"c1","output":"sunny"},
		{"type":"function_call_output","call_id":"c2","output":[{"type":"input_text","text":"rain"}]},
		{"type":"function_call","call_id":"c3","name":"w","arguments":"{}"}]}`,
		`{"model":"g","messages":[{"role":"user","content":"weather?"},
		{"role":"assistant","reasoning_content":"","content":"checking","tool_calls":[{"id":"c1","type":"function","function":{"name":"w","arguments":"{\"city\":\"Paris\"}"}},{"id":"c2","type":"function","function":{"name":"w","arguments":"{}"}}]},
		{"role":"tool","tool_call_id":"c1","content":"sunny"},{"role":"tool","tool_call_id":"c2","content":"rain"},
		{"role":"assistant","tool_calls":[{"id":"c3","type":"function","function":{"name":"w","arguments":"{}"}}]}]}`)
	f("settings", `{"model":"g","input":"x","max_output_tokens":64,"temperature":0.1,"top_p":0.5,"stream":true,"parallel_tool_calls":false,"user":"u","store":true,"truncation":"auto","include":["reasoning.encrypted_content"],"metadata":{"a":"b"},"service_tier":"auto","prompt_cache_key":"k"}`,
		`{"model":"g","messages":[{"role":"user","content":"x"}],"max_tokens":64,"stream":true,"stream_options":{"include_usage":true},"temperature":0.1,"top_p":0.5,"parallel_tool_calls":false,"user":"u"}`)
	f("safety_identifier as user", `{"model":"g","input":"x","safety_identifier":"s"}`, `{"model":"g","messages":[{"role":"user","content":"x"}],"user":"s"}`)
	f("function tools and choices", `{"model":"g","input":"x","tools":[{"type":"function","name":"w","description":"d","parameters":{"type":"object"},"strict":true}],"tool_choice":{"type":"function","name":"w"}}`,
		`{"model":"g","messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"w","description":"d","parameters":{"type":"object"},"strict":true}}],"tool_choice":{"type":"function","function":{"name":"w"}}}`)
	f("tool_choice string", `{"model":"g","input":"x","tools":[{"type":"function","name":"w"}],"tool_choice":"required"}`,
		`{"model":"g","messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"w"}}],"tool_choice":"required"}`)
	f("json_schema format", `{"model":"g","input":"x","text":{"format":{"type":"json_schema","name":"s","schema":{"type":"object"},"strict":true,"description":"d"},"verbosity":"low"}}`,
		`{"model":"g","messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_schema","json_schema":{"name":"s","schema":{"type":"object"},"strict":true,"description":"d"}}}`)
	f("json_object format", `{"model":"g","input":"x","text":{"format":{"type":"json_object"}}}`,
		`{"model":"g","messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_object"}}`)
	f("reasoning effort (passthrough)", `{"model":"g","input":"x","reasoning":{"effort":"high","summary":"auto"}}`,
		`{"model":"g","messages":[{"role":"user","content":"x"}],"reasoning_effort":"high"}`)
	f("empty previous_response_id is no reference", `{"model":"g","input":"x","previous_response_id":null}`, `{"model":"g","messages":[{"role":"user","content":"x"}]}`)
}

func TestResponsesRequestRefusals(t *testing.T) {
	opt := DefaultOptions()
	f := func(in, param, msg string) {
		t.Helper()
		var m Meta
		_, err := ResponsesToChat(nil, []byte(in), &opt, &m)
		e, ok := err.(*Error)
		if !ok || e.Status != 400 || e.Param != param || !strings.Contains(e.Message, msg) {
			t.Errorf("%s: got %#v, want param %q ~%q", in, err, param, msg)
		}
	}
	f(`{"model":"g","input":"x","previous_response_id":"resp_1"}`, "previous_response_id", "does not store responses")
	f(`{"model":"g","input":"x","conversation":"conv_1"}`, "conversation", "does not store")
	f(`{"model":"g","input":"x","prompt":{"id":"p"}}`, "prompt", "not supported")
	f(`{"model":"g","input":"x","background":true}`, "background", "not supported")
	f(`{"input":"x"}`, "model", "field required")
	f(`{"model":"g"}`, "input", "field required")
	f(`{"model":"g","input":[]}`, "input", "at least one")
	f(`{"model":"g","input":[{"type":"item_reference","id":"msg_1"}]}`, "input", "input[0]: item_reference")
	f(`{"model":"g","input":[{"role":"user","content":"a"},{"type":"web_search_call"}]}`, "input", "input[1]: unsupported item type")
	f(`{"model":"g","input":[{"role":"user","content":[{"type":"input_file","file_id":"f"}]}]}`, "input", "unsupported content part")
	f(`{"model":"g","input":[{"role":"tool","content":"a"}]}`, "input", "role must be")
	f(`{"model":"g","input":[{"type":"function_call","name":"f"}]}`, "input", "call_id, name and arguments")
	f(`{"model":"g","input":"x","tools":[{"type":"web_search"}]}`, "tools", "only function tools")
	f(`{"model":"g","input":"x","tool_choice":{"type":"file_search"}}`, "tool_choice", "only")
	f(`{"model":"g","input":"x","text":{"format":{"type":"yaml"}}}`, "text", "text.format.type")
	f(`{"model":"g","input":"x","max_output_tokens":0}`, "max_output_tokens", "[1, 2147483647]")
	// Over the range it was passed on, and refused naming max_tokens.
	f(`{"model":"g","input":"x","max_output_tokens":2147483648}`, "max_output_tokens", "[1, 2147483647]")
	f(`{"model":"g","input":[{"type":"function_call_output","call_id":"c","output":5}]}`, "input", ".output must be")
	f(`{"model":"g","input":"x","tools":[{"type":"function","name":"f","parameters":"x"}]}`, "tools", "JSON Schema object")
	f(`{"model":"g","input":"x","reasoning":{"effort":3}}`, "reasoning", "must be a string")
}

// A Response echoes previous_response_id and store from Meta: what an
// answerer that stores responses (the engine) sets, the id JSON-escaped;
// null and false when left alone (the conversion stores nothing). They
// were always null and false.
func TestAResponseEchoesPreviousResponseIDAndStore(t *testing.T) {
	chat := []byte(`{"id":"c","object":"chat.completion","created":1,"model":"g","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`)
	f := func(prev string, stored bool, want string) {
		t.Helper()
		opt := DefaultOptions()
		var m Meta
		if _, err := ResponsesToChat(nil, []byte(`{"model":"g","input":"x"}`), &opt, &m); err != nil {
			t.Fatal(err)
		}
		m.PrevResponseID, m.Stored = append(m.PrevResponseID, prev...), stored
		got, err := ChatToResponses(nil, chat, &m)
		if err != nil || !strings.Contains(string(got), want) || !json.Valid(got) {
			t.Fatalf("%q %v: %v %s, want %s", prev, stored, err, got, want)
		}
	}
	f("", false, `"previous_response_id":null,"reasoning":{"effort":null,"summary":null},"store":false,`)
	f("resp_1", true, `"previous_response_id":"resp_1","reasoning":{"effort":null,"summary":null},"store":true,`)
	f(`resp_"x`, false, `"previous_response_id":"resp_\"x",`)
}

// Options.LaxStream reads stream as vLLM's pydantic models read a bool (the
// engine's native endpoints); off, stream is a JSON boolean or null, as the
// Anthropic and OpenAI APIs specify (the router's conversion).
func TestStreamIsLaxOnlyWithLaxStream(t *testing.T) {
	strict, lax := DefaultOptions(), DefaultOptions()
	lax.LaxStream = true
	f := func(o *Options, v string, want bool, wantErr bool) {
		t.Helper()
		var m Meta
		_, err := ResponsesToChat(nil, []byte(`{"model":"m","input":"x","stream":`+v+`}`), o, &m)
		if (err != nil) != wantErr || err == nil && m.Stream != want {
			t.Errorf("lax %v, stream %s: %v %v, want %v (error %v)", o.LaxStream, v, m.Stream, err, want, wantErr)
		}
		_, err = AnthropicToChat(nil, []byte(`{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"x"}],"stream":`+v+`}`), o, &m)
		if (err != nil) != wantErr || err == nil && m.Stream != want {
			t.Errorf("anthropic, lax %v, stream %s: %v %v, want %v (error %v)", o.LaxStream, v, m.Stream, err, want, wantErr)
		}
	}
	for _, o := range []*Options{&strict, &lax} {
		f(o, `true`, true, false)
		f(o, `false`, false, false)
		f(o, `null`, false, false)
		f(o, `"maybe"`, false, true)
		f(o, `2`, false, true)
	}
	f(&strict, `1`, false, true)
	f(&strict, `"true"`, false, true)
	f(&lax, `1`, true, false)
	f(&lax, `"true"`, true, false)
	f(&lax, `"OFF"`, false, false)
	f(&lax, `0`, false, false)
}

// A Responses input's reasoning items reach the engine as vLLM's own
// /v1/responses hands them to the chat template
// (vllm/entrypoints/openai/responses/utils.py at 01ca842d,
// _construct_message_from_response_item): the item's text (its first
// content part's, else its first summary part's, else "") becomes the
// reasoning of the assistant message just written when that has none,
// else of an assistant message of its own; a function_call joins the
// assistant message just written, which then has no content key; an
// assistant message item fills the content of an assistant message that
// has none. The converter dropped reasoning items, so a template that
// renders the reasoning of the turns after the last user message (Qwen3's,
// in a tool-calling loop) got another prompt than vLLM renders.
func TestResponsesReasoningItemsReachTheTemplateAsVLLMPassesThem(t *testing.T) {
	opt := DefaultOptions()
	f := func(name, input, want string) {
		t.Helper()
		var m Meta
		got, err := ResponsesToChat(nil, []byte(`{"model":"g","input":[{"role":"user","content":"q"},`+input+`]}`), &opt, &m)
		if err != nil {
			t.Errorf("%s: %v", name, err)
			return
		}
		if want = `{"model":"g","messages":[{"role":"user","content":"q"},` + want + `]}`; !jsonEqual(got, []byte(want)) {
			t.Errorf("%s:\n got %s\nwant %s", name, got, want)
		}
	}
	const call = `{"type":"function_call","call_id":"c1","name":"w","arguments":"{}"}`
	const chatCall = `{"id":"c1","type":"function","function":{"name":"w","arguments":"{}"}}`
	f("a tool-calling loop",
		`{"type":"reasoning","id":"rs_1","content":[{"type":"reasoning_text","text":"think \"A\""},{"type":"reasoning_text","text":"more"}],"summary":[{"type":"summary_text","text":"S"}]},`+call+`,`+
			`{"type":"function_call_output","call_id":"c1","output":"sunny"},{"type":"reasoning","id":"rs_2","summary":[{"type":"summary_text","text":"think B"}]},`+
			`{"type":"message","role":"assistant","content":[{"type":"output_text","text":"done"}]}`,
		`{"role":"assistant","reasoning_content":"think \"A\"","tool_calls":[`+chatCall+`]},{"role":"tool","tool_call_id":"c1","content":"sunny"},`+
			`{"role":"assistant","reasoning_content":"think B","content":"done"}`)
	f("reasoning after the content joins it", `{"role":"assistant","content":"a"},{"type":"reasoning","summary":[],"content":[{"text":"r"}]},`+call,
		`{"role":"assistant","content":"a","reasoning_content":"r","tool_calls":[`+chatCall+`]}`)
	f("a second reasoning starts a message", `{"type":"reasoning","summary":["r1"]},{"type":"reasoning","summary":[]}`,
		`{"role":"assistant","reasoning_content":"r1"},{"role":"assistant","reasoning_content":""}`)
	f("after the calls", call+`,{"type":"reasoning","summary":[{"text":"r"}]},{"type":"message","role":"assistant","content":"c"},`+
		`{"type":"function_call","call_id":"c2","name":"w","arguments":"{}"}`,
		`{"role":"assistant","reasoning_content":"r","content":"c","tool_calls":[`+chatCall+`,{"id":"c2","type":"function","function":{"name":"w","arguments":"{}"}}]}`)
	f("content given twice: two messages", `{"role":"assistant","content":"a"},{"role":"assistant","content":"b"}`,
		`{"role":"assistant","content":"a"},{"role":"assistant","content":"b"}`)
}

// Empty texts add nothing to a Responses request's prompt, as vLLM's
// /v1/responses builds it: empty instructions give no system message
// (vllm/entrypoints/openai/responses/utils.py at 01ca842d,
// construct_input_messages: `if request_instructions:`), and an empty text
// part is left out of the string a content's parts are joined into
// (chat_utils at 001eadcf, `if parse_res:` in
// _parse_chat_message_content_parts). The converter wrote an empty system
// message (a template with a default system prompt then rendered none) and
// "\na" for ["", "a"].
func TestResponsesEmptyTextsAddNothingAsInVLLM(t *testing.T) {
	opt := DefaultOptions()
	f := func(in, want string) {
		t.Helper()
		var m Meta
		got, err := ResponsesToChat(nil, []byte(in), &opt, &m)
		if err != nil {
			t.Errorf("%s: %v", in, err)
			return
		}
		if !jsonEqual(got, []byte(want)) {
			t.Errorf("%s:\n got %s\nwant %s", in, got, want)
		}
	}
	f(`{"model":"g","instructions":"","input":"hi"}`, `{"model":"g","messages":[{"role":"user","content":"hi"}]}`)
	f(`{"model":"g","input":[{"role":"user","content":[{"type":"input_text","text":""},{"type":"input_text","text":"a"},{"type":"input_text","text":""},{"type":"input_text","text":"b"}]}]}`,
		`{"model":"g","messages":[{"role":"user","content":"a\nb"}]}`)
	f(`{"model":"g","input":[{"role":"user","content":"q"},{"type":"function_call","call_id":"c","name":"f","arguments":"{}"},{"type":"function_call_output","call_id":"c","output":[{"type":"input_text","text":""},{"type":"input_text","text":"r"}]}]}`,
		`{"model":"g","messages":[{"role":"user","content":"q"},{"role":"assistant","tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{}"}}]},{"role":"tool","tool_call_id":"c","content":"r"}]}`)
}
