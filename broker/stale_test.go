package broker

import (
	"io"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/infera/infera/internal/testsrv"
	"github.com/nats-io/nats.go"
)

// freezer forwards TCP connections to addr until frozen, then forwards
// nothing more and closes nothing: a broker that hangs, or a network path
// to it that went dark without a reset.
type freezer struct {
	ln     net.Listener
	frozen atomic.Bool
}

func startFreezer(t *testing.T, addr string) *freezer {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &freezer{ln: ln}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			u, err := net.Dial("tcp", addr)
			if err != nil {
				c.Close()
				continue
			}
			t.Cleanup(func() { c.Close(); u.Close() })
			go f.pipe(u, c)
			go f.pipe(c, u)
		}
	}()
	return f
}

func (f *freezer) pipe(dst io.Writer, src io.Reader) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		for f.frozen.Load() {
			time.Sleep(10 * time.Millisecond)
		}
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// TestAConnectionToABrokerThatStoppedAnsweringIsGivenUp: a broker that
// hangs (or a network path to it that goes dark without a reset) leaves the
// TCP connection open. nats.go notices only when its pings go unanswered,
// every 2 minutes by default with two outstanding: for 4-6 minutes the
// router's /health said ok and every NATS request hung until its own
// timeout (a frozen nats-server: a request still waiting at 12 s, /health
// 200), instead of 503 broker_unavailable and a reconnect. Reconnect pings
// every 5 s, so such a connection is dropped within about 15 s.
func TestAConnectionToABrokerThatStoppedAnsweringIsGivenUp(t *testing.T) {
	ns := testsrv.StartNATS(t)
	fz := startFreezer(t, strings.TrimPrefix(ns.URL, "nats://"))
	disconnected := make(chan struct{}, 1)
	nc, err := nats.Connect("nats://"+fz.ln.Addr().String(), append(Reconnect(),
		nats.DisconnectErrHandler(func(*nats.Conn, error) {
			select {
			case disconnected <- struct{}{}:
			default:
			}
		}))...)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	fz.frozen.Store(true)
	start := time.Now()
	select {
	case <-disconnected:
		t.Logf("given up after %v", time.Since(start).Round(time.Millisecond))
	case <-time.After(20 * time.Second):
		t.Fatalf("still %v 20 s after the broker stopped answering", nc.Status())
	}
}
