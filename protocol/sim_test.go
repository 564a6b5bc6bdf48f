package protocol

import (
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/infera/infera/tokenizer"
)

// simEngine is a deterministic chat completions engine for tests: it
// answers a tool call when tools are offered (and the last message is not
// a tool result), else text, with reasoning when the request asks for it.
// It checks the converted request the way an engine would (roles, tool
// call ids) and answers 400 when it is wrong.
type simEngine struct{}

type simReq struct {
	Model    string `json:"model"`
	Messages []struct {
		Role       string          `json:"role"`
		Content    json.RawMessage `json:"content"`
		ToolCallID string          `json:"tool_call_id"`
		ToolCalls  []struct {
			ID       string `json:"id"`
			Function struct {
				Name      string `json:"name"`
				Arguments string `json:"arguments"`
			} `json:"function"`
		} `json:"tool_calls"`
	} `json:"messages"`
	Tools []struct {
		Type     string `json:"type"`
		Function struct {
			Name       string          `json:"name"`
			Parameters json.RawMessage `json:"parameters"`
		} `json:"function"`
	} `json:"tools"`
	ToolChoice    json.RawMessage `json:"tool_choice"`
	Stream        bool            `json:"stream"`
	StreamOptions *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
	MaxTokens       int             `json:"max_tokens"`
	ReasoningEffort string          `json:"reasoning_effort"`
	Kwargs          map[string]bool `json:"chat_template_kwargs"`
	Stop            []string        `json:"stop"`
	ResponseFormat  *struct {
		Type       string `json:"type"`
		JSONSchema *struct {
			Name   string          `json:"name"`
			Schema json.RawMessage `json:"schema"`
		} `json:"json_schema"`
	} `json:"response_format"`
}

type simAnswer struct {
	reasoning string
	words     []string
	toolName  string
	toolArgs  string
	finish    string
	prompt    int
	stopSeq   string
}

// answer decides the answer to a chat body, or returns a 400 message.
func (simEngine) answer(body []byte) (*simReq, simAnswer, string) {
	var r simReq
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(body, &raw); err != nil {
		return nil, simAnswer{}, "engine: bad JSON: " + err.Error()
	}
	if err := json.Unmarshal(body, &r); err != nil {
		return nil, simAnswer{}, "engine: bad request: " + err.Error()
	}
	if r.Model == "" || len(r.Messages) == 0 {
		return nil, simAnswer{}, "engine: model and messages are required"
	}
	calls := map[string]bool{}
	prompt := 0
	var lastText string
	for i, m := range r.Messages {
		switch m.Role {
		case "system", "user", "assistant", "tool":
		default:
			return nil, simAnswer{}, fmt.Sprintf("engine: messages[%d]: bad role %q", i, m.Role)
		}
		if m.Role == "system" && i > 0 && r.Messages[i-1].Role != "system" {
			return nil, simAnswer{}, "engine: system message not at the beginning"
		}
		for _, tc := range m.ToolCalls {
			calls[tc.ID] = true
			var v map[string]any
			if err := json.Unmarshal([]byte(tc.Function.Arguments), &v); err != nil {
				return nil, simAnswer{}, "engine: tool call arguments are not a JSON object"
			}
		}
		if m.Role == "tool" && !calls[m.ToolCallID] {
			return nil, simAnswer{}, fmt.Sprintf("engine: tool message for unknown call %q", m.ToolCallID)
		}
		var s string
		if len(m.Content) == 0 && m.Role == "assistant" && len(m.ToolCalls) > 0 {
			// No content beside tool calls, as the chat API and vLLM allow.
		} else if json.Unmarshal(m.Content, &s) == nil {
			lastText = s
		} else {
			var parts []map[string]any
			if err := json.Unmarshal(m.Content, &parts); err != nil {
				return nil, simAnswer{}, fmt.Sprintf("engine: messages[%d].content: %v", i, err)
			}
			s = string(m.Content)
		}
		prompt += len(s)/4 + 4
	}
	a := simAnswer{prompt: prompt, finish: "stop"}
	if r.ReasoningEffort != "" || r.Kwargs["enable_thinking"] {
		a.reasoning = "Let me think about it."
	}
	last := r.Messages[len(r.Messages)-1]
	if len(r.Tools) > 0 && last.Role != "tool" && string(r.ToolChoice) != `"none"` {
		a.toolName = r.Tools[0].Function.Name
		a.toolArgs = `{"city": "Paris"}`
		a.finish = "tool_calls"
		return &r, a, ""
	}
	text := "Hello from the simulated engine, it is a fine day"
	if last.Role == "tool" {
		text = "The tool said: " + lastText
	}
	if f := r.ResponseFormat; f != nil {
		// A constrained engine answers in the schema's shape (the one
		// scripts/sdk asks for: an object with a string answer).
		if f.Type != "json_schema" || f.JSONSchema == nil || f.JSONSchema.Name == "" || !json.Valid(f.JSONSchema.Schema) {
			return nil, simAnswer{}, "engine: response_format needs a named json_schema"
		}
		text = `{"answer": "Paris"}`
	}
	a.words = strings.SplitAfter(text, " ")
	if len(r.Stop) > 0 {
		for i, w := range a.words {
			if strings.Contains(w, r.Stop[0]) {
				a.words, a.stopSeq = a.words[:i], r.Stop[0]
				break
			}
		}
	}
	if r.MaxTokens > 0 && len(a.words) > r.MaxTokens {
		a.words, a.finish = a.words[:r.MaxTokens], "length"
	}
	return &r, a, ""
}

