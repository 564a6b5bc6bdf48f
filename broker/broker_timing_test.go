package broker

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"slices"
	"testing"
	"time"
)

// latencies records per-request latency and reports p50/p99 in µs.
type latencies []time.Duration

func (l latencies) report(b *testing.B) {
	if len(l) == 0 {
		return
	}
	slices.Sort(l)
	b.ReportMetric(float64(l[len(l)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(l[len(l)*99/100].Microseconds()), "p99-µs")
}

// BenchmarkRoundTrip compares one small request/response over the NATS
// transport with the same request sent directly over HTTP to the same
// loopback engine.
func BenchmarkRoundTrip(b *testing.B) {
	r := newRig(b, ClientConfig{}, ServerConfig{})
	body := []byte(`{"model":"m","prompt":"hello world","max_tokens":1}`)
	ctx := context.Background()
	b.Run("nats", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(body)))
		lat := make(latencies, 0, b.N)
		defer func() { lat.report(b) }()
		for i := 0; i < b.N; i++ {
			t0 := time.Now()
			s, err := r.cli.Do(ctx, "w1", &Request{Path: "/echo", Body: body})
			if err != nil {
				b.Fatal(err)
			}
			n := 0
			for {
				c, err := s.Next()
				if err == io.EOF {
					break
				}
				if err != nil {
					b.Fatal(err)
				}
				n += len(c)
			}
			s.Close()
			lat = append(lat, time.Since(t0))
			if n != len(body) {
				b.Fatalf("got %d bytes", n)
			}
		}
	})
	b.Run("http", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(body)))
		hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64, DisableCompression: true}}
		buf := make([]byte, 4096)
		lat := make(latencies, 0, b.N)
		defer func() { lat.report(b) }()
		for i := 0; i < b.N; i++ {
			t0 := time.Now()
			resp, err := hc.Post(r.eng.URL+"/echo", "application/json", bytes.NewReader(body))
			if err != nil {
				b.Fatal(err)
			}
			n := 0
			for {
				k, err := resp.Body.Read(buf)
				n += k
				if err != nil {
					break
				}
			}
			resp.Body.Close()
			lat = append(lat, time.Since(t0))
			if n != len(body) {
				b.Fatalf("got %d bytes", n)
			}
		}
	})
}

// BenchmarkRoundTripParallel is BenchmarkRoundTrip with concurrent clients
// (throughput: requests/s = 1e9 / ns/op).
func BenchmarkRoundTripParallel(b *testing.B) {
	r := newRig(b, ClientConfig{}, ServerConfig{})
	body := []byte(`{"model":"m","prompt":"hello world","max_tokens":1}`)
	ctx := context.Background()
	b.Run("nats", func(b *testing.B) {
		b.ReportAllocs()
		b.SetParallelism(8)
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				s, err := r.cli.Do(ctx, "w1", &Request{Path: "/echo", Body: body})
				if err != nil {
					b.Error(err)
					return
				}
				for {
					if _, err := s.Next(); err != nil {
						break
					}
				}
				s.Close()
			}
		})
	})
	b.Run("http", func(b *testing.B) {
		b.ReportAllocs()
		b.SetParallelism(8)
		hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64, DisableCompression: true}}
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				resp, err := hc.Post(r.eng.URL+"/echo", "application/json", bytes.NewReader(body))
				if err != nil {
					b.Error(err)
					return
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		})
	})
}
