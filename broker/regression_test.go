package broker

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestStopAcceptingAnswersEveryPublishedRequest: requests published while the worker
// unsubscribes must each get an answer or "no responders"; none may be
// silently dropped (the router would wait for the idle timeout, 900s by
// default).
func TestStopAcceptingAnswersEveryPublishedRequest(t *testing.T) {
	r := newRig(t, ClientConfig{IdleTimeout: 1500 * time.Millisecond}, ServerConfig{})
	var ok, noResp, idle, other atomic.Int64
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 400; i++ {
				select {
				case <-stop:
					return
				default:
				}
				s, err := r.cli.Do(context.Background(), "w1", &Request{Path: "/echo", Body: []byte("x")})
				switch {
				case err == nil:
					ok.Add(1)
					s.Close()
				case errors.Is(err, ErrNoResponders):
					noResp.Add(1)
					return
				case errors.Is(err, ErrIdleTimeout):
					idle.Add(1)
					return
				default:
					other.Add(1)
					return
				}
			}
		}()
	}
	time.Sleep(150 * time.Millisecond)
	r.srv.StopAccepting()
	time.Sleep(2 * time.Second)
	close(stop)
	wg.Wait()
	t.Logf("ok=%d noResponders=%d idleTimeout=%d other=%d", ok.Load(), noResp.Load(), idle.Load(), other.Load())
	if idle.Load() > 0 {
		t.Fatalf("%d requests were silently dropped by StopAccepting (router saw only the idle timeout)", idle.Load())
	}
}

// TestCancelBeforeHandlerRegistersStillCancels: a cancel that reaches the worker before its
// request handler registered the id is ignored, and the engine request runs
// to completion with nobody listening.
func TestCancelBeforeHandlerRegistersStillCancels(t *testing.T) {
	r := newRig(t, ClientConfig{}, ServerConfig{})
	const n = 200
	for i := 0; i < n; i++ {
		ctx, cancel := context.WithCancel(context.Background())
		cancel() // the client is already gone: Do publishes, then cancels at once
		_, _ = r.cli.Do(ctx, "w1", &Request{Path: "/stream?n=100&every=100ms"})
	}
	deadline := time.Now().Add(2 * time.Second)
	for r.eng.active.Load() > 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if a := r.eng.active.Load(); a > 0 {
		t.Fatalf("%d of %d canceled requests still run at the engine", a, n)
	}
}
