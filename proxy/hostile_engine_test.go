package proxy

import (
	"bufio"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/infera/infera/config"
	"github.com/infera/infera/internal/h1"
	"github.com/infera/infera/internal/testsrv"
)

// Attacks on the router from the engine's side, with real sockets: heads
// and bodies a faulty or hostile engine may send. Each case checks what
// the client gets and in which shape, that the next request is served (on
// a fresh connection when the first was poisoned), and that no request
// state, load or upstream connection is left held.

// hostileAnswer is a response with head (status line and headers, each
// line ended) and body, framed by its Content-Length.
func hostileAnswer(head, body string) string {
	return head + "Content-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body
}

// checkNothingHeld waits until the router holds no request state, its
// workers no load, and their pools no connection in use.
func checkNothingHeld(t *testing.T, r *testRouter) {
	t.Helper()
	waitFor(t, func() bool {
		if r.srv.states.n.Load() != 0 {
			return false
		}
		for _, w := range r.fl.View().All {
			if w.Load.Requests.Load() != 0 {
				return false
			}
			if p, ok := w.Client.(*httpPool); ok {
				p.mu.Lock()
				inUse := p.open - len(p.idle)
				p.mu.Unlock()
				if inUse != 0 {
					return false
				}
			}
		}
		return true
	}, "requests, loads and upstream connections released")
}

