package testsrv

import (
	"net"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// SYNDropping returns a loopback host:port whose SYNs go unanswered, as a
// blackholed host's: a listener with a backlog of one that never accepts,
// its accept queue filled, so that Linux drops every further SYN and a
// dial hangs until its own timeout. It is closed when the test ends.
func SYNDropping(t testing.TB) string {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Listen(fd, 0); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(sa.(*syscall.SockaddrInet4).Port))
	// Fill the accept queue: the dial that times out is the first whose
	// SYN was dropped.
	for i := 0; ; i++ {
		c, err := (&net.Dialer{Timeout: 200 * time.Millisecond}).Dial("tcp4", addr)
		if err != nil {
			break
		}
		t.Cleanup(func() { c.Close() })
		if i == 16 {
			t.Fatalf("%s: the accept queue never filled", addr)
		}
	}
	return addr
}

// Closed returns a loopback host:port with nothing listening (connection
// refused).
func Closed(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}
