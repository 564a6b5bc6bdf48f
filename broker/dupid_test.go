package broker

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/infera/infera/internal/testsrv"
)

// Two worker sidecars started under one worker id (a misconfiguration, or
// a rollout whose new sidecar starts before the old one stops) both took
// every request on infera.req.<id>: both engines ran it, and their
// replies, interleaved on one inbox, failed the stream ("reply out of
// order"). The request subject is now a queue group: each request goes to
// one of them.
func TestTwoSidecarsUnderOneIDServeEachRequestOnce(t *testing.T) {
	ns := testsrv.StartNATS(t)
	engA, engB := startEngine(t), startEngine(t)
	for _, e := range []*testEngine{engA, engB} {
		srv, err := NewServer(ServerConfig{Conn: connect(t, ns.URL), EngineURL: e.URL, WorkerID: "dup"})
		if err != nil {
			t.Fatal(err)
		}
		if err := srv.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(srv.Close)
	}
	cli, err := NewClient(ClientConfig{Conn: connect(t, ns.URL), IdleTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	const n = 20
	for i := 0; i < n; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		s, err := cli.Do(ctx, "dup", &Request{Path: "/stream?n=5&every=2ms"})
		if err != nil {
			cancel()
			t.Fatalf("request %d: %v", i, err)
		}
		got := readAll(t, s)
		s.Close()
		cancel()
		want := ""
		for k := 0; k < 5; k++ {
			want += "data: " + strconv.Itoa(k) + "\n\n"
		}
		if got != want {
			t.Fatalf("request %d: stream %q", i, got)
		}
	}
	if a, b := engA.streams.Load(), engB.streams.Load(); a+b != n {
		t.Fatalf("the engines ran %d and %d requests, want %d in all", a, b, n)
	}
}
