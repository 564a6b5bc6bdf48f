package discovery

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
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
