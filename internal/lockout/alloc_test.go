//go:build !race

package lockout

import (
	"net"
	"testing"
	"time"
)

// Locked, on the path every authenticated request takes, allocates
// nothing: with no lockout in force, and with one (a lookup).
func TestLockedDoesNotAllocate(t *testing.T) {
	g, _ := newGuard(3, 0)
	ra := net.Addr(&net.TCPAddr{IP: net.ParseIP("10.9.9.9"), Port: 1234})
	check := func() {
		k, _ := KeyOf(ra)
		if _, ok := g.Locked(k); ok {
			t.Fatal("locked")
		}
	}
	if n := testing.AllocsPerRun(1000, check); n != 0 {
		t.Fatalf("no lockout in force: %.1f allocs", n)
	}
	for i := 0; i < 3; i++ {
		g.Failed(addr(1))
	}
	if n := testing.AllocsPerRun(1000, check); n != 0 {
		t.Fatalf("a lockout in force: %.1f allocs", n)
	}
}

// Await, on the same path, allocates nothing: with no key held anywhere
// (one atomic load) and with one held for another address (a lookup).
func TestAwaitDoesNotAllocate(t *testing.T) {
	g, _ := newGuard(3, 0)
	a := addr(7)
	await := func() { g.Await(a, time.Second) }
	if n := testing.AllocsPerRun(1000, await); n != 0 {
		t.Fatalf("no key held: %.1f allocs", n)
	}
	g.Failed(addr(1))
	g.Hold(addr(1))
	if n := testing.AllocsPerRun(1000, await); n != 0 {
		t.Fatalf("a key held for another address: %.1f allocs", n)
	}
}
