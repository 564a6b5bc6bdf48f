package proxy

import (
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/infera/infera/config"
	"github.com/infera/infera/fleet"
)

// A passthrough Responses stream ends with its terminal event
// (response.completed or response.incomplete: a Responses stream has no
// [DONE], in OpenAI's API as in vLLM's serving_responses.py). An engine
// whose connection breaks after that event (a reset where the chunked
// body's last chunk belongs) gave the client a complete stream: it gets no
// error event after it, the worker is not blamed, and the usage of the
// terminal event is the request's (counted in infera_usage_tokens_total),
// as for a chat stream broken after its data: [DONE]
// (TestStreamBrokenAfterItsEndGetsNoErrorEvent), also when the engine
// did not terminate that event (no blank line) before the cut. One broken
// before it is still broken: the error event, and no usage.
func TestAResponsesStreamBrokenAfterItsTerminalEventIsComplete(t *testing.T) {
	for _, tc := range []struct {
		name, terminal string
		unterminated   bool
	}{
		{"completed", "response.completed", false}, {"incomplete", "response.incomplete", false},
		{"completed unterminated", "response.completed", true}, {"broken before its end", "", false},
	} {
		terminal := tc.terminal
		t.Run(tc.name, func(t *testing.T) {
			up := startRaw(t, func(n int, req string, c net.Conn) {
				c.Write([]byte("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"))
				ev := "event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"id\":\"resp_end1\",\"object\":\"response\",\"status\":\"in_progress\",\"usage\":null}}\n\n" +
					"event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"sequence_number\":1,\"item_id\":\"msg_1\",\"output_index\":0,\"content_index\":0,\"delta\":\"hi\"}\n\n" +
					"event: " + terminal + "\ndata: {\"type\":\"" + terminal + "\",\"sequence_number\":2,\"response\":{\"id\":\"resp_end1\",\"object\":\"response\",\"status\":\"" + strings.TrimPrefix(terminal, "response.") + "\",\"usage\":{\"input_tokens\":7,\"input_tokens_details\":{\"cached_tokens\":0},\"output_tokens\":5,\"output_tokens_details\":{\"reasoning_tokens\":0},\"total_tokens\":12}}}"
				if terminal == "" {
					ev = ev[:strings.LastIndex(ev, "event: ")] // broken before its end
				} else if !tc.unterminated {
					ev += "\n\n"
				}
				fmt.Fprintf(c, "%x\r\n%s\r\n", len(ev), ev)
				time.Sleep(50 * time.Millisecond)
				c.(*net.TCPConn).SetLinger(0)
				c.Close() // a reset where the last chunk belongs
			})
			f := defaultFlags()
			f.RequestMaxRetries = 0
			cfg := config.Default()
			cfg.Protocol.ResponsesPassthrough = true
			r := startRouter(t, f, cfg, up.url)
			before := midStreamErrors()
			p0, c0 := mPromptTokens.Get(), mOutputTokens.Get()
			code, b := post(t, r.url+"/v1/responses", `{"model":"m","input":"hello","stream":true}`)
			if terminal == "" {
				if code != 200 || !strings.Contains(b, "event: error") || mPromptTokens.Get() != p0 || mOutputTokens.Get() != c0 {
					t.Fatalf("a stream broken before its end: %d %q, usage %d %d", code, b, mPromptTokens.Get()-p0, mOutputTokens.Get()-c0)
				}
				return
			}
			if code != 200 || !strings.Contains(b, "event: "+terminal) || strings.Contains(b, "error") || strings.Count(b, "event: ") != 3 {
				t.Fatalf("%d %q, want the engine's three events and no error event", code, b)
			}
			if st := r.fl.Get("w0").Breaker.State(); st != fleet.BreakerClosed || midStreamErrors() != before {
				t.Fatalf("breaker %d, mid-stream errors %v -> %v: the worker was blamed for a complete stream", st, before, midStreamErrors())
			}
			if dp, dc := mPromptTokens.Get()-p0, mOutputTokens.Get()-c0; dp != 7 || dc != 5 {
				t.Fatalf("usage counted %d prompt and %d completion tokens, want the terminal event's 7 and 5", dp, dc)
			}
		})
	}
}

