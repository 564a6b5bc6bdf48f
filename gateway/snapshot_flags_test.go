package gateway

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/infera/infera/config"
)

// A snapshot restored without a config file that this router's flags
// refuse (static workers, restored under --discovery-backend etcd) refuses
// the start naming the snapshot directory and what to do: the error said
// `config "": workers: ...`, naming a config file the router did not have.
func TestASnapshotTheFlagsRefuseNamesTheSnapshotNotAnEmptyConfigFile(t *testing.T) {
	dir := t.TempDir()
	g, err := New(parseServe(t, "--discovery-backend", "static", "--admin-port", "0", "--persist-snapshot-dir", dir))
	if err != nil {
		t.Fatal(err)
	}
	c := *g.Store().Load()
	c.Workers = []config.WorkerSpec{{ID: "w1", URL: "http://127.0.0.1:1", Models: []string{"m"}}}
	g.Store().Set(&c)
	g.Close() // the shutdown snapshot holds the worker

	_, err = New(parseServe(t, "--discovery-backend", "etcd", "--etcd-endpoint", "127.0.0.1:1",
		"--request-transport", "http", "--kv-event-transport", "zmq", "--admin-port", "0", "--persist-snapshot-dir", dir))
	if err == nil {
		t.Fatal("started on a snapshot with static workers under etcd discovery")
	}
	if msg := err.Error(); strings.Contains(msg, `config ""`) || !strings.Contains(msg, dir) || !strings.Contains(msg, "workers") {
		t.Fatalf("the refusal does not name the snapshot directory: %v", err)
	}
}

// With a config file, a newer snapshot that this router's flags refuse (a
// worker id --workers also gives) is not restored: the file serves, as it
// was. It replaced the file (keeping its bytes in .before-restore), then
// the start was refused, and every later one, the file now holding it.
func TestASnapshotTheFlagsRefuseDoesNotReplaceTheConfigFile(t *testing.T) {
	dir, cfgDir := t.TempDir(), t.TempDir()
	g, err := New(parseServe(t, "--discovery-backend", "static", "--admin-port", "0", "--persist-snapshot-dir", dir))
	if err != nil {
		t.Fatal(err)
	}
	c := *g.Store().Load()
	c.Workers = []config.WorkerSpec{{ID: "w1", URL: "http://127.0.0.1:1", Models: []string{"m"}}}
	g.Store().Set(&c)
	g.Close() // the shutdown snapshot holds worker w1

	cfgPath := filepath.Join(cfgDir, "infera.json")
	os.WriteFile(cfgPath, []byte(`{}`), 0o600)
	old := time.Now().Add(-time.Hour)
	os.Chtimes(cfgPath, old, old) // older than the snapshot: a restore is due
	g, err = New(parseServe(t, "--workers", "w1=http://127.0.0.1:2", "--worker-model", "m", "--admin-port", "0",
		"--config", cfgPath, "--persist-snapshot-dir", dir))
	if err != nil {
		t.Fatalf("the start was refused: %v", err)
	}
	defer g.Close()
	if data, _ := os.ReadFile(cfgPath); string(data) != `{}` {
		t.Fatalf("the config file was replaced by a snapshot these flags refuse: %s", data)
	}
	if _, err := os.Stat(cfgPath + ".before-restore"); err == nil {
		t.Fatal("a .before-restore was written for a restore that did not happen")
	}
	if n := len(g.Store().Load().Workers); n != 0 {
		t.Fatalf("%d workers of the refused snapshot serve", n)
	}
}
