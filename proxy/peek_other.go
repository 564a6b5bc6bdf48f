//go:build !linux

package proxy

import "net"

type peekState uint8

const (
	peekEmpty peekState = iota
	peekData
	peekClosed
)

// sockFD: connection checks need Linux; elsewhere they are skipped.
func sockFD(c net.Conn) int { return -1 }

func peek(fd int) peekState { return peekEmpty }