// A passthrough Responses stream whose body ends only when the engine
// closes its connection (HTTP/1.0, or Connection: close without framing)
// and that closes before its terminal event is broken, as a chat stream
// closed before its data: [DONE] is (TestACloseDelimitedStreamCutBeforeItsEndIsBroken):
// the client gets the error event and the worker is blamed. It was relayed
// as complete (the relay's tail cannot show a Responses stream's end). One
// that closes after its response.completed, or after the engine's own
// response.failed (the engine's error, relayed once), is not cut.
func TestACloseDelimitedResponsesStreamCutBeforeItsEndIsBroken(t *testing.T) {
	const created = "event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"id\":\"resp_cd1\",\"object\":\"response\",\"status\":\"in_progress\",\"usage\":null}}\n\n" +
		"event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"sequence_number\":1,\"item_id\":\"msg_1\",\"output_index\":0,\"content_index\":0,\"delta\":\"hi\"}\n\n"
	for _, tc := range []struct {
		name, end string
		cut       bool
	}{
		{"cut", "", true},
		{"completed", "event: response.completed\ndata: {\"type\":\"response.completed\",\"sequence_number\":2,\"response\":{\"id\":\"resp_cd1\",\"object\":\"response\",\"status\":\"completed\",\"usage\":{\"input_tokens\":7,\"output_tokens\":5,\"total_tokens\":12}}}\n\n", false},
		{"completed unterminated", "event: response.completed\ndata: {\"type\":\"response.completed\",\"sequence_number\":2,\"response\":{\"id\":\"resp_cd1\",\"object\":\"response\",\"status\":\"completed\",\"usage\":{\"input_tokens\":7,\"output_tokens\":5,\"total_tokens\":12}}}", false},
		{"failed", "event: response.failed\ndata: {\"type\":\"response.failed\",\"sequence_number\":2,\"response\":{\"id\":\"resp_cd1\",\"object\":\"response\",\"status\":\"failed\",\"error\":{\"code\":\"server_error\",\"message\":\"engine failure\"}}}\n\n", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up := startRaw(t, func(n int, req string, c net.Conn) {
				c.Write([]byte("HTTP/1.0 200 OK\r\nContent-Type: text/event-stream\r\n\r\n" + created))
				time.Sleep(30 * time.Millisecond)
				c.Write([]byte(tc.end))
				time.Sleep(30 * time.Millisecond)
				c.Close()
			})
			f := defaultFlags()
			f.RequestMaxRetries = 0
			f.BreakerFailureThreshold = 1
			cfg := config.Default()
			cfg.Protocol.ResponsesPassthrough = true
			r := startRouter(t, f, cfg, up.url)
			before := midStreamErrors()
			code, b := post(t, r.url+"/v1/responses", `{"model":"m","input":"hello","stream":true}`)
			broke := strings.Count(b, "the worker's response stream broke")
			if !tc.cut {
				if code != 200 || broke != 0 || !strings.HasSuffix(b, strings.TrimRight(tc.end, "\n")+"\n\n") && !strings.HasSuffix(b, tc.end) {
					t.Fatalf("a stream that ended: %d %q", code, b)
				}
				if tc.name != "failed" && (r.fl.Get("w0").Breaker.State() != fleet.BreakerClosed || midStreamErrors() != before) {
					t.Fatalf("the worker was blamed for a complete stream: mid-stream errors %v -> %v", before, midStreamErrors())
				}
				return
			}
			if code != 200 || broke != 1 || !strings.Contains(b, "event: error") {
				t.Fatalf("a cut stream reached the client as %d %q", code, b)
			}
			if st := r.fl.Get("w0").Breaker.State(); st == fleet.BreakerClosed || midStreamErrors() == before {
				t.Fatalf("the worker was not blamed: breaker %d, mid-stream errors %v -> %v", st, before, midStreamErrors())
			}
		})
	}
}
