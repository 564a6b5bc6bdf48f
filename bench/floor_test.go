package bench

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"runtime"
	"strings"
	"testing"
	"time"
)

// exchange sends raw HTTP/1.1 requests one after another on one keep-alive
// connection to addr and reads each whole response (decoded).
func exchange(t *testing.T, addr string, reqs ...string) []string {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	var out []string
	buf := make([]byte, 4096)
	for _, r := range reqs {
		if _, err := io.WriteString(c, r); err != nil {
			t.Fatal(err)
		}
		var fr frame
		var got []byte
		for done := false; !done; {
			n, err := c.Read(buf)
			if err != nil {
				t.Fatalf("after %q: %v", got, err)
			}
			got = append(got, buf[:n]...)
			var ok bool
			if done, ok = fr.scan(buf[:n]); !ok {
				t.Fatalf("response head split across reads: %q", got)
			}
		}
		out = append(out, decoded(t, got))
	}
	return out
}

// decoded returns the response's head and its body with any chunked
// framing removed: how the engine's flushes fall into chunks depends on
// timing, the bytes of the body do not.
func decoded(t *testing.T, resp []byte) string {
	head, body, _ := bytes.Cut(resp, []byte("\r\n\r\n"))
	if bytes.Contains(head, []byte("chunked")) {
		b, err := io.ReadAll(httputil.NewChunkedReader(bufio.NewReader(bytes.NewReader(body))))
		if err != nil {
			t.Fatalf("%v: %q", err, resp)
		}
		body = b
	}
	return string(head) + "\r\n\r\n" + string(body)
}

func chatRequest(stream bool) string {
	body := chatBody(600, stream)
	return fmt.Sprintf("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
}

// startRelayFloors starts the goroutine floor and (on Linux) the epoll
// floor with loops loops in front of up; they stop with the test. It
// returns their addresses by name.
func startRelayFloors(t *testing.T, up string, loops int) map[string]string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = leanServe(ln, up) }()
	t.Cleanup(func() { ln.Close() })
	targets := map[string]string{"goroutine": ln.Addr().String()}
	if runtime.GOOS == "linux" {
		f, err := startEpollFloor("127.0.0.1:0", up, loops)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(f.Close)
		targets["epoll"] = f.addr
	}
	return targets
}

// The reference proxies of bench proxy --floors must deliver what the
// engine sent, JSON and chunked SSE alike, request after request on one
// connection; otherwise their CPU figures measure something else.
func TestFloorRelaysDeliverTheEnginesBytesOnKeepAlive(t *testing.T) {
	be, err := StartFixedBackend("m", 5)
	if err != nil {
		t.Fatal(err)
	}
	defer be.Close()
	up := strings.TrimPrefix(be.URL, "http://")
	reqs := []string{chatRequest(false), chatRequest(true), chatRequest(true), chatRequest(false)}
	want := exchange(t, up, reqs...)
	if !strings.Contains(want[1], "data: [DONE]") || !strings.Contains(want[1], "chunked") {
		t.Fatalf("backend SSE answer: %q", want[1])
	}
	targets := startRelayFloors(t, up, 2)
	for name, addr := range targets {
		for conn := range 3 { // the epoll floor's two loops share the port
			got := exchange(t, addr, reqs...)
			for i := range reqs {
				if got[i] != want[i] {
					t.Fatalf("%s, connection %d, request %d:\n got %q\nwant %q", name, conn, i, got[i], want[i])
				}
			}
		}
	}
	// The server floor answers through fasthttp's server, which writes its
	// own head (Date, Content-Length): the status, content type and body
	// must be the engine's.
	sln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := fasthttpFloor(up)
	go func() { _ = srv.Serve(sockioListener{sln}) }()
	defer srv.Shutdown()
	got := exchange(t, sln.Addr().String(), reqs...)
	for i := range reqs {
		wh, wb, _ := strings.Cut(want[i], "\r\n\r\n")
		gh, gb, _ := strings.Cut(got[i], "\r\n\r\n")
		wct := headerLine(wh, "Content-Type")
		if gb != wb || !strings.HasPrefix(gh, "HTTP/1.1 200 OK\r\n") || wct == "" || headerLine(gh, "Content-Type") != wct {
			t.Fatalf("server floor, request %d:\n got %q\nwant %q", i, got[i], want[i])
		}
	}
}

