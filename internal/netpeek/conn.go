package netpeek

import (
	"errors"
	"net"
)

// ErrStale is what a Conn's Write returns when the connection, back from a
// keep-alive pool, was closed by the peer while it idled (or carries bytes
// no request asked for): nothing was written, so the request may be sent
// again on another connection.
var ErrStale = errors.New("pooled connection closed by the peer")

// Conn is a client connection that checks itself before the first write of
// each request after the first: one peek (and, over TLS, one getsockopt
// when a record waits) instead of writing a request into a connection the
// server already closed. Reads and writes of one request happen in
// sequence (HTTP/1.1 without pipelining), so it needs no locking.
type Conn struct {
	net.Conn
	fd int
	// tls: TLS runs over the connection; a record waiting on it (a session
	// ticket) does not poison it, but one followed by the peer's FIN (its
	// close_notify) does.
	tls bool
	// used: the connection has carried an answer, so the next write starts
	// a request on a pooled connection.
	used bool
}

// NewConn wraps nc, a TCP connection that TLS may run over (isTLS).
func NewConn(nc net.Conn, isTLS bool) Conn {
	return Conn{Conn: nc, fd: SockFD(nc), tls: isTLS}
}

func (c *Conn) Read(p []byte) (int, error) {
	c.used = true
	return c.Conn.Read(p)
}

// Write gives ErrStale, writing nothing, when the first write of a request
// on a used connection finds it closed by the peer or holding bytes nobody
// asked for.
func (c *Conn) Write(p []byte) (int, error) {
	if c.used {
		c.used = false
		switch Peek(c.fd) {
		case Closed:
			return 0, ErrStale
		case Data:
			if !c.tls || PeerClosed(c.fd) {
				return 0, ErrStale
			}
		}
	}
	return c.Conn.Write(p)
}
