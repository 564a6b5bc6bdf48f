package kv

import (
	"testing"

	"github.com/infera/infera/fleet"
	"github.com/infera/infera/radix"
)

// FuzzHandle feeds arbitrary payloads and sequence numbers through the
// sequence logic and index updates: nothing may panic, and clearing the
// worker must leave the index empty.
func FuzzHandle(f *testing.F) {
	for _, v := range []string{vecLegacy, vecLegacyNoRank, vecLegacyFull, vecMap} {
		f.Add(uint64(0), hx(f, v))
	}
	f.Fuzz(func(t *testing.T, seq uint64, payload []byte) {
		x := radix.New()
		m, err := NewManager(ManagerConfig{Index: x})
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		ws := m.newWorkerState(&fleet.Worker{Load: new(fleet.Load), Idx: 1, ID: "fuzz", BlockSize: 1})
		defer ws.unregisterMetrics()
		ws.handle(seq, payload)
		ws.handle(seq+1, payload)
		ws.handle(seq+5, payload)
		x.RemoveWorker(1)
		if st := x.Stats(); st.Entries != 0 || st.Nodes != 0 {
			t.Fatalf("index not empty after RemoveWorker: %+v", st)
		}
	})
}
