package engine

import (
	"fmt"
	"io"
	"strings"
	"testing"
	"time"
)

func BenchmarkKVCacheMatch(b *testing.B) {
	for _, n := range []int{256, 4096} {
		c, err := NewKVCache(16, 8192, nil)
		if err != nil {
			b.Fatal(err)
		}
		tokens := seqTokens(1, n)
		if !c.Insert(tokens) {
			b.Fatal("insert failed")
		}
		hashes := c.AppendHashes(nil, tokens)
		b.Run(fmt.Sprintf("tokens=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(4 * n))
			for i := 0; i < b.N; i++ {
				if c.Match(tokens) != n/16 {
					b.Fatal("miss")
				}
			}
		})
		b.Run(fmt.Sprintf("hashes=%d", n/16), func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				if c.MatchHashes(hashes) != n/16 {
					b.Fatal("miss")
				}
			}
		})
	}
}

// steadyCore returns a Core with batch sequences running and a refill
// function that resubmits finished requests, so every Step is a full step.
func steadyCore(tb testing.TB, batch int) (*Core, func(evs []Event, now time.Duration)) {
	cfg := testCoreConfig()
	cfg.MaxBatch = batch
	cfg.CapacityBlocks = 64 * batch
	c := newTestCore(tb, cfg)
	shared := seqTokens(1, 512)
	for i := 0; i < batch; i++ {
		p := append(append([]uint32(nil), shared...), seqTokens(10000*i, 100)...)
		if err := c.Submit(&Request{Prompt: p, MaxTokens: 32 + i}, 0); err != nil {
			tb.Fatal(err)
		}
	}
	refill := func(evs []Event, now time.Duration) {
		for _, ev := range evs {
			if ev.Done {
				if err := c.Submit(ev.Req, now); err != nil {
					tb.Fatal(err)
				}
			}
		}
	}
	return c, refill
}

func BenchmarkCoreStep(b *testing.B) {
	for _, batch := range []int{8, 64} {
		b.Run(fmt.Sprintf("batch=%d", batch), func(b *testing.B) {
			c, refill := steadyCore(b, batch)
			evs := make([]Event, 0, batch)
			next := time.Duration(0)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				evs, next = c.Step(next, evs[:0])
				refill(evs, next)
			}
			b.ReportMetric(float64(c.Stats().GeneratedTokens)/float64(b.N), "tokens/step")
		})
	}
}

// TestCoreStepAllocs: a steady-state step (finish, free, resubmit, admit,
// prefix match) allocates nothing.
func TestCoreStepAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts differ under -race")
	}
	c, refill := steadyCore(t, 16)
	evs := make([]Event, 0, 16)
	next := time.Duration(0)
	for i := 0; i < 200; i++ { // warm up slices
		evs, next = c.Step(next, evs[:0])
		refill(evs, next)
	}
	allocs := testing.AllocsPerRun(500, func() {
		evs, next = c.Step(next, evs[:0])
		refill(evs, next)
	})
	if allocs != 0 {
		t.Fatalf("Core.Step allocates %.1f times per step", allocs)
	}
}

// BenchmarkServerStream measures the engine's CPU cost per streamed token
// over loopback HTTP, with a very high speedup so the time model is not the
// bottleneck.
func BenchmarkServerStream(b *testing.B) {
	e := startEngineB(b)
	const tokens = 256
	body := fmt.Sprintf(`{"stream":true,"max_tokens":%d,"messages":[{"role":"user","content":"hello"}]}`, tokens)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		resp, err := testClient.Post(e.base+"/v1/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			b.Fatal(err)
		}
		n, err := io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if err != nil || n < tokens*100 {
			b.Fatalf("stream: %d bytes, %v", n, err)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*tokens), "ns/token")
}

func startEngineB(b *testing.B) *testEngine {
	tm := DefaultTimeModel()
	tm.Speedup = 1e6
	srv, err := NewServer(Config{
		ID: "bench", Models: []string{"sim-model"}, DefaultMaxTokens: 8, Fault: Fault{Mode: FaultNone},
		Core: CoreConfig{BlockSize: 16, CapacityBlocks: 4096, MaxBatch: 64, Time: tm},
	})
	if err != nil {
		b.Fatal(err)
	}
	ln, err := netListen()
	if err != nil {
		b.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	b.Cleanup(func() { _ = srv.Close() })
	return &testEngine{srv: srv, base: "http://" + ln.Addr().String()}
}
