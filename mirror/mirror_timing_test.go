package mirror

import (
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"

	"github.com/infera/infera/config"
)

func benchBody(n int) []byte {
	return []byte(`{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("x", n) + `"}]}`)
}

// BenchmarkOffer is the cost of mirroring on the request path: at 0% the
// sampling check, at 100% the copy of path and body into a pooled job and
// the enqueue (the send is a no-op here so that the queue never fills and
// every offer copies).
func BenchmarkOffer(b *testing.B) {
	for _, ratio := range []float64{0, 100} {
		for _, size := range []int{1 << 10, 32 << 10} {
			b.Run(fmt.Sprintf("ratio=%v/body=%dKiB", ratio, size>>10), func(b *testing.B) {
				m := New(Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
				defer m.Close()
				m.send = func(*job) {}
				cfg := &config.Mirror{Enabled: true, TargetAddress: "http://127.0.0.1:1", SamplingRatio: ratio,
					TimeoutMS: 60000, QueueSize: config.MaxMirrorQueue, Concurrency: config.MaxMirrorConcurrency}
				body := benchBody(size)
				path := []byte("/v1/chat/completions")
				b.SetBytes(int64(len(body)))
				b.ReportAllocs()
				for b.Loop() {
					m.Offer(cfg, path, body, false)
				}
				b.StopTimer()
				if ratio == 100 {
					b.ReportMetric(float64(m.m.droppedFull.Get())/float64(b.N), "dropped/op")
				}
			})
		}
	}
}

// BenchmarkOfferRequestPath is Offer at 100% alone, as the request path
// pays it: sampling, the budget, the copy of path and body into a pooled
// job, the enqueue. The benchmark loop takes the job off the queue itself
// (no dispatcher, no sender competing for the CPU).
func BenchmarkOfferRequestPath(b *testing.B) {
	for _, size := range []int{1 << 10, 32 << 10} {
		b.Run(fmt.Sprintf("body=%dKiB", size>>10), func(b *testing.B) {
			m := newMirror(Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
			cfg := &config.Mirror{Enabled: true, TargetAddress: "http://127.0.0.1:1", SamplingRatio: 100,
				TimeoutMS: 60000, QueueSize: config.MaxMirrorQueue, Concurrency: 1}
			body := benchBody(size)
			path := []byte("/v1/chat/completions")
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				if !m.Offer(cfg, path, body, false) {
					b.Fatal("not queued")
				}
				m.release(<-m.q)
			}
		})
	}
}
