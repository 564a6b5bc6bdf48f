package proxy

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/infera/infera/config"
	"github.com/infera/infera/internal/jsonscan"
	"github.com/valyala/fasthttp"
)

// Once the stream converter has ended the client's stream with an error
// event (the engine's error chunk here; a malformed chunk, too many tool
// calls), the response ends there and the upstream is closed, so the
// engine stops: the relay does not read on until the engine finishes.
func TestAConvertedStreamEndsAtItsErrorEvent(t *testing.T) {
	e := &chatEngine{answer: func(ctx *fasthttp.RequestCtx) bool {
		ctx.SetContentType("text/event-stream")
		ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
			ev := func(s string) { w.WriteString("data: " + s + "\n\n"); w.Flush() }
			ev(`{"choices":[{"index":0,"delta":{"content":"Hi"},"finish_reason":null}]}`)
			ev(`{"error":{"message":"engine blew up","type":"InternalServerError","code":500}}`)
			// an engine that keeps generating (or a malformed chunk
			// followed by the rest of a long answer)
			for i := 0; i < 30; i++ {
				time.Sleep(100 * time.Millisecond)
				ev(`{"choices":[{"index":0,"delta":{"content":"x"},"finish_reason":null}]}`)
			}
			ev(`{"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}`)
			ev("[DONE]")
		})
		return true
	}}
	up := startChatEngine(t, e)
	r := startRouter(t, nil, nil, up.url)
	body := strings.Replace(anthropicBody, `"max_tokens"`, `"stream":true,"max_tokens"`, 1)
	start := time.Now()
	resp, b := postH(t, r.url+"/v1/messages", body, nil)
	took := time.Since(start)
	if resp.StatusCode != 200 || !strings.Contains(b, "event: error") {
		t.Fatalf("%d %q", resp.StatusCode, b)
	}
	if took > 1500*time.Millisecond { // the engine goes on for 3 s
		t.Fatalf("the client stream ended with an error event but the response stayed open %v (until the engine finished)", took)
	}
}

// An engine whose SSE lines end in a bare CR (the SSE specification allows
// CRLF, LF or CR) streams through every front door: a chat stream whose
// client did not ask for usage was held back whole by the usage filter
// (no event end found) and relayed at the end with the usage chunk, and a
// converted stream ended at once with "malformed stream chunk".
func TestABareCRStreamIsRelayedFilteredAndConvertedAsItArrives(t *testing.T) {
	const stall = 600 * time.Millisecond
	up := startRaw(t, func(n int, req string, c net.Conn) {
		c.Write([]byte("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"))
		ev := func(s string) { fmt.Fprintf(c, "%x\r\n%s\r\r\r\n", len(s)+2, s) }
		ev(`data: {"id":"x","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":"Hel"},"finish_reason":null}]}`)
		time.Sleep(stall)
		ev(`data:{"id":"x","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{"content":"lo"},"finish_reason":"stop"}]}`)
		ev(`data: {"id":"x","object":"chat.completion.chunk","model":"m","choices":[],"usage":{"prompt_tokens":7,"completion_tokens":2,"total_tokens":9}}`)
		ev(`data: [DONE]`)
		c.Write([]byte("0\r\n\r\n"))
	})
	r := startRouter(t, nil, nil, up.url)
	for _, tc := range []struct{ path, body, first, end string }{
		{"/v1/chat/completions", `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`, `"Hel"`, "data: [DONE]\r\r"},
		{"/v1/messages", `{"model":"m","stream":true,"max_tokens":16,"messages":[{"role":"user","content":"hi"}]}`, `"Hel"`, "event: message_stop"},
		{"/v1/responses", `{"model":"m","stream":true,"input":"hi"}`, `"Hel"`, "event: response.completed"},
	} {
		start := time.Now()
		resp, err := http.Post(r.url+tc.path, "application/json", strings.NewReader(tc.body))
		if err != nil {
			t.Fatal(err)
		}
		var got []byte
		var first time.Duration
		buf := make([]byte, 64<<10)
		for {
			n, err := resp.Body.Read(buf)
			got = append(got, buf[:n]...)
			if first == 0 && strings.Contains(string(got), tc.first) {
				first = time.Since(start)
			}
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatalf("%s: %v", tc.path, err)
			}
		}
		resp.Body.Close()
		b := string(got)
		if first == 0 || first >= stall {
			t.Errorf("%s: the first event arrived after %v, when the engine finished (%v)", tc.path, first, stall)
		}
		if strings.Contains(b, "event: error") || !strings.Contains(b, `"lo"`) || !strings.Contains(b, tc.end) {
			t.Errorf("%s: %q", tc.path, b)
		}
		if tc.path == "/v1/chat/completions" && strings.Contains(b, "prompt_tokens") {
			t.Errorf("the client did not ask for usage and got the usage chunk: %q", b)
		}
	}
}

