package admin

import (
	"io"
	"net"
	"strings"
	"testing"
	"time"
)

// A request that carries both Content-Length and Transfer-Encoding: chunked
// is read as chunked, and an HTTP/1.0 request with Transfer-Encoding by its
// Content-Length alone (net/http ignores the coding there); either way the
// connection closes after its answer (RFC 9112 section 6.1: a front proxy
// that framed it otherwise reads the bytes that follow as another request
// than the listener does). net/http kept both open and answered the next
// request on them.
func TestARequestWithContentLengthAndChunkedClosesItsConnection(t *testing.T) {
	e := newEnv(t, envOpts{})
	next := "GET /api/version HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer " + testKey + "\r\n\r\n"
	for _, head := range []string{
		"GET /api/version HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n",
		"GET /api/version HTTP/1.0\r\nConnection: keep-alive\r\nTransfer-Encoding: chunked\r\n",
	} {
		c, err := net.Dial("tcp", strings.TrimPrefix(e.srv.URL, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(5 * time.Second))
		req := head + "Host: 127.0.0.1\r\nAuthorization: Bearer " + testKey + "\r\n\r\n0\r\n\r\n" + next
		if _, err := c.Write([]byte(req)); err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(c)
		c.Close()
		if n := strings.Count(string(b), "HTTP/1."); n != 1 || !strings.Contains(string(b), " 200 OK\r\n") {
			t.Fatalf("%q: want one answer (200) and the connection closed, got %d answers:\n%s", head, n, b)
		}
		if !strings.Contains(strings.ToLower(string(b)), "connection: close") {
			t.Fatalf("%q: the answer does not say Connection: close:\n%s", head, b)
		}
	}
}
