// Package freeport finds free loopback TCP ports for child processes (the
// engines, routers and servers that tests and `infera bench` start).
//
// A port from the kernel's ephemeral range (what listening on port 0
// gives) is also where outgoing connections take their source ports, so
// between picking it and the child binding it, any client connection on
// the machine may take it ("address already in use"). Get therefore picks
// at random below the ephemeral range, where the kernel never assigns
// source ports, and checks that the port can be bound.
package freeport

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
)

// low is the first port Get picks from (below it are the well-known and
// commonly configured ports).
const low = 20000

// Get returns a loopback TCP port that was free a moment ago.
func Get() (int, error) {
	lo, _ := ephemeralRange()
	if lo-low >= 1000 {
		for range 64 {
			p := low + rand.IntN(lo-low)
			if ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p)); err == nil {
				ln.Close()
				return p, nil
			}
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("cannot find a free port: %w", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// ephemeralRange returns the kernel's source port range (Linux's default
// when it cannot be read).
func ephemeralRange() (lo, hi int) {
	lo, hi = 32768, 60999
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return
	}
	l, err1 := strconv.Atoi(f[0])
	h, err2 := strconv.Atoi(f[1])
	if err1 != nil || err2 != nil || l <= 0 || h < l {
		return
	}
	return l, h
}
