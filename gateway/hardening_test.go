package gateway

import (
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/infera/infera/fleet"
	"github.com/infera/infera/internal/testsrv"
)

// A NATS broker restart is the broker's fault, not the workers': requests
// fail (or wait) while it is down, succeed again after, and no worker's
// breaker opens.
func TestNATSBrokerRestartIsNotAWorkerFault(t *testing.T) {
	etcd := testsrv.StartEtcd(t)
	nsrv := testsrv.StartNATS(t)
	_, e1 := startEngine(t, "--speedup", "50")
	_, e2 := startEngine(t, "--speedup", "50")
	common := []string{"--discovery-backend", "etcd", "--etcd-endpoint", etcd.Endpoint,
		"--request-transport", "nats", "--kv-event-transport", "zmq", "--nats-url", nsrv.URL, "--lease-ttl", "2s"}
	startWorker(t, append([]string{"--id", "w1", "--engine-url", e1}, common...)...)
	startWorker(t, append([]string{"--id", "w2", "--engine-url", e2}, common...)...)
	rt, r := startServe(t, "--discovery-backend", "etcd", "--etcd-endpoint", etcd.Endpoint,
		"--request-transport", "nats", "--kv-event-transport", "zmq", "--nats-url", nsrv.URL,
		"--router-policy", "round-robin", "--breaker-failure-threshold", "2")
	waitRoutable(t, rt, 2)
	if resp, b := doPost(t, r+"/v1/chat/completions", e2eChat); resp.StatusCode != 200 {
		t.Fatalf("before: %d %s", resp.StatusCode, b)
	}
	nsrv.Stop()
	for i := 0; i < 6; i++ { // while the broker is down
		resp, b := doPost(t, r+"/v1/chat/completions", e2eChat)
		if resp.StatusCode != 503 && resp.StatusCode != 200 {
			t.Fatalf("broker down: %d %s, want 503", resp.StatusCode, b)
		}
	}
	nsrv.Start()
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, _ := doPost(t, r+"/v1/chat/completions", e2eChat)
		if resp.StatusCode == 200 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no success after the broker came back: %d", resp.StatusCode)
		}
		time.Sleep(200 * time.Millisecond)
	}
	for _, w := range rt.Fleet().View().All {
		if w.Breaker.State() != fleet.BreakerClosed || w.Breaker.Trips() != 0 {
			t.Fatalf("worker %s blamed for the broker restart: breaker %d, trips %d", w.ID, w.Breaker.State(), w.Breaker.Trips())
		}
	}
}

// Writing the config file non-atomically (empty mid-write), or with null or
// trailing garbage, never removes the workers of a running router: every
// request during the bad writes succeeds.
func TestBadConfigWritesNeverEmptyTheFleet(t *testing.T) {
	_, e1 := startEngine(t, "--speedup", "100")
	dir := t.TempDir()
	path := filepath.Join(dir, "infera.json")
	good := `{"workers":[{"id":"a","url":"` + e1 + `","models":["sim-model"]}]}`
	if err := os.WriteFile(path, []byte(good), 0o644); err != nil {
		t.Fatal(err)
	}
	_, r := startServe(t, "--config", path, "--config-poll", "10ms", "--router-policy", "round-robin")
	var stop atomic.Bool
	var failed atomic.Int64
	var sent atomic.Int64
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() && sent.Load() < 2000 {
				sent.Add(1)
				if resp, _ := doPost(t, r+"/v1/chat/completions", e2eChat); resp.StatusCode != 200 {
					failed.Add(1)
				}
			}
		}()
	}
	for i := 0; i < 30; i++ {
		for _, bad := range []string{"", "null", good + "garbage", `{"timeouts":{"stream_idle_s":1e12}}`, good[:len(good)/2]} {
			os.WriteFile(path, []byte(bad), 0o644)
			time.Sleep(15 * time.Millisecond)
		}
		os.WriteFile(path, []byte(good), 0o644)
		time.Sleep(15 * time.Millisecond)
	}
	stop.Store(true)
	wg.Wait()
	if n := failed.Load(); n != 0 {
		t.Fatalf("%d of %d requests failed while bad config files were written", n, sent.Load())
	}
	if !strings.Contains(good, "sim-model") {
		t.Fatal("unreachable")
	}
}
