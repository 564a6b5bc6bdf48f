package freeport

import (
	"net"
	"strconv"
	"testing"
)

func TestGetReturnsABindablePortBelowTheEphemeralRange(t *testing.T) {
	lo, _ := ephemeralRange()
	for range 20 {
		p, err := Get()
		if err != nil {
			t.Fatal(err)
		}
		if lo-low >= 1000 && (p < low || p >= lo) {
			t.Fatalf("port %d outside [%d, %d)", p, low, lo)
		}
		ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
		if err != nil {
			t.Fatalf("port %d not bindable: %v", p, err)
		}
		ln.Close()
	}
}
