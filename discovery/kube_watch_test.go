package discovery

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/infera/infera/fleet"
	"github.com/infera/infera/internal/testsrv"
)

// A service account allowed to list Pods but not to watch them (a Role
// missing the watch verb): every watch was answered 403, the watcher
// relisted every 10 s, and /health said ok with the discovery line
// healthy, so nothing told the operator the fleet was seen up to 10 s
// late. The watcher still serves from its relists, and its health is now
// false (/health: degraded) with a detail naming the missing verb, until a
// watch is allowed again.
func TestKubeAForbiddenWatchIsReportedAndServedByRelists(t *testing.T) {
	defer func(d time.Duration) { forbiddenRelist = d }(forbiddenRelist)
	forbiddenRelist = 300 * time.Millisecond
	f := newFakeKube("tok")
	var deny atomic.Bool
	deny.Store(true)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("watch") != "" && deny.Load() {
			writeStatus(w, 403, "Forbidden", `pods is forbidden: User "system:serviceaccount:infera:router" cannot watch resource "pods" in API group "" in the namespace "infera"`)
			return
		}
		f.ServeHTTP(w, r)
	}))
	defer srv.Close()
	pod := func(name, id string) podSpec {
		return podSpec{ns: "infera", name: name, labels: workerLabels, phase: "Running", ready: true, ann: strp(recJSON(id))}
	}
	f.set(pod("p1", "w1"), false)
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
	waitFor(t, 5*time.Second, "health naming the forbidden watch", func() bool {
		ok, d := w.Health()
		return !ok && strings.Contains(d, "watch") && strings.Contains(d, "403") && strings.Contains(d, "relist")
	})
	if g := statsFor(BackendKubernetes).degraded.Load(); g != 1 {
		t.Fatalf("infera_discovery_degraded %d, want 1", g)
	}
	// Still served, by relists.
	f.set(pod("p2", "w2"), false)
	waitFor(t, 5*time.Second, "w2 seen by a relist", func() bool { _, ok := sink.get("w2"); return ok })
	// The Role fixed: the next watch is allowed and health is ok again.
	deny.Store(false)
	waitFor(t, 5*time.Second, "healthy once the watch is allowed", func() bool { ok, _ := w.Health(); return ok })
	if g := statsFor(BackendKubernetes).degraded.Load(); g != 0 {
		t.Fatalf("infera_discovery_degraded %d, want 0", g)
	}
	f.set(pod("p3", "w3"), false)
	waitFor(t, 5*time.Second, "w3 seen by the watch", func() bool { _, ok := sink.get("w3"); return ok })
}

// silentWriter swallows everything a handler writes while silent is set,
// and on that request for good once it swallowed something: the
// connection stays open and nothing more arrives, as from an API server
// that stopped answering without a FIN or RST (a partition).
type silentWriter struct {
	http.ResponseWriter
	silent *atomic.Bool
	dead   *bool // the handler's goroutine only
}

func (w silentWriter) mute() bool {
	if w.silent.Load() {
		*w.dead = true
	}
	return *w.dead
}

func (w silentWriter) WriteHeader(code int) {
	if !w.mute() {
		w.ResponseWriter.WriteHeader(code)
	}
}

func (w silentWriter) Write(b []byte) (int, error) {
	if w.mute() {
		return len(b), nil
	}
	return w.ResponseWriter.Write(b)
}

func (w silentWriter) Flush() {
	if !w.mute() {
		w.ResponseWriter.(http.Flusher).Flush()
	}
}

