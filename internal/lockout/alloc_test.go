//go:build !race

package lockout

import (
	"net"
	"testing"
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
