//go:build !race

package mirror

import (
	"io"
	"log/slog"
	"testing"

	"github.com/infera/infera/config"
)

// Offer allocates nothing for a request that is not mirrored: disabled,
// not sampled, or sampled while the queue is full.
func TestOfferAllocatesNothingWhenNotMirrored(t *testing.T) {
	m := New(Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	defer m.Close()
	block := make(chan struct{})
	defer close(block)
	m.send = func(*job) { <-block }
	path, body := []byte("/v1/chat/completions"), benchBody(4096)
	f := func(name string, cfg *config.Mirror) {
		t.Helper()
		if n := testing.AllocsPerRun(1000, func() { m.Offer(cfg, path, body, false) }); n != 0 {
			t.Fatalf("%s: %v allocs/op, want 0", name, n)
		}
	}
	cfg := &config.Mirror{Enabled: true, TargetAddress: "http://127.0.0.1:1", TimeoutMS: 60000, QueueSize: 1, Concurrency: 1}
	f("ratio 0", cfg)
	off := *cfg
	off.Enabled, off.SamplingRatio = false, 100
	f("disabled", &off)
	tiny := *cfg
	tiny.SamplingRatio = 1e-9
	f("not sampled", &tiny)
	full := *cfg
	full.SamplingRatio = 100
	for i := 0; i < 4; i++ { // one in the sender, one at the dispatcher, one queued
		m.Offer(&full, path, body, false)
	}
	f("queue full", &full)
}
