package sockio

import (
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"time"
)

// Conn is a TCP connection whose Read and Write bypass the scheduler's
// system-call accounting, and whose deadlines are lazy (see deadline).
// Everything else (Close, addresses) is the wrapped connection's. Like a
// net.Conn, it takes one Read and one Write at a time concurrently; unlike
// it, not two concurrent Reads (or two Writes). Other connection types are
// not wrapped: see Wrap.
type Conn struct {
	net.Conn
	rc  syscall.RawConn
	net string // "tcp" or "unix", for errors

	rbuf  []byte
	rn    int
	rerr  syscall.Errno
	readF func(uintptr) bool

	wbuf   []byte
	wn     int
	werr   syscall.Errno
	writeF func(uintptr) bool

	sent  bool // WriteAwaitReply: the request is written, wait for the reply
	sendF func(uintptr) bool
	reads int // read(2) calls (tests)

	rd, wd deadline
}

// Wrap returns c as a *Conn when it is a TCP (or Unix) socket, and c itself
// otherwise (TLS, pipes, tests' in-memory connections).
func Wrap(c net.Conn) net.Conn {
	switch c.(type) {
	case *net.TCPConn, *net.UnixConn:
	default:
		return c
	}
	rc, err := c.(syscall.Conn).SyscallConn()
	if err != nil {
		return c
	}
	w := &Conn{Conn: c, rc: rc, net: c.LocalAddr().Network()}
	w.readF = w.readFD
	w.writeF = w.writeFD
	w.sendF = w.sendFD
	return w
}

// Read reads into b like net.Conn's Read.
func (c *Conn) Read(b []byte) (int, error) {
	if len(b) == 0 {
		return 0, nil
	}
	c.rbuf = b
	err := c.rc.Read(c.readF)
	for err != nil && c.early(err, &c.rd, true) {
		err = c.rc.Read(c.readF)
	}
	c.rbuf = nil
	if err != nil {
		return 0, err
	}
	if c.rerr != 0 {
		return 0, c.opError("read", c.rerr)
	}
	if c.rn == 0 {
		return 0, io.EOF
	}
	return c.rn, nil
}

func (c *Conn) readFD(fd uintptr) bool {
	for {
		c.reads++
		n, e := sysRead(fd, c.rbuf)
		switch e {
		case 0:
			c.rn, c.rerr = n, 0
			return true
		case syscall.EINTR:
			continue
		case syscall.EAGAIN:
			return false
		}
		c.rn, c.rerr = 0, e
		return true
	}
}

// Write writes all of b like net.Conn's Write.
func (c *Conn) Write(b []byte) (int, error) {
	if len(b) == 0 {
		return 0, nil
	}
	c.wbuf, c.wn, c.werr = b, 0, 0
	err := c.rc.Write(c.writeF)
	for err != nil && c.early(err, &c.wd, false) {
		err = c.rc.Write(c.writeF)
	}
	n := c.wn
	c.wbuf = nil
	if err != nil {
		return n, err
	}
	if c.werr != 0 {
		return n, c.opError("write", c.werr)
	}
	return n, nil
}

func (c *Conn) writeFD(fd uintptr) bool {
	return c.writeAll(fd) != blocked
}

// write states.
const (
	written = iota // all of wbuf
	blocked        // EAGAIN: the socket buffer is full
	failed         // werr
)

// writeAll writes what is left of wbuf.
func (c *Conn) writeAll(fd uintptr) int {
	for c.wn < len(c.wbuf) {
		n, e := sysWrite(fd, c.wbuf[c.wn:])
		switch e {
		case 0:
			c.wn += n
			continue
		case syscall.EINTR:
			continue
		case syscall.EAGAIN:
			return blocked
		}
		c.werr = e
		return failed
	}
	return written
}

func (c *Conn) opError(op string, e syscall.Errno) error {
	return &net.OpError{Op: op, Net: c.net, Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: os.NewSyscallError(op, e)}
}

