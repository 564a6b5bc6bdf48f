package proxy

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/infera/infera/config"
	"github.com/infera/infera/fleet"
	"github.com/infera/infera/protocol"
	"github.com/infera/infera/tokenizer"
	"github.com/valyala/fasthttp"
)

// chatEngine is a scripted chat completions upstream: it records every
// request (path, body, headers) and answers a chat completion, or its SSE
// stream in one write per event, with a usage chunk when asked for it.
type chatEngine struct {
	mu   sync.Mutex
	reqs []engineReq
	// reasoning, when set, is streamed/answered as reasoning_content.
	reasoning string
	// status, when non-zero, is answered with body errBody.
	status  int
	errBody string
	// answer overrides the whole response (path -> raw body); for
	// passthrough upstreams.
	answer func(ctx *fasthttp.RequestCtx) bool
}

type engineReq struct {
	path, body string
	hdr        http.Header
}

func (e *chatEngine) last(t *testing.T) engineReq {
	t.Helper()
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.reqs) == 0 {
		t.Fatal("the engine got no request")
	}
	return e.reqs[len(e.reqs)-1]
}

func (e *chatEngine) count() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.reqs)
}

const engineUsage = `{"prompt_tokens":20,"completion_tokens":3,"total_tokens":23,"prompt_tokens_details":{"cached_tokens":8}}`

func (e *chatEngine) handler(ctx *fasthttp.RequestCtx) {
	r := engineReq{path: string(ctx.Path()), body: string(ctx.PostBody()), hdr: http.Header{}}
	for k, v := range ctx.Request.Header.All() {
		r.hdr.Add(string(k), string(v))
	}
	e.mu.Lock()
	e.reqs = append(e.reqs, r)
	e.mu.Unlock()
	if e.answer != nil && e.answer(ctx) {
		return
	}
	if e.status != 0 {
		ctx.SetStatusCode(e.status)
		ctx.SetContentType("application/json")
		ctx.SetBodyString(e.errBody)
		return
	}
	var req struct {
		Stream        bool `json:"stream"`
		StreamOptions struct {
			IncludeUsage bool `json:"include_usage"`
		} `json:"stream_options"`
	}
	json.Unmarshal(ctx.PostBody(), &req)
	if !req.Stream {
		ctx.SetContentType("application/json")
		reasoning := ""
		if e.reasoning != "" {
			reasoning = `"reasoning_content":"` + e.reasoning + `",`
		}
		ctx.SetBodyString(`{"id":"c1","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant",` +
			reasoning + `"content":"Hello there!"},"finish_reason":"stop"}],"usage":` + engineUsage + `}`)
		return
	}
	usage := req.StreamOptions.IncludeUsage
	ctx.SetContentType("text/event-stream")
	ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
		ev := func(s string) {
			w.WriteString("data: " + s + "\n\n")
			w.Flush()
		}
		head := `{"id":"c1","object":"chat.completion.chunk","model":"m",`
		ev(head + `"choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}`)
		if e.reasoning != "" {
			ev(head + `"choices":[{"index":0,"delta":{"reasoning_content":"` + e.reasoning + `"},"finish_reason":null}]}`)
		}
		for _, w := range []string{"Hello", " there", "!"} {
			ev(head + `"choices":[{"index":0,"delta":{"content":"` + w + `"},"finish_reason":null}]}`)
		}
		ev(head + `"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}`)
		if usage {
			ev(head + `"choices":[],"usage":` + engineUsage + `}`)
		}
		ev("[DONE]")
	})
}

func startChatEngine(t testing.TB, e *chatEngine) *upstream {
	return startUpstream(t, e.handler)
}

// protoConfig is the default config with the protocol section changed.
func protoConfig(f func(p *config.Protocol)) *config.Config {
	cfg := config.Default()
	if f != nil {
		f(&cfg.Protocol)
	}
	return cfg
}