// An API server that stops answering with the connection left up (a hung
// server, a partition whose TCP keepalive probes a proxy still answers):
// a watch to it is cut once it ran past its server-side timeout
// (timeoutSeconds) and a tenth more, at least a second; health says so,
// and it is resumed from the last resource version as soon as the server
// answers, leaving no connection or goroutine behind.
func TestKubeAWatchToAnAPIServerThatStoppedAnsweringIsCutPastItsTimeout(t *testing.T) {
	f := newFakeKube("tok")
	var silent atomic.Bool
	var open atomic.Int64 // server connections not closed
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("watch") != "" {
			sw := silentWriter{w, &silent, new(bool)}
			f.ServeHTTP(sw, r)
			if *sw.dead {
				<-r.Context().Done() // nor does it end the watch
			}
			return
		}
		f.ServeHTTP(w, r)
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		switch s {
		case http.StateNew:
			open.Add(1)
		case http.StateClosed, http.StateHijacked:
			open.Add(-1)
		}
	}
	srv.Start()
	defer srv.Close()
	g0 := runtime.NumGoroutine()
	pod := func(name, id string) podSpec {
		return podSpec{ns: "infera", name: name, labels: workerLabels, phase: "Running", ready: true, ann: strp(recJSON(id))}
	}
	f.set(pod("p1", "w1"), false)
	sink := newMemSink()
	const timeout = time.Second
	bound := watchBound(timeout)
	w, err := NewKubeWatcher(&KubeConfig{Server: srv.URL, Token: "tok"}, KubeWatcherConfig{Namespace: "infera", WatchTimeout: timeout}, sink)
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
	waitFor(t, time.Second, "the watch", func() bool { return f.watches.Load() == 1 })
	lists := f.lists.Load()

	silent.Store(true)
	start := time.Now()
	// The watch open now ends at its timeout; the next one, silent, is
	// cut at its bound.
	waitFor(t, timeout+bound+time.Second, "the silent watch noticed", func() bool {
		ok, d := w.Health()
		return !ok && strings.Contains(d, "stopped answering")
	})
	if d := time.Since(start); d < bound {
		t.Fatalf("noticed after %v, before the bound %v", d, bound)
	}
	f.set(pod("p2", "w2"), false)            // while silent
	time.Sleep(bound + 500*time.Millisecond) // another silent watch, cut
	if n := open.Load(); n > 3 {
		t.Fatalf("%d connections open after the silent watches were cut", n)
	}

	silent.Store(false)
	waitFor(t, 2*bound, "healthy once the server answers", func() bool { ok, _ := w.Health(); return ok })
	waitFor(t, 2*time.Second, "the change made while silent, seen by the resumed watch", func() bool { _, ok := sink.get("w2"); return ok })
	if f.lists.Load() != lists {
		t.Fatalf("%d relists: the watch should resume from its resource version", f.lists.Load()-lists)
	}
	w.Close()
	srv.CloseClientConnections()
	waitFor(t, 2*time.Second, "no goroutine left", func() bool { return runtime.NumGoroutine() <= g0+2 })
}

