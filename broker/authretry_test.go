package broker

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/infera/infera/internal/testsrv"
	"github.com/nats-io/nats.go"
)

// TestAConnectionKeepsRetryingThroughABrokerThatRefusedItsCredentials: a
// broker that refuses a process's credentials for a while (a bad auth
// config pushed then rolled back, an account resolver that is not up yet
// after a restart) must not end its reconnects. nats.go gives up on a
// server that answers the same auth error twice in a row and closes the
// connection for good: the router then answered 503 broker_unavailable
// to every request, and a worker sidecar served nothing, until restarted.
func TestAConnectionKeepsRetryingThroughABrokerThatRefusedItsCredentials(t *testing.T) {
	conf := filepath.Join(t.TempDir(), "nats.conf")
	setToken := func(tok string) {
		if err := os.WriteFile(conf, []byte(`authorization { token: "`+tok+`" }`+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	setToken("right-token")
	ns := testsrv.StartNATSArgs(t, "-c", conf)
	url := strings.Replace(ns.URL, "nats://", "nats://right-token@", 1)
	nc, err := nats.Connect(url, append(Reconnect(), nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))...)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()

	ns.Stop()
	setToken("another-token")
	ns.Start()
	time.Sleep(1500 * time.Millisecond) // several refused attempts, 250-350 ms apart
	ns.Stop()
	setToken("right-token")
	ns.Start()

	deadline := time.Now().Add(5 * time.Second)
	for !nc.IsConnected() {
		if nc.IsClosed() || time.Now().After(deadline) {
			t.Fatalf("not reconnected once the broker took the credentials again: status %v, last error %v", nc.Status(), nc.LastError())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// syncBuffer is a bytes.Buffer safe for slog and the test together.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestARouterStartedWithCredentialsTheBrokerRefusesSaysWhy: the router
// starts while its broker cannot be connected to (RetryOnFailedConnect)
// and keeps retrying; it said only "NATS broker not reachable at start",
// whatever the reason, and nothing more for as long as it retried: a
// token the broker refuses (or a TLS or port mistake) looked like a
// broker that is down. nats.go reports neither to the async error
// handler while it makes its first connection; the failed attempts are
// logged (throttled) with their reason, never the URL's credentials.
func TestARouterStartedWithCredentialsTheBrokerRefusesSaysWhy(t *testing.T) {
	conf := filepath.Join(t.TempDir(), "nats.conf")
	if err := os.WriteFile(conf, []byte(`authorization { token: "right-token" }`+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ns := testsrv.StartNATSArgs(t, "-c", conf)
	lb := &syncBuffer{}
	old := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(lb, nil)))
	t.Cleanup(func() { slog.SetDefault(old) })

	url := strings.Replace(ns.URL, "nats://", "nats://wrong-token@", 1)
	nc, err := nats.Connect(url, append(Reconnect(), nats.RetryOnFailedConnect(true))...)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	deadline := time.Now().Add(3 * time.Second)
	for !strings.Contains(strings.ToLower(lb.String()), "authorization violation") {
		if time.Now().After(deadline) {
			t.Fatalf("no reason logged while the broker refused the token: %q", lb.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if strings.Contains(lb.String(), "wrong-token") {
		t.Fatalf("the token was logged: %q", lb.String())
	}
}
