// Package tcpfront is a loopback TCP forwarder that holds one port for its
// whole life, so that a server behind it can be stopped and started again
// (on a fresh port of its own) while its clients keep one address. Tests
// (internal/testsrv) and `infera soak` put the servers they restart behind
// one. It knows nothing of what it relays.
package tcpfront

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/infera/infera/internal/freeport"
	"golang.org/x/sys/unix"
)

// Front relays the connections made to its port to a backend.
//
// A server restarted on its own port races every other process on the
// machine for that port in the instant between the stop and the start
// (other tests, benchmarks and servers start on free ports at the same
// time): another server may answer there, or the restarted one may fail
// to bind. A Front closes that window: a socket bound to its port
// (SO_REUSEPORT, not listening) holds the port from New to Close, and a
// second socket on the same port listens only while the server is up.
//
// What a client sees is what a real stop and start look like: while down,
// connecting is refused (nothing listens on the port), and Down cuts the
// connections it relays, the way a stopped server's connections end; after
// Up, new connections reach the new server.
type Front struct {
	// Addr is 127.0.0.1:Port, the address clients use.
	Addr string
	Port int

	hold int // the bound, never listening socket that holds the port

	mu      sync.Mutex
	ln      net.Listener // nil while down
	backend string
	conns   map[net.Conn]struct{} // both ends of every relayed connection
	wg      sync.WaitGroup
	closed  bool
}

// New binds a free loopback port (internal/freeport) and holds it until
// Close. The front starts down: Up gives it a backend.
func New() (*Front, error) {
	f := &Front{conns: map[net.Conn]struct{}{}}
	for attempt := 0; ; attempt++ {
		port, err := freeport.Get()
		if err != nil {
			return nil, err
		}
		fd, err := bindHold(port)
		if err == nil {
			f.Port, f.hold = port, fd
			break
		}
		if attempt >= 10 || !errors.Is(err, syscall.EADDRINUSE) {
			return nil, fmt.Errorf("cannot hold a loopback port for a front: %w", err)
		}
	}
	f.Addr = "127.0.0.1:" + strconv.Itoa(f.Port)
	return f, nil
}

// bindHold binds a TCP socket to 127.0.0.1:port with SO_REUSEPORT and no
// SO_REUSEADDR, without listening: it takes no connections, and no other
// socket can bind the port unless it also sets SO_REUSEPORT (servers do
// not), yet the front's own listener can.
func bindHold(port int) (int, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEPORT, 1); err != nil {
		unix.Close(fd)
		return -1, err
	}
	if err := unix.Bind(fd, &unix.SockaddrInet4{Port: port, Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		unix.Close(fd)
		return -1, err
	}
	return fd, nil
}

// Up relays new connections to backend (host:port), listening on the
// front's port. A front already up only changes its backend; a closed
// one does nothing.
func (f *Front) Up(backend string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return nil
	}
	f.backend = backend
	if f.ln != nil {
		return nil
	}
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		if err := c.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEPORT, 1)
		}); err != nil {
			return err
		}
		return serr
	}}
	ln, err := lc.Listen(context.Background(), "tcp4", f.Addr)
	if err != nil {
		return fmt.Errorf("front %s cannot listen again: %w", f.Addr, err)
	}
	f.ln = ln
	f.wg.Add(1)
	go f.accept(ln)
	return nil
}

// Down stops listening (connecting is refused; the port stays held), then
// cuts every connection relayed so far: in that order, as a server that
// stops closes its listener first, so a client that dials again the
// moment its connection ends is refused, not accepted and then reset.
func (f *Front) Down() {
	f.mu.Lock()
	ln := f.ln
	f.ln = nil
	if ln != nil {
		ln.Close()
	}
	for c := range f.conns {
		c.Close()
	}
	f.conns = map[net.Conn]struct{}{}
	f.mu.Unlock()
	f.wg.Wait()
}

// Close takes the front down for good and gives its port back. It may be
// called more than once.
func (f *Front) Close() {
	f.mu.Lock()
	closed := f.closed
	f.closed = true
	f.mu.Unlock()
	f.Down()
	if !closed {
		unix.Close(f.hold)
	}
}

func (f *Front) accept(ln net.Listener) {
	defer f.wg.Done()
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		f.mu.Lock()
		if f.ln != ln {
			f.mu.Unlock()
			c.Close()
			return
		}
		backend := f.backend
		f.conns[c] = struct{}{}
		f.wg.Add(1)
		f.mu.Unlock()
		go f.relay(c, backend)
	}
}

// relay copies bytes both ways between a client's connection and a new
// connection to backend until either ends, then closes both (the
// protocols relayed here never half-close). A backend that cannot be
// reached closes the client's connection at once.
func (f *Front) relay(c net.Conn, backend string) {
	defer f.wg.Done()
	defer f.forget(c)
	b, err := net.DialTimeout("tcp", backend, 2*time.Second)
	if err != nil {
		c.Close()
		return
	}
	f.mu.Lock()
	if _, ok := f.conns[c]; !ok { // Down cut c meanwhile
		f.mu.Unlock()
		b.Close()
		return
	}
	f.conns[b] = struct{}{}
	f.mu.Unlock()
	defer f.forget(b)
	done := make(chan struct{})
	go func() {
		io.Copy(b, c)
		b.Close()
		c.Close()
		close(done)
	}()
	io.Copy(c, b)
	c.Close()
	b.Close()
	<-done
}

func (f *Front) forget(c net.Conn) {
	c.Close()
	f.mu.Lock()
	delete(f.conns, c)
	f.mu.Unlock()
}
