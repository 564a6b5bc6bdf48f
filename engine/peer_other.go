//go:build !(linux || darwin || freebsd || netbsd || openbsd)

package engine

import "net"

// peerClosed cannot tell on this platform; hung requests end when the fault
// is cleared or the engine stops.
func peerClosed(net.Conn) bool { return false }