// vllmStreamUsage reads a chat body's stream_options as vLLM's
// StreamOptions model and its chat stream generator do
// (vllm/entrypoints/openai/protocol.py: include_usage: Optional[bool] =
// True, continuous_usage_stats: Optional[bool] = False; serving_chat.py:
// no stream_options, no usage; continuous usage only with include_usage).
// Bools are read lax (jsonscan.LaxBool); an explicit null is None: false.
func vllmStreamUsage(body string) (inc, cont bool) {
	var r struct {
		StreamOptions map[string]json.RawMessage `json:"stream_options"`
	}
	json.Unmarshal([]byte(body), &r)
	if r.StreamOptions == nil {
		return false, false
	}
	inc = true
	if v, ok := r.StreamOptions["include_usage"]; ok {
		inc = jsonscan.LaxBool(v) == 't'
	}
	cont = inc && jsonscan.LaxBool(r.StreamOptions["continuous_usage_stats"]) == 't'
	return inc, cont
}

// startUsageEngine answers every chat stream as vLLM does for the
// stream_options it got: two content chunks, each with its usage when
// continuous usage is on, then the usage chunk when usage is included
// (prompt 7, completion 2).
func startUsageEngine(t *testing.T) *rawUpstream {
	return startRaw(t, func(n int, req string, c net.Conn) {
		_, body, _ := strings.Cut(req, "\r\n\r\n")
		inc, cont := vllmStreamUsage(body)
		c.Write([]byte("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"))
		ev := func(s string) { s = "data: " + s + "\n\n"; fmt.Fprintf(c, "%x\r\n%s\r\n", len(s), s) }
		for i, d := range []string{`{"content":"Hel"},"finish_reason":null`, `{"content":"lo"},"finish_reason":"stop"`} {
			u := ""
			if cont {
				u = fmt.Sprintf(`,"usage":{"prompt_tokens":7,"total_tokens":%d,"completion_tokens":%d}`, 8+i, i+1)
			}
			ev(`{"id":"x","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":` + d + `}]` + u + `}`)
		}
		if inc {
			ev(`{"id":"x","object":"chat.completion.chunk","model":"m","choices":[],"usage":{"prompt_tokens":7,"total_tokens":9,"completion_tokens":2}}`)
		}
		ev("[DONE]")
		c.Write([]byte("0\r\n\r\n"))
	})
}

// With force_stream_usage on, a chat stream's client gets the usage vLLM
// started with --enable-force-include-usage sends (should_include_usage:
// include_usage = the client's or forced, continuous usage = include_usage
// and the client's continuous_usage_stats): the usage chunk always, and
// usage in every chunk when the client set continuous_usage_stats, even
// with include_usage false. The router turned continuous_usage_stats off
// for such a client, as it must without forcing, and it got no per-chunk
// usage.
func TestAForcedStreamsClientGetsTheUsageAForcingVLLMSends(t *testing.T) {
	up := startUsageEngine(t)
	cfg := config.Default()
	cfg.Protocol.ForceStreamUsage = true
	r := startRouter(t, nil, cfg, up.url)
	for _, tc := range []struct {
		opts string
		each bool // usage in every content chunk (the usage chunk: always)
	}{
		{``, false},
		{`,"stream_options":null`, false},
		{`,"stream_options":{}`, false},
		{`,"stream_options":{"include_usage":false}`, false},
		{`,"stream_options":{"continuous_usage_stats":true}`, true},
		{`,"stream_options":{"include_usage":false,"continuous_usage_stats":true}`, true},
		{`,"stream_options":{"continuous_usage_stats":"yes","include_usage":null}`, true},
		{`,"stream_options":{"include_usage":false,"continuous_usage_stats":false}`, false},
	} {
		prompt0, out0 := mPromptTokens.Get(), mOutputTokens.Get()
		resp, b := postH(t, r.url+"/v1/chat/completions", `{"model":"m","stream":true`+tc.opts+`,"messages":[{"role":"user","content":"hi"}]}`, nil)
		if resp.StatusCode != 200 || !strings.Contains(b, `"lo"`) || !strings.HasSuffix(b, "data: [DONE]\n\n") {
			t.Fatalf("stream_options %s: %d %q", tc.opts, resp.StatusCode, b)
		}
		final := strings.Contains(b, `"choices":[],"usage"`)
		each := strings.Contains(b, `"finish_reason":null}],"usage"`)
		if !final || each != tc.each {
			t.Errorf("stream_options %s: the client got the usage chunk %v (a forcing vLLM sends it), usage in each chunk %v (vLLM: %v)\n%s",
				tc.opts, final, each, tc.each, b)
		}
		if dp, dc := mPromptTokens.Get()-prompt0, mOutputTokens.Get()-out0; dp != 7 || dc != 2 {
			t.Errorf("stream_options %s: the router counted %d prompt and %d completion tokens, the engine reported 7 and 2", tc.opts, dp, dc)
		}
	}
}

