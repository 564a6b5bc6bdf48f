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

// PeerClosed reports whether the peer of the TCP socket fd closed its side
// (the socket is in CLOSE_WAIT) or the connection is gone (CLOSE, after a
// reset), whatever bytes still wait to be read: a TLS client's close_notify
// arrives as a record before its FIN, so Peek sees Data. One getsockopt
// (TCP_INFO, its first byte: tcpi_state), no allocation. fd < 0 reports
// false.
func PeerClosed(fd int) bool {
	if fd < 0 {
		return false
	}
	var info [8]byte
	n := uint32(len(info))
	_, _, errno := syscall.RawSyscall6(syscall.SYS_GETSOCKOPT, uintptr(fd), syscall.IPPROTO_TCP, syscall.TCP_INFO,
		uintptr(unsafe.Pointer(&info[0])), uintptr(unsafe.Pointer(&n)), 0)
	if errno != 0 {
		return errno == syscall.EBADF || errno == syscall.ENOTCONN
	}
	const tcpClose, tcpCloseWait = 7, 8 // include/net/tcp_states.h
	return n > 0 && (info[0] == tcpCloseWait || info[0] == tcpClose)
}

// TLSRecords reports how many bytes wait on fd when they are whole TLS
// records (wholeRecords), and -1 otherwise: a record still arriving, more
// than tlsPeekMax bytes, nothing, or an error. One recv with MSG_PEEK, no
// allocation. fd < 0 reports -1.
func TLSRecords(fd int) int {
	if fd < 0 {
		return -1
	}
	var b [tlsPeekMax]byte
	n, errno := peekInto(fd, b[:])
	if errno != 0 || n == 0 || n == len(b) {
		return -1
	}
	return wholeRecords(b[:n])
}

// peekInto copies what waits on fd into b without taking it (recv with
// MSG_PEEK|MSG_DONTWAIT).
func peekInto(fd int, b []byte) (int, syscall.Errno) {
	n, _, errno := syscall.RawSyscall6(syscall.SYS_RECVFROM, uintptr(fd), uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)),
		syscall.MSG_PEEK|syscall.MSG_DONTWAIT, 0, 0)
	return int(n), errno
}
