package broker

import (
	"os"
	"path/filepath"
	"strings"
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