// A chat stream's client gets the usage vLLM would send it for its
// stream_options, read as vLLM reads them: an empty object asks for the
// usage chunk (include_usage defaults to true), continuous usage stats
// come in every chunk with it, and an include_usage of false or null
// turns both off. The router, which asks the engine for usage on every
// stream, removes only the usage chunk it added, and counts the stream's
// tokens once, whatever the engine sent. Before, "stream_options":{} and
// {"continuous_usage_stats":true} were taken as not asking: the router
// rewrote them and removed the usage chunk the client would get from vLLM.
func TestAStreamsClientGetsTheUsageVLLMWouldSendIt(t *testing.T) {
	up := startUsageEngine(t)
	r := startRouter(t, nil, nil, up.url)
	for _, tc := range []struct {
		opts        string
		final, each bool // the usage chunk, usage in every content chunk
	}{
		{``, false, false},
		{`,"stream_options":null`, false, false},
		{`,"stream_options":{}`, true, false},
		{`,"stream_options":{"include_usage":true}`, true, false},
		{`,"stream_options":{"include_usage":"yes"}`, true, false},
		{`,"stream_options":{"include_usage":false}`, false, false},
		{`,"stream_options":{"include_usage":null}`, false, false},
		{`,"stream_options":{"continuous_usage_stats":false}`, true, false},
		{`,"stream_options":{"continuous_usage_stats":true}`, true, true},
		{`,"stream_options":{"include_usage":true,"continuous_usage_stats":true}`, true, true},
		{`,"stream_options":{"include_usage":false,"continuous_usage_stats":true}`, false, false},
		{`,"stream_options":{"continuous_usage_stats":true,"include_usage":null}`, false, false},
	} {
		prompt0, out0 := mPromptTokens.Get(), mOutputTokens.Get()
		resp, b := postH(t, r.url+"/v1/chat/completions", `{"model":"m","stream":true`+tc.opts+`,"messages":[{"role":"user","content":"hi"}]}`, nil)
		if resp.StatusCode != 200 || !strings.Contains(b, `"lo"`) || !strings.HasSuffix(b, "data: [DONE]\n\n") {
			t.Fatalf("stream_options %s: %d %q", tc.opts, resp.StatusCode, b)
		}
		final := strings.Contains(b, `"choices":[],"usage"`)
		each := strings.Contains(b, `"finish_reason":null}],"usage"`)
		if final != tc.final || each != tc.each {
			t.Errorf("stream_options %s: the client got the usage chunk %v (vLLM sends it: %v), usage in each chunk %v (vLLM: %v)\n%s",
				tc.opts, final, tc.final, each, tc.each, b)
		}
		if dp, dc := mPromptTokens.Get()-prompt0, mOutputTokens.Get()-out0; dp != 7 || dc != 2 {
			t.Errorf("stream_options %s: the router counted %d prompt and %d completion tokens, the engine reported 7 and 2", tc.opts, dp, dc)
		}
	}
}

