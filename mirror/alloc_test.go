//go:build !race

package mirror

import (
	"io"
	"log/slog"
	"testing"
	"time"

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
		if n := testing.AllocsPerRun(1000, func() { m.Offer(cfg, path, body, nil, false) }); n != 0 {
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
		m.Offer(&full, path, body, nil, false)
	}
	f("queue full", &full)
}

// A warm send allocates only what fasthttp's streamed response body takes
// (its body reader and the closures that give the connection back: 4),
// for a JSON answer, for a stream, and with a target model substituted:
// the request, the response, the buffers, the model substitution and the
// usage scan are pooled or allocation-free.
func TestSendAllocatesOnlyTheStreamedBody(t *testing.T) {
	for i, stream := range []bool{false, true, false} {
		url := startBenchTarget(t)
		m := newMirror(Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		cfg := &config.Mirror{Enabled: true, TargetAddress: url, SamplingRatio: 100, AuthToken: config.NewSecret("tok"),
			TimeoutMS: 60000, QueueSize: 1, Concurrency: 1, LogRecording: false}
		if i == 2 {
			cfg.TargetModel = "canary-v2"
		}
		path, body := []byte("/v1/chat/completions"), benchBody(1024)
		send := func() {
			j := jobPool.Get().(*job)
			j.cfg, j.stream, j.at = cfg, stream, time.Now()
			j.path = append(j.path[:0], path...)
			j.body = append(j.body[:0], body...)
			j.reqID = append(j.reqID[:0], "0123456789abcdef0123456789abcdef"...)
			m.send(j)
			m.release(j)
		}
		send()
		n := testing.AllocsPerRun(200, send)
		m.Close()
		if m.m.ok.Get() != 202 { // AllocsPerRun runs it once more to warm up
			t.Fatalf("stream=%v: %d of 202 requests ok", stream, m.m.ok.Get())
		}
		if n > 4 {
			t.Fatalf("stream=%v: %v allocs per send, want at most 4", stream, n)
		}
	}
}
