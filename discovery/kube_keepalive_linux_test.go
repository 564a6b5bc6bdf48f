package discovery

import (
	"context"
	"net"
	"net/http"
	"syscall"
	"testing"
	"time"
)

// A watch may rightly stay quiet for its whole timeoutSeconds, so an API
// server gone without a FIN or RST (a node lost, a partition) is noticed
// by the connection's TCP keepalive: probes start after 15 s of silence
// and a peer that answers none is dropped within 30 s. The dialer had a
// KeepAlive of 30 s: 30 s idle, then Go's 9 probes 15 s apart, 165 s.
func TestKubeAPIConnectionsDropAPeerThatAnswersNoProbeWithin30s(t *testing.T) {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	c, err := newKubeClient(&KubeConfig{Server: "http://" + ln.Addr().String()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, err := c.hc.Transport.(*http.Transport).DialContext(ctx, "tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	rc, err := conn.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var on, idle, intvl, cnt int
	var gerr error
	rc.Control(func(fd uintptr) {
		get := func(level, opt int) int {
			v, err := syscall.GetsockoptInt(int(fd), level, opt)
			if err != nil && gerr == nil {
				gerr = err
			}
			return v
		}
		on = get(syscall.SOL_SOCKET, syscall.SO_KEEPALIVE)
		idle = get(syscall.IPPROTO_TCP, syscall.TCP_KEEPIDLE)
		intvl = get(syscall.IPPROTO_TCP, syscall.TCP_KEEPINTVL)
		cnt = get(syscall.IPPROTO_TCP, syscall.TCP_KEEPCNT)
	})
	if gerr != nil {
		t.Fatal(gerr)
	}
	if on == 0 || idle+intvl*cnt > 30 {
		t.Fatalf("keepalive %v: idle %d s, %d probes %d s apart: a dead API server is dropped after %d s, want 30 s at most",
			on != 0, idle, cnt, intvl, idle+intvl*cnt)
	}
}