// An API server with its watch cache off sends no bookmark at all, and
// bookmarks are sent at the server's discretion anyway: a watch of such a
// server with nothing changing was cut after 90 s of silence, reported as
// an unreachable API (/health degraded) and resumed, every 90 s. A quiet
// watch now stays open, healthy, until the API server ends it at its
// timeoutSeconds; it is resumed from the last resource version (no relist,
// no event replayed), and a resource version compacted meanwhile (410
// Gone) relists, losing and duplicating no worker.
func TestKubeAQuietWatchWithoutBookmarksStaysUpUntilTheServerEndsIt(t *testing.T) {
	f := newFakeKube("tok")
	f.noBookmarks = true
	srv := startFakeKube(t, f)
	pod := func(name, id string, ready bool) podSpec {
		return podSpec{ns: "infera", name: name, labels: workerLabels, phase: "Running", ready: ready, ann: strp(recJSON(id))}
	}
	f.set(pod("p1", "w1", true), false)
	sink := newMemSink()
	const timeout = 2 * time.Second // timeoutSeconds=2
	w, err := NewKubeWatcher(&KubeConfig{Server: srv.URL, Token: "tok"}, KubeWatcherConfig{Namespace: "infera", WatchTimeout: timeout}, sink)
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
	waitFor(t, time.Second, "the watch", func() bool { return f.watches.Load() == 1 })
	began := time.Now()
	// healthyWhile checks health every 20 ms until cond holds or d passes.
	healthyWhile := func(d time.Duration, what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(d)
		for !cond() {
			if ok, detail := w.Health(); !ok {
				t.Fatalf("%s: health %q after %v", what, detail, time.Since(began).Round(time.Millisecond))
			}
			if time.Now().After(deadline) {
				t.Fatalf("timed out after %v waiting for %s", d, what)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	// Quiet for most of its timeout: neither cut nor unhealthy.
	healthyWhile(timeout*3/4, "a quiet watch", func() bool {
		if n := f.watches.Load(); n != 1 {
			t.Fatalf("%d watches %v into a quiet watch of timeoutSeconds=2", n, time.Since(began).Round(time.Millisecond))
		}
		return time.Since(began) >= timeout*3/4-20*time.Millisecond
	})
	f.set(pod("p2", "w2", true), false)
	healthyWhile(time.Second, "w2 seen by the first watch", func() bool { _, ok := sink.get("w2"); return ok })
	if n := f.watches.Load(); n != 1 {
		t.Fatalf("w2 seen after %d watches, want the first", n)
	}
	// The server ends it: resumed from the last resource version.
	healthyWhile(2*timeout, "the watch resumed", func() bool { return f.watches.Load() == 2 })
	if up, rm, syncs := sink.calls("w2"); up != 1 || rm != 0 || syncs != 1 {
		t.Fatalf("w2: %d upserts, %d removes, %d syncs; want 1, 0 and the first list's", up, rm, syncs)
	}
	// Changes the history loses, then a compaction: the next watch is
	// answered 410 and relists.
	p1 := pod("p1", "w1", false)
	f.set(p1, true)
	f.set(pod("p3", "w3", true), true)
	f.compact(true)
	healthyWhile(3*timeout, "the relist after 410", func() bool {
		_, has1 := sink.get("w1")
		_, has3 := sink.get("w3")
		return !has1 && has3
	})
	if _, ok := sink.get("w2"); !ok || sink.len() != 2 || f.lists.Load() != 2 {
		t.Fatalf("after the relist: %v, %d lists", sink.m, f.lists.Load())
	}
	if up, _, _ := sink.calls("w2"); up != 1 {
		t.Fatalf("w2 upserted %d times", up)
	}
}

// Two Pods advertising one engine under two ids (one routed, the other
// left out by the fleet) and two Pods of one id (a rollout with a fixed
// --id) were each counted as a worker: the health line said 4 workers for
// 2 routed. It now counts what is routed and names the left-out ones
// apart.
func TestKubeHealthCountsWhatIsRouted(t *testing.T) {
	f := newFakeKube("tok")
	srv := startFakeKube(t, f)
	pod := func(name, id, url string) podSpec {
		return podSpec{ns: "infera", name: name, labels: workerLabels, phase: "Running", ready: true,
			ann: strp(`{"id":"` + id + `","url":"` + url + `","models":["m"],"status":"ACTIVE"}`)}
	}
	f.set(pod("p1", "a", "http://10.0.0.9:8100"), false)
	f.set(pod("p2", "b", "http://10.0.0.9:8100"), false) // a's engine
	f.set(pod("p3", "c", "http://10.0.0.8:8100"), false)
	f.set(pod("p4", "c", "http://10.0.0.8:8100"), false) // c again
	fl := fleet.NewFleet(fleet.BreakerConfig{})
	defer fl.Close()
	fl.OneWorkerPerEngine()
	w, err := NewKubeWatcher(&KubeConfig{Server: srv.URL, Token: "tok"}, KubeWatcherConfig{Namespace: "infera"}, fl)
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
	check := func(what string, routed, leftOut int) {
		t.Helper()
		want := fmt.Sprintf("(%d workers", routed)
		if leftOut > 0 {
			want = fmt.Sprintf("(%d workers, %d left out", routed, leftOut)
		}
		waitFor(t, 5*time.Second, what, func() bool {
			_, d := w.Health()
			return len(fl.View().All) == routed && strings.Contains(d, want) && statsFor(BackendKubernetes).workers.Load() == int64(routed)
		})
	}
	check("after the list", 2, 1)
	// By watch events: another Pod on a's engine, then a's Pod gone (b
	// joins).
	f.set(pod("p5", "d", "http://10.0.0.9:8100"), false)
	check("a third id on a's engine", 2, 2)
	f.del("infera", "p1")
	check("a's Pod deleted", 2, 1)
	f.del("infera", "p3")
	check("one of c's Pods deleted", 2, 1)
}

// A proxy in front of the API server may hold a watch's response headers
// until its first event: a quiet watch then answers its headers only when
// the server ends it, at timeoutSeconds, with no event. It lasted that
// long, and is resumed at once, as client-go does (its reflector starts
// the clock before the request): the watch was timed from its headers,
// taken for one that ended at once, and resumed after a delay growing to
// 10 s, the fleet unwatched meanwhile.
func TestKubeAQuietWatchWhoseHeadersAProxyHeldIsResumedAtOnce(t *testing.T) {
	var mu sync.Mutex
	var starts, ends []time.Time
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if r.URL.Query().Get("watch") == "" {
			fmt.Fprint(w, `{"kind":"PodList","metadata":{"resourceVersion":"7"},"items":[]}`)
			return
		}
		mu.Lock()
		starts = append(starts, time.Now())
		mu.Unlock()
		select { // quiet, its headers held, until the server ends it
		case <-time.After(1200 * time.Millisecond):
		case <-r.Context().Done():
			return
		}
		w.WriteHeader(200)
		mu.Lock()
		ends = append(ends, time.Now())
		mu.Unlock()
	}))
	defer srv.Close()
	w, err := NewKubeWatcher(&KubeConfig{Server: srv.URL, Token: "t"}, KubeWatcherConfig{Namespace: "ns", WatchTimeout: time.Second}, newMemSink())
	if err != nil {
		t.Fatal(err)
	}
	w.Start()
	defer w.Close()
	waitFor(t, 10*time.Second, "four watches", func() bool { mu.Lock(); defer mu.Unlock(); return len(starts) >= 4 })
	mu.Lock()
	defer mu.Unlock()
	var waited time.Duration // between a watch's end and the next one
	for i := 0; i < 3; i++ {
		waited += starts[i+1].Sub(ends[i])
	}
	if waited > 300*time.Millisecond {
		t.Fatalf("three quiet watches resumed after %v in all, want at once", waited.Round(time.Millisecond))
	}
}

