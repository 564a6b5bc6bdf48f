package engine

import (
	"encoding/json"
	"io"
	"strings"
	"testing"
)

// plannedChunk is a chat stream chunk with the fields answer shaping sets.
type plannedChunk struct {
	Choices []struct {
		Delta struct {
			Content          *string `json:"content"`
			ReasoningContent *string `json:"reasoning_content"`
			ToolCalls        []struct {
				Index    int    `json:"index"`
				ID       string `json:"id"`
				Type     string `json:"type"`
				Function struct {
					Name      string `json:"name"`
					Arguments string `json:"arguments"`
				} `json:"function"`
			} `json:"tool_calls"`
		} `json:"delta"`
		Message struct {
			Content          *string `json:"content"`
			ReasoningContent *string `json:"reasoning_content"`
			ToolCalls        []struct {
				ID       string `json:"id"`
				Function struct {
					Name      string `json:"name"`
					Arguments string `json:"arguments"`
				} `json:"function"`
			} `json:"tool_calls"`
		} `json:"message"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *struct {
		CompletionTokens        int `json:"completion_tokens"`
		CompletionTokensDetails struct {
			ReasoningTokens int `json:"reasoning_tokens"`
		} `json:"completion_tokens_details"`
	} `json:"usage"`
}

const weatherTools = `"tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object",` +
	`"properties":{"city":{"type":"string"},"days":{"type":"integer"},"unit":{"enum":["c","f"]}},"required":["unit","city"]}}},` +
	`{"type":"function","function":{"name":"get_time","parameters":{"type":"object","properties":{"zone":{"type":"string"}}}}}]`

func TestAnswerShapingReasoning(t *testing.T) {
	e := startEngine(t, func(c *Config) { c.Reasoning = true })
	f := func(extra string, wantReasoning int) {
		t.Helper()
		code, b, _ := e.post(t, "/v1/chat/completions", `{"model":"sim-model","max_tokens":6,"messages":[{"role":"user","content":"hi"}]`+extra+`}`)
		var r plannedChunk
		if code != 200 || json.Unmarshal(b, &r) != nil {
			t.Fatalf("%d %s", code, b)
		}
		msg := r.Choices[0].Message
		got := 0
		if msg.ReasoningContent != nil {
			got = len(strings.Fields(*msg.ReasoningContent))
			if *msg.ReasoningContent != string(appendFiller(nil, 0, wantReasoning)) {
				t.Fatalf("reasoning %q", *msg.ReasoningContent)
			}
		}
		if got != wantReasoning || *msg.Content != string(appendFiller(nil, wantReasoning, 6)) {
			t.Fatalf("%s: reasoning words %d, want %d: %s", extra, got, wantReasoning, b)
		}
		if r.Usage.CompletionTokens != 6 || r.Usage.CompletionTokensDetails.ReasoningTokens != wantReasoning {
			t.Fatalf("usage %s", b)
		}
	}
	f(``, 0)
	f(`,"reasoning_effort":"low"`, 3)
	f(`,"reasoning_effort":"minimal"`, 0)
	f(`,"chat_template_kwargs":{"enable_thinking":true}`, 3)
	f(`,"chat_template_kwargs":{"enable_thinking":false},"reasoning_effort":"high"`, 0)

	// streamed: reasoning_content deltas first, then content deltas
	resp, err := testClient.Post(e.base+"/v1/chat/completions", "application/json", strings.NewReader(
		`{"model":"sim-model","stream":true,"stream_options":{"include_usage":true},"max_tokens":4,"reasoning_effort":"high","messages":[{"role":"user","content":"hi"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, err := readSSE(t, resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	var order []string
	for _, d := range data[:len(data)-1] {
		var c plannedChunk
		if err := json.Unmarshal([]byte(d), &c); err != nil {
			t.Fatalf("%q: %v", d, err)
		}
		switch {
		case c.Usage != nil:
			order = append(order, "usage")
			if c.Usage.CompletionTokensDetails.ReasoningTokens != 2 {
				t.Fatalf("usage %q", d)
			}
		case c.Choices[0].Delta.ReasoningContent != nil:
			order = append(order, "r")
		case c.Choices[0].FinishReason != nil:
			order = append(order, *c.Choices[0].FinishReason)
		case c.Choices[0].Delta.Content != nil && *c.Choices[0].Delta.Content != "":
			order = append(order, "c")
		}
	}
	if strings.Join(order, ",") != "r,r,c,c,length,usage" {
		t.Fatalf("stream order %v", order)
	}
}

func TestAnswerShapingToolCalls(t *testing.T) {
	e := startEngine(t, func(c *Config) { c.ToolCalls = true })
	ask := `"messages":[{"role":"user","content":"weather?"}]`
	f := func(body, wantName, wantArgs, wantFinish string) {
		t.Helper()
		code, b, _ := e.post(t, "/v1/chat/completions", body)
		var r plannedChunk
		if code != 200 || json.Unmarshal(b, &r) != nil {
			t.Fatalf("%d %s", code, b)
		}
		ch := r.Choices[0]
		if *ch.FinishReason != wantFinish {
			t.Fatalf("finish %q: %s", *ch.FinishReason, b)
		}
		if wantName == "" {
			if len(ch.Message.ToolCalls) != 0 || ch.Message.Content == nil || *ch.Message.Content == "" {
				t.Fatalf("want text: %s", b)
			}
			return
		}
		if len(ch.Message.ToolCalls) != 1 || ch.Message.ToolCalls[0].Function.Name != wantName ||
			ch.Message.ToolCalls[0].Function.Arguments != wantArgs || !strings.HasPrefix(ch.Message.ToolCalls[0].ID, "call_") {
			t.Fatalf("tool call: %s", b)
		}
	}
	f(`{"model":"sim-model",`+weatherTools+`,`+ask+`}`, "get_weather", `{"city":"sim","unit":"c"}`, "tool_calls")
	f(`{"model":"sim-model",`+weatherTools+`,"tool_choice":{"type":"function","function":{"name":"get_time"}},`+ask+`}`, "get_time", `{"zone":"sim"}`, "tool_calls")
	f(`{"model":"sim-model","max_tokens":2,`+weatherTools+`,`+ask+`}`, "get_weather", `{"city":"sim",`, "length")
	f(`{"model":"sim-model",`+weatherTools+`,"tool_choice":"none",`+ask+`}`, "", "", "length")
	f(`{"model":"sim-model",`+weatherTools+`,"messages":[{"role":"user","content":"weather?"},`+
		`{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"get_weather","arguments":"{}"}}]},`+
		`{"role":"tool","tool_call_id":"c1","content":"sunny"}]}`, "", "", "length")

	// streamed: the call opens with id and name; arguments arrive in pieces
	var args, name, id, finish string
	pieces := 0
	for _, c := range streamChunks(t, e, `{"model":"sim-model","stream":true,`+weatherTools+`,`+ask+`}`) {
		for _, tc := range c.Choices[0].Delta.ToolCalls {
			pieces++
			args += tc.Function.Arguments
			if tc.ID != "" {
				id, name = tc.ID, tc.Function.Name
			}
		}
		if fr := c.Choices[0].FinishReason; fr != nil {
			finish = *fr
		}
	}
	if args != `{"city":"sim","unit":"c"}` || name != "get_weather" || id == "" || pieces != 4 || finish != "tool_calls" {
		t.Fatalf("streamed call %q %q %q pieces %d finish %q", id, name, args, pieces, finish)
	}
}

func TestSplitPiecesKeepsRunes(t *testing.T) {
	f := func(s string, n int) {
		t.Helper()
		p := splitPieces(s, n)
		if strings.Join(p, "") != s || len(p) > n {
			t.Fatalf("%q -> %q", s, p)
		}
		for _, x := range p {
			if x == "" {
				t.Fatalf("empty piece in %q", p)
			}
			if strings.ToValidUTF8(x, "\uFFFD") != x {
				t.Fatalf("piece %q splits a rune", x)
			}
		}
	}
	f(`{"a":"héllo wörld ✓✓✓"}`, 4)
	f("ab", 4)
	f("", 4)
	f("✓✓✓✓✓", 2)
}

func TestNativeProtocols(t *testing.T) {
	off := startEngine(t, nil)
	if code, _, _ := off.post(t, "/v1/messages", `{"model":"sim-model","max_tokens":3,"messages":[{"role":"user","content":"hi"}]}`); code != 404 {
		t.Fatalf("native protocols off: %d", code)
	}
	e := startEngine(t, func(c *Config) { c.NativeProtocols, c.Reasoning = true, true })
	code, b, _ := e.post(t, "/v1/messages", `{"model":"sim-model","max_tokens":4,"thinking":{"type":"enabled","budget_tokens":2000},"messages":[{"role":"user","content":"hi"}]}`)
	var msg struct {
		Type    string `json:"type"`
		Model   string `json:"model"`
		Content []struct {
			Type string `json:"type"`
		} `json:"content"`
		StopReason string `json:"stop_reason"`
		Usage      struct {
			InputTokens  int `json:"input_tokens"`
			OutputTokens int `json:"output_tokens"`
		} `json:"usage"`
	}
	if code != 200 || json.Unmarshal(b, &msg) != nil || msg.Type != "message" || msg.StopReason != "max_tokens" ||
		len(msg.Content) != 2 || msg.Content[0].Type != "thinking" || msg.Usage.OutputTokens != 4 || msg.Usage.InputTokens == 0 {
		t.Fatalf("messages: %d %s", code, b)
	}
	code, b, _ = e.post(t, "/v1/messages", `{"model":"sim-model","messages":[]}`)
	if code != 400 || !strings.Contains(string(b), `"type":"error"`) {
		t.Fatalf("bad messages request: %d %s", code, b)
	}
	code, b, _ = e.post(t, "/v1/messages", `{"model":"nope","max_tokens":2,"messages":[{"role":"user","content":"hi"}]}`)
	if code != 404 || !strings.Contains(string(b), `"not_found_error"`) {
		t.Fatalf("unknown model: %d %s", code, b)
	}
	code, b, _ = e.post(t, "/v1/messages/count_tokens", `{"model":"sim-model","messages":[{"role":"user","content":"hello there"}]}`)
	if code != 200 || !strings.HasPrefix(string(b), `{"input_tokens":`) {
		t.Fatalf("count_tokens: %d %s", code, b)
	}
	code, b, _ = e.post(t, "/v1/responses", `{"model":"sim-model","input":"hi","max_output_tokens":3}`)
	if code != 200 || !strings.Contains(string(b), `"object":"response"`) || !strings.Contains(string(b), `"output_tokens":3`) {
		t.Fatalf("responses: %d %s", code, b)
	}
	resp, err := testClient.Post(e.base+"/v1/messages", "application/json", strings.NewReader(
		`{"model":"sim-model","stream":true,"max_tokens":3,"messages":[{"role":"user","content":"hi"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	sb, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	s := string(sb)
	if !strings.HasPrefix(s, "event: message_start\n") || !strings.HasSuffix(s, "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n") ||
		strings.Count(s, "event: content_block_delta") != 3 {
		t.Fatalf("messages stream: %s", s)
	}
	if st := e.stats(t); st.Completed != 3 || st.Active != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// A response_format json_schema is answered in the schema's shape, as an
// engine with guided decoding does (what an Anthropic structured output
// becomes through the router), streamed in pieces; json_object with {}.
func TestResponseFormatIsAnsweredInTheSchemasShape(t *testing.T) {
	e := startEngine(t, nil)
	schema := `"response_format":{"type":"json_schema","json_schema":{"name":"output","strict":true,"schema":{"type":"object","properties":{"city":{"type":"string"},"n":{"type":"integer"}},"required":["city","n"]}}}`
	ask := `"messages":[{"role":"user","content":"where?"}]`
	f := func(body, wantContent, wantFinish string) {
		t.Helper()
		code, b, _ := e.post(t, "/v1/chat/completions", body)
		var r plannedChunk
		if code != 200 || json.Unmarshal(b, &r) != nil {
			t.Fatalf("%d %s", code, b)
		}
		ch := r.Choices[0]
		if ch.Message.Content == nil || *ch.Message.Content != wantContent || *ch.FinishReason != wantFinish {
			t.Fatalf("want content %q finish %q: %s", wantContent, wantFinish, b)
		}
	}
	f(`{"model":"sim-model",`+schema+`,`+ask+`}`, `{"city":"sim","n":1}`, "stop")
	f(`{"model":"sim-model","max_tokens":2,`+schema+`,`+ask+`}`, `{"city":"s`, "length")
	f(`{"model":"sim-model","response_format":{"type":"json_object"},`+ask+`}`, `{}`, "stop")

	var text, finish string
	for _, c := range streamChunks(t, e, `{"model":"sim-model","stream":true,`+schema+`,`+ask+`}`) {
		if len(c.Choices) == 0 {
			continue
		}
		if p := c.Choices[0].Delta.Content; p != nil {
			text += *p
		}
		if fr := c.Choices[0].FinishReason; fr != nil {
			finish = *fr
		}
	}
	if text != `{"city":"sim","n":1}` || finish != "stop" {
		t.Fatalf("streamed %q finish %q", text, finish)
	}
}

// streamChunks posts a streaming chat body and returns its chunks before
// [DONE].
func streamChunks(t *testing.T, e *testEngine, body string) []plannedChunk {
	t.Helper()
	resp, err := testClient.Post(e.base+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, err := readSSE(t, resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	var out []plannedChunk
	for _, d := range data[:len(data)-1] {
		var c plannedChunk
		if err := json.Unmarshal([]byte(d), &c); err != nil {
			t.Fatalf("%q: %v", d, err)
		}
		out = append(out, c)
	}
	return out
}
