package proxy

import (
	"crypto/tls"
	"net"
	"time"

	"github.com/infera/infera/fleet"
	"github.com/valyala/fasthttp"
)

// httpTransport gives every worker one keep-alive fasthttp.HostClient.
type httpTransport struct {
	maxConns       int
	connectTimeout time.Duration
}

var _ fleet.Hook = (*httpTransport)(nil)

// WorkerAdded implements fleet.Hook.
func (t *httpTransport) WorkerAdded(w *fleet.Worker) error {
	d := &net.Dialer{Timeout: t.connectTimeout, KeepAlive: 30 * time.Second}
	hc := &fasthttp.HostClient{
		Addr:                          w.Addr,
		Name:                          "infera",
		IsTLS:                         w.TLS,
		MaxConns:                      t.maxConns,
		MaxConnWaitTimeout:            50 * time.Millisecond,
		MaxIdleConnDuration:           60 * time.Second,
		ReadTimeout:                   0, // per-request deadlines; see dconn
		WriteTimeout:                  30 * time.Second,
		StreamResponseBody:            false, // set per response for streams
		MaxResponseBodySize:           64 << 20,
		MaxIdemponentCallAttempts:     1,
		DisablePathNormalizing:        true,
		DisableHeaderNamesNormalizing: true,
		NoDefaultUserAgentHeader:      true,
		Dial: func(addr string) (net.Conn, error) {
			c, err := d.Dial("tcp", addr)
			if err != nil {
				return nil, err
			}
			return &dconn{Conn: c}, nil
		},
	}
	if w.TLS {
		hc.TLSConfig = &tls.Config{ServerName: hostOnly(w.Addr)}
	}
	w.Client = hc
	return nil
}

// WorkerRemoved implements fleet.Hook. Idle connections are closed; live
// streams keep theirs until they end.
func (t *httpTransport) WorkerRemoved(w *fleet.Worker) {
	if hc, ok := w.Client.(*fasthttp.HostClient); ok {
		hc.CloseIdleConnections()
	}
}

func hostOnly(addr string) string {
	h, _, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	return h
}

// dconn wraps an upstream connection so the relay can find it after Do:
// fasthttp records the connection's LocalAddr in the response, and dconn
// returns itself (as *dconnAddr) there. The relay then refreshes the read
// deadline per chunk (streaming idle timeout) on the live connection.
type dconn struct {
	net.Conn
	deadlineSet bool // touched only by the goroutine that owns the connection
}

// dconnAddr is dconn seen as a net.Addr.
type dconnAddr dconn

func (a *dconnAddr) Network() string { return a.Conn.LocalAddr().Network() }
func (a *dconnAddr) String() string  { return a.Conn.LocalAddr().String() }

// LocalAddr returns the connection itself, so the relay can recover it.
func (c *dconn) LocalAddr() net.Addr { return (*dconnAddr)(c) }

// connOf returns the upstream connection that served resp, or nil.
func connOf(resp *fasthttp.Response) *dconn {
	if a, ok := resp.LocalAddr().(*dconnAddr); ok {
		return (*dconn)(a)
	}
	return nil
}

// setReadDeadline sets the deadline on the live connection.
func (c *dconn) setReadDeadline(t time.Time) {
	c.deadlineSet = !t.IsZero()
	c.Conn.SetReadDeadline(t)
}

// clearDeadline removes a deadline the relay set, before the connection goes
// back to the pool (fasthttp does not know about it).
func (c *dconn) clearDeadline() {
	if c.deadlineSet {
		c.deadlineSet = false
		c.Conn.SetReadDeadline(time.Time{})
	}
}
