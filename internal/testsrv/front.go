package testsrv

import (
	"testing"

	"github.com/infera/infera/internal/tcpfront"
)

// Front is a tcpfront.Front held for a whole test: a loopback TCP
// forwarder whose port a server behind it keeps across stops and starts
// (on fresh ports of its own), so that no other process takes the port
// in between (see tcpfront). Its failures fail the test.
type Front struct {
	// Addr is 127.0.0.1:Port, the address clients use.
	Addr string
	Port int

	t testing.TB
	f *tcpfront.Front
}

// NewFront binds a free loopback port and holds it until the test ends.
// The front starts down: Up gives it a backend.
func NewFront(t testing.TB) *Front {
	t.Helper()
	f, err := tcpfront.New()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.Close)
	return &Front{Addr: f.Addr, Port: f.Port, t: t, f: f}
}

// Up relays new connections to backend (host:port), listening on the
// front's port. A front already up only changes its backend.
func (f *Front) Up(backend string) {
	f.t.Helper()
	if err := f.f.Up(backend); err != nil {
		f.t.Fatal(err)
	}
}

// Down stops listening (connecting is refused; the port stays held), then
// cuts every connection relayed so far.
func (f *Front) Down() { f.f.Down() }
