package broker

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"net"
	"net/http/httptrace"
	"sync/atomic"

	"github.com/infera/infera/internal/h1"
)

// judgedConn is a connection to the engine whose response heads are judged
// by the router's own HTTP client rules (h1.Head.Read) before net/http
// reads them: net/http is laxer (it takes Content-Length beside chunked
// framing, and reads an HTTP/1.0 answer marked chunked as raw bytes), and
// an engine must be refused alike over NATS and over HTTP. A refused head
// fails the read with h1's error, which net/http returns wrapped
// (engineFailure: ReasonProtocol); the connection is then closed.
//
// A request marks its connection (expectHead, from httptrace's GotConn,
// before anything is written): the first bytes read after it begin the
// answer's head. Read is called by net/http's read loop only.
type judgedConn struct {
	net.Conn
	expect atomic.Bool

	head h1.Head
	br   *bufio.Reader // over rec, made at the first head
	rec  headRecorder
	// pending: bytes read while judging a head, not yet handed to net/http.
	pending []byte
	fbuf    []byte // a head without its unparsable header lines
}

// headRecorder reads the connection for a head being judged and keeps
// every byte, for net/http to read after the judgement.
type headRecorder struct {
	conn net.Conn
	buf  []byte
	fed  int // bytes of buf handed to the head reader
}

func (r *headRecorder) Read(b []byte) (int, error) {
	if r.fed < len(r.buf) {
		n := copy(b, r.buf[r.fed:])
		r.fed += n
		return n, nil
	}
	n, err := r.conn.Read(b)
	r.buf = append(r.buf, b[:n]...)
	r.fed += n
	return n, err
}

func (c *judgedConn) Read(p []byte) (int, error) {
	if len(c.pending) > 0 {
		n := copy(p, c.pending)
		c.pending = c.pending[n:]
		return n, nil
	}
	n, err := c.Conn.Read(p)
	if n == 0 || !c.expect.Swap(false) {
		return n, err
	}
	// p[:n] begins the answer: read the rest of its head and judge it.
	c.rec.conn = c.Conn
	c.rec.buf = append(c.rec.buf[:0], p[:n]...)
	c.rec.fed = 0
	if c.br == nil {
		c.br = bufio.NewReaderSize(&c.rec, h1.ReadBufSize)
	} else {
		c.br.Reset(&c.rec)
	}
	if herr := c.head.Read(c.br); herr != nil {
		return 0, herr
	}
	// net/http reads the head (and what came after it) as it came, but for
	// headers whose name is no token, in the final head or an interim one:
	// the router drops those and relays the answer, where net/http would
	// fail it whole. c.head holds the final head's headers only: after
	// interim answers (rare) every head is filtered.
	out := c.rec.buf
	st, _, _ := h1.ParseStatusLine(out)
	filter := st < 200
	for i := 0; i < len(c.head.Hdrs) && !filter; i++ {
		k, _ := c.head.Header(i)
		filter = !h1.ValidName(k)
	}
	if filter {
		c.fbuf = dropBadNames(c.fbuf[:0], c.rec.buf, c.rec.fed-c.br.Buffered())
		out = c.fbuf
	}
	n = copy(p, out)
	c.pending = out[n:]
	return n, err
}

// dropBadNames appends to dst the bytes of b, the first headLen of which
// are response heads (interim ones, then the final one), without the
// header lines whose name is not a token.
func dropBadNames(dst, b []byte, headLen int) []byte {
	start := true // the next line is a status line
	for i := 0; i < headLen; {
		e := bytes.IndexByte(b[i:headLen], '\n')
		if e < 0 {
			e = headLen - i - 1
		}
		line := b[i : i+e+1]
		i += e + 1
		name, _, hasColon := bytes.Cut(line, []byte(":"))
		switch {
		case start:
			start = false
		case len(h1.TrimCRLF(line)) == 0:
			start = true
		case hasColon && !h1.ValidName(name):
			continue
		}
		dst = append(dst, line...)
	}
	return append(dst, b[headLen:]...)
}

// expectHead marks the connection of a request about to be written.
func expectHead(info httptrace.GotConnInfo) {
	if c, ok := info.Conn.(*judgedConn); ok {
		c.expect.Store(true)
	}
}

// dialJudged dials the engine (and, for an https engine, runs TLS under
// the judgement) for net/http's Transport.
func dialJudged(d *net.Dialer, tlsCfg *tls.Config) (plain, withTLS func(ctx context.Context, network, addr string) (net.Conn, error)) {
	plain = func(ctx context.Context, network, addr string) (net.Conn, error) {
		nc, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &judgedConn{Conn: nc}, nil
	}
	withTLS = func(ctx context.Context, network, addr string) (net.Conn, error) {
		td := tls.Dialer{NetDialer: d, Config: tlsCfg}
		nc, err := td.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &judgedConn{Conn: nc}, nil
	}
	return plain, withTLS
}