func (a simAnswer) completionTokens() int {
	n := len(a.words)
	if a.reasoning != "" {
		n += 5
	}
	if a.toolName != "" {
		n += 6
	}
	return n
}

func (a simAnswer) usage() string {
	return fmt.Sprintf(`{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d,"prompt_tokens_details":{"cached_tokens":2}}`,
		a.prompt, a.completionTokens(), a.prompt+a.completionTokens())
}

func jstr(s string) string { b, _ := json.Marshal(s); return string(b) }

// body is the non-streaming chat completion.
func (a simAnswer) body() string {
	msg := `{"role":"assistant","content":` + jstr(strings.Join(a.words, ""))
	if a.reasoning != "" {
		msg += `,"reasoning_content":` + jstr(a.reasoning)
	}
	if a.toolName != "" {
		msg += `,"tool_calls":[{"id":"call_sim1","type":"function","function":{"name":` + jstr(a.toolName) + `,"arguments":` + jstr(a.toolArgs) + `}}]`
	}
	msg += "}"
	stop := "null"
	if a.stopSeq != "" {
		stop = jstr(a.stopSeq)
	}
	return `{"id":"chatcmpl-sim","object":"chat.completion","created":1,"model":"sim","choices":[{"index":0,"message":` + msg +
		`,"finish_reason":"` + a.finish + `","stop_reason":` + stop + `}],"usage":` + a.usage() + `}`
}

// sse is the streamed chat completion, vLLM style.
func (a simAnswer) sse(includeUsage bool) string {
	var b strings.Builder
	chunk := func(delta, finish string) {
		f := "null"
		if finish != "" {
			f = `"` + finish + `"`
		}
		stop := ""
		if finish != "" && a.stopSeq != "" {
			stop = `,"stop_reason":` + jstr(a.stopSeq)
		}
		fmt.Fprintf(&b, "data: {\"id\":\"chatcmpl-sim\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"sim\",\"choices\":[{\"index\":0,\"delta\":%s,\"logprobs\":null,\"finish_reason\":%s%s}]}\n\n", delta, f, stop)
	}
	chunk(`{"role":"assistant","content":""}`, "")
	if a.reasoning != "" {
		for _, w := range strings.SplitAfter(a.reasoning, " ") {
			chunk(`{"reasoning_content":`+jstr(w)+`}`, "")
		}
	}
	for _, w := range a.words {
		chunk(`{"content":`+jstr(w)+`}`, "")
	}
	if a.toolName != "" {
		chunk(`{"tool_calls":[{"index":0,"id":"call_sim1","type":"function","function":{"name":`+jstr(a.toolName)+`,"arguments":""}}]}`, "")
		args := a.toolArgs
		for len(args) > 0 {
			n := min(5, len(args))
			chunk(`{"tool_calls":[{"index":0,"function":{"arguments":`+jstr(args[:n])+`}}]}`, "")
			args = args[n:]
		}
	}
	chunk(`{}`, a.finish)
	if includeUsage {
		b.WriteString(`data: {"id":"chatcmpl-sim","object":"chat.completion.chunk","created":1,"model":"sim","choices":[],"usage":` + a.usage() + "}\n\n")
	}
	b.WriteString("data: [DONE]\n\n")
	return b.String()
}

