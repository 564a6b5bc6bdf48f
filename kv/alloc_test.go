//go:build !race

package kv

import (
	"testing"

	"github.com/infera/infera/fleet"
	"github.com/infera/infera/radix"
)

// TestPublisherCheckAllocatesNothing: the publisher check each fed frame
// passes allocates nothing, for a frame of the followed publisher and for
// one dropped from another (a duplicate sidecar floods as fast as the
// real one).
func TestPublisherCheckAllocatesNothing(t *testing.T) {
	m, err := NewManager(ManagerConfig{Index: radix.New()})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	ws := m.newWorkerState(&fleet.Worker{Load: new(fleet.Load), Idx: 0, ID: "alloc", BlockSize: 16})
	defer ws.unregisterMetrics()
	ws.follow(7)
	ws.follow(8) // a change: 8 is followed
	ws.follow(7) // dropped, and the one warning of the next 10 s is logged
	if n := testing.AllocsPerRun(1000, func() { ws.follow(8) }); n != 0 {
		t.Errorf("a frame of the followed publisher: %v allocs", n)
	}
	if n := testing.AllocsPerRun(1000, func() { ws.follow(7) }); n != 0 {
		t.Errorf("a frame dropped from another publisher: %v allocs", n)
	}
	if ws.mDuplicate.Get() != 1+1001 || ws.mChanges.Get() != 1 { // AllocsPerRun runs once more to warm up
		t.Fatalf("duplicates %d, changes %d", ws.mDuplicate.Get(), ws.mChanges.Get())
	}
}
