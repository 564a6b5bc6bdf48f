package radix

import (
	"fmt"
	"runtime"
	"testing"
	"time"
)

// BenchmarkStore applies BlockStored events of 16 blocks and reports
// block-stores per second of wall time (blocks/s) and of process CPU time
// (blocks/cpu-s, steadier on a shared machine). "extend": each of 8 workers
// grows its own chains (8 events per chain, a prefill streaming in);
// "interleaved": every event continues the previous event's chain under
// another worker (new nodes).
func BenchmarkStore(b *testing.B) {
	for _, mode := range []string{"extend", "interleaved"} {
		b.Run(mode, func(b *testing.B) {
			const perEvent, workers = 16, 8
			x := New()
			hs := make([]uint64, perEvent)
			var last, root [workers]uint64
			var prev, prevRoot uint64
			var cpu time.Duration
			b.ReportAllocs()
			b.ResetTimer()
			cpu0 := processCPU()
			for i := 0; i < b.N; i++ {
				if i%(1<<14) == 0 {
					b.StopTimer()
					cpu += processCPU() - cpu0
					x = New() // bound memory: start over every 256k blocks
					runtime.GC()
					cpu0 = processCPU()
					b.StartTimer()
				}
				w := i % workers
				start := (i/workers)%8 == 0
				if mode == "interleaved" {
					start = i%8 == 0
				}
				for j := range hs {
					hs[j] = mix(uint64(i)*perEvent + uint64(j) + 1)
				}
				var err error
				if mode == "extend" {
					if start {
						root[w] = hs[0]
					}
					err = x.Store(w, 0, root[w], last[w], !start, hs)
					last[w] = hs[perEvent-1]
				} else {
					if start {
						prevRoot = hs[0]
					}
					err = x.Store(w, 0, prevRoot, prev, !start, hs)
					prev = hs[perEvent-1]
				}
				if err != nil {
					b.Fatal(err)
				}
			}
			cpu += processCPU() - cpu0
			b.ReportMetric(float64(b.N*perEvent)/b.Elapsed().Seconds(), "blocks/s")
			if cpu > 0 {
				b.ReportMetric(float64(b.N*perEvent)/cpu.Seconds(), "blocks/cpu-s")
			}
		})
	}
}

