package gateway

import (
	"strings"
	"testing"

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
