package proxy

import (
	"net"
	"runtime"
	"testing"
	"time"

	"github.com/infera/infera/internal/netpeek"
)

// abortCounter is an attempt target that counts aborts.
type abortCounter struct{ n int }

func (a *abortCounter) abort() { a.n++ }

// loopbackPair returns both ends of a loopback TCP connection.
func loopbackPair(t *testing.T) (client, server net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	client, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	server, err = ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close(); server.Close() })
	return client, server
}

func TestWatchdogAbortsOnlyWatchedRequestsWhoseClientLeft(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("peek is Linux only")
	}
	l := newLiveness()
	now := time.Now()
	mk := func() (*reqState, *abortCounter, net.Conn) {
		client, server := loopbackPair(t)
		rs := &reqState{start: now.Add(-time.Second)}
		l.register(rs)
		a := &abortCounter{}
		rs.call.cancel.set(a)
		rs.watched = true
		rs.live.since, rs.live.fd = rs.start.UnixNano(), netpeek.SockFD(server)
		return rs, a, client
	}
	gone, goneAbort, goneClient := mk()
	stay, stayAbort, _ := mk()
	young, youngAbort, youngClient := mk()
	young.live.since = now.UnixNano()
	unwatched, unwatchedAbort, unwatchedClient := mk()
	l.remove(unwatched)
	for _, c := range []net.Conn{goneClient, youngClient, unwatchedClient} {
		c.Close()
	}
	time.Sleep(20 * time.Millisecond) // the FIN arrives
	l.check(now.UnixNano())
	if goneAbort.n != 1 || !gone.call.cancel.wasAborted() {
		t.Fatalf("client gone for a watched request: %d aborts, want 1", goneAbort.n)
	}
	if stayAbort.n != 0 || youngAbort.n != 0 || unwatchedAbort.n != 0 {
		t.Fatalf("aborts: client still there %d, request younger than %v %d, unwatched %d; want none",
			stayAbort.n, time.Duration(livenessAfter), youngAbort.n, unwatchedAbort.n)
	}
	l.check(now.UnixNano())
	if goneAbort.n != 1 {
		t.Fatalf("an aborted request was aborted again (%d)", goneAbort.n)
	}
	runtime.KeepAlive([]*reqState{gone, stay, young, unwatched})
}

func TestWatchdogRegistryForgetsStatesThePoolDropped(t *testing.T) {
	l := newLiveness()
	kept := &reqState{}
	l.register(kept)
	for range 100 {
		l.register(&reqState{})
	}
	runtime.GC()
	l.check(time.Now().UnixNano())
	if len(l.reg) != 1 || l.reg[0].Value() != kept {
		t.Fatalf("registry holds %d states after a GC, want only the live one", len(l.reg))
	}
	runtime.KeepAlive(kept)
}
