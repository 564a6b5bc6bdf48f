package bench

import (
	"errors"
	"fmt"
	"net"
	"runtime"
	"syscall"
	"unsafe"
)

// epollProxy is the event-loop reference of `infera bench naive-proxy
// --loops N`: N threads, each with its own epoll set, its own listening
// socket (SO_REUSEPORT) and its own keep-alive connections to the
// upstream, relaying HTTP/1.1 requests and responses byte for byte the way
// nginx's worker does: no goroutine per connection, no scheduler, reads
// and writes issued as raw system calls. It parses only what framing needs
// (Content-Length, chunked), so it is the floor of what a Go proxy with an
// event loop costs per request on this machine, not a usable proxy: no
// limits, timeouts, errors beyond closing, or header hygiene.
func epollProxy(listen, upstream string, loops int) error {
	f, err := startEpollFloor(listen, upstream, loops)
	if err != nil {
		return err
	}
	return <-f.errc
}

// epollFloor is a running epollProxy.
type epollFloor struct {
	addr  string // where it listens
	loops []*epLoop
	errc  chan error // each loop's end
}

// startEpollFloor starts loops event loops on listen (port 0: a free port,
// shared by all loops) relaying to upstream.
func startEpollFloor(listen, upstream string, loops int) (*epollFloor, error) {
	la, err := net.ResolveTCPAddr("tcp4", listen)
	if err != nil {
		return nil, err
	}
	ua, err := net.ResolveTCPAddr("tcp4", upstream)
	if err != nil {
		return nil, err
	}
	f := &epollFloor{errc: make(chan error, loops)}
	for range max(loops, 1) {
		l, err := newLoop(la, ua)
		if err != nil {
			f.Close()
			return nil, err
		}
		if la.Port == 0 {
			sa, err := syscall.Getsockname(l.lfd)
			if err != nil {
				l.closeAll()
				f.Close()
				return nil, err
			}
			la.Port = sa.(*syscall.SockaddrInet4).Port
		}
		f.loops = append(f.loops, l)
	}
	f.addr = la.String()
	for _, l := range f.loops {
		go func() { f.errc <- l.run() }()
	}
	return f, nil
}

// Close stops the loops and waits until they have closed their sockets.
func (f *epollFloor) Close() {
	for _, l := range f.loops {
		one := [8]byte{1}
		_, _ = syscall.Write(l.wake, one[:])
	}
	for range f.loops {
		<-f.errc
	}
	f.loops = nil
}

type epConn struct {
	fd     int
	client bool
	peer   *epConn // the client's upstream while a request is in flight, and back
	in     []byte  // client: request bytes read so far
	out    []byte  // bytes waiting for the socket to take them
	fr     frame   // upstream: the response's framing
}

type epLoop struct {
	ep   int
	lfd  int
	wake int // eventfd: Close
	up   [4]byte
	port int
	fds  []*epConn
	idle []*epConn
	buf  []byte
	evs  []syscall.EpollEvent
}

func newLoop(la, ua *net.TCPAddr) (*epLoop, error) {
	l := &epLoop{buf: make([]byte, 64<<10), evs: make([]syscall.EpollEvent, 256), port: ua.Port, lfd: -1, wake: -1}
	copy(l.up[:], ua.IP.To4())
	var err error
	if l.ep, err = syscall.EpollCreate1(syscall.EPOLL_CLOEXEC); err != nil {
		return nil, err
	}
	if l.wake, err = unixEventfd(); err != nil {
		_ = syscall.Close(l.ep)
		return nil, err
	}
	if err := syscall.EpollCtl(l.ep, syscall.EPOLL_CTL_ADD, l.wake, &syscall.EpollEvent{Events: syscall.EPOLLIN, Fd: int32(l.wake)}); err != nil {
		l.closeAll()
		return nil, err
	}
	if l.lfd, err = syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_NONBLOCK|syscall.SOCK_CLOEXEC, 0); err != nil {
		return nil, err
	}
	_ = syscall.SetsockoptInt(l.lfd, syscall.SOL_SOCKET, syscall.SO_REUSEADDR, 1)
	_ = syscall.SetsockoptInt(l.lfd, syscall.SOL_SOCKET, 0xf /* SO_REUSEPORT */, 1)
	sa := &syscall.SockaddrInet4{Port: la.Port}
	copy(sa.Addr[:], la.IP.To4())
	if err := syscall.Bind(l.lfd, sa); err != nil {
		l.closeAll()
		return nil, fmt.Errorf("cannot listen on %s: %w", la, err)
	}
	if err := syscall.Listen(l.lfd, 4096); err != nil {
		l.closeAll()
		return nil, err
	}
	if err := syscall.EpollCtl(l.ep, syscall.EPOLL_CTL_ADD, l.lfd, &syscall.EpollEvent{Events: syscall.EPOLLIN, Fd: int32(l.lfd)}); err != nil {
		l.closeAll()
		return nil, err
	}
	return l, nil
}

