package mirror

import (
	"net"
	"syscall"
	"unsafe"
)

// sockFD returns the socket descriptor behind c, or -1. Call it once per
// connection.
func sockFD(c net.Conn) int {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return -1
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return -1
	}
	fd := -1
	rc.Control(func(f uintptr) { fd = int(f) })
	return fd
}

// peekState is what a non-blocking peek at a socket found.
type peekState uint8

const (
	peekEmpty  peekState = iota // nothing to read, still open
	peekData                    // bytes are waiting
	peekClosed                  // the peer closed or reset the connection
)

// peek looks at fd without blocking and without consuming anything (recv
// with MSG_PEEK|MSG_DONTWAIT): one system call, no allocation. fd < 0
// reports peekEmpty.
func peek(fd int) peekState {
	if fd < 0 {
		return peekEmpty
	}
	var b [1]byte
	n, _, errno := syscall.Syscall6(syscall.SYS_RECVFROM, uintptr(fd), uintptr(unsafe.Pointer(&b[0])), 1,
		syscall.MSG_PEEK|syscall.MSG_DONTWAIT, 0, 0)
	switch {
	case errno == syscall.EAGAIN || errno == syscall.EINTR:
		return peekEmpty
	case errno != 0 || n == 0:
		return peekClosed
	}
	return peekData
}