// hostilePost posts body to url+path with a bounded client.
func hostilePost(t *testing.T, url, path, body string) (int, string, http.Header) {
	t.Helper()
	c := &http.Client{Timeout: 10 * time.Second}
	resp, err := c.Post(url+path, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatalf("POST %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("POST %s: body: %v (%q)", path, err, b)
	}
	return resp.StatusCode, string(b), resp.Header
}

// hostileEngine answers its first request with answer (closing the
// connection after it when closeAfter), every later one with okJSON.
func hostileEngine(t *testing.T, answer string, closeAfter bool) *rawUpstream {
	return startRaw(t, func(n int, req string, c net.Conn) {
		if n == 1 {
			c.Write([]byte(answer))
			if closeAfter {
				c.Close()
			}
			return
		}
		c.Write([]byte(jsonAnswer(okJSON)))
	})
}

// checkHostileOutcome checks the client's answer to a hostile engine's
// first answer: want (200: okJSON's content, in the endpoint's shape; 502:
// the endpoint's error shape with upstream_protocol_error), then a second
// request served, on the same connection only when reuse, and nothing
// held.
func checkHostileOutcome(t *testing.T, r *testRouter, up *rawUpstream, path string, want int, reuse bool) {
	t.Helper()
	body := chatBody
	if path == "/v1/messages" {
		body = anthropicBody
	}
	code, b, h := hostilePost(t, r.url, path, body)
	if code != want {
		t.Fatalf("client got %d %q, want %d", code, b, want)
	}
	switch {
	case want == 200 && !strings.Contains(b, `"hi"`):
		t.Fatalf("client got %q", b)
	case want == 502 && path == "/v1/messages":
		checkAnthropicError(t, b, "api_error")
	case want == 502:
		checkOpenAIError(t, b)
		if !strings.Contains(b, "upstream_protocol_error") {
			t.Fatalf("client got %q, want upstream_protocol_error", b)
		}
	}
	for k, vs := range h {
		if strings.HasPrefix(k, "X-Evil") || strings.HasPrefix(k, "Access-Control") || h1.KindOf([]byte(k)).Hop() || k == "Set-Cookie" || k == "X-Infera-Worker" {
			t.Fatalf("client got the engine's %s: %q", k, vs)
		}
		for _, v := range vs {
			if strings.Contains(v, "evil") {
				t.Fatalf("client got %s: %q", k, v)
			}
		}
	}
	if code, b, _ := hostilePost(t, r.url, path, body); code != 200 || !strings.Contains(b, `"hi"`) {
		t.Fatalf("next request: %d %q", code, b)
	}
	wantConns := int64(2)
	if reuse {
		wantConns = 1
	}
	if n := up.conns.Load(); n != wantConns {
		t.Fatalf("engine connections: %d, want %d", n, wantConns)
	}
	checkNothingHeld(t, r)
}

// TestAHostileEnginesAnswerIsRelayedCleanOrRefusedWithA502: every head and
// body below is either relayed as the engine's answer (its framing and
// hop-by-hop headers not), on a connection kept only when the answer was
// exactly one complete response, or refused with 502
// upstream_protocol_error in the endpoint's error shape (OpenAI's, or
// Anthropic's on /v1/messages), its connection closed.
func TestAHostileEnginesAnswerIsRelayedCleanOrRefusedWithA502(t *testing.T) {
	ok := okJSON
	chunked := func(te string) string {
		return "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: " + te + "\r\n\r\n" + strconv.FormatInt(int64(len(ok)), 16) + "\r\n" + ok + "\r\n0\r\n\r\n"
	}
	// A head at h1's limit on the bytes of names and values, to the byte
	// (the line being added counts whole: its ": " too).
	atLen := func(d int) string {
		line := "X-Big: " + strings.Repeat("v", 8000) + "\r\n"
		cl := strconv.Itoa(len(ok))
		last := h1.MaxHeaderLen - len("Content-Type"+"application/json") - len("Content-Length"+cl) - 8*(len("X-Big")+8000) - len("X-Last: ") + d
		return "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: " + cl + "\r\n" + strings.Repeat(line, 8) + "X-Last: " + strings.Repeat("w", last) + "\r\n\r\n" + ok
	}
	for _, tc := range []struct {
		name       string
		answer     string
		closeAfter bool // the engine closes its connection after answer
		want       int  // 200 or 502
		reuse      bool // the connection serves the next request
	}{
		{"plain", jsonAnswer(ok), false, 200, true},
		{"bare LF line ends", "HTTP/1.1 200 OK\nContent-Type: application/json\nContent-Length: " + strconv.Itoa(len(ok)) + "\n\n" + ok, false, 200, true},
		{"no reason phrase", hostileAnswer("HTTP/1.1 200\r\nContent-Type: application/json\r\n", ok), false, 200, true},
		{"HTTP/1.0", hostileAnswer("HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n", ok), false, 200, false},
		{"HTTP/2.0", hostileAnswer("HTTP/2.0 200 OK\r\n", ok), false, 502, false},
		{"status 000", hostileAnswer("HTTP/1.1 000 OK\r\n", ok), false, 502, false},
		{"status 099", hostileAnswer("HTTP/1.1 099 OK\r\n", ok), false, 502, false},
		{"status 1000", hostileAnswer("HTTP/1.1 1000 OK\r\n", ok), false, 502, false},
		// RFC 9110 section 15: codes outside 100-599 are invalid, and a
		// client takes them as 5xx; the router relayed them as they came.
		{"status 600", hostileAnswer("HTTP/1.1 600 OK\r\nContent-Type: application/json\r\n", ok), false, 502, false},
		{"status 999", hostileAnswer("HTTP/1.1 999 OK\r\nContent-Type: application/json\r\n", ok), false, 502, false},
		{"garbage", "garbage\r\n\r\n", false, 502, false},
		{"obs-fold", hostileAnswer("HTTP/1.1 200 OK\r\nX-A: 1\r\n 2\r\n", ok), false, 502, false},
		{"CR in a value", hostileAnswer("HTTP/1.1 200 OK\r\nX-A: 1\r2\r\n", ok), false, 502, false},
		// A CR alone ends no line here, but other readers end one at it
		// (RFC 9112 section 2.2): a status line with one is invalid, as
		// nginx's upstream parser has it. It was read as a reason phrase
		// holding a Content-Length that is none.
		{"CR line ends", "HTTP/1.1 200 OK\rContent-Length: 2\r\r\n\r\n" + ok, true, 502, false},
		{"NUL in the reason", hostileAnswer("HTTP/1.1 200 O\x00K\r\nContent-Type: application/json\r\n", ok), false, 502, false},
		{"HT and obs-text in the reason", hostileAnswer("HTTP/1.1 200 O\tK \xe9\r\nContent-Type: application/json\r\n", ok), false, 200, true},
		{"NUL in a name", hostileAnswer("HTTP/1.1 200 OK\r\nX\x00A: 1\r\n", ok), false, 502, false},
		{"NUL in a value", hostileAnswer("HTTP/1.1 200 OK\r\nX-A: 1\x002\r\n", ok), false, 502, false},
		{"DEL in a value", hostileAnswer("HTTP/1.1 200 OK\r\nX-A: 1\x7f\r\n", ok), false, 502, false},
		{"space before the colon", hostileAnswer("HTTP/1.1 200 OK\r\nX-A : 1\r\n", ok), false, 502, false},
		{"empty name", hostileAnswer("HTTP/1.1 200 OK\r\n: 1\r\n", ok), false, 502, false},
		{"a name that is no token", hostileAnswer("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Evil(A): 1\r\n", ok), false, 200, true},
		{"Content-Length twice alike", hostileAnswer("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "+strconv.Itoa(len(ok))+"\r\n", ok), false, 200, true},
		{"Content-Lengths that differ", hostileAnswer("HTTP/1.1 200 OK\r\nContent-Length: 1\r\n", ok), false, 502, false},
		{"Content-Length 1, 1", "HTTP/1.1 200 OK\r\nContent-Length: 1, 1\r\n\r\n" + ok, false, 502, false},
		{"Content-Length +n", "HTTP/1.1 200 OK\r\nContent-Length: +" + strconv.Itoa(len(ok)) + "\r\n\r\n" + ok, false, 502, false},
		{"Content-Length -1", "HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n" + ok, false, 502, false},
		{"Content-Length past int64", "HTTP/1.1 200 OK\r\nContent-Length: 99999999999999999999\r\n\r\n" + ok, false, 502, false},
		{"Content-Length of 18 digits, then a close", "HTTP/1.1 200 OK\r\nContent-Length: 999999999999999999\r\n\r\n" + ok, true, 502, false},
		{"Content-Length and chunked", "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n" + chunked("chunked")[len("HTTP/1.1 200 OK\r\n"):], false, 502, false},
		{"chunked, identity", chunked("chunked, identity"), false, 502, false},
		{"gzip, chunked", chunked("gzip, chunked"), false, 502, false},
		{"Chunked", chunked("Chunked"), false, 200, true},
		{"chunked twice", chunked("chunked\r\nTransfer-Encoding: chunked"), false, 502, false},
		{"empty Transfer-Encoding", "HTTP/1.1 200 OK\r\nTransfer-Encoding: \r\n\r\n" + ok, true, 502, false},
		{"chunk extensions", strings.Replace(chunked("chunked"), "\r\n0\r\n", "\r\n0;a=b;c\r\n", 1), false, 200, true},
		{"a chunk size past int64", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1ffffffffffffffff\r\n" + ok + "\r\n0\r\n\r\n", false, 502, false},
		{"a chunk of 2^63-1, then a close", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n7fffffffffffffff\r\n" + ok, true, 502, false},
		{"no final CRLF, then a close", strings.TrimSuffix(chunked("chunked"), "\r\n"), true, 502, false},
		{"framing and hop-by-hop trailers", strings.Replace(chunked("chunked"), "\r\n0\r\n", "\r\n0\r\nContent-Length: 99\r\nTransfer-Encoding: gzip\r\nX-Evil-Trailer: t\r\n", 1), false, 200, true},
		{"a trailer with NUL", strings.Replace(chunked("chunked"), "\r\n0\r\n", "\r\n0\r\nX\x00: t\r\n", 1), false, 502, false},
		{"cut mid-chunk", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n400\r\n" + ok, true, 502, false},
		{"a chunk longer than its size", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\n" + ok + "\r\n0\r\n\r\n", false, 502, false},
		{"100 Continue", "HTTP/1.1 100 Continue\r\n\r\n" + jsonAnswer(ok), false, 200, true},
		{"102 Processing", "HTTP/1.1 102 Processing\r\n\r\n" + jsonAnswer(ok), false, 200, true},
		{"103 Early Hints with headers", "HTTP/1.1 103 Early Hints\r\nLink: </x>; rel=preload\r\nX-Evil: 1\r\n\r\n" + jsonAnswer(ok), false, 200, true},
		{"nine interim answers", strings.Repeat("HTTP/1.1 100 Continue\r\n\r\n", h1.MaxInterim+1) + jsonAnswer(ok), false, 502, false},
		{"an interim answer, then a close", "HTTP/1.1 100 Continue\r\n\r\n", true, 502, false},
		{"101 Switching Protocols", "HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\nConnection: Upgrade\r\n\r\n" + jsonAnswer(ok), false, 502, false},
		{"cut mid-status line", "HTTP/1.", true, 502, false},
		{"cut mid-head", "HTTP/1.1 200 OK\r\nContent-Le", true, 502, false},
		{"cut mid-body", jsonAnswer(ok)[:len(jsonAnswer(ok))-10], true, 502, false},
		{"close-delimited", "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n" + ok, true, 200, false},
		{"a second response smuggled after the first", jsonAnswer(ok) + hostileAnswer("HTTP/1.1 200 OK\r\n", `{"evil":1}`), false, 200, false},
		{"hop-by-hop and the router's own headers", hostileAnswer("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: X-Evil-Priv, keep-alive\r\nX-Evil-Priv: 1\r\nKeep-Alive: 5\r\nUpgrade: h2c\r\nTrailer: X\r\nProxy-Connection: x\r\nProxy-Authenticate: Basic\r\nTE: trailers\r\nSet-Cookie: a=evil\r\nServer: evil\r\nX-Infera-Worker: evil\r\nAccess-Control-Allow-Origin: *\r\nX-Request-Id: evil\r\nDate: evil\r\n", ok), false, 200, true},
		{"as many headers as allowed", hostileAnswer("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"+strings.Repeat("X-M: 1\r\n", h1.MaxHeaders-2), ok), false, 200, true},
		{"a header too many", hostileAnswer("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"+strings.Repeat("X-M: 1\r\n", h1.MaxHeaders-1), ok), false, 502, false},
		{"header bytes at the limit", atLen(0), false, 200, true},
		{"header bytes a byte over the limit", atLen(1), false, 502, false},
	} {
		for _, path := range []string{"/v1/chat/completions", "/v1/messages"} {
			t.Run(tc.name+path, func(t *testing.T) {
				up := hostileEngine(t, tc.answer, tc.closeAfter)
				f := defaultFlags()
				f.RequestMaxRetries = 0
				r := startRouter(t, f, nil, up.url)
				checkHostileOutcome(t, r, up, path, tc.want, tc.reuse)
			})
		}
	}
}

// hostileStream is a chat completion stream, chunked, its events in two
// chunks, the usage in the last event.
func hostileStream() string {
	events := "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"he\"},\"finish_reason\":null}]}\n\n" +
		"data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"llo\"},\"finish_reason\":\"stop\"}]}\n\n"
	last := "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"model\":\"m\",\"choices\":[],\"usage\":{\"prompt_tokens\":11,\"completion_tokens\":2,\"total_tokens\":13}}\n\ndata: [DONE]\n\n"
	return "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n" +
		strconv.FormatInt(int64(len(events)), 16) + "\r\n" + events + "\r\n" +
		strconv.FormatInt(int64(len(last)), 16) + "\r\n" + last + "\r\n0\r\n\r\n"
}

// TestAnAnswerSplitAtEveryByteIsReadWhole: an answer whose bytes come in
// two writes, split at any byte (inside the status line, a header, the
// chunk framing, an event's data: prefix or its usage JSON), is what it is
// in one write: the same JSON, the same event stream relayed, the same
// converted Anthropic stream with the engine's usage; so is one dribbled
// a byte a write; and every one of them on the one kept-alive connection.
func TestAnAnswerSplitAtEveryByteIsReadWhole(t *testing.T) {
	for _, tc := range []struct {
		name, path, body, answer string
	}{
		{"json", "/v1/chat/completions", chatBody, jsonAnswer(okJSON)},
		{"stream", "/v1/chat/completions", `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`, hostileStream()},
		{"converted stream", "/v1/messages", `{"model":"m","max_tokens":16,"stream":true,"messages":[{"role":"user","content":"hello"}]}`, hostileStream()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up := startRaw(t, func(n int, req string, c net.Conn) {
				if n > len(tc.answer)+1 {
					// Then dribbled, a byte a write.
					for i := range len(tc.answer) {
						c.Write([]byte(tc.answer[i : i+1]))
						time.Sleep(time.Millisecond)
					}
					return
				}
				i := n - 1
				c.Write([]byte(tc.answer[:i]))
				time.Sleep(2 * time.Millisecond)
				c.Write([]byte(tc.answer[i:]))
			})
			r := startRouter(t, nil, nil, up.url)
			want := ""
			for i := 0; i <= len(tc.answer)+1; i++ {
				code, b, _ := hostilePost(t, r.url, tc.path, tc.body)
				if tc.name == "converted stream" {
					// Its ids are the router's, one per answer.
					b = regexpReplace(`"id":"msg_[^"]*"`, b, `"id":"msg"`)
				}
				if i == 0 {
					want = b
					if code != 200 || !strings.Contains(b, `"hi"`) && !strings.Contains(b, "llo") {
						t.Fatalf("whole: %d %q", code, b)
					}
					if tc.name == "converted stream" && !strings.Contains(b, `"output_tokens":2`) {
						t.Fatalf("the engine's usage is not in the converted stream: %q", b)
					}
					continue
				}
				if i > len(tc.answer) && (code != 200 || b != want) {
					t.Fatalf("dribbled: %d %q, want %q", code, b, want)
				}
				if code != 200 || b != want {
					t.Fatalf("split at %d (%q|%q): %d %q, want %q", i, tc.answer[:i], tc.answer[i:], code, b, want)
				}
			}
			if n := up.conns.Load(); n != 1 {
				t.Fatalf("engine connections: %d, want 1", n)
			}
			checkNothingHeld(t, r)
		})
	}
}

func regexpReplace(pat, s, repl string) string {
	return regexp.MustCompile(pat).ReplaceAllString(s, repl)
}

// TestAnEarlyAnswerThatIsNoUsableResponseIsAnInvalidResponse: an engine
// that answers before it takes the request's body (then resets) with a
// 101, an interim answer alone or a head that breaks off has answered
// something that is no HTTP response, as it would have after the body: 502
// upstream_protocol_error, not 503 no_workers_reachable, which says no
// byte of a head came.
func TestAnEarlyAnswerThatIsNoUsableResponseIsAnInvalidResponse(t *testing.T) {
	for _, answer := range []string{
		"HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\nConnection: Upgrade\r\n\r\n",
		"HTTP/1.1 100 Continue\r\n\r\n",
		"HTTP/1.1 413 Payload Too Large\r\nContent-Le",
	} {
		t.Run(strings.Fields(answer)[1], func(t *testing.T) {
			ln, err := net.Listen("tcp4", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { ln.Close() })
			go func() {
				for i := 0; ; i++ {
					c, err := ln.Accept()
					if err != nil {
						return
					}
					go func(first bool) {
						defer c.Close()
						c.SetDeadline(time.Now().Add(10 * time.Second))
						br := bufio.NewReader(c)
						if !first {
							for {
								if _, err := readRawRequest(br); err != nil {
									return
								}
								c.Write([]byte(jsonAnswer(okJSON)))
							}
						}
						// The head only, then the answer, then a reset with
						// the body unread.
						for {
							if line, err := br.ReadString('\n'); err != nil || line == "\r\n" {
								break
							}
						}
						c.Write([]byte(answer))
						c.(*net.TCPConn).SetLinger(0)
					}(i == 0)
				}
			}()
			f := defaultFlags()
			f.MaxBodyBytes = 32 << 20
			f.RequestMaxRetries = 0
			r := startRouter(t, f, nil, "http://"+ln.Addr().String())
			big := `{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("a", 8<<20) + `"}]}`
			code, b, _ := hostilePost(t, r.url, "/v1/chat/completions", big)
			if code != 502 || !strings.Contains(b, "upstream_protocol_error") {
				t.Fatalf("client got %d %q, want 502 upstream_protocol_error", code, b)
			}
			checkOpenAIError(t, b)
			if code, b, _ := hostilePost(t, r.url, "/v1/chat/completions", chatBody); code != 200 {
				t.Fatalf("next request: %d %q", code, b)
			}
			checkNothingHeld(t, r)
		})
	}
}

// TestAnEngineThatStallsMidAnswerIsCutAtItsTimeout: a head or a body that
// stops short of its framing on a kept-alive connection holds the request
// only until its timeout (the non-streamed total, the stream's first
// packet or idle timeout); the client gets the endpoint's timeout answer
// (or, once a stream began, its error event), and the connection is not
// reused.
func TestAnEngineThatStallsMidAnswerIsCutAtItsTimeout(t *testing.T) {
	stream := `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`
	msgStream := `{"model":"m","max_tokens":16,"stream":true,"messages":[{"role":"user","content":"hello"}]}`
	shortSSE := "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: 1000\r\n\r\ndata: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n"
	for _, tc := range []struct {
		name, path, body, answer string
		want                     int
		wantIn                   string
	}{
		{"a body shorter than its Content-Length", "/v1/chat/completions", chatBody, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"id\":", 504, `"code":"timeout"`},
		{"a body shorter than its Content-Length, converted", "/v1/messages", anthropicBody, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"id\":", 504, `"type":"timeout_error"`},
		{"a head without its end", "/v1/chat/completions", stream, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n", 504, `"code":"timeout"`},
		{"a stream stalled inside its first event's data: prefix", "/v1/chat/completions", stream, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n3\r\ndat\r\n", 504, `"code":"timeout"`},
		{"a stream shorter than its Content-Length", "/v1/chat/completions", stream, shortSSE, 200, "data: {\"error\":"},
		{"a stream shorter than its Content-Length, converted", "/v1/messages", msgStream, shortSSE, 200, "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"timeout_error\""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up := startRaw(t, func(n int, req string, c net.Conn) {
				if n == 1 {
					c.Write([]byte(tc.answer)) // and nothing more, the connection open
					return
				}
				c.Write([]byte(jsonAnswer(okJSON)))
			})
			cfg := config.Default()
			cfg.Timeouts = config.Timeouts{StreamFirstPacketSeconds: 1, StreamIdleSeconds: 1, NonStreamTotalSeconds: 1}
			f := defaultFlags()
			f.RequestMaxRetries = 0
			r := startRouter(t, f, cfg, up.url)
			start := time.Now()
			code, b, _ := hostilePost(t, r.url, tc.path, tc.body)
			if took := time.Since(start); took > 3*time.Second {
				t.Fatalf("answered after %v, past the 1 s timeout", took)
			}
			if code != tc.want || !strings.Contains(b, tc.wantIn) {
				t.Fatalf("client got %d %q, want %d with %q", code, b, tc.want, tc.wantIn)
			}
			if code == 504 && tc.path == "/v1/messages" {
				checkAnthropicError(t, b, "timeout_error")
			} else if code == 504 {
				checkOpenAIError(t, b)
			}
			body := chatBody
			if tc.path == "/v1/messages" {
				body = anthropicBody
			}
			if code, b, _ := hostilePost(t, r.url, tc.path, body); code != 200 {
				t.Fatalf("next request: %d %q", code, b)
			}
			if n := up.conns.Load(); n != 2 {
				t.Fatalf("engine connections: %d, want 2", n)
			}
			checkNothingHeld(t, r)
		})
	}
}

// TestAnUnsolicitedResponseOnAnIdleTLSConnectionNeverReachesTheNextClient:
// over TLS the pool's peek at the socket cannot tell an engine's stray
// response from TLS records of its own (session tickets), so it looked at
// nothing: an extra response an engine sent while its connection idled
// (a second copy of the last answer, say) was the next client's answer.
// startTLSEngineWithStrayAnswer starts an https engine that answers every
// request and, on its first connection only, sends a second, unsolicited
// answer after the first; strayed is closed once that is written.
func startTLSEngineWithStrayAnswer(t *testing.T) (url string, ca testsrv.Certs, conns *atomic.Int64, strayed chan struct{}) {
	t.Helper()
	c := testsrv.GenCerts(t)
	cert, err := tls.LoadX509KeyPair(c.ServerCert, c.ServerKey)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := tls.Listen("tcp4", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{cert}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	conns = new(atomic.Int64)
	strayed = make(chan struct{})
	go func() {
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			first := conns.Add(1) == 1
			go func() {
				defer nc.Close()
				nc.SetDeadline(time.Now().Add(10 * time.Second))
				br := bufio.NewReader(nc)
				for n := 0; ; n++ {
					if _, err := readRawRequest(br); err != nil {
						return
					}
					nc.Write([]byte(jsonAnswer(okJSON)))
					if first && n == 0 {
						time.Sleep(50 * time.Millisecond) // the answer is read, the connection idles
						nc.Write([]byte(jsonAnswer(`{"evil":true}`)))
						close(strayed)
					}
				}
			}()
		}
	}()
	return "https://" + ln.Addr().String(), c, conns, strayed
}

func TestAnUnsolicitedResponseOnAnIdleTLSConnectionNeverReachesTheNextClient(t *testing.T) {
	url, ca, conns, strayed := startTLSEngineWithStrayAnswer(t)
	r := startRouter(t, nil, nil, url)
	p := r.fl.View().All[0].Client.(*httpPool)
	p.tlsCfg.RootCAs = ca.Pool(t)
	for i := 0; i < 3; i++ {
		code, b, _ := hostilePost(t, r.url, "/v1/chat/completions", chatBody)
		if code != 200 || strings.Contains(b, "evil") {
			t.Fatalf("request %d: %d %q", i, code, b)
		}
		if i == 0 {
			<-strayed // written on loopback: in the router's socket now
		}
	}
	if n := conns.Load(); n != 2 {
		t.Fatalf("engine connections: %d, want 2 (the one with the stray answer closed, the next kept)", n)
	}
	checkNothingHeld(t, r)
}

// The check of an idle TLS connection reads what arrived through TLS within
// a short wait; a check that runs after its wait has passed (its goroutine
// descheduled on a loaded machine) reads nothing. That is no proof of
// silence: the bytes are still in the socket, and the connection is closed.
func TestAnIdleTLSConnectionWhoseCheckRunsLateIsNotReused(t *testing.T) {
	old := upTLSQuietWait
	upTLSQuietWait = -time.Second // the wait is over before the read starts
	t.Cleanup(func() { upTLSQuietWait = old })
	url, ca, conns, strayed := startTLSEngineWithStrayAnswer(t)
	r := startRouter(t, nil, nil, url)
	p := r.fl.View().All[0].Client.(*httpPool)
	p.tlsCfg.RootCAs = ca.Pool(t)
	for i := 0; i < 2; i++ {
		code, b, _ := hostilePost(t, r.url, "/v1/chat/completions", chatBody)
		if code != 200 || strings.Contains(b, "evil") {
			t.Fatalf("request %d: %d %q", i, code, b)
		}
		if i == 0 {
			<-strayed
		}
	}
	if n := conns.Load(); n != 2 {
		t.Fatalf("engine connections: %d, want 2 (the one with the stray answer closed)", n)
	}
	checkNothingHeld(t, r)
}

// A redirect from a local engine is an invalid response (502), as from an
// external upstream: a client following its Location would reach the
// engine's own address past the gateway's keys, limits and quotas.
func TestARedirectFromAnEngineIsAnInvalidResponse(t *testing.T) {
	up := startRaw(t, func(n int, req string, c net.Conn) {
		c.Write([]byte("HTTP/1.1 307 Temporary Redirect\r\nLocation: http://10.1.2.3:8000/v1/chat/completions\r\nContent-Length: 0\r\n\r\n"))
	})
	f := defaultFlags()
	f.RequestMaxRetries = 0
	r := startRouter(t, f, nil, up.url)
	for _, tc := range []struct{ path, body string }{
		{"/v1/chat/completions", chatBody},
		{"/v1/chat/completions", `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`},
		{"/v1/messages", `{"model":"m","max_tokens":8,"messages":[{"role":"user","content":"hi"}]}`},
	} {
		resp, b := reNoRedirectPost(t, r.url+tc.path, tc.body)
		if resp.StatusCode != 502 || resp.Header.Get("Location") != "" || strings.Contains(b, "10.1.2.3") {
			t.Errorf("%s: an engine's redirect reached the client: %d Location %q body %.200q",
				tc.path, resp.StatusCode, resp.Header.Get("Location"), b)
			continue
		}
		if tc.path == "/v1/messages" {
			checkAnthropicError(t, b, "api_error")
		} else {
			checkOpenAIError(t, b)
		}
	}
}