func unixEventfd() (int, error) {
	fd, _, e := syscall.RawSyscall(syscall.SYS_EVENTFD2, 0, syscall.O_CLOEXEC|syscall.O_NONBLOCK, 0)
	if e != 0 {
		return -1, e
	}
	return int(fd), nil
}

// closeAll closes every socket of the loop and the loop's own descriptors.
func (l *epLoop) closeAll() {
	for _, c := range l.fds {
		if c != nil {
			l.close(c)
		}
	}
	for _, fd := range []int{l.lfd, l.wake, l.ep} {
		if fd >= 0 {
			_ = syscall.Close(fd)
		}
	}
}

func rawRead(fd int, b []byte) (int, syscall.Errno) {
	n, _, e := syscall.RawSyscall(syscall.SYS_READ, uintptr(fd), uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)))
	return int(n), e
}

func rawWrite(fd int, b []byte) (int, syscall.Errno) {
	n, _, e := syscall.RawSyscall(syscall.SYS_WRITE, uintptr(fd), uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)))
	return int(n), e
}

func (l *epLoop) run() error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	defer l.closeAll()
	for {
		// Poll without blocking first (no hand-off of the P); block only
		// when nothing is ready.
		n, _, e := syscall.RawSyscall6(syscall.SYS_EPOLL_WAIT, uintptr(l.ep), uintptr(unsafe.Pointer(&l.evs[0])), uintptr(len(l.evs)), 0, 0, 0)
		if e == 0 && n == 0 {
			var err error
			var m int
			m, err = syscall.EpollWait(l.ep, l.evs, -1)
			if err != nil && !errors.Is(err, syscall.EINTR) {
				return err
			}
			n = uintptr(max(m, 0))
		} else if e != 0 && e != syscall.EINTR {
			return e
		}
		for i := range int(n) {
			ev := l.evs[i]
			fd := int(ev.Fd)
			if fd == l.wake {
				return nil
			}
			if fd == l.lfd {
				l.accept()
				continue
			}
			c := l.conn(fd)
			if c == nil {
				continue
			}
			if ev.Events&syscall.EPOLLOUT != 0 && len(c.out) > 0 {
				l.flush(c)
			}
			if ev.Events&(syscall.EPOLLIN|syscall.EPOLLHUP|syscall.EPOLLERR) != 0 {
				if c.client {
					l.clientRead(c)
				} else {
					l.upRead(c)
				}
			}
		}
	}
}

func (l *epLoop) conn(fd int) *epConn {
	if fd < len(l.fds) {
		return l.fds[fd]
	}
	return nil
}

func (l *epLoop) add(c *epConn) {
	for c.fd >= len(l.fds) {
		l.fds = append(l.fds, nil)
	}
	l.fds[c.fd] = c
	_ = syscall.EpollCtl(l.ep, syscall.EPOLL_CTL_ADD, c.fd, &syscall.EpollEvent{Events: syscall.EPOLLIN | syscall.EPOLLRDHUP, Fd: int32(c.fd)})
}

