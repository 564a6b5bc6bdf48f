package proxy

import (
	"bufio"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

// panickingBody is a response body whose writer panics after its first
// bytes, as a bug in the relay would.
type panickingBody struct{ sent bool }

func (p *panickingBody) Read(b []byte) (int, error) {
	if !p.sent {
		p.sent = true
		return copy(b, "data: {}\n\n"), nil
	}
	panic("relay bug: index out of range")
}

// TestAPanicInAResponseBodysWriterIsLoggedAsAnError: fasthttp recovers a
// panic of a streamed body's writer and cuts the answer; the router logs
// it at ERROR with the panic's text (it logged "http server: error when
// serving connection", throttled, so a relay bug looked like a network
// fault), and counts it apart from client errors.
func TestAPanicInAResponseBodysWriterIsLoggedAsAnError(t *testing.T) {
	logs := captureLogs(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &fasthttp.Server{Logger: serverLogger{}, Handler: func(ctx *fasthttp.RequestCtx) {
		ctx.SetBodyStream(&panickingBody{}, -1)
	}}
	go srv.Serve(ln) //nolint:errcheck // ends with Shutdown
	defer srv.Shutdown()
	panics, clientErrs := mBodyPanics.Get(), mClientErrors.Get()

	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n")); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	for { // the head and the first chunk, then the cut
		if _, err := br.ReadString('\n'); err != nil {
			break
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(logs.String(), "level=ERROR") && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	out := logs.String()
	if !strings.Contains(out, "level=ERROR") || !strings.Contains(out, "writer panicked") || !strings.Contains(out, "relay bug: index out of range") {
		t.Fatalf("no error logged with the panic's text:\n%s", out)
	}
	if mBodyPanics.Get() != panics+1 || mClientErrors.Get() != clientErrs {
		t.Fatalf("body panics %d -> %d, client errors %d -> %d", panics, mBodyPanics.Get(), clientErrs, mClientErrors.Get())
	}
}
