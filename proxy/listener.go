package proxy

import (
	"crypto/tls"
	"errors"
	"net"
	"net/netip"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/infera/infera/internal/logx"
	"github.com/infera/infera/internal/netpeek"
	"github.com/infera/infera/internal/sockio"
)

// listener keeps the server accepting through temporary accept errors:
// running out of file descriptors (EMFILE, ENFILE), aborted handshakes,
// memory pressure. fasthttp's Serve returns on any such error, which would
// stop the process; here Accept backs off (5 ms doubling to 1 s), logs
// (throttled), and tries again until the listener is closed.
type listener struct {
	net.Listener
	// tls, when set, serves TLS over the accepted connections. The
	// handshake runs in fasthttp's first read, under --header-timeout.
	tls *tls.Config
	// max is --max-conns, enforced here so that a connection over it gets
	// an answer in OpenAI's error shape (fasthttp's own cap, set above it,
	// would answer in plain text).
	max  int64
	open atomic.Int64
	// refusal is the answer written to a connection over max.
	refusal []byte

	// conns holds the connections open now, for cutAll.
	mu    sync.Mutex
	conns map[*clientConn]struct{}
}

// cutAll shuts every open client connection down (both directions): the
// requests on them see their client gone and end. shutdown, not close:
// the descriptor stays valid for its reader, the liveness watchdog and
// fasthttp, which closes it when its handler returns.
func (l *listener) cutAll() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	for c := range l.conns {
		syscall.Shutdown(c.fd, syscall.SHUT_RDWR)
	}
	return len(l.conns)
}

// tooManyConns is the answer to a connection over --max-conns (the request
// is not read: its path, and so its protocol, are not known).
var tooManyConns, tooManyConnsVary = refusalAnswer(""), refusalAnswer("Vary: Origin\r\n")

// refusalAnswer is the answer to a connection over --max-conns with the
// header lines extra ("Vary: Origin\r\n" with --cors-allow-origins listing
// origins).
func refusalAnswer(extra string) []byte {
	body := `{"error":{"message":"too many open connections (--max-conns); retry","type":"` + typeUnavailable + `","param":null,"code":"too_many_connections"}}`
	return []byte("HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: " + strconv.Itoa(len(body)) +
		"\r\nRetry-After: 1\r\n" + extra + "Connection: close\r\n\r\n" + body)
}

var acceptLog = &logx.Throttle{Every: 5 * time.Second}

func (l *listener) Accept() (net.Conn, error) {
	delay := 5 * time.Millisecond
	for {
		c, err := l.Listener.Accept()
		if err == nil {
			if l.max > 0 && l.open.Add(1) > l.max {
				l.open.Add(-1)
				mConnsRefused.Inc()
				if l.tls == nil { // a TLS client would need a handshake first
					c.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
					c.Write(l.refusal)
				}
				c.Close()
				continue
			}
			raw := sockio.Wrap(c)
			nc := raw
			if l.tls != nil {
				nc = tls.Server(raw, l.tls) // over sockio's reads and lazy deadlines, as upstream TLS
			}
			cc := &clientConn{Conn: nc, raw: raw, fd: netpeek.SockFD(c), tls: l.tls != nil, l: l}
			if t, ok := cc.RemoteAddr().(*net.TCPAddr); ok {
				a, _ := netip.AddrFromSlice(t.IP)
				if p := appendPeerText(cc.peer[:0], a); len(p) <= len(cc.peer) {
					cc.npeer = uint8(copy(cc.peer[:], p))
				}
			}
			if l.max > 0 {
				cc.open = &l.open
			}
			l.mu.Lock()
			if l.conns == nil {
				l.conns = map[*clientConn]struct{}{}
			}
			l.conns[cc] = struct{}{}
			l.mu.Unlock()
			return cc, nil
		}
		if errors.Is(err, net.ErrClosed) {
			return nil, err
		}
		mAcceptErrors.Inc()
		reason := "accept failed"
		if errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) {
			reason = "out of file descriptors (raise the limit or lower --max-conns)"
		}
		acceptLog.Warn("cannot accept connection; retrying", "reason", reason, "err", err.Error(), "retry_in", delay.String())
		time.Sleep(delay)
		delay = min(2*delay, time.Second)
	}
}

// clientConn is an accepted client connection with its socket descriptor
// kept for the liveness watchdog.
type clientConn struct {
	net.Conn
	raw    net.Conn // the TCP connection under TLS (Conn itself without TLS)
	fd     int
	tls    bool
	open   *atomic.Int64 // the listener's count of open connections (nil: not counted)
	l      *listener
	closed atomic.Bool
	// linger says the answer was written before the request's body was
	// read (closeUnread): Close must not reset the connection.
	linger atomic.Bool
	// wireLeft, while wireBound, is how many more bytes the connection
	// may read for a chunked request (boundWire); only the goroutine
	// serving the connection reads it, so it needs no lock.
	wireLeft  int64
	wireBound bool
	// wireTimedOut says a read under the bound met the read deadline
	// (wireTimeout); the same goroutine sets and reads it.
	wireTimedOut bool
	// peer[:npeer] is the text of the TCP peer's address (peerIP), as the
	// engine gets it at the end of X-Forwarded-For: formatted once, when
	// the connection is accepted, for all its requests (peerText).
	peer  [maxPeerText]byte
	npeer uint8
}

