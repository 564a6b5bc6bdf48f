package sched

import (
	"encoding/binary"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/infera/infera/config"
	"github.com/infera/infera/fleet"
	"github.com/infera/infera/internal/memlimit"
)

// benchSched builds n workers serving "Qwen2.5-72B-Instruct", with the
// clock and memory reader of the tests.
func benchSched(b *testing.B, n int) *Scheduler {
	recs := make([]fleet.Record, n)
	for i := range recs {
		recs[i] = rec(fmt.Sprintf("w%04d", i), "", "Qwen2.5-72B-Instruct")
	}
	s, _ := newTestSched(b, recs...)
	return s
}

// BenchmarkPick measures one full scheduling decision (model routing,
// breakers, layers, session/prefix bookkeeping) per layer that decides.
//
//	lb:          default config (prefix index fed, layers 1-2 off)
//	affinity:    session bound, layer 1 hits
//	prefix:      no session, layer 2 hits on a repeated prompt
//	three-layer: affinity + prefix + fuzzy model routing on; the session's
//	             worker is soft-overloaded, so layer 1 passes, layer 2 hits
func BenchmarkPick(b *testing.B) {
	for _, layer := range []string{"lb", "affinity", "prefix", "three-layer"} {
		for _, n := range []int{8, 256} {
			for _, size := range []int{1 << 10, 64 << 10} {
				b.Run(fmt.Sprintf("%s/workers=%d/prompt=%dKB", layer, n, size>>10), func(b *testing.B) {
					benchPick(b, layer, n, size)
				})
			}
		}
	}
}

func benchPick(b *testing.B, layer string, n, size int) {
	s := benchSched(b, n)
	cfg := config.Default()
	switch layer {
	case "affinity":
		cfg.SessionAffinity.Enabled = true
	case "prefix":
		cfg.PrefixCache.Enabled = true
	case "three-layer":
		cfg.SessionAffinity.Enabled = true
		cfg.PrefixCache.Enabled = true
		cfg.ModelRouting.Enabled = true
	}
	prompt := make([]byte, size)
	for i := 0; i+8 <= size; i += 8 {
		binary.LittleEndian.PutUint64(prompt[i:], uint64(i)*0x9E3779B97F4A7C15)
	}
	r := &Request{Model: []byte("Qwen2.5-72B-Instruct"), Prompt: prompt}
	if layer == "affinity" || layer == "three-layer" {
		r.SessionID = []byte("session-0123456789")
	}
	if layer == "three-layer" {
		r.Model = []byte("qwen2.5-72b") // abbreviation: fuzzy rule 2
	}
	scratch := make([]*fleet.Worker, 0, n)
	d, err := s.Pick(cfg, r, scratch)
	if err != nil {
		b.Fatal(err)
	}
	if layer == "three-layer" {
		// Overload the bound worker; put the prompt on another one.
		for i := 0; i < 8; i++ {
			d.Worker.Acquire(1, 1, 1)
		}
		other := s.Fleet.View().Routable[0]
		if other == d.Worker {
			other = s.Fleet.View().Routable[1]
		}
		s.pidx.Load().record(r.phash, nil, other, s.Now())
	}
	want := map[string]Layer{"lb": LayerLB, "affinity": LayerAffinity, "prefix": LayerPrefix, "three-layer": LayerPrefix}[layer]
	r.hashed = false
	if d, _ := s.Pick(cfg, r, scratch); d.Layer != want {
		b.Fatalf("layer %s (%s), want %s", d.Layer, d.Reason, want)
	}
	b.ReportAllocs()
	b.SetBytes(int64(size))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		r.hashed = false
		r.phash = r.phash[:0]
		if _, err := s.Pick(cfg, r, scratch); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkPrefixIndexInsert inserts unique 8-block prompts (the flood
// case) and reports the heap bytes per indexed block.
func BenchmarkPrefixIndexInsert(b *testing.B) {
	p := newPrefixIndex(128, 0)
	w := &fleet.Worker{Load: new(fleet.Load), Idx: 1, Serial: 1}
	buf := make([]byte, 1024)
	r := &Request{}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	b.ReportAllocs()
	b.SetBytes(int64(len(buf)))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		binary.LittleEndian.PutUint64(buf, uint64(i))
		r.Prompt = buf
		p.hashAndMatch(r, 0, 0, nil)
		p.record(r.phash, nil, w, 0)
	}
	b.StopTimer()
	runtime.GC()
	runtime.ReadMemStats(&after)
	if n := p.Len(); n > 0 {
		b.ReportMetric(float64(int64(after.HeapAlloc)-int64(before.HeapAlloc))/float64(n), "heapB/block")
		b.ReportMetric(float64(prefixEntryBytes), "acctB/block")
	}
	runtime.KeepAlive(p)
}

// BenchmarkPrefixIndexMatch matches a 1 KB (8-block) indexed prompt from
// parallel goroutines.
func BenchmarkPrefixIndexMatch(b *testing.B) {
	p := newPrefixIndex(128, 0)
	w := &fleet.Worker{Load: new(fleet.Load), Idx: 1, Serial: 1}
	prompts := make([][]byte, 1024)
	for i := range prompts {
		prompts[i] = make([]byte, 1024)
		binary.LittleEndian.PutUint64(prompts[i], uint64(i))
		r := &Request{Prompt: prompts[i]}
		p.hashAndMatch(r, 0, 0, nil)
		p.record(r.phash, nil, w, 0)
	}
	b.ReportAllocs()
	b.SetBytes(1024)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		r := &Request{phash: make([]uint64, 0, 8)}
		i := 0
		for pb.Next() {
			r.Prompt = prompts[i&1023]
			if d, _ := p.hashAndMatch(r, 0, 0, nil); d != 8 {
				panic("BUG: miss")
			}
			i++
		}
	})
}