// An engine's keep-alive comments reach a converted stream's client as
// comments, as they reach a chat client: the converter skipped them, so
// while the engine only kept its stream alive the Messages or Responses
// client got nothing at all, and a client or proxy that drops an idle
// stream dropped it.
func TestAnEnginesKeepAlivesReachAConvertedStream(t *testing.T) {
	up := startRaw(t, func(n int, req string, c net.Conn) {
		c.Write([]byte("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"))
		ev := func(s string) { fmt.Fprintf(c, "%x\r\n%s\r\n", len(s), s) }
		ev(`data: {"choices":[{"index":0,"delta":{"content":"Hel"},"finish_reason":null}]}` + "\n\n")
		for i := 0; i < 4; i++ {
			time.Sleep(150 * time.Millisecond)
			ev(": keep-alive\n\n")
		}
		ev(`data: {"choices":[{"index":0,"delta":{"content":"lo"},"finish_reason":"stop"}]}` + "\n\ndata: [DONE]\n\n")
		c.Write([]byte("0\r\n\r\n"))
	})
	r := startRouter(t, nil, nil, up.url)
	for _, p := range [][2]string{
		{"/v1/messages", `{"model":"m","stream":true,"max_tokens":16,"messages":[{"role":"user","content":"hi"}]}`},
		{"/v1/responses", `{"model":"m","stream":true,"input":"hi"}`},
	} {
		resp, err := http.Post(r.url+p[0], "application/json", strings.NewReader(p[1]))
		if err != nil {
			t.Fatal(err)
		}
		var got []byte
		reads := 0
		buf := make([]byte, 64<<10)
		for {
			n, err := resp.Body.Read(buf)
			if n > 0 {
				reads++
				got = append(got, buf[:n]...)
			}
			if err != nil {
				break
			}
		}
		resp.Body.Close()
		if k := strings.Count(string(got), ":\n\n"); k != 4 || reads < 5 || !strings.Contains(string(got), `"lo"`) {
			t.Errorf("%s: %d keep-alives in %d reads: %q", p[0], k, reads, got)
		}
	}
}

// An engine that reports a failure inside a stream it relays as it came
// (vLLM and SGLang send data: {"error":{...}}, older vLLM
// {"object":"error",...}, then data: [DONE]) failed the request: the
// client gets the engine's events unchanged, and the answer is counted and
// logged as the worker's failure ("end":"upstream_error", a mid-stream
// error, a failure on the worker), as a converted stream's error chunk is.
// It used to count as a complete stream. A model whose text is "error" or
// holds a quoted {"error": ...} (escaped inside its JSON string) is a
// complete stream. An error event whose code is a client error (4xx: a
// prompt too long for the model, say) fails the request but is not the
// worker's fault, as a 4xx answer is not: it was counted against the
// worker, so a client sending such requests tripped a healthy worker's
// breaker; the same holds in a converted stream.
func TestAnEngineErrorEventInARelayedStreamIsTheWorkersFailure(t *testing.T) {
	const chunk = `data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":%s},"finish_reason":null}]}` + "\n\n"
	filtered := `{"model":"m","stream":true,"stream_options":{"include_usage":false},"messages":[{"role":"user","content":"hi"}]}`
	plainStream := `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`
	for _, tc := range []struct {
		name, body, event string
		failed, blamed    bool
	}{
		{"vllm error object", plainStream, `data: {"error":{"message":"engine blew up","type":"InternalServerError","param":null,"code":500}}` + "\n\n", true, true},
		{"older vllm error", plainStream, `data: {"object":"error","message":"engine blew up","type":"InternalServerError","param":null,"code":500}` + "\n\n", true, true},
		{"usage filtered", filtered, `data: {"error": {"message":"engine blew up","code":500}}` + "\n\n", true, true},
		{"no code", plainStream, `data: {"error":{"message":"out of KV blocks","type":"internal_error"}}` + "\n\n", true, true},
		{"vllm client error", plainStream, `data: {"error":{"message":"prompt too long","type":"BadRequestError","param":null,"code":400}}` + "\n\n", true, false},
		{"older vllm client error", plainStream, `data: {"object":"error","message":"prompt too long","type":"BadRequestError","param":null,"code":400}` + "\n\n", true, false},
		{"usage filtered client error", filtered, `data: {"error": {"message":"prompt too long","code":422}}` + "\n\n", true, false},
		{"text that says error", plainStream, fmt.Sprintf(chunk, `"error"`), false, false},
		{"text holding an error object", plainStream, fmt.Sprintf(chunk, `"{\"error\": \"x\"}"`), false, false},
		{"a null error field", plainStream, `data: {"error":null,"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{},"finish_reason":null}]}` + "\n\n", false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up := startRaw(t, func(n int, req string, c net.Conn) {
				c.Write([]byte("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"))
				for _, ev := range []string{fmt.Sprintf(chunk, `"hi"`), tc.event,
					`data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}` + "\n\n", "data: [DONE]\n\n"} {
					fmt.Fprintf(c, "%x\r\n%s\r\n", len(ev), ev)
					time.Sleep(5 * time.Millisecond)
				}
				c.Write([]byte("0\r\n\r\n"))
			})
			r, lines, _ := accessRouter(t, "", up.url)
			before := midStreamErrors()
			resp, b := send(t, "POST", r.url+"/v1/chat/completions", "", "s", tc.body)
			if resp.StatusCode != 200 || !strings.Contains(b, tc.event) || strings.Count(b, "data: [DONE]") != 1 {
				t.Fatalf("%d %q", resp.StatusCode, b)
			}
			_, fails := r.fl.Get("w0").Counts()
			errs := midStreamErrors()
			var convFails uint64
			if tc.failed {
				// The same error in a converted stream.
				body := `{"model":"m","stream":true,"max_tokens":16,"messages":[{"role":"user","content":"hi"}]}`
				if resp, b := send(t, "POST", r.url+"/v1/messages", "", "m", body); resp.StatusCode != 200 || !strings.Contains(b, "event: error") {
					t.Fatalf("converted: %d %q", resp.StatusCode, b)
				}
				_, f2 := r.fl.Get("w0").Counts()
				convFails = f2 - fails
			}
			l := byRequestID(lines())["s"]
			if tc.failed {
				want := 0
				if tc.blamed {
					want = 1
				}
				if l == nil || l["end"] != "upstream_error" || errs != before+1 || int(fails) != want {
					t.Fatalf("engine error event: access log %v, mid-stream errors %d -> %d, worker failures %d (want %d)", l, before, errs, fails, want)
				}
				if int(convFails) != want {
					t.Fatalf("converted stream: worker failures +%d, want +%d", convFails, want)
				}
				return
			}
			if l == nil || l["end"] != "complete" || midStreamErrors() != before || fails != 0 {
				t.Fatalf("no error: access log %v, mid-stream errors %d -> %d, worker failures %d", l, before, midStreamErrors(), fails)
			}
		})
	}
}

