package kv

import (
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/infera/infera/fleet"
	"github.com/infera/infera/radix"
)

// A worker that sends no KV events (no endpoint under zmq, or silent over
// NATS) must cost neither a queue nor a goroutine: with a 4096-frame queue
// and a goroutine each, 3000 such workers held about 500 MB of heap.
func TestAWorkerWithoutKVEventsCostsNoQueueNorGoroutine(t *testing.T) {
	for _, tr := range []string{"zmq", "nats"} {
		m, err := NewManager(ManagerConfig{Index: radix.New(), Transport: tr})
		if err != nil {
			t.Fatal(err)
		}
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		g0 := runtime.NumGoroutine()
		const n = 1000
		for i := 0; i < n; i++ {
			if err := m.WorkerAdded(&fleet.Worker{Load: new(fleet.Load), Idx: i, ID: fmt.Sprint("w", i)}); err != nil {
				t.Fatal(err)
			}
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		per := (int64(after.HeapAlloc) - int64(before.HeapAlloc)) / n
		if g := runtime.NumGoroutine() - g0; g > 10 {
			t.Errorf("%s: %d idle workers started %d goroutines", tr, n, g)
		}
		if per > 32<<10 {
			t.Errorf("%s: an idle worker costs %d bytes of heap", tr, per)
		}
		if tr == "nats" {
			// The first frame starts the worker's goroutine: still applied.
			if !m.Feed("w7", 0, nil, 0, []byte{0x91}) {
				t.Fatal("frame not queued")
			}
			deadline := time.Now().Add(5 * time.Second)
			for m.Stats("w7").Malformed+m.Stats("w7").Applied == 0 && time.Now().Before(deadline) {
				time.Sleep(5 * time.Millisecond)
			}
			if s := m.Stats("w7"); s.Malformed+s.Applied == 0 {
				t.Fatalf("frame fed to an idle worker never handled: %+v", s)
			}
		}
		m.Close()
	}
}