// splitRandom cuts s into pieces of 1..max bytes.
func splitRandom(r *rand.Rand, s []byte, max int) [][]byte {
	var out [][]byte
	for len(s) > 0 {
		n := 1 + r.IntN(max)
		if n > len(s) {
			n = len(s)
		}
		out = append(out, s[:n])
		s = s[n:]
	}
	return out
}

// gateway is a minimal front door built on this package and simEngine,
// as the proxy will wire it: convert the request, answer from the engine,
// convert the answer (streams fed in random pieces).
type gateway struct {
	t   testing.TB
	opt Options
}

func (g *gateway) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	body, _ := io.ReadAll(req.Body)
	var api API
	switch req.URL.Path {
	case "/v1/messages", "/v1/messages/count_tokens":
		api = Anthropic
	case "/v1/responses":
		api = Responses
	default:
		http.NotFound(w, req)
		return
	}
	var m Meta
	var chat []byte
	var err error
	switch req.URL.Path {
	case "/v1/messages":
		chat, err = AnthropicToChat(nil, body, &g.opt, &m)
	case "/v1/messages/count_tokens":
		chat, err = AnthropicCountTokensToChat(nil, body, &g.opt, &m)
	default:
		chat, err = ResponsesToChat(nil, body, &g.opt, &m)
	}
	w.Header().Set("Content-Type", "application/json")
	if err != nil {
		e := err.(*Error)
		w.WriteHeader(e.Status)
		w.Write(e.Append(nil, api))
		return
	}
	if req.URL.Path == "/v1/messages/count_tokens" {
		var arena []byte
		msgs, tools, err := ChatMessages(nil, chat, &arena)
		if err != nil {
			g.t.Errorf("ChatMessages: %v", err)
		}
		var tok tokenizer.Simple
		prompt, _ := tok.RenderChat(nil, msgs, tools, true)
		w.Write(AppendCountTokens(nil, len(tok.Encode(nil, prompt))))
		return
	}
	r, a, bad := simEngine{}.answer(chat)
	if bad != "" {
		g.t.Errorf("engine refused the converted request: %s\nclient body: %s\nchat body: %s", bad, body, chat)
		w.WriteHeader(400)
		w.Write(ConvertError(nil, api, 400, []byte(`{"error":{"message":`+jstr(bad)+`,"type":"invalid_request_error"}}`)))
		return
	}
	if !r.Stream {
		out, err := func() ([]byte, error) {
			if api == Anthropic {
				return ChatToAnthropic(nil, []byte(a.body()), &m)
			}
			return ChatToResponses(nil, []byte(a.body()), &m)
		}()
		if err != nil {
			g.t.Errorf("converting the answer: %v", err)
		}
		w.Write(out)
		return
	}
	if r.StreamOptions == nil || !r.StreamOptions.IncludeUsage {
		g.t.Errorf("a converted stream must ask for usage: %s", chat)
	}
	w.Header().Set("Content-Type", "text/event-stream")
	fl := w.(http.Flusher)
	c := AcquireStreamConverter(&m)
	defer ReleaseStreamConverter(c)
	var out []byte
	rnd := rand.New(rand.NewPCG(rand.Uint64(), 1))
	for _, piece := range splitRandom(rnd, []byte(a.sse(true)), 64) {
		out = c.Feed(out[:0], piece)
		if len(out) > 0 {
			w.Write(out)
			fl.Flush()
		}
	}
	w.Write(c.Finish(out[:0]))
}

// startGateway serves a gateway on a loopback port until the test ends.
func startGateway(t *testing.T, opt Options) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: &gateway{t: t, opt: opt}}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return "http://" + ln.Addr().String()
}
