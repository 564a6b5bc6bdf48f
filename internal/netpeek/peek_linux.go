package netpeek

import (
	"net"
	"syscall"
	"unsafe"
)

// SockFD returns the socket descriptor behind c, or -1 (TLS, pipes, tests'
// in-memory connections). Call it once per connection.
func SockFD(c net.Conn) int {
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

// Peek looks at fd (recv with MSG_PEEK|MSG_DONTWAIT): one system call, no
// allocation. fd < 0 reports Empty.
func Peek(fd int) State {
	if fd < 0 {
		return Empty
	}
	var b [1]byte
	n, _, errno := syscall.RawSyscall6(syscall.SYS_RECVFROM, uintptr(fd), uintptr(unsafe.Pointer(&b[0])), 1,
		syscall.MSG_PEEK|syscall.MSG_DONTWAIT, 0, 0)
	switch {
	case errno == syscall.EAGAIN || errno == syscall.EINTR:
		return Empty
	case errno != 0:
		return Closed
	case n == 0:
		return Closed
	}
	return Data
}
