package proxy

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestAnAnswerBeforeTheBodyReachesAClientStillSendingIt: a 413 (body over
// --max-body-bytes, refused from its Content-Length) or a 401 (wrong key,
// refused before the body is read) is written while the client is still
// sending a large body. Closing the socket with that body unread would send
// a reset: the client's write fails, which the official SDKs report as
// "Connection error" (and retry the upload) without reading the answer.
// The lingering close lets the client finish sending and read the answer,
// over a real socket.
func TestAnAnswerBeforeTheBodyReachesAClientStillSendingIt(t *testing.T) {
	up := startUpstream(t, okHandler)
	f := defaultFlags()
	f.APIKey = "sk-linger-test"
	f.MaxBodyBytes = 1 << 20
	r := startRouter(t, f, nil, up.url)
	addr := strings.TrimPrefix(r.url, "http://")
	body := bytes.Repeat([]byte("x"), 32<<20)
	for _, c := range []struct {
		name, path, key string
		status          int
		code            string
	}{
		{"over --max-body-bytes", "/v1/chat/completions", f.APIKey, 413, "request_too_large"},
		{"over --max-body-bytes, Anthropic", "/v1/messages", f.APIKey, 413, "request_too_large"},
		{"wrong key", "/v1/chat/completions", "sk-wrong", 401, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			conn, err := net.Dial("tcp4", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			conn.SetDeadline(time.Now().Add(20 * time.Second))
			// As the SDKs do: the whole body first, then the answer.
			fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", c.path, c.key, len(body))
			if _, err := conn.Write(body); err != nil {
				// What the SDKs report as a connection error, never
				// reading the answer.
				t.Fatalf("sending the body: %v", err)
			}
			resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
			if err != nil {
				t.Fatalf("no answer: %v", err)
			}
			b, err := io.ReadAll(resp.Body)
			if err != nil {
				t.Fatalf("answer cut: %v (%q)", err, b)
			}
			if resp.StatusCode != c.status || !bytes.Contains(b, []byte(c.code)) {
				t.Fatalf("answer %d %s, want %d %s", resp.StatusCode, b, c.status, c.code)
			}
		})
	}
	if mLingeringCloses.Get() == 0 {
		t.Fatal("no lingering close counted")
	}
	// The lingering connections end and give their slots back.
	waitFor(t, func() bool { return r.srv.OpenConnections() == 0 }, "lingering connections closed")
}

// A chunked body over --max-body-bytes gets 413 with Connection: close,
// and the connection is closed after it: the rest of the body is not read
// as a request. writeError's reset of the response dropped the flag: the
// connection served the next request, after reading and discarding the
// rest of the body.
func TestA413ForAChunkedBodyClosesTheConnection(t *testing.T) {
	up := startUpstream(t, okHandler)
	f := defaultFlags()
	f.MaxBodyBytes = 100000
	r := startRouter(t, f, nil, up.url)
	conn := dialRouter(t, r.url)
	chunk := strings.Repeat("x", 150000)
	fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n", len(chunk), chunk)
	fmt.Fprintf(conn, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 413 || !resp.Close || !bytes.Contains(b, []byte("request_too_large")) {
		t.Fatalf("%d (close %v) %s", resp.StatusCode, resp.Close, b)
	}
	if resp, err := http.ReadResponse(br, nil); err == nil {
		t.Fatalf("the connection served another request after the 413: %d", resp.StatusCode)
	}
}

// A body that does not arrive within --body-timeout gets 408
// request_timeout (router.md's table), not 400.
func TestABodyPastTheBodyTimeoutGets408(t *testing.T) {
	up := startUpstream(t, okHandler)
	f := defaultFlags()
	f.BodyTimeout = 300 * time.Millisecond
	r := startRouter(t, f, nil, up.url)
	conn := dialRouter(t, r.url)
	// More than fasthttp reads with the head (8 KiB), then nothing.
	fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 20000\r\n\r\n%s", strings.Repeat("x", 9000))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 408 || !bytes.Contains(b, []byte("request_timeout")) {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
}

// A chunked body that stops arriving gets the same 408 request_timeout at
// --body-timeout wherever it stops: inside a chunk's data, and inside its
// framing too (a chunk size, its extension, the CRLF after its data).
// fasthttp wraps a read error in the framing in ErrBrokenChunk, which does
// not unwrap, so the deadline there was taken for a broken body: 400
// bad_request "request body not received".
func TestAChunkedBodyStalledInItsFramingGets408(t *testing.T) {
	up := startUpstream(t, okHandler)
	f := defaultFlags()
	f.BodyTimeout = 300 * time.Millisecond
	r := startRouter(t, f, nil, up.url)
	for _, c := range []struct{ name, path, sent, code string }{
		{"in a chunk's data", "/v1/chat/completions", "a\r\n{\"a\":", `"code":"request_timeout"`},
		{"in a chunk size", "/v1/chat/completions", "5", `"code":"request_timeout"`},
		{"in a chunk extension", "/v1/chat/completions", "5;x=y", `"code":"request_timeout"`},
		{"before the CRLF after a chunk", "/v1/chat/completions", "5\r\n{\"a\":", `"code":"request_timeout"`},
		{"before the CRLF after a chunk, Anthropic", "/v1/messages", "5\r\n{\"a\":", "not received within --body-timeout"},
	} {
		t.Run(c.name, func(t *testing.T) {
			conn := dialRouter(t, r.url)
			fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n%s", c.path, c.sent)
			resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != 408 || !resp.Close || !bytes.Contains(b, []byte(c.code)) {
				t.Fatalf("%d (close %v) %s", resp.StatusCode, resp.Close, b)
			}
		})
	}
}

// --body-timeout 0 is the default 60 s, as --header-timeout 0 is its
// default: the body is not left under the head's deadline. It was, so a
// body still arriving when --header-timeout (10 s) ran out got 408 "not
// received within --body-timeout".
func TestABodyTimeoutOfZeroIsTheDefaultNotTheHeaderTimeout(t *testing.T) {
	up := startUpstream(t, okHandler)
	f := defaultFlags()
	f.HeaderTimeout = 300 * time.Millisecond
	f.BodyTimeout = 0
	r := startRouter(t, f, nil, up.url)
	conn := dialRouter(t, r.url)
	body := `{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("x", 20000) + `"}]}`
	fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body[:9000])
	time.Sleep(800 * time.Millisecond) // past --header-timeout, well within the body's
	io.WriteString(conn, body[9000:])
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
}

// dialRouter opens a raw connection to the router at url, closed at the
// test's end, with a 10 s deadline.
func dialRouter(t *testing.T, url string) net.Conn {
	t.Helper()
	conn, err := net.Dial("tcp4", strings.TrimPrefix(url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	return conn
}

// /tokenize, /detokenize and /debug/route answer a body they cannot take
// as the inference endpoints do: 413 request_too_large over
// --max-body-bytes, read to its end first (lingering close), so a client
// still sending reads the answer; 408 past --body-timeout. They answered
// 400 "request body not accepted" and closed the socket on the unread
// body: the client's write was reset before it could read even that.
func TestTheIntrospectionEndpointsAnswerABodyTheyCannotTakeAsInferenceDoes(t *testing.T) {
	up := startUpstream(t, okHandler)
	f := defaultFlags()
	f.RouterPolicy = "kv-aware"
	f.MaxBodyBytes = 1 << 20
	f.BodyTimeout = 300 * time.Millisecond
	r := startRouter(t, f, nil, up.url)
	addr := strings.TrimPrefix(r.url, "http://")
	body := bytes.Repeat([]byte("x"), 32<<20)
	for _, path := range []string{"/tokenize", "/detokenize", "/debug/route"} {
		t.Run(path, func(t *testing.T) {
			conn, err := net.Dial("tcp4", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			conn.SetDeadline(time.Now().Add(20 * time.Second))
			fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", path, len(body))
			if _, err := conn.Write(body); err != nil {
				t.Fatalf("sending the body: %v", err)
			}
			resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
			if err != nil {
				t.Fatalf("no answer: %v", err)
			}
			b, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != 413 || !resp.Close || !bytes.Contains(b, []byte(`"code":"request_too_large"`)) {
				t.Fatalf("over --max-body-bytes: %d (close %v) %s", resp.StatusCode, resp.Close, b)
			}

			slow := dialRouter(t, r.url)
			fmt.Fprintf(slow, "POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 20000\r\n\r\n%s", path, strings.Repeat("x", 9000))
			resp, err = http.ReadResponse(bufio.NewReader(slow), nil)
			if err != nil {
				t.Fatal(err)
			}
			b, _ = io.ReadAll(resp.Body)
			if resp.StatusCode != 408 || !bytes.Contains(b, []byte("request_timeout")) {
				t.Fatalf("past --body-timeout: %d %s", resp.StatusCode, b)
			}
		})
	}
}

// --client-write-timeout 0 is its default (60 s), as the other timeouts'
// 0 is theirs: it switched the write bound off, so a client that stopped
// reading held its stream and the engine's slot until the engine finished.
func TestAClientWriteTimeoutOfZeroIsTheDefault(t *testing.T) {
	f := defaultFlags()
	f.ClientWriteTimeout = 0
	s := startRouter(t, f, nil).srv
	if s.srv.WriteTimeout != 60*time.Second || s.wto != 60*time.Second {
		t.Fatalf("write bound %v (relay %v), want 60s", s.srv.WriteTimeout, s.wto)
	}
}
