//go:build !linux

package netpeek

import "net"

// SockFD: peeking needs Linux; elsewhere the checks are skipped.
func SockFD(c net.Conn) int { return -1 }

// Peek reports Empty (unsupported).
func Peek(fd int) State { return Empty }

// PeerClosed reports false (unsupported).
func PeerClosed(fd int) bool { return false }

// TLSRecords reports -1 (unsupported).
func TLSRecords(fd int) int { return -1 }
