package protocol

import (
	"strings"
	"testing"
)

func anthropicMeta(t *testing.T, req string) *Meta {
	t.Helper()
	opt := DefaultOptions()
	m := new(Meta)
	if _, err := AnthropicToChat(nil, []byte(req), &opt, m); err != nil {
		t.Fatal(err)
	}
	m.ID = append(m.ID[:0], "msg_test"...)
	return m
}

func responsesMeta(t *testing.T, req string) *Meta {
	t.Helper()
	opt := DefaultOptions()
	m := new(Meta)
	if _, err := ResponsesToChat(nil, []byte(req), &opt, m); err != nil {
		t.Fatal(err)
	}
	m.ID = append(m.ID[:0], "resp_test"...)
	m.Created = 1700000000
	return m
}

func TestChatAnswerConvertsToAnthropicMessage(t *testing.T) {
	m := anthropicMeta(t, `{"model":"claude-client","max_tokens":5,"stop_sequences":["END"],"messages":[{"role":"user","content":"x"}]}`)
	f := func(name, chat, want string) {
		t.Helper()
		got, err := ChatToAnthropic(nil, []byte(chat), m)
		if err != nil || !jsonEqual(got, []byte(want)) {
			t.Errorf("%s: %v\n got %s\nwant %s", name, err, got, want)
		}
	}
	usage := `"usage":{"prompt_tokens":10,"completion_tokens":4,"prompt_tokens_details":{"cached_tokens":6}}`
	wantUsage := `"stop_details":null,"container":null,"diagnostics":null,"usage":{"input_tokens":4,"cache_creation_input_tokens":0,"cache_read_input_tokens":6,"output_tokens":4,"cache_creation":{"ephemeral_5m_input_tokens":0,"ephemeral_1h_input_tokens":0},"inference_geo":null,"output_tokens_details":null,"server_tool_use":null,"service_tier":null,"speed":null}`
	f("text, end_turn, cached tokens", `{"id":"c","model":"engine-model","choices":[{"index":0,"message":{"role":"assistant","content":"Hi \"you\""},"finish_reason":"stop"}],`+usage+`}`,
		`{"id":"msg_test","type":"message","role":"assistant","model":"claude-client","content":[{"type":"text","text":"Hi \"you\"","citations":null}],"stop_reason":"end_turn","stop_sequence":null,`+wantUsage+`}`)
	f("length is max_tokens", `{"choices":[{"message":{"content":"a"},"finish_reason":"length"}]}`,
		`{"id":"msg_test","type":"message","role":"assistant","model":"claude-client","content":[{"type":"text","text":"a","citations":null}],"stop_reason":"max_tokens","stop_sequence":null,"stop_details":null,"container":null,"diagnostics":null,"usage":{"input_tokens":0,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":0,"cache_creation":{"ephemeral_5m_input_tokens":0,"ephemeral_1h_input_tokens":0},"inference_geo":null,"output_tokens_details":null,"server_tool_use":null,"service_tier":null,"speed":null}}`)
	f("vLLM stop_reason names the stop sequence", `{"choices":[{"message":{"content":"a"},"finish_reason":"stop","stop_reason":"END"}]}`,
		`{"id":"msg_test","type":"message","role":"assistant","model":"claude-client","content":[{"type":"text","text":"a","citations":null}],"stop_reason":"stop_sequence","stop_sequence":"END","stop_details":null,"container":null,"diagnostics":null,"usage":{"input_tokens":0,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":0,"cache_creation":{"ephemeral_5m_input_tokens":0,"ephemeral_1h_input_tokens":0},"inference_geo":null,"output_tokens_details":null,"server_tool_use":null,"service_tier":null,"speed":null}}`)
	f("SGLang matched_stop names the stop sequence", `{"choices":[{"message":{"content":"a"},"finish_reason":"stop","matched_stop":"END"}]}`,
		`{"id":"msg_test","type":"message","role":"assistant","model":"claude-client","content":[{"type":"text","text":"a","citations":null}],"stop_reason":"stop_sequence","stop_sequence":"END","stop_details":null,"container":null,"diagnostics":null,"usage":{"input_tokens":0,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":0,"cache_creation":{"ephemeral_5m_input_tokens":0,"ephemeral_1h_input_tokens":0},"inference_geo":null,"output_tokens_details":null,"server_tool_use":null,"service_tier":null,"speed":null}}`)
	f("reasoning, tool calls (object arguments, bad arguments), tool_use", `{"choices":[{"message":{"content":null,"reasoning_content":"hmm","tool_calls":[
		{"id":"call_1","type":"function","function":{"name":"f","arguments":"{\"a\": [1, \"x\"]}"}},
		{"id":"call_2","type":"function","function":{"name":"g","arguments":"not json"}}]},"finish_reason":"tool_calls"}],`+usage+`}`,
		`{"id":"msg_test","type":"message","role":"assistant","model":"claude-client","content":[{"type":"thinking","thinking":"hmm","signature":""},
		{"type":"tool_use","id":"call_1","name":"f","input":{"a":[1,"x"]},"caller":{"type":"direct"}},{"type":"tool_use","id":"call_2","name":"g","input":{},"caller":{"type":"direct"}}],"stop_reason":"tool_use","stop_sequence":null,`+wantUsage+`}`)
	f("content_filter is refusal", `{"choices":[{"message":{"content":""},"finish_reason":"content_filter"}]}`,
		`{"id":"msg_test","type":"message","role":"assistant","model":"claude-client","content":[],"stop_reason":"refusal","stop_sequence":null,"stop_details":{"type":"refusal","category":null,"explanation":null},"container":null,"diagnostics":null,"usage":{"input_tokens":0,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":0,"cache_creation":{"ephemeral_5m_input_tokens":0,"ephemeral_1h_input_tokens":0},"inference_geo":null,"output_tokens_details":null,"server_tool_use":null,"service_tier":null,"speed":null}}`)
	if _, err := ChatToAnthropic(nil, []byte(`{"choices":`), m); err == nil || err.(*Error).Status != 502 {
		t.Errorf("unreadable engine answer: %v", err)
	}
	// An answer without a choice has nothing to answer with (it was a 200
	// with no content and end_turn).
	for _, body := range []string{`{"choices":[],"usage":{"prompt_tokens":3}}`, `{"choices":[null]}`} {
		if _, err := ChatToAnthropic(nil, []byte(body), m); err == nil || err.(*Error).Status != 502 {
			t.Errorf("%s: %v", body, err)
		}
		if _, err := ChatToResponses(nil, []byte(body), m); err == nil || err.(*Error).Status != 502 {
			t.Errorf("Responses, %s: %v", body, err)
		}
	}
}

