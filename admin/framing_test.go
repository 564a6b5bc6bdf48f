package admin

import (
	"io"
	"net"
	"strings"
	"testing"
	"time"
)

// A request that carries both Content-Length and Transfer-Encoding: chunked
// is read as chunked, and the connection closes after its answer (RFC 9112
// section 6.1: a front proxy that framed it by its Content-Length reads the
// bytes that follow as another request than the listener does). net/http
// kept it open and answered the next request on it.
func TestARequestWithContentLengthAndChunkedClosesItsConnection(t *testing.T) {
	e := newEnv(t, envOpts{})
	c, err := net.Dial("tcp", strings.TrimPrefix(e.srv.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	next := "GET /api/version HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer " + testKey + "\r\n\r\n"
	req := "GET /api/version HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer " + testKey +
		"\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + next
	if _, err := c.Write([]byte(req)); err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(c)
	if n := strings.Count(string(b), "HTTP/1.1 "); n != 1 {
		t.Fatalf("want one answer and the connection closed, got %d answers:\n%s", n, b)
	}
	if !strings.Contains(strings.ToLower(string(b)), "connection: close") {
		t.Fatalf("the answer does not say Connection: close:\n%s", b)
	}
}
