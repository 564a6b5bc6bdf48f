package mirror

import (
	"errors"
	"net"
	"sync"
	"time"

	"github.com/infera/infera/config"
	"github.com/infera/infera/internal/netpeek"
	"github.com/infera/infera/upstream"
	"github.com/valyala/fasthttp"
)

// targetPool is the connection pool to one mirror target address: one
// fasthttp.HostClient, built when a config snapshot names a new address.
type targetPool struct {
	raw string
	ep  upstream.Endpoint
	err error // the address does not parse
	hc  *fasthttp.HostClient
}

// targetPools are the pools of the last two addresses used: after a reload
// that changes the address, the jobs of the old snapshot still queued keep
// their pool instead of rebuilding one in turn with the new address. A
// third address replaces the older one (its idle connections are closed).
type targetPools struct {
	cur, prev *targetPool
}

func (p *targetPools) find(raw string) *targetPool {
	if p == nil {
		return nil
	}
	if p.cur.raw == raw {
		return p.cur
	}
	if p.prev != nil && p.prev.raw == raw {
		return p.prev
	}
	return nil
}

// maxStaleRetries bounds the attempts of one mirrored request that found
// its pooled connection closed by the target before anything was written
// (fasthttp's MaxIdemponentCallAttempts counts the first attempt too).
const maxStaleRetries = 4

// targetPool returns the pool for the address raw.
func (m *Mirror) targetPool(raw string) *targetPool {
	if t := m.tgt.Load().find(raw); t != nil {
		return t
	}
	m.tgtMu.Lock()
	defer m.tgtMu.Unlock()
	cur := m.tgt.Load()
	if t := cur.find(raw); t != nil {
		return t
	}
	t := &targetPool{raw: raw}
	t.ep, t.err = upstream.ParseEndpoint(raw)
	if t.err == nil {
		isTLS := t.ep.TLS
		t.hc = &fasthttp.HostClient{
			Addr:      t.ep.Addr,
			IsTLS:     t.ep.TLS,
			TLSConfig: m.tlsConfig,
			// The connect timeout, shortened to the request's budget; the
			// dial is aborted by Close.
			DialTimeout: func(addr string, timeout time.Duration) (net.Conn, error) {
				return m.dial(addr, timeout, isTLS)
			},
			// The senders bound the requests in flight by
			// mirror.concurrency, so this bound is never the one that
			// waits; if it were, the wait is bounded by the request's
			// budget.
			MaxConns:            config.MaxMirrorConcurrency,
			MaxConnWaitTimeout:  time.Hour,
			MaxIdleConnDuration: 30 * time.Second,
			// Do returns after the headers: the answer, streamed or not,
			// is read from the connection by the sender, in a bounded
			// buffer. The request's deadline (DoDeadline) is set on the
			// connection once, before the request is written, and never
			// refreshed: it cuts a stream that outlives the budget.
			StreamResponseBody: true,
			// Only a request that found its pooled connection closed before
			// anything was written is tried again (retryStale); everything
			// else is sent once.
			MaxIdemponentCallAttempts: maxStaleRetries,
			RetryIfErr:                retryStale,
			// The header list is fixed (send.go): no default User-Agent,
			// names written as given, the path sent as given.
			NoDefaultUserAgentHeader:      true,
			DisableHeaderNamesNormalizing: true,
			DisablePathNormalizing:        true,
		}
	}
	next := &targetPools{cur: t}
	if cur != nil {
		next.prev = cur.cur
		// Requests in flight to the dropped address end normally; their
		// connections close when they are released or idle out.
		cur.prev.closeIdle()
	}
	m.tgt.Store(next)
	return t
}

func (t *targetPool) closeIdle() {
	if t != nil && t.hc != nil {
		t.hc.CloseIdleConnections()
	}
}

// closeIdle closes the idle connections of the pools.
func (m *Mirror) closeIdle() {
	if p := m.tgt.Load(); p != nil {
		p.cur.closeIdle()
		p.prev.closeIdle()
	}
}

// retryStale lets fasthttp try a request again only when it found its
// pooled connection closed by the target before writing anything (the
// target's keep-alive timeout): nothing reached the target, so nothing is
// mirrored twice.
func retryStale(_ *fasthttp.Request, _ int, err error) (resetTimeout, retry bool) {
	return false, errors.Is(err, errStale)
}

// errStale: a pooled connection was found closed (or carrying bytes nobody
// asked for) before a request was written on it.
var errStale = errors.New("mirror: pooled connection closed by the target")

// dial opens a connection to the target: at most the connect timeout, and
// at most the request's budget when fasthttp passes one. Connections are
// registered so that Close can abort the requests using them. isTLS: TLS
// will run over the connection.
func (m *Mirror) dial(addr string, timeout time.Duration, isTLS bool) (net.Conn, error) {
	if timeout <= 0 || timeout > m.opts.ConnectTimeout {
		timeout = m.opts.ConnectTimeout
	}
	d := net.Dialer{Timeout: timeout, KeepAlive: 30 * time.Second}
	nc, err := d.DialContext(m.ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	c := &conn{Conn: nc, set: &m.conns, fd: netpeek.SockFD(nc), tls: isTLS}
	if !m.conns.add(c) {
		nc.Close()
		return nil, errClosed
	}
	return c, nil
}

var errClosed = errors.New("mirror: closed")

// conn is a connection to the target, as fasthttp sees it (TLS, when used,
// is layered above it by fasthttp).
type conn struct {
	net.Conn
	set *connSet
	fd  int // the socket, for peek; -1 if unknown
	// tls: TLS runs over the connection; its records (a session ticket,
	// an alert) may wait on an idle connection without poisoning it.
	tls bool
	// used: the connection has carried an answer, so the next write
	// starts a request on a pooled connection. Reads and writes of one
	// connection happen in sequence (HTTP/1.1 without pipelining), handed
	// from sender to sender through fasthttp's pool.
	used bool
	once sync.Once
}

func (c *conn) Read(p []byte) (int, error) {
	c.used = true
	return c.Conn.Read(p)
}

// Write checks a pooled connection before the first write of a request:
// a connection the target closed while it was idle, or one with bytes
// waiting that no request asked for, gives errStale (nothing is written;
// fasthttp closes the connection and tries another).
func (c *conn) Write(p []byte) (int, error) {
	if c.used {
		c.used = false
		if st := netpeek.Peek(c.fd); st == netpeek.Closed || st == netpeek.Data && !c.tls {
			return 0, errStale
		}
	}
	return c.Conn.Write(p)
}

func (c *conn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.set.remove(c) })
	return err
}

// connSet is the open connections, closed together by Close.
type connSet struct {
	mu     sync.Mutex
	m      map[*conn]struct{}
	closed bool
}

func (s *connSet) add(c *conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	if s.m == nil {
		s.m = make(map[*conn]struct{})
	}
	s.m[c] = struct{}{}
	return true
}

func (s *connSet) remove(c *conn) {
	s.mu.Lock()
	delete(s.m, c)
	s.mu.Unlock()
}

// closeAll closes every open connection (blocked reads and writes return
// at once) and refuses new ones.
func (s *connSet) closeAll() {
	s.mu.Lock()
	s.closed = true
	open := make([]*conn, 0, len(s.m))
	for c := range s.m {
		open = append(open, c)
	}
	s.mu.Unlock()
	for _, c := range open {
		c.Close()
	}
}

func (s *connSet) len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.m)
}
