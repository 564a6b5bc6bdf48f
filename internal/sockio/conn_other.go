//go:build !linux

package sockio

import "net"

// Wrap returns c: the raw path is Linux-only.
func Wrap(c net.Conn) net.Conn { return c }