func (l *epLoop) close(c *epConn) {
	if c == nil || c.fd < 0 {
		return
	}
	l.fds[c.fd] = nil
	_ = syscall.Close(c.fd)
	c.fd = -1
	if p := c.peer; p != nil {
		c.peer, p.peer = nil, nil
		l.close(p)
	}
}

func (l *epLoop) accept() {
	for {
		fd, _, err := syscall.Accept4(l.lfd, syscall.SOCK_NONBLOCK|syscall.SOCK_CLOEXEC)
		if err != nil {
			return
		}
		_ = syscall.SetsockoptInt(fd, syscall.IPPROTO_TCP, syscall.TCP_NODELAY, 1)
		l.add(&epConn{fd: fd, client: true})
	}
}

// maxPending bounds what a client may send ahead of its answers.
const maxPending = 1 << 20

func (l *epLoop) clientRead(c *epConn) {
	n, e := rawRead(c.fd, l.buf)
	if e == syscall.EAGAIN {
		return
	}
	if e != 0 || n == 0 || len(c.in)+n > maxPending {
		l.close(c)
		return
	}
	// Read even while a request is in flight: level-triggered readiness
	// would otherwise report the unread bytes again and again.
	c.in = append(c.in, l.buf[:n]...)
	l.dispatch(c)
}

// dispatch sends the client's next whole request upstream, one at a time.
func (l *epLoop) dispatch(c *epConn) {
	if c.peer != nil || c.fd < 0 {
		return
	}
	need := requestEnd(c.in)
	if need == 0 {
		return
	}
	u := l.upstream()
	if u == nil {
		l.close(c)
		return
	}
	c.peer, u.peer = u, c
	u.fr = frame{}
	l.send(u, c.in[:need])
	c.in = append(c.in[:0], c.in[need:]...)
}

func (l *epLoop) upstream() *epConn {
	if n := len(l.idle); n > 0 {
		u := l.idle[n-1]
		l.idle = l.idle[:n-1]
		if u.fd >= 0 {
			return u
		}
	}
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil
	}
	if err := syscall.Connect(fd, &syscall.SockaddrInet4{Port: l.port, Addr: l.up}); err != nil {
		_ = syscall.Close(fd)
		return nil
	}
	_ = syscall.SetNonblock(fd, true)
	_ = syscall.SetsockoptInt(fd, syscall.IPPROTO_TCP, syscall.TCP_NODELAY, 1)
	u := &epConn{fd: fd}
	l.add(u)
	return u
}

// send writes b to c, keeping what the socket does not take for EPOLLOUT.
func (l *epLoop) send(c *epConn, b []byte) {
	if len(c.out) > 0 {
		c.out = append(c.out, b...)
		return
	}
	for len(b) > 0 {
		n, e := rawWrite(c.fd, b)
		if e == syscall.EAGAIN {
			c.out = append(c.out, b...)
			_ = syscall.EpollCtl(l.ep, syscall.EPOLL_CTL_MOD, c.fd, &syscall.EpollEvent{Events: syscall.EPOLLIN | syscall.EPOLLOUT | syscall.EPOLLRDHUP, Fd: int32(c.fd)})
			return
		}
		if e != 0 {
			l.close(c)
			return
		}
		b = b[n:]
	}
}

func (l *epLoop) flush(c *epConn) {
	b := c.out
	c.out = c.out[:0]
	_ = syscall.EpollCtl(l.ep, syscall.EPOLL_CTL_MOD, c.fd, &syscall.EpollEvent{Events: syscall.EPOLLIN | syscall.EPOLLRDHUP, Fd: int32(c.fd)})
	l.send(c, b)
}

func (l *epLoop) upRead(u *epConn) {
	c := u.peer
	n, e := rawRead(u.fd, l.buf)
	if e == syscall.EAGAIN {
		return
	}
	if e != 0 || n == 0 || c == nil {
		l.close(u)
		return
	}
	b := l.buf[:n]
	done, ok := u.fr.scan(b)
	if !ok {
		l.close(u)
		return
	}
	l.send(c, b)
	if done {
		c.peer, u.peer = nil, nil
		l.idle = append(l.idle, u)
		l.dispatch(c)
	}
}
