//go:build !race

package realip

import (
	"net/netip"
	"testing"
)

// Finding the client allocates nothing: the header is read in place.
func TestFindingTheClientDoesNotAllocate(t *testing.T) {
	p := mustParse(t, "10.0.0.0/8", "2001:db8:ffff::/48")
	peer := netip.MustParseAddr("10.0.0.2")
	xff := [][]byte{[]byte("198.51.100.1, [2001:db8::7]:5555"), []byte("10.1.1.1, 2001:db8:ffff::1 ,10.0.0.3:80")}
	want := netip.MustParseAddr("2001:db8::7")
	if n := testing.AllocsPerRun(1000, func() {
		if p.Client(peer, xff) != want {
			t.Fatal("wrong client")
		}
	}); n != 0 {
		t.Fatalf("%.1f allocs", n)
	}
	s := []string{"198.51.100.1, unknown", "10.1.1.1"}
	if n := testing.AllocsPerRun(1000, func() { p.ClientString(peer, s) }); n != 0 {
		t.Fatalf("strings: %.1f allocs", n)
	}
}
