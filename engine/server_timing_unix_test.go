//go:build linux || darwin

package engine

import (
	"fmt"
	"io"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkServerConcurrentStreams runs 32 concurrent streams against one
// engine at --speedup 20 and reports process CPU (engine and the in-process
// clients together) per streamed token, and the wall time per token.
func BenchmarkServerConcurrentStreams(b *testing.B) {
	e := startEngineB(b)
	e.srv.mu.Lock()
	e.srv.core.cfg.Time.Speedup = 20
	e.srv.mu.Unlock()
	const streams, tokens = 32, 64
	body := fmt.Sprintf(`{"stream":true,"max_tokens":%d,"prompt":"hello there"}`, tokens)
	b.ReportAllocs()
	b.ResetTimer()
	cpu0 := cpuTime()
	for i := 0; i < b.N; i++ {
		var wg sync.WaitGroup
		for j := 0; j < streams; j++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				resp, err := testClient.Post(e.base+"/v1/completions", "application/json", strings.NewReader(body))
				if err != nil {
					b.Error(err)
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}()
		}
		wg.Wait()
	}
	b.StopTimer()
	n := float64(b.N * streams * tokens)
	b.ReportMetric(float64((cpuTime()-cpu0).Microseconds())/n, "cpu-us/token")
	b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N*tokens), "wall-us/step")
}
