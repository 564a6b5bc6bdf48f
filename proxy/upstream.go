package proxy

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/infera/infera/fleet"
	"github.com/infera/infera/internal/h1"
	"github.com/infera/infera/internal/netpeek"
	"github.com/infera/infera/internal/sockio"
)

// The HTTP/1.1 upstream client. It is ours rather than fasthttp.HostClient
// because the relay needs what HostClient does not offer: a body reader that
// returns everything already buffered in one Read (one client write per
// burst of SSE events, as nginx does with proxy_buffering off), a pooled
// connection that is never reused when anything but exactly one complete
// response (after any interim 1xx answers) arrived on it (no upgraded
// tunnel, no unsolicited bytes, whether they came with the response or
// while the connection was idle), and access to the live connection for
// per-read deadlines and aborts.

const (
	upReadBufSize = h1.ReadBufSize // a head is judged by h1, as the worker judges its engine's
	upMaxHeaders  = h1.MaxHeaders
	upIdleMax     = 55 * time.Second // engines close idle keep-alives; stay below common 60 s
	upMaxInterim  = h1.MaxInterim
	// upEarlyAnswerWait bounds the read of an answer the engine sent before
	// it stopped taking the request (earlyAnswer): the peer is gone, so all
	// of it is already in the socket.
	upEarlyAnswerWait = 50 * time.Millisecond
	upMaxConnTokens   = h1.MaxConnTokens
)

// upTLSQuietWait bounds the read of bytes found on an idle TLS connection
// (tlsQuiet): they are in the socket already. A variable: a test makes the
// check run late.
var upTLSQuietWait = 10 * time.Millisecond

var (
	errUpMalformed  = h1.ErrMalformed
	errUpUpgrade    = h1.ErrUpgrade
	errUpHeaderSize = h1.ErrHeaderSize
	errUpInterim    = h1.ErrInterim
	errUpNoConns    = errors.New("too many connections to worker")
)

// httpPool is the per-worker connection pool (fleet.Worker.Client).
type httpPool struct {
	addr     string
	host     string // the Host header: addr for workers, the URL's host for external upstreams
	tlsCfg   *tls.Config
	dialer   net.Dialer
	maxConns int

	mu   sync.Mutex
	idle []*upConn // LIFO
	open int
	dead bool
	// reapT runs reap while connections are idle (reapOn).
	reapT     *time.Timer
	reapOn    bool
	reapEvery time.Duration // upReapEvery when the pool was made
}

// upReapEvery is how often a pool with idle connections closes those the
// engine closed or that idled past upIdleMax. get looks only at the one it
// pops, and LIFO reuse under light traffic never pops the oldest: each
// held a descriptor in CLOSE_WAIT for as long as traffic stayed below its
// peak, or stopped.
var upReapEvery = 5 * time.Second

func newHTTPPool(w *fleet.Worker, maxConns int, connectTimeout time.Duration) *httpPool {
	p := &httpPool{addr: w.Addr, host: w.Addr, maxConns: maxConns, reapEvery: upReapEvery}
	p.dialer = net.Dialer{Timeout: connectTimeout, KeepAlive: 30 * time.Second}
	if w.TLS {
		p.tlsCfg = &tls.Config{ServerName: hostOnly(w.Addr)}
	}
	return p
}

func hostOnly(addr string) string {
	h, _, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	return h
}

// get returns a pooled connection checked for unsolicited bytes, or a new
// one. reused tells whether the connection served a request before.
func (p *httpPool) get(deadline time.Time) (c *upConn, reused bool, err error) {
	now := coarseNow.Load()
	p.mu.Lock()
	for n := len(p.idle); n > 0; n = len(p.idle) {
		c = p.idle[n-1]
		p.idle[n-1] = nil
		p.idle = p.idle[:n-1]
		p.mu.Unlock()
		if now-c.idleSince < int64(upIdleMax) && c.quiet() {
			return c, true, nil
		}
		// Expired, poisoned by unsolicited bytes, closed by the peer, or
		// closed underneath the pool by an abort: never handed out.
		c.closeConn()
		p.mu.Lock()
	}
	if p.maxConns > 0 && p.open >= p.maxConns {
		p.mu.Unlock()
		return nil, false, errUpNoConns
	}
	p.open++
	p.mu.Unlock()
	c, err = p.dial(deadline)
	if err != nil {
		p.mu.Lock()
		p.open--
		p.mu.Unlock()
		return nil, false, err
	}
	return c, false, nil
}

