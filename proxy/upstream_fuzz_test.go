package proxy

import (
	"bufio"
	"bytes"
	"io"
	"net/http"
	"strings"
	"testing"
)

// parseResponse runs the upstream client's response parser over b: the head,
// then the body with coalescing reads. It returns the body, whether the
// connection could be reused, and the first error.
func parseResponse(b []byte) (status int, body []byte, reusable bool, err error) {
	c := &upConn{br: bufio.NewReaderSize(bytes.NewReader(b), 4096)}
	if err = c.readHead(); err != nil {
		return 0, nil, false, err
	}
	buf := make([]byte, 1024)
	for i := 0; i < 1<<16; i++ {
		n, rerr := c.read(buf)
		body = append(body, buf[:n]...)
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			return c.Code, body, false, rerr
		}
		if n == 0 && c.eof {
			break
		}
	}
	reusable = c.eof && c.bodyErr == nil && !c.CloseAfter && c.br.Buffered() == 0
	return c.Code, body, reusable, nil
}

func TestUpstreamResponseParsing(t *testing.T) {
	f := func(in string, wantStatus int, wantBody string, wantReuse bool) {
		t.Helper()
		st, body, reuse, err := parseResponse([]byte(in))
		if err != nil || st != wantStatus || string(body) != wantBody || reuse != wantReuse {
			t.Fatalf("%q: status %d body %q reuse %v err %v", in, st, body, reuse, err)
		}
	}
	bad := func(in string) {
		t.Helper()
		if _, _, reuse, err := parseResponse([]byte(in)); err == nil || reuse {
			t.Fatalf("%q: accepted (reuse %v)", in, reuse)
		}
	}
	f("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello", 200, "hello", true)
	f("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\nX-T: 1\r\n\r\n", 200, "hello world", true)
	f("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\nok", 201, "ok", true)
	f("HTTP/1.1 204 No Content\r\n\r\n", 204, "", true)
	f("HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok", 200, "ok", false)
	f("HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok", 200, "ok", false)
	f("HTTP/1.1 200 OK\r\n\r\nuntil close", 200, "until close", false)
	// An extra response after the answer: never reusable.
	f("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokHTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nevil", 200, "ok", false)
	bad("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n")
	bad("HTTP/1.1 200 OK\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n")
	bad("HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nok")
	// net/http compares Content-Lengths as written, and judges an interim head's framing.
	bad("HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 02\r\n\r\nok")
	bad("HTTP/1.1 103 Early Hints\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
	bad("HTTP/1.1 103 Early Hints\r\nTransfer-Encoding: gzip\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
	f("HTTP/1.1 103 Early Hints\r\nConnection: close\r\nTransfer-Encoding: chunked\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", 200, "ok", true)
	f("HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length:  2 \r\n\r\nok", 200, "ok", true)
	bad("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n")
	bad("HTTP/1.1 200 OK\r\n Folded: x\r\n\r\n")
	bad("HTTP/2 200\r\n\r\n")
	bad("HTTP/1.1 20 OK\r\n\r\n")
	bad("HTTP/1.1 600 OK\r\nContent-Length: 2\r\n\r\nok") // RFC 9110 section 15: invalid
	bad("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhel")
	bad("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n")
	bad("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhelloXX0\r\n\r\n")
	bad("HTTP/1.1 200 OK\r\nBad\x00Header: 1\r\n\r\n")
	// Chunked framing net/http refuses (the worker reads its engine with it).
	bad("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\nok\n0\n\n")
	bad("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\n0\r\n\r\n")
	bad("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n 2\r\nok\r\n0\r\n\r\n")
	bad("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2 ;x\r\nok\r\n0\r\n\r\n")
	bad("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\nnot a header\r\n\r\n")
	f("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2 \r\nok\r\n0\r\nX-T: 1\r\n\r\n", 200, "ok", true)
	// net/http folds a trailer line that starts with white space into the
	// one before it, and refuses framing past its allowance (16 bytes a
	// chunk and twice its data, plus 16 KiB).
	f("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\nX-T: 1\r\n 2\r\n\r\n", 200, "ok", true)
	bad("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n X-T: 1\r\n\r\n")
	bad("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + strings.Repeat("1;"+strings.Repeat("x", 2000)+"\r\nk\r\n", 10) + "0\r\n\r\n")
	f("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"+strings.Repeat("1;"+strings.Repeat("x", 2000)+"\r\nk\r\n", 8)+"0\r\n\r\n", 200, "kkkkkkkk", true)
}

// FuzzUpstreamResponse feeds arbitrary engine bytes to the upstream
// client's parser: it never panics or loops, and whenever it and Go's
// net/http both accept a response, they agree on status and body.
func FuzzUpstreamResponse(f *testing.F) {
	for _, s := range []string{
		"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
		"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
		"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n12\r\ndata: {\"i\":0}\n\n\r\n0\r\n\r\n",
		"HTTP/1.1 101 Switching Protocols\r\n\r\n",
		"HTTP/1.0 200 OK\r\n\r\nbody",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		st, body, _, err := parseResponse(b)
		if err != nil {
			return
		}
		resp, herr := http.ReadResponse(bufio.NewReader(bytes.NewReader(b)), nil)
		if herr != nil {
			return
		}
		hb, herr := io.ReadAll(resp.Body)
		if herr != nil || resp.StatusCode < 200 {
			return
		}
		if resp.StatusCode != st || !bytes.Equal(hb, body) {
			t.Fatalf("status %d vs net/http %d; body %q vs %q", st, resp.StatusCode, body, hb)
		}
	})
}