// WriteAwaitReply writes b, then waits until the connection has something
// to read (the peer's reply, its close) or the read deadline passes, for a
// request/response exchange. A Read's first read(2) would find nothing
// there yet (EAGAIN) and only then wait, one wasted system call per
// exchange; here the wait needs none, and the Read that follows finds the
// reply. It returns what Write would; a wait that ends without a reply (the
// deadline, Close) is not an error here: the next Read meets the same
// deadline or closed connection. It must not run concurrently with Read or
// Write.
//
// The wait is safe: RawConn.Read forgets earlier readiness before calling
// sendFD, which writes the request, so any reply arrives after that and
// wakes the wait.
func (c *Conn) WriteAwaitReply(b []byte) (int, error) {
	if len(b) == 0 {
		return 0, nil
	}
	c.wbuf, c.wn, c.werr, c.sent = b, 0, 0, false
	c.rc.Read(c.sendF) // the wait's own error is the next Read's
	n, sent := c.wn, c.sent
	c.wbuf, c.sent = nil, false
	switch {
	case c.werr != 0:
		return n, c.opError("write", c.werr)
	case !sent:
		// The socket buffer filled up (or the call never ran: a deadline
		// already past, a closed connection): write the rest the usual way.
		m, err := c.Write(b[n:])
		return n + m, err
	}
	return n, nil
}

// sendFD writes the request on its first call and asks RawConn.Read to wait
// for readability; the call after the wait ends the exchange without
// reading.
func (c *Conn) sendFD(fd uintptr) bool {
	if c.sent {
		return true
	}
	if c.writeAll(fd) != written {
		return true
	}
	c.sent = true
	return false
}

// deadline is one direction's deadline, armed lazily. Setting a deadline on
// a runtime connection modifies a runtime timer; an HTTP server sets one two
// or three times per request (idle, header, body), each time a little later
// than the last. Here a deadline that falls after the one already armed is
// only recorded: the armed one fires first, and the Read or Write it stops
// re-arms the recorded deadline and carries on (early). A deadline earlier
// than the armed one, the first one, and one already past are armed at once,
// so a deadline never fires late and one set to interrupt a call does.
type deadline struct {
	mu    sync.Mutex
	want  time.Time // the caller's deadline; zero = none
	armed time.Time // the connection's; zero = none
	arms  int       // times the connection's deadline was set (tests)
}

func (c *Conn) setDeadline(d *deadline, t time.Time, read bool) error {
	// Unlocked without defer: the recorded case, one or two per request
	// and direction, is most of the calls and a deferred Unlock was a
	// third of their cost.
	d.mu.Lock()
	d.want = t
	if t.IsZero() || !d.armed.IsZero() && !d.armed.After(t) {
		d.mu.Unlock()
		return nil
	}
	d.armed = t
	d.arms++
	err := c.arm(t, read)
	d.mu.Unlock()
	return err
}

func (c *Conn) arm(t time.Time, read bool) error {
	if read {
		return c.Conn.SetReadDeadline(t)
	}
	return c.Conn.SetWriteDeadline(t)
}

// early reports whether err is a deadline that fired before the caller's
// (or with none left): it re-arms the caller's deadline, and the call is
// retried.
func (c *Conn) early(err error, d *deadline, read bool) bool {
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		return false
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.want.IsZero() && !time.Now().Before(d.want) {
		return false
	}
	d.armed = d.want
	d.arms++
	return c.arm(d.want, read) == nil
}

// SetReadDeadline sets the read deadline (lazily: see deadline).
func (c *Conn) SetReadDeadline(t time.Time) error { return c.setDeadline(&c.rd, t, true) }

// SetWriteDeadline sets the write deadline (lazily: see deadline).
func (c *Conn) SetWriteDeadline(t time.Time) error { return c.setDeadline(&c.wd, t, false) }

// SetDeadline sets both deadlines.
func (c *Conn) SetDeadline(t time.Time) error {
	if err := c.SetReadDeadline(t); err != nil {
		return err
	}
	return c.SetWriteDeadline(t)
}