// headerLine returns the value of header name in head ("" if absent).
func headerLine(head, name string) string {
	for _, l := range strings.Split(head, "\r\n") {
		if k, v, ok := strings.Cut(l, ":"); ok && strings.EqualFold(k, name) {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// Closing the epoll floor ends its loops and frees its port.
func TestEpollFloorCloseFreesItsPort(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("epoll")
	}
	f, err := startEpollFloor("127.0.0.1:0", "127.0.0.1:9", 2)
	if err != nil {
		t.Fatal(err)
	}
	addr := f.addr
	f.Close()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("port still held after Close: %v", err)
	}
	ln.Close()
}

// chunkedBody encodes data as a chunked body cut into chunks of the sizes
// sizes gives (cycling), with an extension on odd chunks and a trailer
// when trailer is set.
func chunkedBody(data []byte, sizes []byte, trailer bool) []byte {
	var b bytes.Buffer
	for i := 0; len(data) > 0; i++ {
		n := 1
		if len(sizes) > 0 {
			n = int(sizes[i%len(sizes)]) + 1
		}
		n = min(n, len(data))
		if i%2 == 1 {
			fmt.Fprintf(&b, "%X;ext=1\r\n", n)
		} else {
			fmt.Fprintf(&b, "%x\r\n", n)
		}
		b.Write(data[:n])
		b.WriteString("\r\n")
		data = data[n:]
	}
	b.WriteString("0\r\n")
	if trailer {
		b.WriteString("X-Trailer: 1\r\n")
	}
	b.WriteString("\r\n")
	return b.Bytes()
}

// The framing finds the end of a chunked body exactly at its last byte,
// however reads split it, and agrees with net/http's chunked decoder on
// where that is.
func FuzzFrameFindsTheEndOfAChunkedBody(f *testing.F) {
	f.Add([]byte("data: {}\n\n"), []byte{3, 200}, []byte{1, 5}, false)
	f.Add([]byte("\r\n0\r\n\r\n"), []byte{0}, []byte{}, true)
	f.Add(bytes.Repeat([]byte("x"), 600), []byte{255, 17}, []byte{7, 7, 7}, true)
	f.Fuzz(func(t *testing.T, data, sizes, cuts []byte, trailer bool) {
		if len(data) > 1<<14 {
			return
		}
		body := chunkedBody(data, sizes, trailer)
		decoded, err := io.ReadAll(httputil.NewChunkedReader(bufio.NewReader(bytes.NewReader(body))))
		if err != nil || !bytes.Equal(decoded, data) {
			t.Fatalf("test encoder: %v", err)
		}
		resp := append([]byte("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"), body...)
		head := len(resp) - len(body)
		var fr frame
		off := 0
		for i := 0; off < len(resp); i++ {
			n := len(resp) - off
			if i == 0 {
				n = head + min(n-head, 1) // the head arrives whole, with a byte of body
			} else if len(cuts) > 0 {
				n = min(n, int(cuts[i%len(cuts)])+1)
			}
			done, ok := fr.scan(resp[off : off+n])
			if !ok {
				t.Fatal("head not found")
			}
			off += n
			if done != (off == len(resp)) {
				t.Fatalf("done=%v after %d of %d bytes", done, off, len(resp))
			}
		}
	})
}

// Content-Length framing: done exactly when the announced body has come.
func TestFrameContentLengthEndsAtTheLastByte(t *testing.T) {
	resp := []byte("HTTP/1.1 200 OK\r\ncontent-LENGTH: 5\r\n\r\nhello")
	for cut := 40; cut < len(resp); cut++ {
		var fr frame
		d1, ok := fr.scan(resp[:cut])
		d2, _ := fr.scan(resp[cut:])
		if !ok || d1 || !d2 {
			t.Fatalf("cut %d: %v %v %v", cut, ok, d1, d2)
		}
	}
	if n := requestEnd([]byte("POST / HTTP/1.1\r\nContent-Length: 3\r\n\r\nab")); n != 0 {
		t.Fatalf("incomplete request: end %d", n)
	}
	if n := requestEnd([]byte("GET / HTTP/1.1\r\n\r\nGET")); n != 18 {
		t.Fatalf("bodiless request: end %d, want 18", n)
	}
}

// A client that sends its next request before the answer (pipelining) gets
// both answers in order from the byte relays; the epoll loop must not spin
// on the unread bytes meanwhile.
func TestFloorRelaysAnswerPipelinedRequestsInOrder(t *testing.T) {
	be, err := StartFixedBackend("m", 3)
	if err != nil {
		t.Fatal(err)
	}
	defer be.Close()
	up := strings.TrimPrefix(be.URL, "http://")
	targets := startRelayFloors(t, up, 1)
	for name, addr := range targets {
		c, err := net.DialTimeout("tcp", addr, 2*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.WriteString(c, chatRequest(true)+chatRequest(false)); err != nil {
			t.Fatal(err)
		}
		br := bufio.NewReader(c)
		for i, wantType := range []string{"text/event-stream", "application/json"} {
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatalf("%s: answer %d: %v", name, i, err)
			}
			b, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil || resp.StatusCode != 200 || resp.Header.Get("Content-Type") != wantType || len(b) == 0 {
				t.Fatalf("%s: answer %d: %d %q %q (%v)", name, i, resp.StatusCode, resp.Header.Get("Content-Type"), b, err)
			}
		}
		c.Close()
	}
}