func TestChatAnswerConvertsToResponse(t *testing.T) {
	m := responsesMeta(t, `{"model":"gpt-client","input":"x","instructions":"be nice","max_output_tokens":20,"temperature":0.5,"tools":[{"type":"function","name":"f"}],"tool_choice":"auto","metadata":{"k":"v"},"user":"u","reasoning":{"effort":"low"},"text":{"verbosity":"low"}}`)
	got, err := ChatToResponses(nil, []byte(`{"choices":[{"message":{"content":"answer","reasoning_content":"think","tool_calls":[{"id":"call_9","type":"function","function":{"name":"f","arguments":"{\"a\":1}"}}]},"finish_reason":"tool_calls"}],"usage":{"prompt_tokens":10,"completion_tokens":4,"prompt_tokens_details":{"cached_tokens":6},"completion_tokens_details":{"reasoning_tokens":2}}}`), m)
	if err != nil {
		t.Fatal(err)
	}
	s := string(got)
	for _, want := range []string{
		`"id":"resp_test","object":"response","created_at":1700000000,"status":"completed"`,
		`"instructions":"be nice","max_output_tokens":20,"model":"gpt-client"`,
		`"type":"reasoning","summary":[],"content":[{"type":"reasoning_text","text":"think"}],"status":"completed"}`,
		`"type":"message","status":"completed","role":"assistant","content":[{"type":"output_text","text":"answer","annotations":[],"logprobs":[]}]}`,
		`"type":"function_call","call_id":"call_9","name":"f","arguments":"{\"a\":1}","status":"completed"}`,
		`"temperature":0.5`, `"tools":[{"type":"function","name":"f"}]`, `"tool_choice":"auto"`, `"user":"u"`, `"metadata":{"k":"v"}`,
		// The API answers every key of these objects: those the request
		// left out have their defaults.
		`"reasoning":{"effort":"low","summary":null}`, `"text":{"verbosity":"low","format":{"type":"text"}}`,
		`"usage":{"input_tokens":10,"input_tokens_details":{"cached_tokens":6},"output_tokens":4,"output_tokens_details":{"reasoning_tokens":2},"total_tokens":14}`,
	} {
		if !strings.Contains(s, want) {
			t.Errorf("missing %s in\n%s", want, s)
		}
	}
	if !validJSONObject(got) {
		t.Errorf("not JSON: %s", got)
	}
	got, _ = ChatToResponses(nil, []byte(`{"choices":[{"message":{"content":"a"},"finish_reason":"length"}]}`), m)
	if !strings.Contains(string(got), `"status":"incomplete","background":false,"error":null,"incomplete_details":{"reason":"max_output_tokens"}`) {
		t.Errorf("length: %s", got)
	}
}