func postH(t *testing.T, url, body string, hdr map[string]string) (*http.Response, string) {
	t.Helper()
	req, _ := http.NewRequest("POST", url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

// sseEvents splits an SSE body into (event name, data) pairs.
func sseEvents(t *testing.T, body string) [][2]string {
	t.Helper()
	var out [][2]string
	for _, ev := range strings.Split(strings.TrimSuffix(body, "\n\n"), "\n\n") {
		var name, data string
		for _, line := range strings.Split(ev, "\n") {
			switch {
			case strings.HasPrefix(line, "event: "):
				name = line[len("event: "):]
			case strings.HasPrefix(line, "data: "):
				data = line[len("data: "):]
			default:
				t.Fatalf("bad SSE line %q in %q", line, body)
			}
		}
		out = append(out, [2]string{name, data})
	}
	return out
}

// checkAnthropicError asserts Anthropic's error shape with the given type.
func checkAnthropicError(t *testing.T, body, typ string) {
	t.Helper()
	checkAnthropicErrorShape(t, body, typ, true)
}

// checkAnthropicErrorEvent checks the data of a stream's error event,
// which carries no request_id (the answer's header has it).
func checkAnthropicErrorEvent(t *testing.T, body, typ string) {
	t.Helper()
	checkAnthropicErrorShape(t, body, typ, false)
}

func checkAnthropicErrorShape(t *testing.T, body, typ string, withID bool) {
	t.Helper()
	var e struct {
		Type  string `json:"type"`
		Error struct {
			Type    string `json:"type"`
			Message string `json:"message"`
		} `json:"error"`
		RequestID string `json:"request_id"` // as Anthropic's API answers (its SDKs' ErrorResponse.request_id)
	}
	if err := json.Unmarshal([]byte(body), &e); err != nil || e.Type != "error" || e.Error.Type != typ || e.Error.Message == "" || (e.RequestID == "") == withID {
		t.Fatalf("not an Anthropic %s error with its request_id: %q (%v)", typ, body, err)
	}
}

const anthropicBody = `{"model":"m","max_tokens":16,"system":"be brief","messages":[{"role":"user","content":"hello"}]}`

func TestMessagesConvertedToChatAndBack(t *testing.T) {
	e := &chatEngine{}
	up := startChatEngine(t, e)
	r := startRouter(t, nil, nil, up.url)
	resp, b := postH(t, r.url+"/v1/messages", anthropicBody, map[string]string{"anthropic-version": "2023-06-01", "Accept-Encoding": "gzip"})
	var m struct {
		ID      string `json:"id"`
		Type    string `json:"type"`
		Role    string `json:"role"`
		Model   string `json:"model"`
		Content []struct {
			Type, Text string
		} `json:"content"`
		StopReason string `json:"stop_reason"`
		Usage      struct {
			InputTokens     int `json:"input_tokens"`
			OutputTokens    int `json:"output_tokens"`
			CacheReadTokens int `json:"cache_read_input_tokens"`
		} `json:"usage"`
	}
	if resp.StatusCode != 200 || json.Unmarshal([]byte(b), &m) != nil {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	if !strings.HasPrefix(m.ID, "msg_") || m.Type != "message" || m.Role != "assistant" || m.Model != "m" ||
		len(m.Content) != 1 || m.Content[0].Text != "Hello there!" || m.StopReason != "end_turn" ||
		m.Usage.InputTokens != 12 || m.Usage.CacheReadTokens != 8 || m.Usage.OutputTokens != 3 {
		t.Fatalf("message %s", b)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Fatalf("content type %q", ct)
	}
	got := e.last(t)
	want := `{"model":"m","messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hello"}],"max_tokens":16}`
	if got.path != "/v1/chat/completions" || got.body != want {
		t.Fatalf("engine got %s %s, want %s", got.path, got.body, want)
	}
	if got.hdr.Get("Accept-Encoding") != "" || got.hdr.Get("Anthropic-Version") != "2023-06-01" {
		t.Fatalf("engine headers %v", got.hdr)
	}
	// The engine's usage reached the router's metrics.
	if !strings.Contains(metricsText(), `infera_protocol_requests_total{mode="convert"}`) {
		t.Fatal("no conversion metric")
	}
}

func metricsText() string {
	var sb strings.Builder
	metrics.WritePrometheus(&sb, false)
	return sb.String()
}

func TestMessagesStreamConverted(t *testing.T) {
	e := &chatEngine{reasoning: "let me think"}
	up := startChatEngine(t, e)
	r := startRouter(t, nil, nil, up.url)
	body := strings.Replace(anthropicBody, `"max_tokens"`, `"stream":true,"max_tokens"`, 1)
	resp, b := postH(t, r.url+"/v1/messages", body, nil)
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("%d %q: %s", resp.StatusCode, resp.Header.Get("Content-Type"), b)
	}
	var names []string
	text, thinking := "", ""
	for _, ev := range sseEvents(t, b) {
		names = append(names, ev[0])
		var d struct {
			Type  string `json:"type"`
			Delta struct {
				Type, Text, Thinking string
			} `json:"delta"`
			Usage struct {
				InputTokens  int `json:"input_tokens"`
				OutputTokens int `json:"output_tokens"`
			} `json:"usage"`
		}
		if err := json.Unmarshal([]byte(ev[1]), &d); err != nil || d.Type != ev[0] {
			t.Fatalf("event %q data %q: %v", ev[0], ev[1], err)
		}
		text += d.Delta.Text
		thinking += d.Delta.Thinking
		if ev[0] == "message_delta" && (d.Usage.InputTokens != 12 || d.Usage.OutputTokens != 3) {
			t.Fatalf("final usage %s", ev[1])
		}
	}
	want := "message_start content_block_start ping content_block_delta content_block_stop content_block_start " +
		"content_block_delta content_block_delta content_block_delta content_block_stop message_delta message_stop"
	if strings.Join(names, " ") != want || text != "Hello there!" || thinking != "let me think" {
		t.Fatalf("events %v text %q thinking %q", names, text, thinking)
	}
	if got := e.last(t); !strings.Contains(got.body, `"stream":true,"stream_options":{"include_usage":true}`) {
		t.Fatalf("engine body %s", got.body)
	}
}

// A max_output_tokens written as an integral float (100.0, 1e2) is one the
// converter accepts, as Python and vLLM do; the converted body carried it
// as written, and the router's own parse of that body refused it: 400
// "max_tokens must be a non-negative integer", naming a parameter the
// client never sent. In passthrough the routing view was the same.
func TestAResponsesMaxOutputTokensWrittenAsAFloatIsServed(t *testing.T) {
	for _, pass := range []bool{false, true} {
		e := &chatEngine{}
		up := startChatEngine(t, e)
		cfg := config.Default()
		cfg.Protocol.ResponsesPassthrough = pass
		r := startRouter(t, nil, cfg, up.url)
		for _, v := range []string{"100.0", "1e2"} {
			body := `{"model":"m","input":"hello","max_output_tokens":` + v + `}`
			resp, b := postH(t, r.url+"/v1/responses", body, nil)
			if resp.StatusCode != 200 {
				t.Errorf("passthrough %v, max_output_tokens %s: %d %s", pass, v, resp.StatusCode, b)
				continue
			}
			want := `{"model":"m","messages":[{"role":"user","content":"hello"}],"max_tokens":100}`
			if pass {
				want = body
			}
			if got := e.last(t); got.body != want {
				t.Errorf("passthrough %v: the engine got %s, want %s", pass, got.body, want)
			}
		}
	}
}

func TestResponsesConvertedToChatAndBack(t *testing.T) {
	e := &chatEngine{}
	up := startChatEngine(t, e)
	r := startRouter(t, nil, nil, up.url)
	resp, b := postH(t, r.url+"/v1/responses", `{"model":"m","instructions":"be brief","input":"hello","max_output_tokens":16}`, nil)
	var out struct {
		Object string `json:"object"`
		Status string `json:"status"`
		Output []struct {
			Type    string                  `json:"type"`
			Content []struct{ Text string } `json:"content"`
		} `json:"output"`
		Usage struct {
			InputTokens  int `json:"input_tokens"`
			OutputTokens int `json:"output_tokens"`
		} `json:"usage"`
	}
	if resp.StatusCode != 200 || json.Unmarshal([]byte(b), &out) != nil || out.Object != "response" || out.Status != "completed" ||
		len(out.Output) != 1 || out.Output[0].Content[0].Text != "Hello there!" || out.Usage.InputTokens != 20 || out.Usage.OutputTokens != 3 {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	if got := e.last(t); got.path != "/v1/chat/completions" ||
		got.body != `{"model":"m","messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hello"}],"max_tokens":16}` {
		t.Fatalf("engine got %s %s", got.path, got.body)
	}
	resp, b = postH(t, r.url+"/v1/responses", `{"model":"m","input":"hello","stream":true}`, nil)
	evs := sseEvents(t, b)
	if resp.StatusCode != 200 || evs[0][0] != "response.created" || evs[len(evs)-1][0] != "response.completed" ||
		!strings.Contains(evs[len(evs)-1][1], `"output_tokens":3`) {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	for i, ev := range evs {
		if !strings.Contains(ev[1], fmt.Sprintf(`"sequence_number":%d`, i)) {
			t.Fatalf("event %d %s", i, ev[1])
		}
	}
}

// Every error a client of /v1/messages gets is in Anthropic's shape, and
// on /v1/responses in OpenAI's, whoever made it.
func TestProtocolErrorsInTheClientsShape(t *testing.T) {
	e := &chatEngine{}
	up := startChatEngine(t, e)
	f := defaultFlags()
	f.APIKey = "sekret"
	r := startRouter(t, f, nil, up.url)
	auth := map[string]string{"x-api-key": "sekret"}

	resp, b := postH(t, r.url+"/v1/messages", anthropicBody, nil)
	if resp.StatusCode != 401 {
		t.Fatalf("no key: %d %s", resp.StatusCode, b)
	}
	checkAnthropicError(t, b, "authentication_error")
	// The body's request_id is the answer's Request-Id, on count_tokens too.
	for _, path := range []string{"/v1/messages", "/v1/messages/count_tokens"} {
		resp, b = postH(t, r.url+path, anthropicBody, map[string]string{"x-api-key": "wrong"})
		if id := resp.Header.Get("Request-Id"); id == "" || !strings.HasSuffix(b, `,"request_id":"`+id+`"}`) {
			t.Fatalf("%s: Request-Id %q, body %s", path, id, b)
		}
	}
	if resp, b = postH(t, r.url+"/v1/messages", anthropicBody, map[string]string{"x-api-key": "wrong"}); resp.StatusCode != 401 {
		t.Fatalf("wrong key: %d %s", resp.StatusCode, b)
	}
	checkAnthropicError(t, b, "authentication_error")
	if resp, b = postH(t, r.url+"/v1/messages", anthropicBody, map[string]string{"Authorization": "bearer sekret"}); resp.StatusCode != 200 {
		t.Fatalf("bearer key: %d %s", resp.StatusCode, b)
	}
	if resp, b = postH(t, r.url+"/v1/messages", anthropicBody, auth); resp.StatusCode != 200 {
		t.Fatalf("x-api-key: %d %s", resp.StatusCode, b)
	}
	if got := e.last(t); got.hdr.Get("x-api-key") != "" || got.hdr.Get("Authorization") != "" {
		t.Fatalf("the router's key reached the engine: %v", got.hdr)
	}
	n := e.count()
	resp, b = postH(t, r.url+"/v1/messages", `{"model":"m","max_tokens":8,"messages":[{"role":"robot","content":"x"}]}`, auth)
	if resp.StatusCode != 400 || e.count() != n {
		t.Fatalf("bad role: %d %s", resp.StatusCode, b)
	}
	checkAnthropicError(t, b, "invalid_request_error")
	resp, b = postH(t, r.url+"/v1/messages", `{"model":"nope","max_tokens":8,"messages":[{"role":"user","content":"x"}]}`, auth)
	if resp.StatusCode != 404 {
		t.Fatalf("unknown model: %d %s", resp.StatusCode, b)
	}
	checkAnthropicError(t, b, "not_found_error")
	if resp, b = postH(t, r.url+"/v1/messages", `{"model":"m",`, auth); resp.StatusCode != 400 {
		t.Fatalf("malformed: %d %s", resp.StatusCode, b)
	}
	checkAnthropicError(t, b, "invalid_request_error")
	req, _ := http.NewRequest("GET", r.url+"/v1/messages", nil)
	req.Header.Set("x-api-key", "sekret")
	gr, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	gb, _ := io.ReadAll(gr.Body)
	gr.Body.Close()
	if gr.StatusCode != 405 {
		t.Fatalf("GET: %d %s", gr.StatusCode, gb)
	}
	checkAnthropicError(t, string(gb), "invalid_request_error")

	// Responses: OpenAI's shape, naming the parameter.
	resp, b = postH(t, r.url+"/v1/responses", `{"model":"m","input":"x","previous_response_id":"resp_1"}`, map[string]string{"Authorization": "Bearer sekret"})
	if resp.StatusCode != 400 || !strings.Contains(b, `"param":"previous_response_id"`) {
		t.Fatalf("previous_response_id: %d %s", resp.StatusCode, b)
	}
	checkOpenAIError(t, b)

	// The engine's own errors keep their status, in the client's shape.
	e.status, e.errBody = 400, `{"object":"error","message":"This model's maximum context length is 4096 tokens","type":"BadRequestError","code":400}`
	resp, b = postH(t, r.url+"/v1/messages", anthropicBody, auth)
	if resp.StatusCode != 400 || !strings.Contains(b, "maximum context length") {
		t.Fatalf("engine 400: %d %s", resp.StatusCode, b)
	}
	checkAnthropicError(t, b, "invalid_request_error")
	// A 5xx retried on every worker: the last answer, converted.
	e.status, e.errBody = 503, `{"error":{"message":"engine overloaded","type":"server_error"}}`
	resp, b = postH(t, r.url+"/v1/messages", anthropicBody, auth)
	if resp.StatusCode != 503 || !strings.Contains(b, "engine overloaded") {
		t.Fatalf("engine 503: %d %s", resp.StatusCode, b)
	}
	checkAnthropicError(t, b, "overloaded_error")
	e.status = 0

	// The engine's answer is not a chat completion: 502.
	e.answer = func(ctx *fasthttp.RequestCtx) bool { ctx.SetBodyString(`{"what":1}`); return true }
	resp, b = postH(t, r.url+"/v1/messages", anthropicBody, auth)
	if resp.StatusCode != 502 {
		t.Fatalf("unreadable answer: %d %s", resp.StatusCode, b)
	}
	checkAnthropicError(t, b, "api_error")
	e.answer = nil

	// No worker at all: 503 in Anthropic's shape.
	r.fl.Sync(nil)
	resp, b = postH(t, r.url+"/v1/messages", anthropicBody, auth)
	if resp.StatusCode != 503 && resp.StatusCode != 404 {
		t.Fatalf("no worker: %d %s", resp.StatusCode, b)
	}
	checkAnthropicError(t, b, map[int]string{503: "overloaded_error", 404: "not_found_error"}[resp.StatusCode])
}

// A converted stream whose engine dies mid-way ends with Anthropic's error
// event; a passthrough one too.
func TestProtocolStreamFailureEndsWithTheProtocolsErrorEvent(t *testing.T) {
	up := startRaw(t, func(n int, req string, c net.Conn) {
		c.Write([]byte("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"))
		var part string
		if strings.Contains(req, "POST /v1/messages") {
			part = "event: message_start\ndata: {\"type\":\"message_start\"}\n\nevent: content_block_delta\ndata: {\"par"
		} else {
			part = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"},\"finish_reason\":null}]}\n\ndata: {\"par"
		}
		fmt.Fprintf(c, "%x\r\n%s\r\n", len(part), part)
		time.Sleep(30 * time.Millisecond)
		c.(*net.TCPConn).SetLinger(0)
		c.Close()
	})
	body := strings.Replace(anthropicBody, `"max_tokens"`, `"stream":true,"max_tokens"`, 1)
	for _, pass := range []bool{false, true} {
		cfg := protoConfig(func(p *config.Protocol) { p.AnthropicPassthrough = pass })
		f := defaultFlags()
		f.RequestMaxRetries = 0
		r := startRouter(t, f, cfg, up.url)
		resp, b := postH(t, r.url+"/v1/messages", body, nil)
		i := strings.LastIndex(b, "event: error\ndata: ")
		if resp.StatusCode != 200 || i < 0 || !strings.HasSuffix(b, "}\n\n") {
			t.Fatalf("passthrough %v: %d %q", pass, resp.StatusCode, b)
		}
		if i > 0 && b[i-2:i] != "\n\n" {
			t.Fatalf("passthrough %v: error event glued to a partial one: %q", pass, b)
		}
		checkAnthropicErrorEvent(t, strings.TrimSuffix(b[i+len("event: error\ndata: "):], "\n\n"), "api_error")
	}
}

func TestPassthroughForwardsTheClientsBytes(t *testing.T) {
	native := `{"id":"msg_1","type":"message","role":"assistant","model":"m","content":[{"type":"text","text":"hi"}],` +
		`"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":7,"cache_read_input_tokens":5,"output_tokens":2}}`
	e := &chatEngine{answer: func(ctx *fasthttp.RequestCtx) bool {
		switch string(ctx.Path()) {
		case "/v1/messages":
			ctx.SetContentType("application/json")
			ctx.SetBodyString(native)
		case "/v1/messages/count_tokens":
			ctx.SetBodyString(`{"input_tokens":99}`)
		case "/v1/responses":
			ctx.SetBodyString(`{"object":"response","usage":{"input_tokens":4,"output_tokens":1}}`)
		default:
			return false
		}
		return true
	}}
	up := startChatEngine(t, e)
	cfg := protoConfig(func(p *config.Protocol) { p.AnthropicPassthrough, p.ResponsesPassthrough = true, true })
	cfg.ModelRouting = config.ModelRouting{Enabled: true, Mappings: []config.ModelMapping{{Pattern: "claude-*", Services: []string{"m"}}}}
	r := startRouter(t, nil, cfg, up.url)
	prompt0 := mPromptTokens.Get()

	body := `{"model":"m", "max_tokens":16,"system":"be brief","messages":[{"role":"user","content":"h\u00e9llo"}],"x-extension":{"keep":[1,2]}}`
	resp, b := postH(t, r.url+"/v1/messages", body, nil)
	if resp.StatusCode != 200 || b != native {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	if got := e.last(t); got.path != "/v1/messages" || got.body != body {
		t.Fatalf("engine got %s %q", got.path, got.body)
	}
	if d := mPromptTokens.Get() - prompt0; d != 12 {
		t.Fatalf("passthrough usage: %d prompt tokens recorded, want 7+5", d)
	}
	// Model routing rewrites the model in the client's own body.
	resp, _ = postH(t, r.url+"/v1/messages", strings.Replace(body, `"m"`, `"claude-3-opus"`, 1), nil)
	if got := e.last(t); resp.StatusCode != 200 || got.body != body {
		t.Fatalf("rewritten: %d %q", resp.StatusCode, got.body)
	}
	// What the converter refuses is still the engine's to judge.
	odd := `{"model":"m","max_tokens":8,"messages":[{"role":"user","content":[{"type":"document","source":{"type":"file","file_id":"f1"}}]}]}`
	if resp, b = postH(t, r.url+"/v1/messages", odd, nil); resp.StatusCode != 200 || e.last(t).body != odd {
		t.Fatalf("converter-refused body: %d %s", resp.StatusCode, b)
	}
	if resp, b = postH(t, r.url+"/v1/messages/count_tokens", `{"model":"m","messages":[{"role":"user","content":"x"}]}`, nil); resp.StatusCode != 200 || b != `{"input_tokens":99}` || e.last(t).path != "/v1/messages/count_tokens" {
		t.Fatalf("count_tokens: %d %s", resp.StatusCode, b)
	}
	rb := `{"model":"m","input":"hi","previous_response_id":"resp_1"}`
	if resp, b = postH(t, r.url+"/v1/responses", rb, nil); resp.StatusCode != 200 || e.last(t).body != rb || e.last(t).path != "/v1/responses" {
		t.Fatalf("responses: %d %s", resp.StatusCode, b)
	}
	// Still refused: a body that is not JSON, or names no model.
	n := e.count()
	resp, b = postH(t, r.url+"/v1/messages", `{"max_tokens":8,"messages":[]}`, nil)
	if resp.StatusCode != 400 || e.count() != n {
		t.Fatalf("no model: %d %s", resp.StatusCode, b)
	}
	checkAnthropicError(t, b, "invalid_request_error")
	// And a key the router reads, in another case (an engine matching keys
	// regardless of case would read another model, or more tokens).
	for _, path := range []string{"/v1/messages", "/v1/responses"} {
		resp, b = postH(t, r.url+path, `{"model":"m","Model":"x","max_tokens":8,"messages":[{"role":"user","content":"hi"}],"input":"hi"}`, nil)
		if resp.StatusCode != 400 || e.count() != n || !strings.Contains(b, "another case") {
			t.Fatalf("%s, a case variant of model: %d %s", path, resp.StatusCode, b)
		}
		// Nor a routing key twice: the engine would pick its own copy.
		resp, b = postH(t, r.url+path, `{"model":"x","max_tokens":8,"messages":[{"role":"user","content":"hi"}],"input":"hi","model":"m"}`, nil)
		if resp.StatusCode != 400 || e.count() != n || !strings.Contains(b, "duplicate key model") {
			t.Fatalf("%s, model twice: %d %s", path, resp.StatusCode, b)
		}
	}
}

func TestCountTokensWithTheRoutersTokenizer(t *testing.T) {
	e := &chatEngine{}
	up := startChatEngine(t, e)
	for _, policy := range []string{"round-robin", "kv-aware"} {
		f := defaultFlags()
		f.RouterPolicy = policy
		r := startRouter(t, f, nil, up.url)
		count := func(body string) int {
			t.Helper()
			resp, b := postH(t, r.url+"/v1/messages/count_tokens", body, nil)
			var c struct {
				InputTokens int `json:"input_tokens"`
			}
			if resp.StatusCode != 200 || json.Unmarshal([]byte(b), &c) != nil {
				t.Fatalf("%d %s", resp.StatusCode, b)
			}
			return c.InputTokens
		}
		got := count(`{"model":"m","system":"be brief","messages":[{"role":"user","content":"hello there"}]}`)
		var tk tokenizer.Simple
		text, _ := tk.RenderChat(nil, []tokenizer.Message{{Role: "system", Content: "be brief"}, {Role: "user", Content: "hello there"}}, nil, true)
		if want := len(tk.Encode(nil, text)); got != want {
			t.Fatalf("%s: %d tokens, want %d", policy, got, want)
		}
		if long := count(`{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("hello ", 100) + `"}]}`); long <= got {
			t.Fatalf("%s: long prompt counted %d", policy, long)
		}
		// Past 1024 messages the count is extrapolated from the part
		// encoded, in the same measure: escapes and image data do not
		// inflate it (it was 1.7 times the exact count here).
		var conv strings.Builder
		var tm []tokenizer.Message
		conv.WriteString(`{"model":"m","messages":[`)
		for i := 0; i < 3000; i++ {
			role := [2]string{"user", "assistant"}[i%2]
			if i > 0 {
				conv.WriteByte(',')
			}
			conv.WriteString(`{"role":"` + role + `","content":"\u4e2d\u6587 hello"}`)
			tm = append(tm, tokenizer.Message{Role: role, Content: "中文 hello"})
		}
		conv.WriteString(`,{"role":"user","content":[{"type":"image","source":{"type":"base64","media_type":"image/png","data":"` +
			strings.Repeat("QUFB", 20000) + `"}},{"type":"text","text":"what is it?"}]}]}`)
		tm = append(tm, tokenizer.Message{Role: "user", Content: "what is it?"})
		text, _ = tk.RenderChat(nil, tm, nil, true)
		exact, est := len(tk.Encode(nil, text)), count(conv.String())
		if r := float64(est) / float64(exact); r < 0.95 || r > 1.05 {
			t.Fatalf("%s: 3001 messages counted %d, exact %d (x%.2f)", policy, est, exact, r)
		}
	}
	if e.count() != 0 {
		t.Fatal("count_tokens reached the engine in conversion mode")
	}
}

// An empty model name is refused by count_tokens as by Messages (400
// "model must not be empty"); it was counted (200), even with a default
// model, which Messages does not apply to "" either.
func TestCountTokensForAnEmptyModelIsRefusedAsMessagesRefusesIt(t *testing.T) {
	up := startChatEngine(t, &chatEngine{})
	for _, routing := range []bool{false, true} {
		cfg := config.Default()
		cfg.ModelRouting.Enabled = routing
		if routing {
			cfg.ModelRouting.DefaultModel = "m"
		}
		r := startRouter(t, nil, cfg, up.url)
		want, wantBody := postH(t, r.url+"/v1/messages", `{"model":"","max_tokens":3,"messages":[{"role":"user","content":"x"}]}`, nil)
		resp, b := postH(t, r.url+"/v1/messages/count_tokens", `{"model":"","messages":[{"role":"user","content":"x"}]}`, nil)
		if want.StatusCode != 400 || resp.StatusCode != want.StatusCode || !strings.Contains(b, `"type":"invalid_request_error","message":"model must not be empty"`) ||
			!strings.Contains(b, `"request_id":"`+resp.Header.Get("Request-Id")+`"`) {
			t.Fatalf("routing %v: count_tokens %d %s; messages %d %s", routing, resp.StatusCode, b, want.StatusCode, wantBody)
		}
	}
}

// Past --router-tokenize-max-bytes count_tokens extrapolates from the part
// it encodes (Simple: 4 bytes a token, so the estimate is close), and tools
// larger than the bound are refused in Anthropic's shape.
func TestCountTokensPastTheTokenizeBoundIsExtrapolated(t *testing.T) {
	up := startChatEngine(t, &chatEngine{})
	f := defaultFlags()
	f.RouterTokenizeMaxBytes = 4096
	r := startRouter(t, f, nil, up.url)
	var msgs strings.Builder
	for i := 0; i < 400; i++ { // 400 messages of 100 bytes: 10x the bound
		if i > 0 {
			msgs.WriteByte(',')
		}
		msgs.WriteString(`{"role":"` + [2]string{"user", "assistant"}[i%2] + `","content":"` + strings.Repeat("abcd", 25) + `"}`)
	}
	resp, b := postH(t, r.url+"/v1/messages/count_tokens", `{"model":"m","messages":[`+msgs.String()+`]}`, nil)
	var c struct {
		InputTokens int `json:"input_tokens"`
	}
	if resp.StatusCode != 200 || json.Unmarshal([]byte(b), &c) != nil {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	// Exact is about 13056: 400 x (100 bytes + ~30 of ChatML markup) / 4.
	if c.InputTokens < 12000 || c.InputTokens > 14000 {
		t.Fatalf("counted %d tokens for about 13056", c.InputTokens)
	}
	// More messages than are decoded (maxRouteMessages), within the bytes.
	f2 := defaultFlags()
	f2.RouterTokenizeMaxBytes = 1 << 20
	r2 := startRouter(t, f2, nil, up.url)
	msgs.Reset()
	for i := 0; i < 3000; i++ {
		if i > 0 {
			msgs.WriteByte(',')
		}
		msgs.WriteString(`{"role":"` + [2]string{"user", "assistant"}[i%2] + `","content":"` + strings.Repeat("abcd", 25) + `"}`)
	}
	resp, b = postH(t, r2.url+"/v1/messages/count_tokens", `{"model":"m","messages":[`+msgs.String()+`]}`, nil)
	c.InputTokens = 0
	if resp.StatusCode != 200 || json.Unmarshal([]byte(b), &c) != nil {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	// Exact is about 3000 x 130 / 4 = 97,500.
	if c.InputTokens < 90000 || c.InputTokens > 105000 {
		t.Fatalf("counted %d tokens of 3000 messages for about 97,500", c.InputTokens)
	}
	tools := `[{"name":"f","description":"` + strings.Repeat("d", 5000) + `","input_schema":{"type":"object"}}]`
	resp, b = postH(t, r.url+"/v1/messages/count_tokens", `{"model":"m","tools":`+tools+`,"messages":[{"role":"user","content":"hi"}]}`, nil)
	if resp.StatusCode != 400 || !strings.Contains(b, "router-tokenize-max-bytes") {
		t.Fatalf("tools over the bound: %d %s", resp.StatusCode, b)
	}
	checkAnthropicError(t, b, "invalid_request_error")
}

// The router always asks the engine for streaming usage; a client that did
// not ask does not get the usage chunk unless force_stream_usage is on.
func TestStreamUsageAskedAlwaysRelayedWhenAskedOrForced(t *testing.T) {
	e := &chatEngine{}
	up := startChatEngine(t, e)
	for _, force := range []bool{false, true} {
		r := startRouter(t, nil, protoConfig(func(p *config.Protocol) { p.ForceStreamUsage = force }), up.url)
		for _, asked := range []bool{false, true} {
			body := streamBody
			if asked {
				body = strings.Replace(body, `"stream":true`, `"stream":true,"stream_options":{"include_usage":true}`, 1)
			}
			before := mOutputTokens.Get()
			resp, b := postH(t, r.url+"/v1/chat/completions", body, nil)
			if resp.StatusCode != 200 || !strings.HasSuffix(b, "data: [DONE]\n\n") || strings.Count(b, `"content":`) != 4 {
				t.Fatalf("%d %q", resp.StatusCode, b)
			}
			if got := e.last(t).body; !strings.Contains(got, `"include_usage":true`) {
				t.Fatalf("the engine was not asked for usage: %s", got)
			}
			if relayed, want := strings.Contains(b, `"usage"`), asked || force; relayed != want {
				t.Fatalf("force %v asked %v: usage relayed %v: %q", force, asked, relayed, b)
			}
			if d := mOutputTokens.Get() - before; d != 3 {
				t.Fatalf("force %v asked %v: %d completion tokens recorded", force, asked, d)
			}
		}
	}
	// The client's body reaches the engine as it was, plus stream_options.
	r := startRouter(t, nil, nil, up.url)
	postH(t, r.url+"/v1/chat/completions", `{"model":"m","stream":true,"stream_options":{"continuous":1},"messages":[{"role":"user","content":"hi"}]}`, nil)
	if got := e.last(t).body; got != `{"model":"m","stream":true,"stream_options":{"include_usage":true,"continuous":1},"messages":[{"role":"user","content":"hi"}]}` {
		t.Fatalf("engine got %s", got)
	}
}

func TestReasoningModeOnChatBodies(t *testing.T) {
	e := &chatEngine{}
	up := startChatEngine(t, e)
	body := `{"model":"m","reasoning_effort":"minimal","messages":[{"role":"user","content":"hi"}]}`
	f := func(p config.Protocol, want string) {
		t.Helper()
		r := startRouter(t, nil, protoConfig(func(c *config.Protocol) { *c = p }), up.url)
		if resp, b := postH(t, r.url+"/v1/chat/completions", body, nil); resp.StatusCode != 200 {
			t.Fatalf("%d %s", resp.StatusCode, b)
		}
		if got := e.last(t).body; got != want {
			t.Fatalf("mode %q: engine got %s, want %s", p.ReasoningEffortMode, got, want)
		}
	}
	f(config.Protocol{ReasoningEffortMode: "passthrough"}, body)
	f(config.Protocol{ReasoningEffortMode: "map"}, `{"model":"m","messages":[{"role":"user","content":"hi"}],"chat_template_kwargs":{"enable_thinking":false}}`)
	f(config.Protocol{ReasoningEffortMode: "map", ReasoningMap: config.ReasoningMap{Target: "both", ThinkingOffEfforts: []string{"none"}}},
		`{"model":"m","messages":[{"role":"user","content":"hi"}],"reasoning_effort":"minimal","chat_template_kwargs":{"enable_thinking":true}}`)
	f(config.Protocol{ReasoningEffortMode: "drop"}, `{"model":"m","messages":[{"role":"user","content":"hi"}]}`)
	// Anthropic thinking in map mode reaches the engine as enable_thinking.
	r := startRouter(t, nil, protoConfig(func(c *config.Protocol) { c.ReasoningEffortMode = "map" }), up.url)
	postH(t, r.url+"/v1/messages", `{"model":"m","max_tokens":2048,"thinking":{"type":"enabled","budget_tokens":1024},"messages":[{"role":"user","content":"hi"}]}`, nil)
	if got := e.last(t).body; !strings.Contains(got, `"chat_template_kwargs":{"enable_thinking":true}`) {
		t.Fatalf("thinking: engine got %s", got)
	}
	// A reasoning_effort that is not a string is the client's error.
	resp, b := postH(t, r.url+"/v1/chat/completions", `{"model":"m","reasoning_effort":5,"messages":[{"role":"user","content":"hi"}]}`, nil)
	if resp.StatusCode != 400 || !strings.Contains(b, `"param":"reasoning_effort"`) {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
}

// A converted answer that arrives in many pieces is read whole first.
func TestConvertedAnswerReadWholeAcrossReads(t *testing.T) {
	answer := `{"id":"c","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"` +
		strings.Repeat("word ", 20000) + `"},"finish_reason":"length"}],"usage":` + engineUsage + `}`
	up := startRaw(t, func(n int, req string, c net.Conn) {
		fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", len(answer))
		for i := 0; i < len(answer); i += 7000 {
			c.Write([]byte(answer[i:min(i+7000, len(answer))]))
			time.Sleep(2 * time.Millisecond)
		}
	})
	r := startRouter(t, nil, nil, up.url)
	resp, b := postH(t, r.url+"/v1/messages", anthropicBody, nil)
	var m struct {
		Content []struct{ Text string } `json:"content"`
	}
	if resp.StatusCode != 200 || json.Unmarshal([]byte(b), &m) != nil || len(m.Content[0].Text) != 100000 {
		t.Fatalf("%d %d bytes", resp.StatusCode, len(b))
	}
}

// fakeUp is an upstream body delivered in scripted reads, then EOF or an
// error.
type fakeUp struct {
	chunks [][]byte
	i      int
	err    error
}

func (u *fakeUp) status() int                            { return 200 }
func (u *fakeUp) copyHeaders(*fasthttp.ResponseHeader)   {}
func (u *fakeUp) header([]byte) []byte                   { return nil }
func (u *fakeUp) contentType() []byte                    { return nil }
func (u *fakeUp) contentLength() int64                   { return -1 }
func (u *fakeUp) closeDelimited() bool                   { return false }
func (u *fakeUp) setReadDeadline(time.Time)              {}
func (u *fakeUp) finish(bool)                            {}
func (u *fakeUp) readFailure(err error, _ bool) *failure { return fail(failBroken, err) }
func (u *fakeUp) read(p []byte) (int, error) {
	if u.i < len(u.chunks) {
		n := copy(p, u.chunks[u.i])
		u.i++
		return n, nil
	}
	if u.err != nil {
		return 0, u.err
	}
	return 0, io.EOF
}

// The relay's Read path (fasthttp's fallback when it does not use WriteTo)
// transforms exactly as WriteTo does: same bytes for a converted stream and
// a usage-filtered one, ended cleanly or by an upstream failure.
func TestRelayReadTransformsLikeWriteTo(t *testing.T) {
	chat := []string{
		`data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}` + "\n\n",
		`data: {"choices":[{"index":0,"delta":{"content":"Hel`, `lo"}}]}` + "\n\ndata: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"!\"}}]}\n\n",
		`data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}` + "\n\n" + `data: {"choices":[],"usage":` + engineUsage + "}\n\n",
		"data: [DONE]\n\n",
	}
	opt := protocolDefaultOptions()
	run := func(stage stageKind, failAt int, useRead bool) string {
		rs := &reqState{rbuf: make([]byte, relayBufSize)}
		rs.lease.Worker = &fleet.Worker{Load: new(fleet.Load), ID: "w"}
		p := &rs.proto
		if _, err := protocolAnthropicToChat(&opt, &p.meta); err != nil {
			t.Fatal(err)
		}
		p.meta.ID = append(p.meta.ID[:0], "msg_fixed"...)
		p.stage, p.relaying = stage, true
		if stage == stageConvert {
			p.api = protocolAnthropic
			p.conv = protocolAcquire(&p.meta)
		}
		up := &fakeUp{}
		for i, c := range chat {
			if failAt >= 0 && i == failAt {
				up.err = io.ErrUnexpectedEOF
				break
			}
			up.chunks = append(up.chunks, []byte(c))
		}
		r := &relay{rs: rs, up: up, buf: rs.rbuf, sse: true, st: p}
		var out strings.Builder
		if useRead {
			buf := make([]byte, 7)
			for {
				n, err := r.Read(buf)
				out.Write(buf[:n])
				if err == io.EOF {
					break
				}
				if err != nil {
					t.Fatal(err)
				}
			}
		} else {
			r.WriteTo(&out)
		}
		p.reset()
		return out.String()
	}
	for _, stage := range []stageKind{stageConvert, stageFilter} {
		for _, failAt := range []int{-1, 2} {
			w, r := run(stage, failAt, false), run(stage, failAt, true)
			if w != r || w == "" {
				t.Fatalf("stage %d fail at %d:\nWriteTo %q\nRead    %q", stage, failAt, w, r)
			}
			switch {
			case stage == stageFilter && failAt < 0 && (strings.Contains(w, `"usage"`) || !strings.HasSuffix(w, "data: [DONE]\n\n")):
				t.Fatalf("filtered: %q", w)
			case stage == stageConvert && failAt < 0 && !strings.HasSuffix(w, "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"):
				t.Fatalf("converted: %q", w)
			case failAt >= 0 && !strings.Contains(w, "error"):
				t.Fatalf("failed stream without an error event: %q", w)
			}
		}
	}
}

// Small indirections so the relay test reads plainly.
var (
	protocolAnthropic = protocol.Anthropic
	protocolAcquire   = protocol.AcquireStreamConverter
)

func protocolDefaultOptions() protocol.Options { return protocol.DefaultOptions() }

func protocolAnthropicToChat(opt *protocol.Options, m *protocol.Meta) ([]byte, error) {
	return protocol.AnthropicToChat(nil, []byte(`{"model":"m","max_tokens":8,"stream":true,"messages":[{"role":"user","content":"hi"}]}`), opt, m)
}

// TestMessagesAnswersCarryAnthropicsRequestIdHeader: Anthropic's SDKs read
// an answer's id from request-id (its _request_id); /v1/messages answers,
// errors too, carry the router's request id there as in X-Request-Id, and
// only there on the other endpoints.
func TestMessagesAnswersCarryAnthropicsRequestIdHeader(t *testing.T) {
	e := &chatEngine{}
	up := startChatEngine(t, e)
	r := startRouter(t, nil, nil, up.url)
	for _, body := range []string{anthropicBody, `{"model":"nope","max_tokens":1,"messages":[{"role":"user","content":"hi"}]}`} {
		resp, b := postH(t, r.url+"/v1/messages", body, nil)
		id := resp.Header.Get("X-Request-Id")
		if id == "" || resp.Header.Get("Request-Id") != id || len(resp.Header.Values("Request-Id")) != 1 {
			t.Fatalf("%d %s: X-Request-Id %q, request-id %q", resp.StatusCode, b, id, resp.Header.Values("Request-Id"))
		}
	}
	resp, _ := postH(t, r.url+"/v1/chat/completions", chatBody, nil)
	if resp.Header.Get("Request-Id") != "" {
		t.Fatalf("chat answer with request-id %q", resp.Header.Get("Request-Id"))
	}
}

// TestAConvertedRequestReachesTheEngineAsJSON: the body of a converted
// request is the router's JSON, so the engine gets application/json
// whatever Content-Type the client sent (curl's default form type reached
// the engine with a JSON body; a FastAPI engine may refuse that).
func TestAConvertedRequestReachesTheEngineAsJSON(t *testing.T) {
	e := &chatEngine{}
	up := startChatEngine(t, e)
	r := startRouter(t, nil, nil, up.url)
	for _, ct := range []string{"application/x-www-form-urlencoded", "text/plain", ""} {
		resp, b := postH(t, r.url+"/v1/messages", anthropicBody, map[string]string{"Content-Type": ct})
		if resp.StatusCode != 200 {
			t.Fatalf("%q: %d %s", ct, resp.StatusCode, b)
		}
		if got := e.last(t).hdr.Values("Content-Type"); len(got) != 1 || got[0] != "application/json" {
			t.Fatalf("client type %q: the engine got Content-Type %q", ct, got)
		}
	}
}

// count_tokens decodes the converted messages into a buffer as large as
// the converted body: it is reserved in the in-flight body budget with
// the bodies (concurrent large counts held hundreds of MB outside it),
// and given back when the request ends.
func TestCountTokensReservesItsDecodeBufferInTheBodyBudget(t *testing.T) {
	up := startChatEngine(t, &chatEngine{})
	body := `{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("abcd ", 4000) + `"}]}` // 20 KB
	f := defaultFlags()
	f.MaxInflightBodyBytes = 50000 // the body (20 KB), not its conversion and decoded messages too
	r := startRouter(t, f, nil, up.url)
	resp, b := postH(t, r.url+"/v1/messages/count_tokens", body, nil)
	if resp.StatusCode != 503 {
		t.Fatalf("%d %s, want 503", resp.StatusCode, b)
	}
	checkAnthropicError(t, b, "overloaded_error")
	f2 := defaultFlags()
	f2.MaxInflightBodyBytes = 70000
	r2 := startRouter(t, f2, nil, up.url)
	for i := 0; i < 3; i++ { // given back: the next count fits again
		if resp, b := postH(t, r2.url+"/v1/messages/count_tokens", body, nil); resp.StatusCode != 200 {
			t.Fatalf("count %d: %d %s", i, resp.StatusCode, b)
		}
	}
}

// Reasoning that arrives while a tool call's arguments are still streaming
// (held text is, for this reason) must not stop the tool block: the rest
// of the arguments then went to a block already stopped
// (content_block_delta after content_block_stop; Responses:
// function_call_arguments.delta after the item's output_item.done, whose
// arguments were cut).
func TestReasoningInsideAToolCallDoesNotStopItsBlock(t *testing.T) {
	chunk := func(s string) string { return fmt.Sprintf("%x\r\n%s\r\n", len(s), s) }
	up := startRaw(t, func(n int, req string, c net.Conn) {
		c.Write([]byte("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n" +
			chunk(`data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"c1","function":{"name":"f","arguments":"{\"a\""}}]},"finish_reason":null}]}`+"\n\n") +
			chunk(`data: {"choices":[{"index":0,"delta":{"reasoning_content":"hmm"},"finish_reason":null}]}`+"\n\n") +
			chunk(`data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":":1}"}}]},"finish_reason":null}]}`+"\n\n") +
			chunk(`data: {"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}`+"\n\n") +
			chunk("data: [DONE]\n\n") + "0\r\n\r\n"))
	})
	f := defaultFlags()
	f.RequestMaxRetries = 0
	r := startRouter(t, f, nil, up.url)

	_, b := postH(t, r.url+"/v1/messages", strings.Replace(anthropicBody, `"max_tokens"`, `"stream":true,"max_tokens"`, 1), nil)
	stopped := map[float64]bool{}
	for _, ev := range sseEvents(t, b) {
		var d struct {
			Index float64 `json:"index"`
		}
		json.Unmarshal([]byte(ev[1]), &d)
		switch ev[0] {
		case "content_block_stop":
			stopped[d.Index] = true
		case "content_block_delta":
			if stopped[d.Index] {
				t.Fatalf("Messages: a delta for block %v after its content_block_stop:\n%s", d.Index, b)
			}
		}
	}

	_, b = postH(t, r.url+"/v1/responses", `{"model":"m","input":"hi","stream":true}`, nil)
	done := map[float64]bool{}
	for _, ev := range sseEvents(t, b) {
		var d struct {
			OutputIndex float64 `json:"output_index"`
		}
		json.Unmarshal([]byte(ev[1]), &d)
		switch ev[0] {
		case "response.output_item.done":
			done[d.OutputIndex] = true
		case "response.function_call_arguments.delta":
			if done[d.OutputIndex] {
				t.Fatalf("Responses: an arguments delta for item %v after its output_item.done:\n%s", d.OutputIndex, b)
			}
		}
	}
}

// A tool call's arguments fragment that arrives after text stopped the
// call's block (its arguments were whole, then text, then one more
// fragment of the same call: vLLM's end-of-stream flush of unstreamed
// argument tokens) is dropped: a stopped block, a done item, is final for
// the client, which may have run the call (Messages sent an
// input_json_delta after content_block_stop; Responses an arguments delta
// after output_item.done, and response.completed disagreed with it).
func TestAToolCallsFragmentAfterItsBlockStoppedIsDropped(t *testing.T) {
	chunk := func(s string) string { return fmt.Sprintf("%x\r\n%s\r\n", len(s), s) }
	up := startRaw(t, func(n int, req string, c net.Conn) {
		c.Write([]byte("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n" +
			chunk(`data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"c1","type":"function","function":{"name":"f","arguments":"{\"a\":1}"}}]},"finish_reason":null}]}`+"\n\n") +
			chunk(`data: {"choices":[{"index":0,"delta":{"content":"\n"},"finish_reason":null}]}`+"\n\n") +
			chunk(`data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":" "}}]},"finish_reason":"tool_calls"}]}`+"\n\n") +
			chunk("data: [DONE]\n\n") + "0\r\n\r\n"))
	})
	f := defaultFlags()
	f.RequestMaxRetries = 0
	r := startRouter(t, f, nil, up.url)

	var errs []string
	_, b := postH(t, r.url+"/v1/messages", strings.Replace(anthropicBody, `"max_tokens"`, `"stream":true,"max_tokens"`, 1), nil)
	stopped := map[float64]bool{}
	for _, ev := range sseEvents(t, b) {
		var d struct {
			Index float64 `json:"index"`
		}
		json.Unmarshal([]byte(ev[1]), &d)
		switch ev[0] {
		case "content_block_stop":
			stopped[d.Index] = true
		case "content_block_delta":
			if stopped[d.Index] {
				errs = append(errs, fmt.Sprintf("Messages: a delta for block %v after its content_block_stop:\n%s", d.Index, b))
			}
		}
	}

	_, b = postH(t, r.url+"/v1/responses", `{"model":"m","input":"hi","stream":true}`, nil)
	done := map[float64]bool{}
	for _, ev := range sseEvents(t, b) {
		var d struct {
			OutputIndex float64 `json:"output_index"`
		}
		json.Unmarshal([]byte(ev[1]), &d)
		switch ev[0] {
		case "response.output_item.done":
			done[d.OutputIndex] = true
		case "response.function_call_arguments.delta":
			if done[d.OutputIndex] {
				errs = append(errs, fmt.Sprintf("Responses: an arguments delta for item %v after its output_item.done:\n%s", d.OutputIndex, b))
			}
		}
	}
	if len(errs) > 0 {
		t.Fatal(strings.Join(errs, "\n\n"))
	}
}

// The same engine answer (content, then a refusal) reads the same on
// /v1/messages streamed or not: content, a newline, the refusal (streamed,
// the refusal was glued to the content).
func TestARefusalAfterTextReadsTheSameStreamedOrNot(t *testing.T) {
	e := &chatEngine{}
	e.answer = func(ctx *fasthttp.RequestCtx) bool {
		if !strings.Contains(string(ctx.PostBody()), `"stream":true`) {
			ctx.SetContentType("application/json")
			ctx.SetBodyString(`{"id":"c1","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"Sure.","refusal":"I cannot help with that."},"finish_reason":"stop"}]}`)
			return true
		}
		ctx.SetContentType("text/event-stream")
		ctx.SetBodyString(`data: {"choices":[{"index":0,"delta":{"role":"assistant","content":"Sure."},"finish_reason":null}]}` + "\n\n" +
			`data: {"choices":[{"index":0,"delta":{"refusal":"I cannot help with that."},"finish_reason":null}]}` + "\n\n" +
			`data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}` + "\n\n" + "data: [DONE]\n\n")
		return true
	}
	up := startChatEngine(t, e)
	r := startRouter(t, nil, nil, up.url)

	_, b := postH(t, r.url+"/v1/messages", anthropicBody, nil)
	var msg struct {
		Content []struct{ Type, Text string } `json:"content"`
	}
	if err := json.Unmarshal([]byte(b), &msg); err != nil || len(msg.Content) != 1 {
		t.Fatalf("non-streamed: %v %s", err, b)
	}
	_, sb := postH(t, r.url+"/v1/messages", strings.Replace(anthropicBody, `"max_tokens"`, `"stream":true,"max_tokens"`, 1), nil)
	streamed := ""
	for _, ev := range sseEvents(t, sb) {
		var d struct {
			Delta struct{ Type, Text string } `json:"delta"`
		}
		json.Unmarshal([]byte(ev[1]), &d)
		if ev[0] == "content_block_delta" {
			streamed += d.Delta.Text
		}
	}
	if streamed != msg.Content[0].Text {
		t.Fatalf("the same answer reads differently:\n non-streamed text %q\n     streamed text %q", msg.Content[0].Text, streamed)
	}
}

// In map mode a Messages request's thinking becomes
// chat_template_kwargs.enable_thinking, which changes the prompt Qwen3's
// template renders (disabled: the empty think block after the generation
// prompt). count_tokens counted the prompt without it: 9 tokens for "hi"
// where the same body sent to /v1/messages is rendered, hashed and
// answered (input_tokens) with 13. A bad thinking field is still ignored
// by the count.
func TestCountTokensRendersTheThinkingTheRequestWould(t *testing.T) {
	dir := qwen3Dir(t)
	e := &chatEngine{}
	up := startChatEngine(t, e)
	f := defaultFlags()
	f.RouterPolicy, f.RouterTokenizerPath = "kv-aware", dir
	r := startRouter(t, f, protoConfig(func(c *config.Protocol) { c.ReasoningEffortMode = "map" }), up.url)
	tok, err := tokenizer.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	const user = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
	for thinking, want := range map[string]string{
		``:                                user,
		`"thinking":{"type":"disabled"},`: user + "<think>\n\n</think>\n\n",
		`"thinking":{"type":"enabled","budget_tokens":2048},`: user,
		`"thinking":{"type":"bogus"},`:                        user,
	} {
		resp, b := postH(t, r.url+"/v1/messages/count_tokens", `{"model":"m",`+thinking+`"messages":[{"role":"user","content":"hi"}]}`, nil)
		var c struct {
			InputTokens int `json:"input_tokens"`
		}
		if resp.StatusCode != 200 || json.Unmarshal([]byte(b), &c) != nil {
			t.Fatalf("%s: %d %s", thinking, resp.StatusCode, b)
		}
		if n := len(tok.Encode(nil, []byte(want))); c.InputTokens != n {
			t.Errorf("%s: counted %d tokens, want %d (%q)", thinking, c.InputTokens, n, want)
		}
	}
}

// POST /debug/route shows what kv-aware would decide for a body, so a chat
// is rewritten by the reasoning mode first, as a request is: in map mode
// reasoning_effort "none" becomes chat_template_kwargs.enable_thinking
// false, whose prompt Qwen3 renders 4 tokens longer. The debug route
// tokenized and hashed the body as sent (9 tokens) where the request is
// routed on 13.
func TestDebugRouteRewritesTheReasoningAsARequestIs(t *testing.T) {
	dir := qwen3Dir(t)
	up := startChatEngine(t, &chatEngine{})
	f := defaultFlags()
	f.RouterPolicy, f.RouterTokenizerPath = "kv-aware", dir
	r := startRouter(t, f, protoConfig(func(c *config.Protocol) { c.ReasoningEffortMode = "map" }), up.url)
	route := func(extra string) []string {
		t.Helper()
		resp, b := postH(t, r.url+"/debug/route", `{"model":"m",`+extra+`"messages":[{"role":"user","content":"hi"}]}`, nil)
		var d struct {
			Tokens int      `json:"tokens"`
			Hashes []string `json:"block_hashes"`
		}
		if resp.StatusCode != 200 || json.Unmarshal([]byte(b), &d) != nil {
			t.Fatalf("%s: %d %s", extra, resp.StatusCode, b)
		}
		return append(d.Hashes, fmt.Sprint(d.Tokens, " tokens"))
	}
	if got, want := route(`"reasoning_effort":"none",`), route(`"chat_template_kwargs":{"enable_thinking":false},`); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("reasoning_effort none: debug route hashed %v, the request is routed on %v", got, want)
	}
	if got, want := route(`"reasoning_effort":"high",`), route(``); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("reasoning_effort high: debug route hashed %v, the request is routed on %v", got, want)
	}
}

// In passthrough the router makes a chat view of the client's body for
// routing and holds it until the request ends, beside the body: it is
// reserved in the in-flight body budget as a converted body is (it was
// outside it, so passthrough Messages and Responses requests held twice
// the bytes the budget allowed).
func TestAPassthroughChatViewIsReservedInTheBodyBudget(t *testing.T) {
	e := &chatEngine{answer: func(ctx *fasthttp.RequestCtx) bool {
		ctx.SetContentType("application/json")
		ctx.SetBodyString(`{"object":"response","usage":{"input_tokens":4,"output_tokens":1}}`)
		return true
	}}
	up := startChatEngine(t, e)
	body := `{"model":"m","input":"` + strings.Repeat("abcd ", 4000) + `"}` // 20 KB
	cfg := protoConfig(func(p *config.Protocol) { p.ResponsesPassthrough = true })
	f := defaultFlags()
	f.MaxInflightBodyBytes = 30000 // the body, not its chat view too
	r := startRouter(t, f, cfg, up.url)
	resp, b := postH(t, r.url+"/v1/responses", body, nil)
	if resp.StatusCode != 503 {
		t.Fatalf("%d %s, want 503", resp.StatusCode, b)
	}
	checkOpenAIError(t, b)
	if n := e.count(); n != 0 {
		t.Fatalf("the engine got %d requests", n)
	}
	f2 := defaultFlags()
	f2.MaxInflightBodyBytes = 50000
	r2 := startRouter(t, f2, cfg, up.url)
	for i := 0; i < 3; i++ { // given back: the next request fits again
		if resp, b := postH(t, r2.url+"/v1/responses", body, nil); resp.StatusCode != 200 {
			t.Fatalf("request %d: %d %s", i, resp.StatusCode, b)
		}
	}
}

// A passthrough body the converter refuses (a server tool, a stored
// previous_response_id) is routed on a minimal view with an empty prompt:
// the user limits weigh the client's body instead (about 4 bytes a token)
// and its output limit. The view's one-token prompt let four concurrent
// 8,000-token requests through a 5,000 TPM bucket that admits one such
// convertible request.
func TestACoarselyRoutedPassthroughBodyIsEstimatedFromItsSize(t *testing.T) {
	e := &chatEngine{answer: func(ctx *fasthttp.RequestCtx) bool {
		ctx.SetContentType("application/json")
		ctx.SetBodyString(`{"object":"response","status":"completed","output":[]}`) // no usage: the estimate stays charged
		return true
	}}
	up := startChatEngine(t, e)
	key, hash := mintKey(t)
	f := defaultFlags()
	f.RequestMaxRetries = 0
	r, _ := govRouter(t, f, fmt.Sprintf(`{
		"protocol": {"responses_passthrough": true},
		"user_limit": {"templates": [{"name": "t", "default": true, "rate": {"enabled": true, "tpm": 5000}}]},
		"users": [{"name": "alice", "keys": [%q]}]}`, hash), up.url)
	body := `{"model":"m","input":"` + strings.Repeat("word ", 8000) + `","max_output_tokens":10,"tools":[{"type":"web_search"}]}`
	if res := postPath(t, r.url, "/v1/responses", key, body); res.status != 200 {
		t.Fatalf("first: %d %s", res.status, res.body) // larger than the bucket: passes while it is full
	}
	if res := postPath(t, r.url, "/v1/responses", key, body); res.status != 429 || res.code != "rate_limit_tpm" {
		t.Fatalf("second: %d %s, want 429 rate_limit_tpm", res.status, res.body)
	}
	if n := e.count(); n != 1 {
		t.Fatalf("the engine got %d requests, want 1", n)
	}
}

// A converted Responses request keeps, for the answer to echo, a copy of
// its settings (its tools, metadata, instructions) until it ends: up to
// the body's size again, reserved in the in-flight body budget with the
// client's body and the converted one (it was outside it).
func TestAResponsesEchoIsReservedInTheBodyBudget(t *testing.T) {
	up := startChatEngine(t, &chatEngine{})
	tool := `{"type":"function","name":"f","description":"` + strings.Repeat("abcd ", 20) + `","parameters":{"type":"object"}}`
	body := `{"model":"m","input":"hi","tools":[` + strings.Repeat(tool+",", 150) + tool + `]}` // 27 KB of tools
	f := defaultFlags()
	f.MaxInflightBodyBytes = 70000 // the body and its conversion (about 58 KB), not the echoed tools too
	r := startRouter(t, f, nil, up.url)
	resp, b := postH(t, r.url+"/v1/responses", body, nil)
	if resp.StatusCode != 503 {
		t.Fatalf("%d %.200s, want 503", resp.StatusCode, b)
	}
	checkOpenAIError(t, b)
	f2 := defaultFlags()
	f2.MaxInflightBodyBytes = 100000
	r2 := startRouter(t, f2, nil, up.url)
	for i := 0; i < 3; i++ { // given back: the next request fits again
		if resp, b := postH(t, r2.url+"/v1/responses", body, nil); resp.StatusCode != 200 {
			t.Fatalf("request %d: %d %.200s", i, resp.StatusCode, b)
		}
	}
}

// ...but a coarse body's base64 data (a PDF's, an image's) counts nothing,
// as images do not in a converted prompt's estimate: two requests with a
// 256 KiB document and a short question fit a 5,000 TPM bucket.
func TestACoarselyRoutedBodysBase64DataIsNotCountedAsText(t *testing.T) {
	e := &chatEngine{answer: func(ctx *fasthttp.RequestCtx) bool {
		ctx.SetContentType("application/json")
		ctx.SetBodyString(`{"id":"msg_1","type":"message","content":[]}`) // no usage: the estimate stays charged
		return true
	}}
	up := startChatEngine(t, e)
	key, hash := mintKey(t)
	f := defaultFlags()
	f.RequestMaxRetries = 0
	r, _ := govRouter(t, f, fmt.Sprintf(`{
		"protocol": {"anthropic_passthrough": true},
		"user_limit": {"templates": [{"name": "t", "default": true, "rate": {"enabled": true, "tpm": 5000}}]},
		"users": [{"name": "alice", "keys": [%q]}]}`, hash), up.url)
	pdf := strings.Repeat("JVBERi0xLjQKJcfs", 1<<14) // 256 KiB of base64: 65,536 tokens at 4 bytes a token
	body := `{"model":"m","max_tokens":100,"messages":[{"role":"user","content":[{"type":"document","source":{"type":"base64","media_type":"application/pdf","data":"` +
		pdf + `"}},{"type":"text","text":"What does this say?"}]}]}`
	for i := 0; i < 2; i++ {
		if res := postPath(t, r.url, "/v1/messages", key, body); res.status != 200 {
			t.Fatalf("request %d: %d %s", i, res.status, res.body)
		}
	}
	if n := e.count(); n != 2 {
		t.Fatalf("the engine got %d requests, want 2", n)
	}
}

// An unknown path under /v1/messages gets Anthropic's 404 with a request
// id, in its headers and its body, as every other Anthropic answer of the
// router (it had none); a client's valid X-Request-Id is the one.
func TestAnUnknownMessagesPathCarriesARequestID(t *testing.T) {
	up := startUpstream(t, okHandler)
	r := startRouter(t, nil, nil, up.url)
	resp, body := postWith(t, r.url+"/v1/messages/batches", anthropicBody, nil)
	if resp.StatusCode != 404 || resp.Header.Get("X-Request-Id") == "" || resp.Header.Get("Request-Id") != resp.Header.Get("X-Request-Id") {
		t.Fatalf("%d %v %s", resp.StatusCode, resp.Header, body)
	}
	checkAnthropicError(t, body, "not_found_error")
	resp, body = postWith(t, r.url+"/v1/messages/batches", anthropicBody, map[string]string{"X-Request-Id": "mine-1"})
	if resp.Header.Get("Request-Id") != "mine-1" || !strings.Contains(body, `"request_id":"mine-1"`) {
		t.Fatalf("%v %s", resp.Header, body)
	}
}

// count_tokens, answered by the router in conversion mode, refuses a model
// nothing serves as a Messages request for it is refused (404
// not_found_error in Anthropic's shape), and counts for every name model
// routing takes: another notation, a fuzzy match, a mapping, the default
// model. It counted for any name (200 {"input_tokens":N}).
func TestCountTokensForAModelNothingServesIsNotFound(t *testing.T) {
	e := &chatEngine{}
	up := startChatEngine(t, e)
	f := func(cfg *config.Config, model string, want int) {
		t.Helper()
		r := startRouter(t, nil, cfg, up.url)
		body := `{"model":"` + model + `","messages":[{"role":"user","content":"x"}]}`
		resp, b := postH(t, r.url+"/v1/messages/count_tokens", body, nil)
		if resp.StatusCode != want {
			t.Fatalf("%q: %d %s, want %d", model, resp.StatusCode, b, want)
		}
		if want == 404 {
			id := resp.Header.Get("Request-Id")
			if start, end := `{"type":"error","error":{"type":"not_found_error","message":"The model `+"`"+model+"`"+` does not exist or is not served by any worker`, `"},"request_id":"`+id+`"}`; id == "" || !strings.HasPrefix(b, start) || !strings.HasSuffix(b, end) {
				t.Fatalf("%q: %s, want %s...%s", model, b, start, end)
			}
			// The same answer as a Messages request for that model.
			resp2, b2 := postH(t, r.url+"/v1/messages", `{"model":"`+model+`","max_tokens":3,"messages":[{"role":"user","content":"x"}]}`, nil)
			if resp2.StatusCode != 404 || !strings.Contains(b2, `"not_found_error"`) {
				t.Fatalf("%q: messages %d %s", model, resp2.StatusCode, b2)
			}
		}
	}
	plain := config.Default()
	plain.ModelRouting.Enabled = false
	f(plain, "m", 200)
	f(plain, "nosuch", 404)
	f(plain, "M", 404)
	routed := config.Default()
	routed.ModelRouting.Enabled, routed.ModelRouting.FuzzyMatch = true, true
	f(routed, "M", 200)
	f(routed, "org/m", 200)
	f(routed, "nosuch", 404)
	mapped := config.Default()
	mapped.ModelRouting.Enabled = true
	mapped.ModelRouting.Mappings = []config.ModelMapping{{Pattern: "gpt-4*", Services: []string{"m"}}}
	f(mapped, "gpt-4o", 200)
	defaulted := config.Default()
	defaulted.ModelRouting.Enabled, defaulted.ModelRouting.DefaultModel = true, "m"
	f(defaulted, "nosuch", 200)
	if e.count() != 0 {
		t.Fatal("count_tokens reached the engine in conversion mode")
	}
}

// TestProtoStateResetClearsEveryField: reset clears protoFlags whole and
// empties the rest in place; a field added outside protoFlags must be
// added to reset, and to this list.
func TestProtoStateResetClearsEveryField(t *testing.T) {
	var p protoState
	p.api, p.mode, p.stage, p.relaying, p.coarse, p.noStore, p.background = protocol.Anthropic, protoConvert, stageFilter, true, true, true, true
	p.prev = append(p.prev, "resp_1"...)
	p.buf, p.out, p.in = append(p.buf, 'b'), append(p.out, 'o'), append(p.in, 'i')
	p.meta.Model = append(p.meta.Model, 'm')
	p.meta.MaxTokens = 7
	p.resp.reads = 3
	p.reset()
	if p.protoFlags != (protoFlags{}) || len(p.prev)+len(p.buf)+len(p.out)+len(p.in)+len(p.meta.Model) != 0 ||
		p.meta.MaxTokens != -1 || p.resp.reads != 0 || cap(p.buf) == 0 {
		t.Fatalf("after reset: %+v", p)
	}
	var names []string
	pt := reflect.TypeOf(protoState{})
	for i := range pt.NumField() {
		names = append(names, pt.Field(i).Name)
	}
	if got, want := strings.Join(names, ","), "protoFlags,resp,prev,meta,filter,buf,out,in"; got != want {
		t.Fatalf("protoState's fields are %s, reset knows %s", got, want)
	}
}
