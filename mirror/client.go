package mirror

import (
	"crypto/tls"
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
	return false, errors.Is(err, netpeek.ErrStale)
}

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
	c := &conn{Conn: netpeek.NewConn(nc, isTLS), set: &m.conns}
	if !m.conns.add(c) {
		nc.Close()
		return nil, errClosed
	}
	if !isTLS {
		return c, nil
	}
	// The TLS handshake is made here, within the same bound: fasthttp would
	// leave it to the request's first write, before any read deadline is
	// set, so a target that accepted the connection and never answered the
	// handshake held its sender forever.
	return netpeek.Handshake(c, m.clientTLSConfig(addr), time.Now().Add(timeout))
}

// clientTLSConfig is the TLS configuration of a connection to addr: the
// mirror's (Go's defaults when nil), with addr's host as the server name
// unless it names one.
func (m *Mirror) clientTLSConfig(addr string) *tls.Config {
	cfg := &tls.Config{}
	if m.tlsConfig != nil {
		cfg = m.tlsConfig.Clone()
	}
	if cfg.ServerName == "" {
		if host, _, err := net.SplitHostPort(addr); err == nil {
			cfg.ServerName = host
		}
	}
	return cfg
}

var errClosed = errors.New("mirror: closed")

// conn is a connection to the target, as fasthttp sees it (TLS, when used,
// is layered above it by fasthttp). A pooled connection the target closed
// while it idled, or one with bytes waiting that no request asked for,
// refuses the request's first write (netpeek.ErrStale; fasthttp closes it
// and tries another).
type conn struct {
	netpeek.Conn
	set  *connSet
	once sync.Once
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
