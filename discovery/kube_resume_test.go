package discovery

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// An API server that flapped (watches refused 429, the retry delay grown
// to 0.8 s) and recovered: a watch that then stayed up longer than the
// reset period starts the delay over, so the next retry comes after the
// first delay (0.2 s) even though that watch ended with an error, as
// client-go's reflector resets its backoff (DelayWithReset, 2 min). The
// delay was kept until a watch ended cleanly: the grown delay, and more,
// came back however long the API server had been healthy.
func TestKubeAWatchHealthyPastTheResetPeriodStartsTheRetryDelayOver(t *testing.T) {
	defer func(d time.Duration) { kubeBackoffReset = d }(kubeBackoffReset)
	kubeBackoffReset = time.Second
	f := newFakeKube("tok")
	pod := func(name, id string) podSpec {
		return podSpec{ns: "infera", name: name, labels: workerLabels, phase: "Running", ready: true, ann: strp(recJSON(id))}
	}
	f.set(pod("p1", "w1"), false)
	var n atomic.Int64
	var mu sync.Mutex
	var starts []time.Time // of each watch request
	var ended time.Time    // when the healthy watch was ended
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("watch") == "" {
			f.ServeHTTP(w, r)
			return
		}
		mu.Lock()
		starts = append(starts, time.Now())
		mu.Unlock()
		switch i := n.Add(1); {
		case i <= 3: // flapping: retried after 0.2, 0.4, 0.8 s
			writeStatus(w, 429, "TooManyRequests", "too many requests, please try again later")
		case i == 4: // recovered: up 1.5 s, then ended by a throttling error event
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(200)
			fmt.Fprintf(w, `{"type":"BOOKMARK","object":{"kind":"Pod","apiVersion":"v1","metadata":{"resourceVersion":%q}}}`+"\n", r.URL.Query().Get("resourceVersion"))
			w.(http.Flusher).Flush()
			select {
			case <-time.After(1500 * time.Millisecond):
			case <-r.Context().Done():
				return
			}
			mu.Lock()
			ended = time.Now()
			mu.Unlock()
			fmt.Fprint(w, `{"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","status":"Failure","code":429,"reason":"TooManyRequests","message":"too many requests, please try again later"}}`+"\n")
		default:
			f.ServeHTTP(w, r)
		}
	}))
	defer srv.Close()
	sink := newMemSink()
	w, err := NewKubeWatcher(&KubeConfig{Server: srv.URL, Token: "tok"}, KubeWatcherConfig{Namespace: "infera"}, sink)
	if err != nil {
		t.Fatal(err)
	}
	w.Start()
	defer w.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := w.WaitSynced(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the watch after the one ended by an error", func() bool { return n.Load() >= 5 })
	mu.Lock()
	flapping := starts[3].Sub(starts[0])
	gap := starts[4].Sub(ended)
	mu.Unlock()
	if flapping < 1200*time.Millisecond { // 0.2 + 0.4 + 0.8 s
		t.Fatalf("three 429s retried within %v: no growing delay", flapping.Round(time.Millisecond))
	}
	if gap > 800*time.Millisecond { // the first delay, 0.2 s; the grown one was 1.6 s
		t.Fatalf("a watch healthy for 1.5 s (reset period 1 s) ended by an error was retried after %v, want the first delay (0.2 s)", gap.Round(time.Millisecond))
	}
	if n := f.lists.Load(); n != 1 {
		t.Fatalf("%d lists: a throttled watch relisted", n)
	}
	f.set(pod("p2", "w2"), false)
	waitFor(t, 5*time.Second, "w2 seen by the watch", func() bool { _, ok := sink.get("w2"); return ok })
}