// BenchmarkStoreSteady applies BlockStored events of 16 blocks to an index
// held at a constant 512k blocks, as in a fleet whose caches are full: each
// of 8 workers stores a new 16-block chain and evicts (BlockRemoved) its
// oldest one, so tables never grow. It reports stored blocks per second of
// wall and of CPU time; removals are included in the cost.
func BenchmarkStoreSteady(b *testing.B) {
	const perEvent, workers, live = 16, 8, 1 << 15 // live chains
	x := New()
	chainOf := func(n int) []uint64 {
		hs := make([]uint64, perEvent)
		for j := range hs {
			hs[j] = mix(uint64(n)*perEvent + uint64(j) + 1)
		}
		return hs
	}
	for n := 0; n < live; n++ {
		hs := chainOf(n)
		if err := x.Store(n%workers, 0, hs[0], 0, false, hs); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	cpu0 := processCPU()
	old := make([]uint64, perEvent)
	for i := 0; i < b.N; i++ {
		n := live + i
		hs := chainOf(n)
		if err := x.Store(n%workers, 0, hs[0], 0, false, hs); err != nil {
			b.Fatal(err)
		}
		copy(old, chainOf(n-live))
		x.Remove((n-live)%workers, 0, old[0], old)
	}
	cpu := processCPU() - cpu0
	b.ReportMetric(float64(b.N*perEvent)/b.Elapsed().Seconds(), "blocks/s")
	if cpu > 0 {
		b.ReportMetric(float64(b.N*perEvent)/cpu.Seconds(), "blocks/cpu-s")
	}
}

// fill makes workers hold chains of nblocks: all share the first quarter
// (a system prompt), then each worker has its own continuation; plus
// background chains so the maps are not tiny. It returns worker 0's chain.
func fill(x *Index, workers, nblocks int) []uint64 {
	shared := nblocks / 4
	var q []uint64
	for w := 0; w < workers; w++ {
		hs := make([]uint64, nblocks)
		for j := range hs {
			if j < shared {
				hs[j] = mix(uint64(j) + 1)
			} else {
				hs[j] = mix(uint64(w+1)<<32 | uint64(j))
			}
		}
		if err := x.Store(w, 0, hs[0], 0, false, hs); err != nil {
			panic(err)
		}
		if w == 0 {
			q = hs
		}
	}
	for c := 0; c < 2000; c++ { // background: 2000 chains of 32 blocks
		hs := make([]uint64, 32)
		for j := range hs {
			hs[j] = mix(uint64(c+1)<<40 | uint64(j))
		}
		_ = x.Store(c%workers, 0, hs[0], 0, false, hs)
	}
	return q
}

func BenchmarkMatch(b *testing.B) {
	for _, tokens := range []int{1024, 8192, 32768} {
		for _, workers := range []int{8, 256} {
			b.Run(fmt.Sprintf("tokens=%d/workers=%d", tokens, workers), func(b *testing.B) {
				x := New()
				q := fill(x, workers, tokens/16)
				if got := sorted(x.Match(nil, q)); len(got) != workers || got[0].Blocks != len(q) {
					b.Fatalf("unexpected match: %d overlaps", len(got))
				}
				b.ReportAllocs()
				b.ResetTimer()
				b.RunParallel(func(pb *testing.PB) {
					dst := make([]Overlap, 0, 512)
					for pb.Next() {
						dst = x.Match(dst[:0], q)
					}
				})
			})
		}
	}
}

// BenchmarkBytesPerBlock reports heap bytes per (block, worker) entry for 8
// workers with a shared prefix (measured with runtime.MemStats) next to the
// index's own estimate.
func BenchmarkBytesPerBlock(b *testing.B) {
	for i := 0; i < b.N; i++ {
		var m0, m1 runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&m0)
		x := New()
		for c := 0; c < 4096; c++ { // 4096 chains of 64 blocks over 8 workers
			hs := make([]uint64, 64)
			for j := range hs {
				if j < 16 {
					hs[j] = mix(uint64(c%16)<<32 | uint64(j) + 1)
				} else {
					hs[j] = mix(uint64(c+1)<<40 | uint64(j))
				}
			}
			_ = x.Store(c%8, 0, hs[0], 0, false, hs)
		}
		runtime.GC()
		runtime.ReadMemStats(&m1)
		st := x.Stats()
		b.ReportMetric(float64(m1.HeapAlloc-m0.HeapAlloc)/float64(st.Blocks), "heapB/block")
		b.ReportMetric(float64(st.Bytes)/float64(st.Blocks), "estB/block")
		b.ReportMetric(float64(st.Entries), "entries")
		runtime.KeepAlive(x)
	}
}

// BenchmarkRemoveWorker purges one of 8 workers from an index holding
// 8 x 16384 blocks (a shared quarter, the rest per worker): the time the
// fleet lock is held when a worker leaves.
func BenchmarkRemoveWorker(b *testing.B) {
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		x := New()
		for c := 0; c < 8*64; c++ { // 512 chains of 256 blocks
			hs := make([]uint64, 256)
			for j := range hs {
				if j < 64 {
					hs[j] = mix(uint64(c%8)<<32 | uint64(j) + 1)
				} else {
					hs[j] = mix(uint64(c+1)<<40 | uint64(j))
				}
			}
			_ = x.Store(c%8, 0, hs[0], 0, false, hs)
		}
		b.StartTimer()
		x.RemoveWorker(3)
		b.StopTimer()
		if x.WorkerBlocks(3) != 0 {
			b.Fatal("worker not purged")
		}
		b.StartTimer()
	}
}