func (p *httpPool) dial(deadline time.Time) (*upConn, error) {
	d := p.dialer
	if !deadline.IsZero() {
		d.Deadline = deadline
	}
	nc, err := d.Dial("tcp", p.addr)
	if err != nil {
		return nil, err
	}
	fd := netpeek.SockFD(nc)
	nc = sockio.Wrap(nc) // TLS runs on top of it
	if p.tlsCfg != nil {
		tc := tls.Client(nc, p.tlsCfg)
		if !deadline.IsZero() {
			tc.SetDeadline(deadline)
		}
		if err := tc.Handshake(); err != nil {
			nc.Close()
			return nil, err
		}
		tc.SetDeadline(time.Time{})
		nc = tc
	}
	c := acquireUpConn()
	c.fd = fd
	// TLS sends records of its own (session tickets): bytes a peek finds
	// are read through TLS before they are taken for a stray response.
	c.tls = p.tlsCfg != nil
	c.nc, c.pool = nc, p
	c.br.Reset(nc)
	return c, nil
}

// put returns a connection whose response was read completely.
func (p *httpPool) put(c *upConn) {
	c.idleSince = coarseNow.Load()
	p.mu.Lock()
	if !p.dead {
		p.idle = append(p.idle, c)
		if !p.reapOn {
			p.reapOn = true
			if p.reapT == nil {
				p.reapT = time.AfterFunc(p.reapEvery, p.reap)
			} else {
				p.reapT.Reset(p.reapEvery)
			}
		}
		p.mu.Unlock()
		return
	}
	p.mu.Unlock()
	c.closeConn()
}

// reap closes the idle connections the engine closed (or sent stray
// bytes on) and those idle past upIdleMax, and runs again while some stay.
func (p *httpPool) reap() {
	now := coarseNow.Load()
	var stale []*upConn
	p.mu.Lock()
	kept := p.idle[:0]
	for _, c := range p.idle {
		if now-c.idleSince < int64(upIdleMax) && c.quiet() {
			kept = append(kept, c)
		} else {
			stale = append(stale, c)
		}
	}
	clear(p.idle[len(kept):])
	p.idle = kept
	p.reapOn = len(kept) > 0 && !p.dead
	if p.reapOn {
		p.reapT.Reset(p.reapEvery)
	}
	p.mu.Unlock()
	for _, c := range stale {
		c.closeConn()
	}
}

// closeIdle closes idle connections; with dead set, connections in use are
// closed when their response ends (the worker left the fleet).
func (p *httpPool) closeIdle(dead bool) {
	p.mu.Lock()
	idle := p.idle
	p.idle = nil
	p.dead = p.dead || dead
	if p.reapT != nil {
		p.reapT.Stop()
	}
	p.reapOn = false
	p.mu.Unlock()
	for _, c := range idle {
		c.closeConn()
	}
}

// upConn is one upstream connection and, while a request is in flight, the
// state of its response.
type upConn struct {
	nc        net.Conn
	fd        int  // socket descriptor for idle checks; -1 when unknown
	tls       bool // TLS runs over the socket (tlsQuiet)
	br        *bufio.Reader
	wbuf      []byte
	pool      *httpPool
	idleSince int64 // coarseNow when it went back to the pool

	// Response head.
	h1.Head

	// Body state.
	st       bodyState
	remain   int64 // bytes left in the body (Content-Length) or current chunk
	excess   int64 // chunked framing bytes beyond net/http's allowance (readChunkSize)
	eof      bool
	bodyErr  error
	deadline time.Time // current read deadline
	aborted  bool      // closed by abort (client gone)
	abortMu  sync.Mutex
}

var upConnPool = sync.Pool{New: func() any {
	return &upConn{br: bufio.NewReaderSize(nil, upReadBufSize), wbuf: make([]byte, 0, 4096)}
}}

func acquireUpConn() *upConn { return upConnPool.Get().(*upConn) }

func (c *upConn) closeConn() {
	c.abortMu.Lock()
	if c.nc != nil {
		c.nc.Close()
	}
	c.abortMu.Unlock()
	p := c.pool
	if p != nil {
		p.mu.Lock()
		p.open--
		p.mu.Unlock()
	}
	c.release()
}