// An API server shedding load (API Priority and Fairness) answers a watch
// 429 Too Many Requests: it is asked again from the same resource version
// after a growing delay, as client-go's reflector does, with no relist:
// every 429 relisted, a full Pod list sent to the server that asked for
// less load, and the delay was not kept between them.
func TestKubeAWatchAnswered429IsRetriedWithoutARelist(t *testing.T) {
	f := newFakeKube("tok")
	var shed atomic.Int64
	shed.Store(4)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("watch") != "" && shed.Add(-1) >= 0 {
			w.Header().Set("Retry-After", "1")
			writeStatus(w, 429, "TooManyRequests", "too many requests, please try again later")
			return
		}
		f.ServeHTTP(w, r)
	}))
	defer srv.Close()
	pod := func(name, id string) podSpec {
		return podSpec{ns: "infera", name: name, labels: workerLabels, phase: "Running", ready: true, ann: strp(recJSON(id))}
	}
	f.set(pod("p1", "w1"), false)
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
	start := time.Now()
	waitFor(t, 10*time.Second, "a watch past the 429s", func() bool { return f.watches.Load() == 1 })
	if d := time.Since(start); d < 1500*time.Millisecond { // 0.2 + 0.4 + 0.8 s
		t.Fatalf("four 429s retried within %v: no growing delay", d.Round(time.Millisecond))
	}
	if n := f.lists.Load(); n != 1 {
		t.Fatalf("%d lists: a 429 relisted", n)
	}
	f.set(pod("p2", "w2"), false)
	waitFor(t, 5*time.Second, "w2 seen by the watch", func() bool { _, ok := sink.get("w2"); return ok })
}

// An API server shedding load may end an open watch with an ERROR event
// (a Status: 429 TooManyRequests, 504 ServerTimeout, 500 InternalError)
// rather than refuse the request: the watch is asked again from the same
// resource version after a growing delay, as client-go's reflector does
// (it relists only on 410 Gone); each such event relisted every Pod.
func TestKubeAWatchEndedByAThrottlingErrorEventIsRetriedWithoutARelist(t *testing.T) {
	f := newFakeKube("tok")
	statuses := []struct {
		code   int
		reason string
	}{{429, "TooManyRequests"}, {504, "ServerTimeout"}, {500, "InternalError"}}
	var shed atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("watch") != "" {
			if i := shed.Add(1) - 1; i < int64(len(statuses)) {
				st := statuses[i]
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(200)
				fmt.Fprintf(w, `{"type":"BOOKMARK","object":{"kind":"Pod","apiVersion":"v1","metadata":{"resourceVersion":%q}}}`+"\n", r.URL.Query().Get("resourceVersion"))
				fmt.Fprintf(w, `{"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","status":"Failure","code":%d,"reason":%q,"message":"too many requests, please try again later"}}`+"\n", st.code, st.reason)
				return
			}
		}
		f.ServeHTTP(w, r)
	}))
	defer srv.Close()
	pod := func(name, id string) podSpec {
		return podSpec{ns: "infera", name: name, labels: workerLabels, phase: "Running", ready: true, ann: strp(recJSON(id))}
	}
	f.set(pod("p1", "w1"), false)
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
	start := time.Now()
	waitFor(t, 10*time.Second, "a watch past the error events", func() bool { return f.watches.Load() == 1 })
	if d := time.Since(start); d < 1200*time.Millisecond { // 0.2 + 0.4 + 0.8 s
		t.Fatalf("three error events retried within %v: no growing delay", d.Round(time.Millisecond))
	}
	if n := f.lists.Load(); n != 1 {
		t.Fatalf("%d lists: an error event relisted", n)
	}
	if ok, d := w.Health(); !ok {
		t.Fatalf("health %q: the API answered", d)
	}
	f.set(pod("p2", "w2"), false)
	waitFor(t, 5*time.Second, "w2 seen by the watch", func() bool { _, ok := sink.get("w2"); return ok })
}