// An object nested in an event's data whose first key is "error" is no
// engine error event: a legacy completion's top_logprobs maps tokens to
// their logprobs ({"error":-0.01,...} when the model's likely token is
// "error"), and a passthrough Responses event echoes the request's tools,
// whose parameters may name a property "error" first. Both healthy streams
// were logged "end":"upstream_error", counted as mid-stream errors and
// blamed on the worker. Only the event's data itself, data: {"error":...},
// is the engine's error event.
func TestAnObjectNestedInAnEventWhoseFirstKeyIsErrorIsNoEngineError(t *testing.T) {
	cmpl := `data: {"id":"c","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":"error","logprobs":{"text_offset":[0],"token_logprobs":[-0.01],"tokens":["error"],"top_logprobs":[{"error":-0.01,"Error":-4.6}]},"finish_reason":null}]}` + "\n\n"
	created := "event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"id\":\"r\",\"error\":null,\"tools\":[{\"type\":\"function\",\"name\":\"report\",\"parameters\":{\"type\": \"object\", \"properties\": {\"error\": {\"type\": \"string\"}}}}]}}\n\n"
	completed := "event: response.completed\ndata: {\"type\":\"response.completed\",\"sequence_number\":1,\"response\":{\"id\":\"r\",\"status\":\"completed\",\"error\":null}}\n\n"
	for _, tc := range []struct {
		name, path, body string
		events           []string
	}{
		{"legacy completion logprobs", "/v1/completions", `{"model":"m","stream":true,"prompt":"hi","logprobs":2}`, []string{cmpl, cmpl, "data: [DONE]\n\n"}},
		{"responses tools echoed", "/v1/responses", `{"model":"m","stream":true,"input":"hi"}`, []string{created, completed}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up := startRaw(t, func(n int, req string, c net.Conn) {
				c.Write([]byte("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"))
				for _, ev := range tc.events {
					fmt.Fprintf(c, "%x\r\n%s\r\n", len(ev), ev)
					time.Sleep(5 * time.Millisecond)
				}
				c.Write([]byte("0\r\n\r\n"))
			})
			cfg := config.Default()
			cfg.Protocol.ResponsesPassthrough = true
			path := t.TempDir() + "/access.log"
			al, err := OpenAccessLog(path)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { al.Close() })
			r := startRouterWith(t, nil, cfg, func(o *Options) { o.AccessLog = al }, up.url)
			before := midStreamErrors()
			resp, b := send(t, "POST", r.url+tc.path, "", "s", tc.body)
			if resp.StatusCode != 200 || !strings.Contains(b, tc.events[1]) {
				t.Fatalf("%d %q", resp.StatusCode, b)
			}
			_, fails := r.fl.Get("w0").Counts()
			r.srv.Shutdown()
			al.Close()
			l := byRequestID(readAccessLog(t, path))["s"]
			if l == nil || l["end"] != "complete" || midStreamErrors() != before || fails != 0 {
				t.Fatalf("a healthy stream: access log %v, mid-stream errors %d -> %d, worker failures %d", l, before, midStreamErrors(), fails)
			}
		})
	}
}

