package soak

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// A short soak: the harness drives a real router over NATS and etcd while
// it kills, hangs and faults engines and restarts NATS, and every request
// ends in a complete answer or a clean error.
func TestShortSoakLosesNothing(t *testing.T) {
	for _, b := range []string{"/usr/bin/etcd", "/usr/sbin/nats-server"} {
		if _, err := os.Stat(b); err != nil {
			if os.Getenv("INFERA_REQUIRE_SERVERS") != "" {
				t.Fatalf("%s missing (make deps)", b)
			}
			t.Skip(b + " missing")
		}
	}
	bin := filepath.Join(t.TempDir(), "infera")
	cmd := exec.Command("go", "build", "-o", bin, ".")
	cmd.Dir = ".."
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	c := &Cmd{Duration: 30 * time.Second, Engines: 3, Clients: 8, StreamPct: 70, ChaosEvery: 5 * time.Second,
		ReloadEvery: 3 * time.Second, InferaBin: bin, Etcd: "/usr/bin/etcd", NATS: "/usr/sbin/nats-server", Seed: 7}
	var log bytes.Buffer
	rep, err := c.run(context.Background(), &log)
	if err != nil {
		t.Fatalf("%v\n%s", err, log.String())
	}
	t.Logf("%+v", rep)
	if rep.Lost != 0 || rep.Duplicated != 0 || rep.OK == 0 || len(rep.Chaos) < 4 {
		t.Fatalf("lost %d duplicated %d ok %d chaos %v\n%s", rep.Lost, rep.Duplicated, rep.OK, rep.Chaos, log.String())
	}
}
