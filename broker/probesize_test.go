package broker

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/infera/infera/internal/testsrv"
)

// TestAWorkerWithManyOpenRequestsIsStillProbed: the router's probe of a
// worker lists the requests open there (Infera-Open, up to 1,000 ids,
// about 23 KB). Past the broker's max_payload the probe was refused by
// the NATS client and never sent, so nothing bounced: with 400 requests
// open at a worker under an 8 KB max_payload, a worker that died left
// every one of them waiting for its idle timeout (900 s by default)
// instead of failing over 6-8 s later. The list is cut to fit.
func TestAWorkerWithManyOpenRequestsIsStillProbed(t *testing.T) {
	old := probeEvery
	probeEvery = 50 * time.Millisecond
	t.Cleanup(func() { probeEvery = old })

	conf := filepath.Join(t.TempDir(), "nats.conf")
	if err := os.WriteFile(conf, []byte("max_payload: 8192\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ns := testsrv.StartNATSArgs(t, "-c", conf)
	eng := startEngine(t)
	wnc, rnc := connect(t, ns.URL), connect(t, ns.URL)
	srv, err := NewServer(ServerConfig{Conn: wnc, WorkerID: "w1", EngineURL: eng.URL})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	cli, err := NewClient(ClientConfig{Conn: rnc, IdleTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })

	const n = 400 // 400 ids of 23 bytes: 9.2 KB
	errs := make(chan error, n)
	for i := 0; i < n; i++ {
		go func() {
			s, err := cli.Do(context.Background(), "w1", &Request{Path: "/stream?n=1&every=1ms&before=30s"})
			if err == nil {
				s.Close()
			}
			errs <- err
		}()
	}
	for i := 0; srv.InFlight() != n; i++ {
		if i > 500 {
			t.Fatalf("the worker took %d of %d requests", srv.InFlight(), n)
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(3 * probeEvery) // probes that list them all
	wnc.Close()                // the worker dies
	deadline := time.After(5 * time.Second)
	for i := 0; i < n; i++ {
		select {
		case err := <-errs:
			if !errors.Is(err, ErrWorkerGone) {
				t.Fatalf("request %d: %v, want ErrWorkerGone", i, err)
			}
		case <-deadline:
			t.Fatalf("%d of %d requests still wait for a dead worker", n-i, n)
		}
	}
}
