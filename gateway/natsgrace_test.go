package gateway

import (
	"strings"
	"testing"
	"time"

	"github.com/infera/infera/internal/testsrv"
)

// TestARouterStartedWhileTheBrokerWasDownDoesNotBlameWorkersForItsFirstConnect:
// for a while after the router's broker connection comes back, workers that
// have not subscribed again yet ("no responders") are the broker's fault,
// not theirs (503 broker_unavailable, no breaker fault), as after any
// reconnect. A router started while the broker was down connects for the
// first time through nats.go's connected callback, not the reconnected one,
// and got no such grace: the workers' sidecars, reconnecting too, were
// blamed for every request that came before them (in a 3 s burst, 68
// requests got 503 worker_unavailable and the breakers counted 193 faults).
func TestARouterStartedWhileTheBrokerWasDownDoesNotBlameWorkersForItsFirstConnect(t *testing.T) {
	nsrv := testsrv.StartNATS(t)
	nsrv.Stop()
	// A worker no sidecar serves: every request to it is "no responders".
	_, r := startServe(t, "--discovery-backend", "static", "--workers", "grace-w=http://127.0.0.1:9",
		"--worker-model", "sim-model", "--request-transport", "nats", "--kv-event-transport", "zmq",
		"--nats-url", nsrv.URL)
	nsrv.Start()
	for end := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if c, b := getHealth(t, r); strings.Contains(b, `"nats":{"ok":true`) {
			break
		} else if time.Now().After(end) {
			t.Fatalf("the router never connected: %d %s", c, b)
		}
	}
	resp, b := doPost(t, r+"/v1/chat/completions", e2eChat)
	if resp.StatusCode != 503 || !strings.Contains(string(b), "broker_unavailable") {
		t.Fatalf("a request to a worker not subscribed yet, just after the first connect: %d %s", resp.StatusCode, b)
	}
	if v := metric(t, r, `infera_router_worker_failures_total{worker="grace-w"}`); v != "0" {
		t.Fatalf("the worker was blamed: failures_total %s", v)
	}
}