// An engine that fails a request before its first token answers 200 with
// its error event first (vLLM and SGLang: data: {"error":{...}} then
// data: [DONE]), often in one write. Those first bytes were never judged:
// read with the head, they were relayed (or, when they were the whole
// body, written at once) and the request was logged "end":"complete",
// neither counted as a mid-stream error nor blamed on the worker, for a
// client that asks for usage and, through the usage filter, for one that
// does not.
func TestAnEngineErrorEventInAStreamsFirstBytesIsTheWorkersFailure(t *testing.T) {
	errEv := `data: {"error": {"message": "engine blew up", "type": "InternalServerError", "param": null, "code": 500}}` + "\n\n"
	filtered := `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`
	withUsage := `{"model":"m","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}`
	for _, tc := range []struct {
		name, body string
		oneWrite   bool
	}{
		{"whole stream in one write, usage filtered", filtered, true},
		{"whole stream in one write", withUsage, true},
		{"first event alone, usage filtered", filtered, false},
		{"first event alone", withUsage, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up := startRaw(t, func(n int, req string, c net.Conn) {
				head := "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
				first := fmt.Sprintf("%x\r\n%s\r\n", len(errEv), errEv)
				rest := fmt.Sprintf("%x\r\n%s\r\n0\r\n\r\n", len("data: [DONE]\n\n"), "data: [DONE]\n\n")
				if tc.oneWrite {
					c.Write([]byte(head + first + rest))
					return
				}
				c.Write([]byte(head + first))
				time.Sleep(20 * time.Millisecond)
				c.Write([]byte(rest))
			})
			r, lines, _ := accessRouter(t, "", up.url)
			before := midStreamErrors()
			resp, b := send(t, "POST", r.url+"/v1/chat/completions", "", "s", tc.body)
			if resp.StatusCode != 200 || !strings.HasPrefix(b, errEv) || strings.Count(b, "data: [DONE]") != 1 {
				t.Fatalf("%d %q", resp.StatusCode, b)
			}
			_, fails := r.fl.Get("w0").Counts()
			l := byRequestID(lines())["s"]
			if l == nil || l["end"] != "upstream_error" || midStreamErrors() != before+1 || fails != 1 {
				t.Fatalf("engine error event first: access log %v, mid-stream errors %d -> %d, worker failures %d", l, before, midStreamErrors(), fails)
			}
		})
	}
}

// A passthrough Responses stream echoes the client's request in its
// response.created (metadata, tools, the text format's schema): a client
// whose metadata or tool schema says "type":"error" or "object":"error"
// made each of its healthy streams the worker's failure, so any client
// could open a healthy worker's breaker with a few requests. Only the
// event's data itself names an error event.
func TestAClientsObjectEchoedInAStreamIsNoEngineError(t *testing.T) {
	created := "event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"id\":\"r\",\"error\":null,\"metadata\":{\"type\":\"error\",\"object\": \"error\"},\"tools\":[{\"type\":\"function\",\"name\":\"f\",\"parameters\":{\"type\":\"object\",\"properties\":{\"e\":{\"type\": \"error\"},\"f\":{\"type\":\"response.failed\"}}}}]}}\n\n"
	completed := "event: response.completed\ndata: {\"type\":\"response.completed\",\"sequence_number\":1,\"response\":{\"id\":\"r\",\"status\":\"completed\",\"error\":null,\"metadata\":{\"type\":\"error\"}}}\n\n"
	up := startRaw(t, func(n int, req string, c net.Conn) {
		c.Write([]byte("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"))
		for _, ev := range []string{created, completed} {
			fmt.Fprintf(c, "%x\r\n%s\r\n", len(ev), ev)
			time.Sleep(5 * time.Millisecond)
		}
		c.Write([]byte("0\r\n\r\n"))
	})
	cfg := config.Default()
	cfg.Protocol.ResponsesPassthrough = true
	r := startRouter(t, nil, cfg, up.url)
	before := midStreamErrors()
	for i := 0; i < 3; i++ {
		code, b := post(t, r.url+"/v1/responses", `{"model":"m","stream":true,"input":"hi","metadata":{"type":"error","object":"error"}}`)
		if code != 200 || !strings.Contains(b, completed) {
			t.Fatalf("%d %q", code, b)
		}
	}
	if _, fails := r.fl.Get("w0").Counts(); midStreamErrors() != before || fails != 0 {
		t.Fatalf("healthy streams echoing the client's metadata: mid-stream errors %d -> %d, worker failures %d", before, midStreamErrors(), fails)
	}
}