// An API server restarting breaks the open watch and refuses connections
// for a while: the watch is asked again from the last resource version
// after a growing delay, as client-go's reflector does for "connection
// refused" (it relists only on 410 Gone or an unknown resource version),
// and the changes made meanwhile come from the server's history. It
// relisted: a full Pod list from every router at once against an API
// server just back up.
func TestKubeAWatchOfARestartingAPIServerResumesFromItsResourceVersion(t *testing.T) {
	f := newFakeKube("tok")
	// The API server's address is a front's, held for the whole test: a
	// server restarted on its own port could find it taken by another
	// test (go test -p) in the 700 ms it is down.
	front := testsrv.NewFront(t)
	addr := front.Addr
	serve := func() *http.Server {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		s := &http.Server{Handler: f}
		go s.Serve(ln)
		front.Up(ln.Addr().String())
		return s
	}
	s := serve()
	defer func() { s.Close() }()
	pod := func(name, id string) podSpec {
		return podSpec{ns: "infera", name: name, labels: workerLabels, phase: "Running", ready: true, ann: strp(recJSON(id))}
	}
	f.set(pod("p1", "w1"), false)
	sink := newMemSink()
	w, err := NewKubeWatcher(&KubeConfig{Server: "http://" + addr, Token: "tok"}, KubeWatcherConfig{Namespace: "infera"}, sink)
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
	waitFor(t, 2*time.Second, "the watch", func() bool { return f.watches.Load() == 1 })

	front.Down() // the API server goes down: its watch broken, connections refused
	s.Close()
	waitFor(t, 2*time.Second, "health saying the API is unreachable", func() bool { ok, _ := w.Health(); return !ok })
	f.set(pod("p2", "w2"), false) // changed while it is down
	time.Sleep(700 * time.Millisecond)
	s = serve()
	waitFor(t, 5*time.Second, "healthy once the API server is back", func() bool { ok, _ := w.Health(); return ok })
	waitFor(t, 5*time.Second, "the change made while down, seen by the resumed watch", func() bool { _, ok := sink.get("w2"); return ok })
	if n := f.lists.Load(); n != 1 {
		t.Fatalf("%d lists: the restart relisted", n)
	}
	if f.watches.Load() < 2 {
		t.Fatalf("%d watches", f.watches.Load())
	}
}

// Each watch asks for a server-side timeout drawn in [5 min, 10 min), as
// client-go's reflector draws it (minWatchTimeout * (1 + rand)): with a
// fixed 300 s, routers started together ended and re-watched at the same
// moments, every 5 minutes, for good.
func TestKubeEachWatchAsksARandomTimeoutOf5To10Minutes(t *testing.T) {
	var mu sync.Mutex
	var asked []int
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		q := r.URL.Query()
		if q.Get("watch") == "" {
			fmt.Fprint(w, `{"kind":"PodList","metadata":{"resourceVersion":"7"},"items":[]}`)
			return
		}
		n, err := strconv.Atoi(q.Get("timeoutSeconds"))
		if err != nil {
			n = -1
		}
		mu.Lock()
		asked = append(asked, n)
		mu.Unlock()
		// One bookmark, then the end: resumed at once.
		fmt.Fprint(w, `{"type":"BOOKMARK","object":{"kind":"Pod","apiVersion":"v1","metadata":{"resourceVersion":"7"}}}`+"\n")
	}))
	defer srv.Close()
	w, err := NewKubeWatcher(&KubeConfig{Server: srv.URL, Token: "t"}, KubeWatcherConfig{Namespace: "ns"}, newMemSink())
	if err != nil {
		t.Fatal(err)
	}
	w.Start()
	defer w.Close()
	waitFor(t, 5*time.Second, "20 watches", func() bool { mu.Lock(); defer mu.Unlock(); return len(asked) >= 20 })
	w.Close()
	mu.Lock()
	defer mu.Unlock()
	seen := map[int]bool{}
	for _, n := range asked {
		if n < 300 || n >= 600 {
			t.Fatalf("timeoutSeconds=%d asked, want [300, 600): %v", n, asked)
		}
		seen[n] = true
	}
	if len(seen) < 2 {
		t.Fatalf("%d watches all asked timeoutSeconds=%d", len(asked), asked[0])
	}
}