func (c *upConn) release() {
	c.abortMu.Lock()
	c.nc, c.pool = nil, nil
	c.aborted = false
	c.abortMu.Unlock()
	c.br.Reset(nil)
	c.wbuf = c.wbuf[:0]
	c.deadline = time.Time{}
	c.resetResponse()
	upConnPool.Put(c)
}

func (c *upConn) resetResponse() {
	c.Head.Reset()
	c.st, c.remain, c.eof, c.bodyErr, c.excess = stSize, 0, false, nil, 0
}

// quiet reports whether an idle connection is still open and nothing
// arrived on it since its last response (an engine that sends an extra,
// unsolicited response poisons the connection: it is closed, never reused;
// over TLS, bytes found are read through TLS first, tlsQuiet).
// A connection an abort closed is not quiet: its descriptor number may
// already belong to another socket, so it is not peeked at; the peek runs
// under abortMu, so no abort closes the descriptor during it.
func (c *upConn) quiet() bool {
	if c.br.Buffered() != 0 {
		return false
	}
	c.abortMu.Lock()
	ok := false
	if !c.aborted && c.nc != nil {
		switch netpeek.Peek(c.fd) {
		case netpeek.Empty:
			ok = true
		case netpeek.Data:
			ok = c.tls && c.tlsQuiet()
		}
	}
	c.abortMu.Unlock()
	return ok
}

// tlsQuiet reports whether the bytes that arrived on an idle TLS
// connection are TLS records of its own (session tickets, which the TLS
// client takes in), not a response: it reads them, waiting at most
// upTLSQuietWait (they are in the socket already) for what they hold. A
// timeout leaves the TLS connection usable (crypto/tls keeps no timeout
// error); the read deadline is the connection's again after it. abortMu
// must be held.
//
// Anything it cannot tell is not quiet, and the connection is closed: bytes
// that are not whole records (a record still arriving, which the read could
// take half of and leave the rest to the next request), and bytes still in
// the socket after the read (its deadline passed before it ran: a check
// descheduled under load took a response for silence). What it cannot see
// is a record that starts arriving during the read, as a response that
// arrives after the peek of a plain connection.
func (c *upConn) tlsQuiet() bool {
	if netpeek.TLSRecords(c.fd) < 0 {
		return false
	}
	c.nc.SetReadDeadline(time.Now().Add(upTLSQuietWait))
	_, err := c.br.Peek(1)
	c.nc.SetReadDeadline(c.deadline)
	return c.br.Buffered() == 0 && isTimeout(err) && netpeek.Peek(c.fd) == netpeek.Empty
}

// abort closes the connection from another goroutine (the client left):
// a blocked read or write returns at once.
func (c *upConn) abort() {
	c.abortMu.Lock()
	if c.nc != nil && !c.aborted {
		c.aborted = true
		c.nc.Close()
	}
	c.abortMu.Unlock()
}

func (c *upConn) wasAborted() bool {
	c.abortMu.Lock()
	a := c.aborted
	c.abortMu.Unlock()
	return a
}

// setDeadline sets the connection's read and write deadline. The socket
// underneath (TLS or not) is a sockio.Conn, whose deadlines are lazy: a
// later deadline per read of a stream costs no runtime timer work.
func (c *upConn) setDeadline(t time.Time) {
	if t.Equal(c.deadline) {
		return
	}
	c.deadline = t
	c.nc.SetDeadline(t)
}

// writeRequest writes one request: the request line, Host (the pool's),
// the given header block, Content-Length, and the body.
func (c *upConn) writeRequest(method, path []byte, hdr []byte, body []byte) error {
	b := c.wbuf[:0]
	b = append(b, method...)
	b = append(b, ' ')
	b = append(b, path...)
	b = append(b, " HTTP/1.1\r\nHost: "...)
	b = append(b, c.pool.host...)
	b = append(b, "\r\n"...)
	b = append(b, hdr...)
	b = append(b, "Content-Length: "...)
	b = strconv.AppendInt(b, int64(len(body)), 10)
	b = append(b, "\r\n\r\n"...)
	var err error
	if len(b)+len(body) <= 64<<10 {
		b = append(b, body...)
		if sc, ok := c.nc.(*sockio.Conn); ok {
			// Wait for the reply's first bytes without a read that would
			// find nothing yet (readHead's first read then finds them).
			_, err = sc.WriteAwaitReply(b)
		} else {
			_, err = c.nc.Write(b)
		}
	} else {
		// Through the connection's own Write (a sockio.Conn's deadlines are
		// lazy: the runtime connection under it may hold a stale one).
		bufs := net.Buffers{b, body}
		_, err = bufs.WriteTo(c.nc)
	}
	c.wbuf = b[:0]
	return err
}

