//go:build linux || darwin || freebsd || netbsd || openbsd

package engine

import (
	"net"
	"syscall"
)

// peerClosed reports whether the client closed its side of conn, without
// consuming any byte (MSG_PEEK | MSG_DONTWAIT). Pipelined data pending on the
// socket counts as open.
func peerClosed(conn net.Conn) bool {
	sc, ok := conn.(syscall.Conn)
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return true
	}
	closed := false
	var buf [1]byte
	cerr := rc.Control(func(fd uintptr) {
		n, _, err := syscall.Recvfrom(int(fd), buf[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		switch {
		case err == syscall.EAGAIN || err == syscall.EWOULDBLOCK || err == syscall.EINTR:
		case err != nil:
			closed = true
		case n == 0:
			closed = true
		}
	})
	return cerr != nil || closed
}