// carriesError finds the engine's error event in every framing and shape
// engines send (vLLM's and SGLang's data: {"error": ...}, older vLLM's
// "object": "error", Anthropic's and the Responses API's "type": "error",
// spaced as Python's json.dumps writes, LF, CRLF or CR framed), and no
// "error" inside a string or an object nested in an event's data.
func TestOnlyAnEventsOwnErrorObjectIsAnEngineError(t *testing.T) {
	for _, c := range []struct {
		in   string
		want bool
	}{
		{"data:{\"error\":{}}\n\n", true},
		{"data: {\"error\": {\"message\": \"x\"}}\r\n\r\n", true},
		{"data: {\"x\":1}\r\rdata: {\"error\": {\"message\": \"x\"}}\r\r", true},
		{"event: error\r\ndata: {\"type\": \"error\", \"error\": {\"type\": \"overloaded_error\"}}\r\n\r\n", true},
		{"data: {\"object\": \"error\", \"message\": \"m\"}\n\n", true},
		{"event: error\ndata: {\"code\":\"x\",\"message\":\"m\",\"param\":null,\"sequence_number\":3,\"type\":\"error\"}\n\n", true},
		{"data: {\"error\": {\"object\": \"error\", \"message\": \"m\"}}\n\n", true},
		{"data: {\"id\":\"a\\\"{[\",\"type\":\"error\"}\n\n", true},
		{"data: {\"id\":\"c\",\"error\":\"\"}\n\n", false},
		{"data: {\"choices\":[{\"logprobs\":{\"top_logprobs\":[{\"error\":-1}]}}]}\n\n", false},
		{"data: {\"error\":null}\n\n", false},
		{"data: {\"error\": null, \"x\": 1}\n\n", false},
		{": {\"error\":1}\n\n", false},
		{"data: \"error\"\n\n", false},
		{"data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"function\":{\"arguments\":\"{\\\"error\\\": {\\\"type\\\": \\\"error\\\"}}\"}}]}}]}\n\n", false},
		{"data: {\"choices\":[{\"delta\":{\"reasoning_content\":\"\\\"error\\\"\"}}]}\n\n", false},
	} {
		if got := carriesError([]byte(c.in)); got != c.want {
			t.Errorf("%q: %v want %v", c.in, got, c.want)
		}
	}
	// A chat stream's error event puts its mark first: only that is looked at.
	for _, c := range []struct {
		in   string
		want bool
	}{
		{"data:{\"error\":{}}\n\n", true},
		{"data: {\"error\": {\"message\": \"x\"}}\r\n\r\n", true},
		{"data: {\"x\":1}\r\rdata: {\"error\": {\"message\": \"x\"}}\r\r", true},
		{"data: {\"x\":1}\n\ndata: { \"object\": \"error\", \"message\": \"m\"}\n\n", true},
		{"data: {\"error\": {\"object\": \"error\", \"message\": \"m\"}}\n\n", true},
		{"data: {\"id\":\"c\",\"error\":\"\"}\n\n", false},
		{"data: {\"choices\":[{\"logprobs\":{\"top_logprobs\":[{\"error\":-1}]}}]}\n\n", false},
		{"data: {\"error\":null}\n\n", false},
		{"data: {\"error\": null, \"x\": 1}\n\n", false},
		{": {\"error\":1}\n\n", false},
		{"data: \"error\"\n\n", false},
		{"data: {\"object\":\"chat.completion.chunk\",\"choices\":[{\"delta\":{\"content\":\"error\"}}]}\n\n", false},
		{"data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"function\":{\"arguments\":\"{\\\"error\\\": {\\\"type\\\": \\\"error\\\"}}\"}}]}}]}\n\n", false},
	} {
		if got := chatCarriesError([]byte(c.in)); got != c.want {
			t.Errorf("chat stream %q: %v want %v", c.in, got, c.want)
		}
	}
	for _, c := range []struct {
		in   string
		want bool
	}{
		{"event: response.failed\ndata: {\"type\":\"response.failed\",\"sequence_number\":4,\"response\":{\"status\":\"failed\"}}\n\n", true},
		{"event: response.failed\r\ndata: {\"type\": \"response.failed\", \"sequence_number\": 4}\r\n\r\n", true},
		{"event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"metadata\":{\"type\":\"response.failed\"}}}\n\n", false},
	} {
		if got := responseFailed([]byte(c.in)); got != c.want {
			t.Errorf("response.failed in %q: %v want %v", c.in, got, c.want)
		}
	}
}

