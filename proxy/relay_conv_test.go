package proxy

import (
	"bufio"
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
