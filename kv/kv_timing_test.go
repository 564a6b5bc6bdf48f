package kv

import (
	"testing"

	"github.com/infera/infera/fleet"
	"github.com/infera/infera/radix"
)

// BenchmarkDecode decodes a legacy batch of 32 BlockStored events of one
// 16-token block each and reports events/s and MB/s.
func BenchmarkDecode(b *testing.B) {
	for _, layout := range []string{layoutLegacy, layoutMap} {
		b.Run(layout, func(b *testing.B) {
			isMap := layout == layoutMap
			const events = 32
			p := appendBatchHeader(nil, isMap, 1, events)
			toks := make([]uint32, 16)
			for i := range toks {
				toks[i] = uint32(1000 + i*37)
			}
			for i := 0; i < events; i++ {
				p = appendStored(p, isMap, []uint64{uint64(i) * 0x9e3779b97f4a7c15}, uint64(i), i > 0, toks, 16)
			}
			p = appendBatchTrailer(p, isMap, 0)
			var d Decoder
			b.SetBytes(int64(len(p)))
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if _, err := d.Decode(p); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N*events)/b.Elapsed().Seconds(), "events/s")
		})
	}
}

func BenchmarkHashBlocks(b *testing.B) {
	toks := make([]uint32, 8192)
	for i := range toks {
		toks[i] = uint32(i * 7)
	}
	dst := make([]uint64, 0, 512)
	b.SetBytes(int64(4 * len(toks)))
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		dst = HashBlocks(dst[:0], toks, 16, "")
	}
}

// BenchmarkApply runs the whole ingest path without sockets (decode, router
// hashing, engine-to-router map, index store) on batches of 32 BlockStored
// events of one 16-token block each, chained into 32-block sequences:
// "handle" from the sequence logic on, "frame" as a fed frame (the
// publisher check first), side by side.
func BenchmarkApply(b *testing.B) {
	b.Run("handle", func(b *testing.B) { benchmarkApply(b, false) })
	b.Run("frame", func(b *testing.B) { benchmarkApply(b, true) })
}

func benchmarkApply(b *testing.B, asFrame bool) {
	const events, nbatches = 32, 512
	payloads := make([][]byte, nbatches)
	for i := range payloads {
		p := appendBatchHeader(nil, false, 1, events)
		for j := 0; j < events; j++ {
			toks := make([]uint32, 16)
			for k := range toks {
				toks[k] = uint32(i*100000 + j*16 + k)
			}
			h := uint64(i*events + j + 1)
			p = appendStored(p, false, []uint64{h}, h-1, j > 0, toks, 16)
		}
		payloads[i] = appendBatchTrailer(p, false, 0)
	}
	var m *Manager
	var ws *workerState
	reset := func() {
		if m != nil {
			ws.unregisterMetrics()
			m.Close()
		}
		var err error
		if m, err = NewManager(ManagerConfig{Index: radix.New()}); err != nil {
			b.Fatal(err)
		}
		ws = m.newWorkerState(&fleet.Worker{Load: new(fleet.Load), Idx: 0, ID: "bench", BlockSize: 16})
	}
	reset()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if i%nbatches == 0 && i > 0 {
			b.StopTimer()
			reset()
			b.StartTimer()
		}
		if asFrame {
			f := frame{instance: 0x5eed, seq: uint64(i), payload: payloads[i%nbatches]}
			ws.handleFrame(&f)
		} else {
			ws.handle(uint64(i), payloads[i%nbatches])
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(b.N*events)/b.Elapsed().Seconds(), "blocks/s")
	if ws.mMalformed.Get() != 0 || ws.mDropped.Get() != 0 || ws.mApplied.Get() == 0 {
		b.Fatalf("malformed %d dropped %d applied %d", ws.mMalformed.Get(), ws.mDropped.Get(), ws.mApplied.Get())
	}
}

// BenchmarkPublisherCheck is the check every fed frame passes: one of the
// followed publisher's, and one dropped from another publisher (whose
// takeover the benchmark must never reach).
func BenchmarkPublisherCheck(b *testing.B) {
	m, err := NewManager(ManagerConfig{Index: radix.New(), PublisherTakeover: 1 << 62})
	if err != nil {
		b.Fatal(err)
	}
	defer m.Close()
	ws := m.newWorkerState(&fleet.Worker{Load: new(fleet.Load), Idx: 0, ID: "bench", BlockSize: 16})
	defer ws.unregisterMetrics()
	ws.follow(7)
	ws.follow(8)
	b.Run("followed", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			ws.follow(8)
		}
	})
	b.Run("dropped", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			ws.follow(7)
		}
	})
}
