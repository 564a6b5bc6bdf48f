//go:build cgo && linux

package kv

import (
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/infera/infera/engine"
	"github.com/infera/infera/fleet"
	"github.com/infera/infera/radix"
)

func threads(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Skip("no /proc/self/task:", err)
	}
	return len(ents)
}

// A followed worker's subscriber waits in Go's netpoller, not in zmq_poll
// on an OS thread of its own: 1000 idle workers took 1009 threads and
// about half a core. 200 workers whose publishers are up and silent must
// not take a thread each, and stopping them must not wait out the poll
// interval.
func TestFollowedWorkersWaitWithoutAThreadEach(t *testing.T) {
	pub := newTestPublisher(t, false, engine.LayoutMap)
	m, err := NewManager(ManagerConfig{Index: radix.New(), Transport: "zmq", PollInterval: 10 * time.Second,
		ReplayTimeout: time.Second, ReconnectDelay: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	before := threads(t)
	const n = 200
	for i := 0; i < n; i++ {
		if err := m.WorkerAdded(&fleet.Worker{Load: new(fleet.Load), Idx: i, ID: fmt.Sprint("w", i), KVEventsEndpoint: pub.Endpoint()}); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(time.Second) // every subscriber connected and waiting
	grew := threads(t) - before
	t.Logf("%d followed workers: %d more threads", n, grew)
	if grew > n/4 {
		t.Errorf("%d followed workers took %d more threads", n, grew)
	}
	start := time.Now()
	m.Close()
	if took := time.Since(start); took > 3*time.Second {
		t.Errorf("stopping %d subscribers took %v (poll interval 10 s)", n, took)
	}
}
