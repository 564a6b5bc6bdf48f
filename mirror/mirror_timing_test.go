package mirror

import (
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/infera/infera/config"
	"github.com/valyala/fasthttp"
)

func benchBody(n int) []byte {
	return []byte(`{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("x", n) + `"}]}`)
}

// reqID is a request id as the router makes one (32 hex digits).
var reqID = []byte("0123456789abcdef0123456789abcdef")

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
					m.Offer(cfg, path, body, reqID, false)
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
				if !m.Offer(cfg, path, body, reqID, false) {
					b.Fatal("not queued")
				}
				m.release(<-m.q)
			}
		})
	}
}

// startBenchTarget is a fasthttp server on loopback answering like an engine:
// a JSON completion with usage, or (Accept: text/event-stream) an SSE
// stream of 16 token events, a usage chunk and [DONE].
func startBenchTarget(b testing.TB) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	answer := []byte(`{"id":"m","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":16,"completion_tokens":1,"total_tokens":17}}`)
	var stream []byte
	for i := 0; i < 16; i++ {
		stream = fmt.Appendf(stream, "data: {\"id\":\"m\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"tok%d\"}}]}\n\n", i)
	}
	stream = append(stream, "data: {\"id\":\"m\",\"choices\":[],\"usage\":{\"prompt_tokens\":16,\"completion_tokens\":16}}\n\ndata: [DONE]\n\n"...)
	srv := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		if string(ctx.Request.Header.Peek("Accept")) == "text/event-stream" {
			ctx.SetContentType("text/event-stream")
			r := streamReaders.Get().(*streamReader)
			r.Reset(stream)
			ctx.SetBodyStream(r, -1) // chunked, as engines stream
			return
		}
		ctx.SetContentType("application/json")
		ctx.SetBody(answer)
	}}
	go srv.Serve(ln)
	b.Cleanup(func() { srv.Shutdown() })
	return "http://" + ln.Addr().String()
}

// streamReader is a pooled reader of a streamed answer: the server closes
// it (back to the pool) once it is sent, so the target allocates nothing.
type streamReader struct{ bytes.Reader }

var streamReaders = sync.Pool{New: func() any { return new(streamReader) }}

func (r *streamReader) Close() error {
	streamReaders.Put(r)
	return nil
}

// cpuTime is this process's user+system CPU time.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkSend is the asynchronous sender's cost per mirrored request: one
// job sent to a loopback target and its answer read to the end (a JSON
// completion, or an SSE stream of 18 events; with or without a target
// model substituted in the body), one at a time. The target
// runs in this process, so cpu-ns/op (the process's CPU time per request)
// counts both sides; allocs/op are the sender's (fasthttp's server
// allocates nothing per request).
func BenchmarkSend(b *testing.B) {
	for _, c := range []struct {
		stream bool
		model  string
	}{{false, ""}, {true, ""}, {false, "canary-v2"}} {
		stream := c.stream
		b.Run(fmt.Sprintf("stream=%v/target_model=%v", stream, c.model != ""), func(b *testing.B) {
			url := startBenchTarget(b)
			m := newMirror(Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
			defer m.Close()
			cfg := &config.Mirror{Enabled: true, TargetAddress: url, SamplingRatio: 100, AuthToken: config.NewSecret("tok"),
				TimeoutMS: 60000, QueueSize: 1, Concurrency: 1, TargetModel: c.model}
			body := benchBody(1 << 10)
			path := []byte("/v1/chat/completions")
			send := func() {
				j := jobPool.Get().(*job)
				j.cfg, j.stream, j.at = cfg, stream, time.Now()
				j.path = append(j.path[:0], path...)
				j.body = append(j.body[:0], body...)
				m.send(j)
				m.release(j)
			}
			send() // connect
			if m.m.ok.Get() != 1 {
				b.Fatal("the first request did not succeed")
			}
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			cpu0 := cpuTime(b)
			for b.Loop() {
				send()
			}
			b.StopTimer()
			b.ReportMetric(float64(cpuTime(b)-cpu0)/float64(b.N), "cpu-ns/op")
			if got := m.m.ok.Get(); got != uint64(b.N)+1 {
				b.Fatalf("%d of %d requests ok", got, b.N+1)
			}
		})
	}
}