// maxPeerText bounds an address's text (an IPv6 address's is at most 39
// bytes without a zone, which appendPeerText drops).
const maxPeerText = 48

// errWireBound is a chunked request that took more bytes than its bound
// (boundWire).
var errWireBound = errors.New("chunked request framing exceeds its bound")

// Read reads from the connection, within the bound of a chunked request
// (boundWire).
func (c *clientConn) Read(b []byte) (int, error) {
	if !c.wireBound {
		return c.Conn.Read(b)
	}
	if c.wireLeft <= 0 {
		return 0, errWireBound
	}
	if int64(len(b)) > c.wireLeft {
		b = b[:c.wireLeft]
	}
	n, err := c.Conn.Read(b)
	c.wireLeft -= int64(n)
	if err != nil && errors.Is(err, os.ErrDeadlineExceeded) {
		c.wireTimedOut = true
	}
	return n, err
}

// boundWire starts a request on the connection: a chunked one (chunked)
// may read n more bytes, whatever reads them (readBody, or fasthttp
// discarding a body the handler left), another one is not bounded here.
// fasthttp skips chunk extensions without a bound and byte by byte: a body
// of a few bytes carried a GiB of them past --max-body-bytes. The bound
// lasts until the request's answer is out (endWireBound): its body has
// then been read whole, by the handler or by fasthttp's discard, or the
// connection closes.
func (c *clientConn) boundWire(chunked bool, n int64) {
	c.wireLeft, c.wireBound, c.wireTimedOut = n, chunked, false
}

// endWireBound is the server's ConnState hook: a connection gone idle
// (its answer out) ends its request's bound (boundWire), so the next
// request's head is not read under what a chunked one left of it (a
// request after one that came near its bound got 400 and a reset). It
// runs on the goroutine serving the connection, as Read does.
func endWireBound(nc net.Conn, st fasthttp.ConnState) {
	if c, ok := nc.(*clientConn); ok && st == fasthttp.StateIdle {
		c.boundWire(false, 0)
	}
}

// wireSpent reports whether boundWire's bound is used up.
func (c *clientConn) wireSpent() bool { return c.wireBound && c.wireLeft <= 0 }

// wireTimeout reports whether a read of a chunked request's body met the
// read deadline (--body-timeout). fasthttp wraps a read error met in the
// chunk framing (a chunk size, its extension, the CRLF after its data) in
// ErrBrokenChunk, which does not unwrap: without this the deadline there
// reads as a broken body.
func (c *clientConn) wireTimeout() bool { return c.wireBound && c.wireTimedOut }

// Close closes the connection and, the first time, gives its slot back. A
// connection whose request body was left unread lingers instead: closing
// a socket with unread input sends a reset, and the client, still sending
// its body, loses the answer written just before (a 413 or 401 reaches an
// SDK as a connection error). Its write side is shut (the client reads the
// answer, then end of stream) and what the client still sends is read and
// dropped, up to lingerBytes within lingerTime (and lingerIdle between
// reads), as nginx's lingering_close does; the slot is given back after.
func (c *clientConn) Close() error {
	if c.linger.Load() && c.fd >= 0 && c.closed.CompareAndSwap(false, true) {
		mLingeringCloses.Inc()
		syscall.Shutdown(c.fd, syscall.SHUT_WR)
		go c.drain()
		return nil
	}
	if c.closed.CompareAndSwap(false, true) {
		c.release()
	}
	return c.Conn.Close()
}

// lingerBufs holds the buffers lingering closes read into.
var lingerBufs = sync.Pool{New: func() any { b := make([]byte, 8<<10); return &b }}

const (
	lingerTime  = 5 * time.Second
	lingerIdle  = time.Second
	lingerBytes = 64 << 20
)

// drain is the lingering close (Close).
func (c *clientConn) drain() {
	end := time.Now().Add(lingerTime)
	bp := lingerBufs.Get().(*[]byte)
	defer lingerBufs.Put(bp)
	buf := *bp
	for n := 0; n < lingerBytes; {
		d := time.Now().Add(lingerIdle)
		if d.After(end) {
			d = end
		}
		c.raw.SetReadDeadline(d)
		k, err := c.raw.Read(buf)
		n += k
		if err != nil {
			break
		}
	}
	c.release()
	c.Conn.Close()
}

func (c *clientConn) release() {
	if c.open != nil {
		c.open.Add(-1)
	}
	if c.l != nil {
		c.l.mu.Lock()
		delete(c.l.conns, c)
		c.l.mu.Unlock()
	}
}

// closeUnread answers on a connection closed after this answer with the
// request's body (or part of it) unread: the close lingers (clientConn).
func closeUnread(ctx *fasthttp.RequestCtx) {
	ctx.SetConnectionClose()
	if c, ok := ctx.Conn().(*clientConn); ok {
		c.linger.Store(true)
	}
}

// maxConns resolves --max-conns: 0 means half of the open-file limit (the
// other half is for upstream connections, files and the runtime).
func maxConns(n int) int {
	if n > 0 {
		return n
	}
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil || rl.Cur == 0 {
		return 256 * 1024
	}
	c := rl.Cur / 2
	if c > 256*1024 {
		c = 256 * 1024
	}
	if c < 16 {
		c = 16
	}
	return int(c)
}
