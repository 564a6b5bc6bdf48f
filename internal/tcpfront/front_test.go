package tcpfront

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"syscall"
	"testing"
	"time"
)

// echoServer answers each line with the same line plus its own name.
func echoServer(t *testing.T, name string) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				for {
					l, err := br.ReadString('\n')
					if err != nil {
						return
					}
					c.Write([]byte(name + ":" + l))
				}
			}()
		}
	}()
	return ln
}

func newFront(t *testing.T) *Front {
	t.Helper()
	f, err := New()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.Close)
	return f
}

func up(t *testing.T, f *Front, backend string) {
	t.Helper()
	if err := f.Up(backend); err != nil {
		t.Fatal(err)
	}
}

func roundTrip(c net.Conn) (string, error) {
	c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := c.Write([]byte("hi\n")); err != nil {
		return "", err
	}
	return bufio.NewReader(c).ReadString('\n')
}

// Between Down and Up the front's port is refused to clients and to any
// other process that wants to listen on it; Down cuts the relayed
// connections and Up reaches the new backend.
func TestFrontHoldsItsPortWhileDownAndCutsItsConnections(t *testing.T) {
	a, b := echoServer(t, "a"), echoServer(t, "b")
	f := newFront(t)
	if _, err := net.DialTimeout("tcp", f.Addr, time.Second); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("a front not yet up: dial %v, want connection refused", err)
	}
	up(t, f, a.Addr().String())
	c, err := net.DialTimeout("tcp", f.Addr, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if got, err := roundTrip(c); got != "a:hi\n" {
		t.Fatalf("through the front: %q %v", got, err)
	}

	f.Down()
	if _, err := roundTrip(c); err == nil {
		t.Fatal("a connection relayed before Down still works after it")
	}
	if _, err := net.DialTimeout("tcp", f.Addr, time.Second); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("a front that is down: dial %v, want connection refused", err)
	}
	if ln, err := net.Listen("tcp", f.Addr); err == nil {
		ln.Close()
		t.Fatalf("another listener took the port of a front that is down")
	}
	if ln, err := net.Listen("tcp", "0.0.0.0:"+f.Addr[len("127.0.0.1:"):]); err == nil {
		ln.Close()
		t.Fatalf("a wildcard listener took the port of a front that is down")
	}

	up(t, f, b.Addr().String())
	c2, err := net.DialTimeout("tcp", f.Addr, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	if got, err := roundTrip(c2); got != "b:hi\n" {
		t.Fatalf("through the front after Up on a new backend: %q %v", got, err)
	}
}

// A front going down stops listening before it cuts the connections it
// relays, as a server that stops closes its listener first: a client
// that dials again the moment its connection ends is refused, not
// accepted and then reset (which a client may take for another failure
// than a server that is down).
func TestAFrontRefusesAClientThatReconnectsTheMomentItsConnectionIsCut(t *testing.T) {
	a := echoServer(t, "a")
	f := newFront(t)
	for i := 0; i < 100; i++ {
		up(t, f, a.Addr().String())
		c, err := net.DialTimeout("tcp", f.Addr, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := roundTrip(c); err != nil {
			t.Fatal(err)
		}
		redial := make(chan error, 1)
		go func() {
			c.SetReadDeadline(time.Now().Add(5 * time.Second))
			c.Read(make([]byte, 1)) // ends when Down cuts it
			c.Close()
			c2, err := net.DialTimeout("tcp", f.Addr, time.Second)
			if err != nil {
				redial <- err
				return
			}
			_, err = roundTrip(c2)
			c2.Close()
			redial <- fmt.Errorf("accepted, then %v", err)
		}()
		f.Down()
		if err := <-redial; !errors.Is(err, syscall.ECONNREFUSED) {
			t.Fatalf("cycle %d: dialing the moment the front cut the connection: %v, want connection refused", i, err)
		}
	}
}
