package broker

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/infera/infera/internal/testsrv"
	"github.com/nats-io/nats.go"
)

// A router whose NATS user may not publish to the workers' request
// subjects (a locked-down broker's permissions, easy to get wrong) gets
// ErrDenied, which says so and is not the worker's fault: it got
// ErrWorkerGone, "its NATS subscriptions vanished", and the live worker
// was blamed (its breaker) for the router's configuration.
func TestARequestTheBrokerRefusesToPublishIsDeniedNotWorkerGone(t *testing.T) {
	old := probeEvery
	probeEvery = 50 * time.Millisecond
	t.Cleanup(func() { probeEvery = old })
	conf := filepath.Join(t.TempDir(), "nats.conf")
	if err := os.WriteFile(conf, []byte(`authorization {
  users = [
    {user: router, password: rpass, permissions: {publish: {deny: ["infera.req.>"]}}}
    {user: worker, password: wpass}
  ]
}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	ns := testsrv.StartNATSArgs(t, "-c", conf)
	eng := startEngine(t)
	dial := func(user, pass string) *nats.Conn {
		nc, err := nats.Connect(ns.URL, nats.UserInfo(user, pass), nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		return nc
	}
	srv, err := NewServer(ServerConfig{Conn: dial("worker", "wpass"), WorkerID: "w1", EngineURL: eng.URL})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	cli, err := NewClient(ClientConfig{Conn: dial("router", "rpass")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := cli.Do(ctx, "w1", &Request{Path: "/stream?n=1&every=1ms"})
	if err == nil {
		defer s.Close()
		_, err = s.Next()
	}
	if !errors.Is(err, ErrDenied) || errors.Is(err, ErrWorkerGone) {
		t.Fatalf("err %v, want ErrDenied", err)
	}
	if !strings.Contains(err.Error(), ReqSubject("w1")) || !strings.Contains(err.Error(), "permissions violation") {
		t.Fatalf("err %q does not say which subject was refused, nor why", err)
	}
}