// An answer cut by the output limit is an incomplete Response whose last
// item, the one being written, is incomplete too (as OpenAI reports it);
// the items before it are completed.
func TestTheItemAnOutputLimitCutIsIncomplete(t *testing.T) {
	m := responsesMeta(t, `{"model":"g","input":"x","max_output_tokens":5}`)
	for _, tc := range []struct{ body, completed, incomplete string }{
		{`{"choices":[{"message":{"content":"a","reasoning_content":"r"},"finish_reason":"length"}]}`,
			`"type":"reasoning","summary":[],"content":[{"type":"reasoning_text","text":"r"}],"status":"completed"}`,
			`"type":"message","status":"incomplete","role":"assistant","content":[{"type":"output_text","text":"a"`},
		{`{"choices":[{"message":{"reasoning_content":"r"},"finish_reason":"length"}]}`,
			``, `"type":"reasoning","summary":[],"content":[{"type":"reasoning_text","text":"r"}],"status":"incomplete"}`},
		{`{"choices":[{"message":{"content":"a","reasoning_content":"r"},"finish_reason":"stop"}]}`,
			`"type":"message","status":"completed"`, ``},
	} {
		got, err := ChatToResponses(nil, []byte(tc.body), m)
		if err != nil {
			t.Fatal(err)
		}
		s := string(got)
		if !strings.Contains(s, tc.completed) || !strings.Contains(s, tc.incomplete) {
			t.Errorf("%s:\n%s", tc.body, s)
		}
		if n := strings.Count(s, `"status":"incomplete"`); n != 2*b01(tc.incomplete != "") {
			t.Errorf("%s: %d incomplete statuses:\n%s", tc.body, n, s)
		}
	}
}

func b01(b bool) int {
	if b {
		return 1
	}
	return 0
}

func TestEngineErrorsConvertToTheClientShape(t *testing.T) {
	f := func(api API, status int, body, want string) {
		t.Helper()
		if got := ConvertError(nil, api, status, []byte(body)); !jsonEqual(got, []byte(want)) {
			t.Errorf("%v %d %s:\n got %s\nwant %s", api, status, body, got, want)
		}
	}
	openai := `{"error":{"message":"This model's maximum context length is 10","type":"BadRequestError","param":"messages","code":400}}`
	f(Anthropic, 400, openai, `{"type":"error","error":{"type":"invalid_request_error","message":"This model's maximum context length is 10"}}`)
	f(Responses, 400, openai, `{"error":{"message":"This model's maximum context length is 10","type":"BadRequestError","param":"messages","code":null}}`)
	f(Anthropic, 500, `{"object":"error","message":"flat \"vllm\" error","type":"InternalServerError","param":null,"code":500}`, `{"type":"error","error":{"type":"api_error","message":"flat \"vllm\" error"}}`)
	f(Anthropic, 429, `{"detail":"slow down"}`, `{"type":"error","error":{"type":"rate_limit_error","message":"slow down"}}`)
	f(Anthropic, 503, `<html>bad gateway</html>`, `{"type":"error","error":{"type":"overloaded_error","message":"upstream answered HTTP 503"}}`)
	f(Responses, 504, ``, `{"error":{"message":"upstream answered HTTP 504","type":"timeout_error","param":null,"code":null}}`)
	for status, typ := range map[int]string{400: "invalid_request_error", 401: "authentication_error", 403: "permission_error", 404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 500: "api_error", 502: "api_error", 503: "overloaded_error", 504: "timeout_error", 529: "overloaded_error"} {
		want := `{"type":"error","error":{"type":"` + typ + `","message":"m"}}`
		if got := AppendError(nil, Anthropic, status, TypeServer, "p", "m"); string(got) != want {
			t.Errorf("%d: %s", status, got)
		}
	}
	e := badRequest("model", "model: field required")
	if got := string(e.Append(nil, Responses)); got != `{"error":{"message":"model: field required","type":"invalid_request_error","param":"model","code":null}}` {
		t.Errorf("responses error %s", got)
	}
}

// A stop sequence longer than the converter's stack buffer is still matched:
// the answer reports stop_sequence with it, not end_turn.
func TestALongStopSequenceIsReportedAsTheStopSequence(t *testing.T) {
	long := strings.Repeat("Z", 300)
	m := anthropicMeta(t, `{"model":"claude-client","max_tokens":5,"stop_sequences":["`+long+`"],"messages":[{"role":"user","content":"x"}]}`)
	got, err := ChatToAnthropic(nil, []byte(`{"choices":[{"message":{"content":"a"},"finish_reason":"stop","stop_reason":"`+long+`"}]}`), m)
	if err != nil || !strings.Contains(string(got), `"stop_reason":"stop_sequence","stop_sequence":"`+long+`"`) {
		t.Fatalf("%v: %s", err, got)
	}
}
