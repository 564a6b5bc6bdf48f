package proxy

import (
	"fmt"
	"net"
	"runtime"
	"strings"
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

// A client that pipelines a request behind a slow non-streaming one, more
// of it than the server's read buffer took, then closes its connection:
// its engine request is cancelled. The watchdog's peek saw the unread
// pipelined bytes (the FIN is behind them) and took the client for
// present, and the engine generated for nobody until it answered.
func TestAPipeliningClientThatLeavesCancelsTheEngineRequest(t *testing.T) {
	closed := make(chan time.Time, 1)
	up := startRaw(t, func(n int, req string, c net.Conn) {
		b := make([]byte, 1)
		c.SetReadDeadline(time.Now().Add(8 * time.Second))
		if _, err := c.Read(b); err != nil {
			closed <- time.Now()
		}
	})
	r := startRouter(t, nil, nil, up.url)
	c, err := net.Dial("tcp4", strings.TrimPrefix(r.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	big := strings.Repeat(" ", 40000) + chatBody
	req := fmt.Sprintf("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s", len(chatBody), chatBody) +
		fmt.Sprintf("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s", len(big), big)
	if _, err := c.Write([]byte(req)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	left := time.Now()
	c.Close()
	select {
	case at := <-closed:
		if d := at.Sub(left); d > 2*time.Second {
			t.Fatalf("engine connection closed %v after the client left", d)
		}
	case <-time.After(4 * time.Second):
		t.Fatal("the engine request was not cancelled within 4 s of the client leaving (its pipelined bytes hide the close)")
	}
}
