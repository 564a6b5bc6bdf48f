package discovery

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
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

// timingOutConn is a client connection whose reads fail as the kernel
// fails them once TCP keepalive gave its peer up (ETIMEDOUT) after
// timeOut is called: a dead API server's connection without the 30 s of
// unanswered probes, which loopback cannot produce (its kernel answers
// them).
type timingOutConn struct {
	net.Conn
	dead atomic.Bool
}

func (c *timingOutConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if err != nil && c.dead.Load() {
		return n, &net.OpError{Op: "read", Net: "tcp", Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: os.NewSyscallError("read", syscall.ETIMEDOUT)}
	}
	return n, err
}

func (c *timingOutConn) timeOut() {
	c.dead.Store(true)
	c.SetReadDeadline(time.Now()) // wakes the blocked read
}

// A watch stream cut mid-way by its connection (a reset, a close in the
// middle of an event, a keepalive timeout: ETIMEDOUT) is resumed at once
// by a watch from the last resource version seen, an event's or a
// bookmark's, with no relist, as client-go's stream watcher ends such a
// watch as the server's own end (apimachinery's IsProbableEOF and
// IsTimeout); only a 410 Gone relists. A keepalive timeout relisted: a
// full Pod list from every router whose connection to a lost API server
// timed out.
func TestKubeAWatchStreamCutByItsConnectionIsResumedFromTheLastResourceVersion(t *testing.T) {
	type req struct {
		watch bool
		rv    string
	}
	reqs := make(chan req, 16)
	cut := make(chan struct{})     // the test has seen what the watch sent
	sent := make(chan struct{}, 1) // the third watch sent its bookmark
	var watches atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		reqs <- req{q.Get("watch") != "", q.Get("resourceVersion")}
		if q.Get("watch") == "" {
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"kind":"PodList","metadata":{"resourceVersion":"10"},"items":[%s]}`, kubePodJSON("p1", "w1", 9))
			return
		}
		conn, buf, err := w.(http.Hijacker).Hijack()
		if err != nil {
			t.Error(err)
			return
		}
		defer conn.Close()
		buf.WriteString("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
		chunk := func(s string) { fmt.Fprintf(buf, "%x\r\n%s\r\n", len(s), s); buf.Flush() }
		wait := func() {
			select {
			case <-cut:
			case <-time.After(10 * time.Second):
			}
		}
		switch watches.Add(1) {
		case 1: // an event and a bookmark, then the connection reset
			chunk(`{"type":"ADDED","object":` + kubePodJSON("p2", "w2", 11) + "}\n")
			chunk(`{"type":"BOOKMARK","object":{"kind":"Pod","apiVersion":"v1","metadata":{"resourceVersion":"15"}}}` + "\n")
			chunk(`{"type":"ADDED","object":` + kubeMarkerJSON() + "}\n") // the bookmark was read
			wait()
			conn.(*net.TCPConn).SetLinger(0) // RST
		case 2: // an event, then closed in the middle of the next one
			chunk(`{"type":"ADDED","object":` + kubePodJSON("p3", "w3", 16) + "}\n")
			wait()
			chunk(`{"type":"ADDED","object":{"kind":"Pod","metadata":{"name":"p4","resourceVersion":"17"`)
		case 3: // a bookmark, then the client's read times out (ETIMEDOUT)
			chunk(`{"type":"BOOKMARK","object":{"kind":"Pod","apiVersion":"v1","metadata":{"resourceVersion":"20"}}}` + "\n")
			chunk(`{"type":"DELETED","object":` + kubeMarkerJSON() + "}\n") // the bookmark was read
			sent <- struct{}{}
			conn.SetReadDeadline(time.Now().Add(10 * time.Second))
			buf.ReadByte() // until the client closes the connection
		default: // served until the end of the test
			wait()
		}
	}))
	defer srv.Close()
	sink := newMemSink()
	w, err := NewKubeWatcher(&KubeConfig{Server: srv.URL, Token: "tok"}, KubeWatcherConfig{Namespace: "infera"}, sink)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []*timingOutConn
	tr := w.c.hc.Transport.(*http.Transport)
	dial := tr.DialContext
	tr.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		tc := &timingOutConn{Conn: c}
		mu.Lock()
		conns = append(conns, tc)
		mu.Unlock()
		return tc, nil
	}
	w.Start()
	defer w.Close()
	defer close(cut)
	next := func(what string, want req) {
		t.Helper()
		select {
		case got := <-reqs:
			if got != want {
				kind := "a list"
				if got.watch {
					kind = "a watch"
				}
				t.Fatalf("%s: the next request is %s from resourceVersion %q, want a watch from %q", what, kind, got.rv, want.rv)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: no request within 5 s", what)
		}
	}
	next("start", req{false, ""})
	next("after the list", req{true, "10"})
	waitFor(t, 5*time.Second, "w2 seen", func() bool { _, ok := sink.get("w2"); return ok })
	// The marker came after the bookmark: the bookmark was read.
	waitFor(t, 5*time.Second, "the marker seen", func() bool { _, ok := sink.get("mark"); return ok })
	cut <- struct{}{}
	next("after a reset", req{true, "15"})
	waitFor(t, 5*time.Second, "w3 seen", func() bool { _, ok := sink.get("w3"); return ok })
	cut <- struct{}{}
	next("after a close in the middle of an event", req{true, "16"})
	select {
	case <-sent:
	case <-time.After(5 * time.Second):
		t.Fatal("the third watch sent no bookmark")
	}
	waitFor(t, 5*time.Second, "the marker gone", func() bool { _, ok := sink.get("mark"); return !ok }) // the bookmark read
	mu.Lock()
	for _, c := range conns {
		c.timeOut()
	}
	mu.Unlock()
	next("after a keepalive timeout", req{true, "20"})
	if n := sink.len(); n != 3 {
		t.Fatalf("the sink holds %d workers, want w1, w2, w3", n)
	}
	if ok, d := w.Health(); !ok {
		t.Fatalf("health %q after the watch resumed", d)
	}
}

// kubeMarkerJSON is a routable Pod whose record names id "mark", with no
// resource version: its event, sent after a bookmark, is seen by the test
// once the bookmark before it was read, and leaves the watch's resource
// version the bookmark's.
func kubeMarkerJSON() string {
	ann := strings.ReplaceAll(recJSON("mark"), `"`, `\"`)
	return fmt.Sprintf(`{"kind":"Pod","apiVersion":"v1","metadata":{"name":"marker","namespace":"infera","annotations":{%q:"%s"}},`+
		`"status":{"phase":"Running","conditions":[{"type":"Ready","status":"True"}]}}`, DefaultAnnotation, ann)
}

// kubePodJSON is a routable Pod of the given resource version whose
// record names id.
func kubePodJSON(name, id string, rv int) string {
	ann := strings.ReplaceAll(recJSON(id), `"`, `\"`)
	return fmt.Sprintf(`{"kind":"Pod","apiVersion":"v1","metadata":{"name":%q,"namespace":"infera","resourceVersion":"%d","annotations":{%q:"%s"}},`+
		`"status":{"phase":"Running","conditions":[{"type":"Ready","status":"True"}]}}`, name, rv, DefaultAnnotation, ann)
}