// readHead reads the response head (h1.Head.Read: the router's judgement
// of an engine's answer, which the worker sidecar shares) and readies the
// body reader for its framing. An answer h1 refuses is never reused.
func (c *upConn) readHead() error {
	c.resetResponse()
	if err := c.Head.Read(c.br); err != nil {
		return err
	}
	switch {
	case c.Chunked:
		c.st = stSize
	case c.CLen >= 0:
		c.st, c.remain = stData, c.CLen
		c.eof = c.CLen == 0
	default:
		c.st, c.remain = stData, -1
	}
	return nil
}

// earlyAnswer reads the answer an engine sent before it stopped taking the
// request, after writing the request failed with werr. An engine with a
// body limit answers 413 as soon as it has the head and closes without
// reading the body; the router's write then fails (a reset, a broken
// pipe) with the answer already in its socket. Only those two errors are
// taken: the peer is gone, so all it sent is there, and the read is
// bounded by upEarlyAnswerWait anyway (the deadline is deadline again
// afterwards). It returns nil when a complete head was read; the error of
// a head h1 refuses (a 101, an interim answer alone, a head cut part-way:
// the engine answered something that is no response, as it would have
// after the body); werr when nothing usable came. The connection is never
// reused after it.
func (c *upConn) earlyAnswer(werr error, deadline time.Time) error {
	if !errors.Is(werr, syscall.ECONNRESET) && !errors.Is(werr, syscall.EPIPE) || c.wasAborted() {
		return werr
	}
	d := time.Now().Add(upEarlyAnswerWait)
	if !deadline.IsZero() && deadline.Before(d) {
		d = deadline
	}
	c.setDeadline(d)
	err := c.readHead()
	c.setDeadline(deadline)
	if err != nil {
		if h1.Invalid(err) {
			return err
		}
		return werr
	}
	c.CloseAfter = true // the request was not all sent
	return nil
}

// bodyState is where the body reader is in the response framing.
type bodyState uint8

const (
	stSize     bodyState = iota // chunked: expecting a chunk-size line
	stData                      // reading data (remain bytes; -1: until close)
	stCRLF                      // chunked: expecting the CRLF after a chunk
	stTrailers                  // chunked: reading the trailer section
)

// read reads body bytes into p. The first step may block; further bytes are
// added only while the connection's buffer already holds them, so one call
// returns a whole burst of events without waiting for more.
func (c *upConn) read(p []byte) (int, error) {
	if c.eof {
		return 0, io.EOF
	}
	if c.bodyErr != nil {
		return 0, c.bodyErr
	}
	n := 0
	for n < len(p) {
		m, progressed, err := c.step(p[n:], n == 0)
		n += m
		if err != nil {
			if err == io.EOF {
				c.eof = true
				return n, io.EOF // n may be > 0: the caller knows the body is complete
			}
			c.bodyErr = err
			if n > 0 {
				return n, nil // the error comes with the next read
			}
			return 0, err
		}
		if !progressed {
			break
		}
	}
	return n, nil
}

// step performs one action of the body reader. With block false it only
// uses what is already buffered and reports progressed=false when it would
// have to wait.
func (c *upConn) step(p []byte, block bool) (n int, progressed bool, err error) {
	switch c.st {
	case stSize:
		if !block && !c.bufferedLine() {
			return 0, false, nil
		}
		size, err := c.readChunkSize()
		if err != nil {
			return 0, true, err
		}
		if size == 0 {
			c.st = stTrailers
		} else {
			c.st, c.remain = stData, size
		}
		return 0, true, nil
	case stTrailers:
		if !block && !c.bufferedLine() {
			return 0, false, nil
		}
		line, err := c.br.ReadSlice('\n')
		if err != nil {
			return 0, true, unexpected(err)
		}
		line, ok := chunkLine(line)
		if !ok {
			return 0, true, errUpMalformed
		}
		if len(line) == 0 {
			return 0, true, io.EOF
		}
		// A trailer is a header line, as net/http (the worker's engine
		// client) reads it, which folds a line that starts with white
		// space into the trailer before it.
		if line[0] == ' ' || line[0] == '\t' {
			if c.remain == 0 || !h1.ValidValue(line) {
				return 0, true, errUpMalformed
			}
		} else if name, _, err := h1.HeaderLine(line); err != nil || !h1.ValidName(name) {
			return 0, true, errUpMalformed
		}
		if c.remain--; c.remain < -upMaxHeaders {
			return 0, true, errUpHeaderSize
		}
		return 0, true, nil
	case stCRLF:
		if !block && !c.bufferedLine() {
			return 0, false, nil
		}
		if err := c.readCRLF(); err != nil {
			return 0, true, err
		}
		c.st = stSize
		return 0, true, nil
	}
	// stData
	if !block && c.br.Buffered() == 0 {
		return 0, false, nil
	}
	if c.remain < 0 { // until the connection closes
		m, err := c.br.Read(p)
		return m, true, err
	}
	if int64(len(p)) > c.remain {
		p = p[:c.remain]
	}
	m, err := c.br.Read(p)
	c.remain -= int64(m)
	if m == 0 {
		if err == nil {
			err = io.ErrNoProgress
		}
		return 0, true, unexpected(err)
	}
	if c.remain == 0 {
		if !c.Chunked {
			return m, true, io.EOF
		}
		c.st, c.remain = stCRLF, 0
	}
	return m, true, nil
}