// The chat stream's check (the mark first in an event's data) finds
// nothing the general one (the mark anywhere directly in the data) would
// not, and neither panics on any bytes.
func FuzzChatErrorCheckIsWithinTheGeneralOne(f *testing.F) {
	for _, s := range []string{"data: {\"error\":{}}\n\n", "data: { \"object\": \"error\"}\r\r", "data:{\"type\":\"error\"}\r\n\r\n", "data: {\"x\":1}\n\ndata: {\"error\":null}\n\n", "data: {"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, p []byte) {
		if chatCarriesError(p) && !carriesError(p) {
			t.Fatalf("%q: an error event for a chat stream only", p)
		}
	})
}

func TestEngineErrorStatusReadsTheErrorEventsCode(t *testing.T) {
	for in, want := range map[string]int{
		"data: {\"x\":1}\n\ndata: {\"error\":{\"message\":\"m\",\"code\":400}}\n\n":     400,
		"data:{\"object\":\"error\",\"message\":\"m\",\"code\":503}\r\n\r\n":            503,
		"data: {\"error\":{\"message\":\"m\",\"code\":\"bad\"}}\n\n":                    0,
		"data: {\"error\":{\"message\":\"m\"}}\n\n":                                     0,
		"data: {\"error\":{\"message\":\"m\",\"code\":200}}\n\n":                        0,
		"data: {\"id\":\"c\",\"choices\":[{\"delta\":{\"content\":\"code 400\"}}]}\n\n": 0,
		"data: {\"error\":{\"code\":4":                                                  0,
	} {
		if got := engineErrorStatus([]byte(in)); got != want {
			t.Errorf("%q: %d, want %d", in, got, want)
		}
	}
}

// An engine's stream that carries its error event after chunks with their
// usage so far (continuous usage stats), read whole in the first read, adds
// no tokens to the router's metrics: the usage so far is not the request's
// (relay.CloseWithError drops it alike for a stream relayed in parts).
func TestAFailedStreamReadWholeCountsNoUsageSoFar(t *testing.T) {
	up := startRaw(t, func(n int, req string, c net.Conn) {
		body := `data: {"id":"x","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{"content":"Hel"},"finish_reason":null}],"usage":{"prompt_tokens":7,"total_tokens":8,"completion_tokens":1}}` + "\n\n" +
			`data: {"error":{"message":"engine blew up","type":"InternalServerError","code":500}}` + "\n\n" + "data: [DONE]\n\n"
		fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	})
	r := startRouter(t, nil, nil, up.url)
	prompt0, out0 := mPromptTokens.Get(), mOutputTokens.Get()
	resp, b := postH(t, r.url+"/v1/chat/completions", `{"model":"m","stream":true,"stream_options":{"continuous_usage_stats":true},"messages":[{"role":"user","content":"hi"}]}`, nil)
	if resp.StatusCode != 200 || !strings.Contains(b, "engine blew up") {
		t.Fatalf("%d %q", resp.StatusCode, b)
	}
	if dp, dc := mPromptTokens.Get()-prompt0, mOutputTokens.Get()-out0; dp != 0 || dc != 0 {
		t.Errorf("a failed stream counted %d prompt and %d completion tokens (its first chunk's usage so far)", dp, dc)
	}
}
