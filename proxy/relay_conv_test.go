package proxy

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

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