// Two Ready Pods advertising one worker id (a rollout with a fixed --id, a
// copied manifest): the worker stays with the Pod that holds it until that
// Pod goes away (deleted, not Ready, terminating, its id changed), then
// passes to another Pod of the id. Any change to the other Pod (a
// MODIFIED event: a label, a condition, its record) or a third Pod of the
// id (ADDED) switched the worker to it, made anew: its KV entries,
// breaker and counters reset, its engine changed, each time.
func TestKubeAWorkerIDSharedByTwoPodsStaysWithThePodHoldingIt(t *testing.T) {
	f := newFakeKube("tok")
	srv := startFakeKube(t, f)
	pod := func(name, ip string) podSpec {
		return podSpec{ns: "infera", name: name, labels: workerLabels, phase: "Running", ready: true,
			ann: strp(fmt.Sprintf(`{"id":"w","url":"http://%s:8100","models":["m"],"status":"ACTIVE"}`, ip))}
	}
	ips := map[string]string{"p1": "10.0.0.1", "p2": "10.0.0.2", "p3": "10.0.0.3"}
	f.set(pod("p1", ips["p1"]), false)
	f.set(pod("p2", ips["p2"]), false)
	fl := fleet.NewFleet(fleet.BreakerConfig{})
	defer fl.Close()
	w, err := NewKubeWatcher(&KubeConfig{Server: srv.URL, Token: "tok"}, KubeWatcherConfig{Namespace: "infera"}, fl)
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
	w0 := fl.Get("w")
	if w0 == nil {
		t.Fatal("no worker w after the list")
	}
	holder, other := "p1", "p2"
	if w0.URL == "http://"+ips["p2"]+":8100" {
		holder, other = "p2", "p1"
	}
	waitFor(t, 2*time.Second, "the watch", func() bool { return f.watches.Load() == 1 })
	// stays checks, once the watch has seen everything (a sentinel Pod
	// added after it: events come in order), that w is still w0.
	sentinels := 0
	stays := func(what string) {
		t.Helper()
		sentinels++
		id := fmt.Sprintf("s%d", sentinels)
		f.set(podSpec{ns: "infera", name: id, labels: workerLabels, phase: "Running", ready: true,
			ann: strp(fmt.Sprintf(`{"id":%q,"url":"http://10.0.1.%d:8100","models":["m"],"status":"ACTIVE"}`, id, sentinels))}, false)
		waitFor(t, 2*time.Second, what+": seen by the watch", func() bool { return fl.Get(id) != nil })
		if got := fl.Get("w"); got != w0 {
			url := "none"
			if got != nil {
				url = got.URL
			}
			t.Fatalf("%s: worker w switched to %s (was %s, %s's)", what, url, w0.URL, holder)
		}
	}
	// The other Pod changes: a label, then Ready flapping.
	o := pod(other, ips[other])
	o.labels = map[string]string{"app": "infera", "tier": "worker", "rev": "2"}
	f.set(o, false)
	stays("the other Pod relabelled")
	o.ready = false
	f.set(o, false)
	o.ready = true
	f.set(o, false)
	stays("the other Pod Ready again")
	f.set(pod("p3", ips["p3"]), false)
	stays("a third Pod of the id added")
	// The holder goes away: the worker passes to another Pod of the id.
	f.del("infera", holder)
	waitFor(t, 2*time.Second, "w on another Pod once its holder is deleted", func() bool {
		got := fl.Get("w")
		return got != nil && got.URL != w0.URL
	})
}