// BenchmarkAffinity measures a session lookup hit.
func BenchmarkAffinity(b *testing.B) {
	t := newAffinityTable(100000)
	w := &fleet.Worker{Load: new(fleet.Load)}
	for i := 0; i < 100000; i++ {
		t.bind(uint64(i)*0x9E3779B97F4A7C15, w, 1)
	}
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := uint64(0)
		for pb.Next() {
			t.get((i%100000)*0x9E3779B97F4A7C15, 2, int64(time.Hour))
			i++
		}
	})
}

// BenchmarkAffinityNewSessionAtTheLimit measures binding a new session to a
// full table (max_entries 100000): each bind evicts the table's oldest.
func BenchmarkAffinityNewSessionAtTheLimit(b *testing.B) {
	t := newAffinityTable(100000)
	w := &fleet.Worker{Load: new(fleet.Load)}
	for i := 0; i < 100000; i++ {
		t.bind(uint64(i+1)*0x9E3779B97F4A7C15, w, int64(i+1))
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t.bind(uint64(100001+i)*0x9E3779B97F4A7C15, w, int64(100001+i))
	}
}

// BenchmarkResolveModel measures fuzzy model resolution (abbreviation, the
// slowest rule) over a view of 64 models.
func BenchmarkResolveModel(b *testing.B) {
	v := &fleet.View{ByModel: map[string][]*fleet.Worker{}}
	for i := 0; i < 64; i++ {
		v.Models = append(v.Models, fmt.Sprintf("Org/Model%d-%dB-Instruct", i, i))
	}
	s := &Scheduler{}
	mi := s.modelIndex(v)
	name := []byte("model63-63b")
	if mi.resolve(name, true) != "Org/Model63-63B-Instruct" {
		b.Fatal("no match")
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		mi.resolve(name, true)
	}
}

// BenchmarkReadMemory measures the default memory reader (called at most
// once per second, or every 4096 new blocks, from the dispatch path).
func BenchmarkReadMemory(b *testing.B) {
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		if _, _, err := memlimit.Read(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkPrefixIndexMatchRecord is a repeated 1 KB prompt (a shared
// system prompt, the proxy benchmark's body) matched and recorded for the
// worker that already holds it, from parallel goroutines: the per-request
// work of the prefix index when every block is a hit.
func BenchmarkPrefixIndexMatchRecord(b *testing.B) {
	p := newPrefixIndex(128, 0)
	w := &fleet.Worker{Load: new(fleet.Load), Idx: 1, Serial: 1}
	prompt := make([]byte, 1024)
	r0 := &Request{Prompt: prompt}
	p.hashAndMatch(r0, 0, 0, nil)
	p.record(r0.phash, nil, w, 0)
	b.ReportAllocs()
	b.SetBytes(1024)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		r := &Request{}
		for pb.Next() {
			r.Reset()
			r.Prompt = prompt
			if d, _ := p.hashAndMatch(r, 0, 0, nil); d != 8 {
				panic("BUG: miss")
			}
			p.record(r.phash, r.psnap, w, 0)
		}
	})
}
