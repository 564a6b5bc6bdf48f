package proxy

import (
	"bufio"
	"encoding/json"
	"strings"
	"sync"
	"testing"

	"github.com/valyala/fasthttp"

	"github.com/infera/infera/internal/jsonscan"
)

// laxEngine answers as vLLM does: stream and stream_options.include_usage
// read as pydantic's lax bool; a stream ends with a usage chunk when
// include_usage is true.
type laxEngine struct {
	mu     sync.Mutex
	bodies []string
}

func (e *laxEngine) handler(ctx *fasthttp.RequestCtx) {
	e.mu.Lock()
	e.bodies = append(e.bodies, string(ctx.PostBody()))
	e.mu.Unlock()
	var req struct {
		Stream        json.RawMessage            `json:"stream"`
		StreamOptions map[string]json.RawMessage `json:"stream_options"`
	}
	if json.Unmarshal(ctx.PostBody(), &req) != nil {
		ctx.SetStatusCode(400)
		return
	}
	if jsonscan.LaxBool(req.Stream) != 't' {
		ctx.SetContentType("application/json")
		ctx.SetBodyString(`{"id":"c1","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":` + engineUsage + `}`)
		return
	}
	usage := jsonscan.LaxBool(req.StreamOptions["include_usage"]) == 't'
	ctx.SetContentType("text/event-stream")
	ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
		head := `data: {"id":"c1","object":"chat.completion.chunk","model":"m",`
		w.WriteString(head + `"choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":"stop"}]}` + "\n\n")
		if usage {
			w.WriteString(head + `"choices":[],"usage":` + engineUsage + "}\n\n")
		}
		w.WriteString("data: [DONE]\n\n")
	})
}

func (e *laxEngine) last() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.bodies[len(e.bodies)-1]
}

// stream and stream_options.include_usage are read as vLLM reads them
// (pydantic's lax bool): "stream":"true" or 1 is a stream the engine
// answers (it was refused with 400 "stream must be a boolean"), and
// "include_usage":"true" asks for the usage chunk (it was removed from the
// client's stream by the usage filter).
func TestStreamAndIncludeUsageAreReadAsTheEngineReadsThem(t *testing.T) {
	e := &laxEngine{}
	up := startUpstream(t, e.handler)
	r := startRouter(t, nil, nil, up.url)
	const usageChunk = `"choices":[],"usage":`
	for _, path := range []string{"/v1/chat/completions", "/v1/completions"} {
		rest := `"messages":[{"role":"user","content":"hi"}]}`
		if path == "/v1/completions" {
			rest = `"prompt":"hi"}`
		}
		for _, v := range []string{`true`, `"true"`, `1`, `"yes"`, `"\u0074rue"`, `"ON"`, `1.0`} {
			body := `{"model":"m","stream":` + v + `,` + rest
			code, b := post(t, r.url+path, body)
			if code != 200 || !strings.HasSuffix(b, "data: [DONE]\n\n") || strings.Contains(b, usageChunk) {
				t.Fatalf("%s %s: %d %q, want a stream without usage", path, body, code, b)
			}
			if got := e.last(); !strings.Contains(got, `"include_usage":true`) {
				t.Fatalf("%s %s: the engine got %s, without usage asked", path, body, got)
			}
			for _, u := range []string{`"true"`, `1`, `"Yes"`} {
				body := `{"model":"m","stream":` + v + `,"stream_options":{"include_usage":` + u + `},` + rest
				code, b := post(t, r.url+path, body)
				if code != 200 || !strings.Contains(b, usageChunk) {
					t.Fatalf("%s %s: %d %q, want the usage chunk the client asked for", path, body, code, b)
				}
			}
			for _, u := range []string{`"false"`, `0`, `"off"`} {
				body := `{"model":"m","stream":` + v + `,"stream_options":{"include_usage":` + u + `},` + rest
				code, b := post(t, r.url+path, body)
				if code != 200 || strings.Contains(b, usageChunk) || !strings.HasSuffix(b, "data: [DONE]\n\n") {
					t.Fatalf("%s %s: %d %q, want a stream without usage", path, body, code, b)
				}
			}
		}
		for _, v := range []string{`"false"`, `0`, `"no"`, `null`} {
			body := `{"model":"m","stream":` + v + `,` + rest
			if code, b := post(t, r.url+path, body); code != 200 || !strings.HasPrefix(b, "{") {
				t.Fatalf("%s %s: %d %q, want a whole answer", path, body, code, b)
			}
		}
		for _, v := range []string{`2`, `"maybe"`, `"truee"`, `[]`, `{}`} {
			body := `{"model":"m","stream":` + v + `,` + rest
			code, b := post(t, r.url+path, body)
			if code != 400 || !strings.Contains(b, `"param":"stream"`) {
				t.Fatalf("%s %s: %d %q, want 400 on stream", path, body, code, b)
			}
			checkOpenAIError(t, b)
		}
	}
}

// A passthrough body the converter refuses is routed on a view whose
// stream flag is read as the engine reads it: "stream":"true" (which the
// converter refuses, and vLLM's /v1/responses and /v1/messages stream) is
// a stream; it was routed as a whole answer.
func TestAPassthroughRoutingViewReadsStreamAsTheEngineDoes(t *testing.T) {
	for v, want := range map[string]bool{`true`: true, `"true"`: true, `1`: true, `"on"`: true, `false`: false, `"false"`: false, `null`: false, `"x"`: false} {
		view, err := routingView(nil, []byte(`{"model":"m","stream":`+v+`,"input":"hi"}`))
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.Contains(string(view), `"stream":true`); got != want {
			t.Errorf("stream %s: view %s, want stream %v", v, view, want)
		}
	}
}
