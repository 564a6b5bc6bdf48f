//go:build !linux

package mirror

import "net"

// sockFD: pooled connections are not checked before reuse on this system.
func sockFD(net.Conn) int { return -1 }

type peekState uint8

const (
	peekEmpty peekState = iota
	peekData
	peekClosed
)

func peek(int) peekState { return peekEmpty }
