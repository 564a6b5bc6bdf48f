package sockio

import (
	"io"
	"net"
	"os"
	"syscall"
)

// Conn is a TCP connection whose Read and Write bypass the scheduler's
// system-call accounting. Everything else (deadlines, Close, addresses) is
// the wrapped connection's. Like a net.Conn, it takes one Read and one
// Write at a time concurrently; unlike it, not two concurrent Reads (or two
// Writes). Other connection types are not wrapped: see Wrap.
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
	return w
}

// Unwrap returns the wrapped connection.
func (c *Conn) Unwrap() net.Conn { return c.Conn }

// Read reads into b like net.Conn's Read.
func (c *Conn) Read(b []byte) (int, error) {
	if len(b) == 0 {
		return 0, nil
	}
	c.rbuf = b
	err := c.rc.Read(c.readF)
	c.rbuf = nil
	if err != nil {
		return 0, err
	}
	if c.rerr != 0 {
		return 0, &net.OpError{Op: "read", Net: c.net, Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: os.NewSyscallError("read", c.rerr)}
	}
	if c.rn == 0 {
		return 0, io.EOF
	}
	return c.rn, nil
}

func (c *Conn) readFD(fd uintptr) bool {
	for {
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
	n := c.wn
	c.wbuf = nil
	if err != nil {
		return n, err
	}
	if c.werr != 0 {
		return n, &net.OpError{Op: "write", Net: c.net, Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: os.NewSyscallError("write", c.werr)}
	}
	return n, nil
}

func (c *Conn) writeFD(fd uintptr) bool {
	for c.wn < len(c.wbuf) {
		n, e := sysWrite(fd, c.wbuf[c.wn:])
		switch e {
		case 0:
			c.wn += n
			continue
		case syscall.EINTR:
			continue
		case syscall.EAGAIN:
			return false
		}
		c.werr = e
		return true
	}
	return true
}
