package kvroute

import (
	"fmt"
	"testing"

	"github.com/infera/infera/fleet"
	"github.com/infera/infera/radix"
	"github.com/infera/infera/sched"
)

// BenchmarkPickKV scores a 512-block (8k tokens at block size 16) prompt
// over 8 and 256 workers, each caching a different prefix length of it.
func BenchmarkPickKV(b *testing.B) {
	for _, n := range []int{8, 256} {
		b.Run(fmt.Sprintf("workers=%d", n), func(b *testing.B) {
			x := radix.New()
			hashes := make([]uint64, 512)
			for i := range hashes {
				hashes[i] = uint64(i+1) * 0x9e3779b97f4a7c15
			}
			ws := make([]*fleet.Worker, n)
			for i := range ws {
				ws[i] = &fleet.Worker{Load: new(fleet.Load), Idx: i, ID: fmt.Sprint(i)}
				ws[i].Load.Blocks.Store(int64(i % 7))
				if err := x.Store(i, 0, 0, 0, false, hashes[:1+i*37%512]); err != nil {
					b.Fatal(err)
				}
			}
			k := NewKVAware(KVAwareConfig{Index: x})
			r := &sched.Request{BlockHashes: hashes}
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if k.PickKV(ws, r) == nil {
						b.Fatal("nil pick")
					}
				}
			})
		})
	}
}

// BenchmarkPickKVSerial is one decision at a time for an 8k-token prompt
// (512 blocks) over 8 workers, each caching a different prefix length and
// carrying different load.
func BenchmarkPickKVSerial(b *testing.B) {
	x := radix.New()
	hashes := make([]uint64, 512)
	for i := range hashes {
		hashes[i] = uint64(i+1) * 0x9e3779b97f4a7c15
	}
	ws := make([]*fleet.Worker, 8)
	for i := range ws {
		ws[i] = &fleet.Worker{Load: new(fleet.Load), Idx: i, ID: fmt.Sprintf("engine-%d", i)}
		ws[i].Acquire(int64(1000*i), int64(100*i), int64(i%7))
		if err := x.Store(i, 0, 0, 0, false, hashes[:1+i*61%512]); err != nil {
			b.Fatal(err)
		}
	}
	k := NewKVAware(KVAwareConfig{Index: x, OverlapWeight: 1})
	r := &sched.Request{BlockHashes: hashes, PromptTokens: 8192}
	b.ReportAllocs()
	for b.Loop() {
		if k.PickKV(ws, r) == nil {
			b.Fatal("nil pick")
		}
	}
}