func unexpected(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}

// bufferedLine reports whether a complete line is buffered.
func (c *upConn) bufferedLine() bool {
	n := c.br.Buffered()
	if n == 0 {
		return false
	}
	b, _ := c.br.Peek(n)
	return bytes.IndexByte(b, '\n') >= 0
}

func (c *upConn) readCRLF() error {
	line, err := c.br.ReadSlice('\n')
	if err != nil {
		return unexpected(err)
	}
	if len(line) != 2 || line[0] != '\r' {
		return errUpMalformed
	}
	return nil
}

// chunkLine returns a line of chunked framing without its CRLF, and false
// when it does not end in CRLF or holds another CR: a bare LF ends header
// lines, never chunked framing (RFC 9112 erratum 7633), and net/http, with
// which the worker reads its engine, refuses it there.
func chunkLine(line []byte) ([]byte, bool) {
	n := len(line)
	if n < 2 || line[n-2] != '\r' || bytes.IndexByte(line[:n-2], '\r') >= 0 {
		return nil, false
	}
	return line[:n-2], true
}

func (c *upConn) readChunkSize() (int64, error) {
	line, err := c.br.ReadSlice('\n')
	if err != nil {
		if err == bufio.ErrBufferFull {
			return 0, errUpMalformed
		}
		return 0, unexpected(err)
	}
	line, ok := chunkLine(line)
	if !ok {
		return 0, errUpMalformed
	}
	c.excess += int64(len(line)) + 2
	// As net/http reads it: trailing white space, then the extensions,
	// go; what is left is the size, nothing around it.
	for n := len(line); n > 0 && (line[n-1] == ' ' || line[n-1] == '\t'); n = len(line) {
		line = line[:n-1]
	}
	if i := bytes.IndexByte(line, ';'); i >= 0 {
		line = line[:i]
	}
	if len(line) == 0 || len(line) > 16 || len(line) == 16 && line[0] > '7' { // 16 digits fit int64 below 8
		return 0, errUpMalformed
	}
	var n int64
	for _, ch := range line {
		var d byte
		switch {
		case ch >= '0' && ch <= '9':
			d = ch - '0'
		case ch >= 'a' && ch <= 'f':
			d = ch - 'a' + 10
		case ch >= 'A' && ch <= 'F':
			d = ch - 'A' + 10
		default:
			return 0, errUpMalformed
		}
		n = n<<4 | int64(d)
	}
	// net/http allows 16 bytes of framing a chunk, plus twice its data,
	// and refuses an answer whose framing (chunk extensions, mostly)
	// passes that by 16 KiB.
	if d := 16 + 2*n; d < 0 || d >= c.excess {
		c.excess = 0
	} else if c.excess -= d; c.excess > 16<<10 {
		return 0, errUpMalformed
	}
	return n, nil
}

// finish ends the response on this connection: back to the pool when the
// body was read to its end and nothing else arrived, closed otherwise.
func (c *upConn) finish() {
	if c.eof && c.bodyErr == nil && !c.CloseAfter && c.br.Buffered() == 0 && !c.wasAborted() {
		// An armed deadline stays: the next request sets its own (or
		// clears it), and an idle connection has no read pending.
		p := c.pool
		c.resetResponse()
		p.put(c)
		return
	}
	c.closeConn()
}
