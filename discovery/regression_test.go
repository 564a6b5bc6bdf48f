package discovery

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/infera/infera/fleet"
	"github.com/infera/infera/internal/testsrv"
)

func review2Pod(name, id, url string) kubeEvent {
	rec := fmt.Sprintf(`{"id":%q,"url":%q,"models":["m"],"role":"mixed","status":"ACTIVE"}`, id, url)
	obj := map[string]any{
		"metadata": map[string]any{"name": name, "namespace": "ns", "resourceVersion": "1",
			"annotations": map[string]string{DefaultAnnotation: rec}},
		"status": map[string]any{"phase": "Running", "conditions": []map[string]string{{"type": "Ready", "status": "True"}}},
	}
	b, _ := json.Marshal(obj)
	return kubeEvent{Type: "ADDED", Object: b}
}

// TestKubeDuplicateWorkerIDStaysRoutableWhenOldPodLeaves: two Pods advertising the same worker id (e.g.
// INFERA_WORKER_ID set in a Deployment template during a rollout). When the
// old Pod goes away the new, still Ready Pod must stay routable.
func TestKubeDuplicateWorkerIDStaysRoutableWhenOldPodLeaves(t *testing.T) {
	sink := newMemSink()
	w := &KubeWatcher{cfg: KubeWatcherConfig{Annotation: DefaultAnnotation}, sink: sink,
		st: statsFor(BackendKubernetes), h: newHealth(), byPod: map[string]fleet.Record{}}
	if err := w.apply(ptr(review2Pod("old", "w", "http://10.0.0.1:8100"))); err != nil {
		t.Fatal(err)
	}
	if err := w.apply(ptr(review2Pod("new", "w", "http://10.0.0.2:8100"))); err != nil {
		t.Fatal(err)
	}
	del := review2Pod("old", "w", "http://10.0.0.1:8100")
	del.Type = "DELETED"
	if err := w.apply(&del); err != nil {
		t.Fatal(err)
	}
	r, ok := sink.get("w")
	if !ok || r.URL != "http://10.0.0.2:8100" {
		t.Fatalf("after the old Pod left: worker w = %+v, present %v; want the new Pod's record", r, ok)
	}
}

func ptr[T any](v T) *T { return &v }

// An etcd that comes back empty (a single member without persistent
// storage) starts its revisions over. The resumed watch waited for a
// revision the new store would reach only after as many writes as the old
// one had seen, so the workers that registered again were never
// discovered and the ones gone were never removed. A probe whose revision
// is behind the one the watcher has seen relists.
func TestEtcdThatComesBackEmptyIsRelisted(t *testing.T) {
	e := testsrv.StartEtcd(t)
	ctx := context.Background()
	sink := newMemSink()
	// A long request timeout: the probe's Get waits out the restart, so
	// only the revision can tell that etcd came back empty.
	startWatcher(t, EtcdConfig{Endpoints: []string{e.Endpoint}, HealthInterval: 100 * time.Millisecond, RequestTimeout: 20 * time.Second}, sink)
	cli := etcdClient(t, e.Endpoint)
	for i := 0; i < 200; i++ { // revisions the empty etcd will not reach soon
		if _, err := cli.Put(ctx, "/other/key", "x"); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := cli.Put(ctx, "/infera/workers/w1", `{"id":"w1","url":"http://127.0.0.1:8100","models":["m"]}`); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "w1 discovered", func() bool { _, ok := sink.get("w1"); return ok })

	e.RestartEmpty()
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	_, err := cli.Put(pctx, "/infera/workers/w2", `{"id":"w2","url":"http://127.0.0.1:8101","models":["m"]}`)
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "w2 discovered and w1 (gone with the old data) removed", func() bool {
		_, has2 := sink.get("w2")
		_, has1 := sink.get("w1")
		return has2 && !has1
	})
}

// A watch the API server (or a proxy in front of it) ends at once, with no
// event, is retried with a growing delay, as client-go does with its "very
// short watch": it was resumed at once, so the router sent the API server
// watch requests in a tight loop for as long as that went on.
func TestKubeWatchEndingAtOnceIsNotRetriedInATightLoop(t *testing.T) {
	var lists, watches atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if r.URL.Query().Get("watch") == "" {
			lists.Add(1)
			fmt.Fprint(w, `{"kind":"PodList","metadata":{"resourceVersion":"7"},"items":[]}`)
			return
		}
		watches.Add(1) // 200, then the stream ends with no event
	}))
	defer srv.Close()
	w, err := NewKubeWatcher(&KubeConfig{Server: srv.URL, Token: "t"}, KubeWatcherConfig{Namespace: "ns"}, newMemSink())
	if err != nil {
		t.Fatal(err)
	}
	w.Start()
	time.Sleep(2 * time.Second)
	w.Close()
	if n := watches.Load(); n > 10 {
		t.Fatalf("%d watch requests (%d lists) in 2 s against a server that ends every watch at once", n, lists.Load())
	}
	if ok, _ := w.Health(); !ok {
		t.Fatal("the API answers: discovery should stay healthy")
	}
}

// A watch from the resource version a list just returned that is answered
// 410 Gone (as a status or an ERROR event: an API server behind a load
// balancer whose watch cache lags, or one that misbehaves) is relisted
// with a growing delay: it was relisted at once, 3,600-7,200 full Pod
// lists a second against the API server for as long as that went on. A
// 410 on a watch that ran a while still relists at once.
func TestKubeAResourceVersionExpiredAtOnceIsNotRelistedInATightLoop(t *testing.T) {
	for _, httpGone := range []bool{true, false} {
		f := newFakeKube("tok")
		srv := startFakeKube(t, f)
		f.set(podSpec{ns: "infera", name: "p1", labels: workerLabels, phase: "Running", ready: true, ann: strp(recJSON("w1"))}, false)
		sink := newMemSink()
		w, err := NewKubeWatcher(&KubeConfig{Server: srv.URL, Token: "tok"}, KubeWatcherConfig{}, sink)
		if err != nil {
			t.Fatal(err)
		}
		w.Start()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if err := w.WaitSynced(ctx); err != nil {
			t.Fatal(err)
		}
		cancel()
		f.mu.Lock()
		f.minRV, f.httpGone = 1<<40, httpGone // every resource version too old
		f.mu.Unlock()
		l0 := f.lists.Load()
		time.Sleep(2 * time.Second)
		if n := f.lists.Load() - l0; n > 10 {
			w.Close()
			t.Fatalf("http 410 %v: %d lists in 2 s against a server that answers every watch 410", httpGone, n)
		}
		// The server heals: the watcher relists (within its delay) and
		// watches again.
		f.mu.Lock()
		f.minRV = 0
		f.mu.Unlock()
		time.Sleep(3 * time.Second) // past the longest delay grown so far
		f.set(podSpec{ns: "infera", name: "p2", labels: workerLabels, phase: "Running", ready: true, ann: strp(recJSON("w2"))}, false)
		waitFor(t, 12*time.Second, "w2 seen once the server healed", func() bool { _, ok := sink.get("w2"); return ok })
		w.Close()
	}
}

// After an outage of a minute, etcd's clients came back up to two minutes
// after etcd did (gRPC's reconnect backoff grows to 120 s): in 50 s
// outages the watcher served its stale list for 13-27 s more, and a
// worker's lease, which etcd's restart renews for one TTL, expired before
// its heartbeat got through, so the worker left the fleet until it
// registered again. The clients now retry every 2 s at most.
func TestEtcdClientsReconnectSoonAfterALongOutage(t *testing.T) {
	if testing.Short() {
		t.Skip("a 30 s etcd outage")
	}
	if raceEnabled {
		// A test of reconnect timing (49 s), run by make test's pass
		// without the race detector; the etcd watcher's and registrar's
		// concurrency is raced by the shorter outage tests.
		t.Skip("a 30 s etcd outage: timing, run without -race")
	}
	e := testsrv.StartEtcd(t)
	ctx := context.Background()
	w := startWatcher(t, EtcdConfig{Endpoints: []string{e.Endpoint}}, newMemSink())
	cli := etcdClient(t, e.Endpoint)
	reg := NewEtcdRegistrar(cli, "", 10*time.Second)
	if err := reg.Register(ctx, rec("w1", "http://127.0.0.1:8100")); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { reg.Deregister(context.Background()) })

	e.Stop()
	waitFor(t, 10*time.Second, "the outage noticed", func() bool { ok, _ := w.Health(); return !ok })
	time.Sleep(30 * time.Second) // gRPC's default backoff would next retry about 43 s in (±20%)
	e.Start()
	back := time.Now()

	fresh := etcdClient(t, e.Endpoint) // a new client connects at once
	for time.Since(back) < 12*time.Second {
		if ok, _ := w.Health(); !ok && time.Since(back) > 6*time.Second {
			t.Fatalf("the watcher still says etcd is unreachable %v after it came back", time.Since(back).Round(time.Second))
		}
		gctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		resp, err := fresh.Get(gctx, DefaultEtcdPrefix+"w1")
		cancel()
		if err == nil && len(resp.Kvs) == 0 {
			t.Fatalf("worker w1's record vanished %v after etcd came back: its heartbeat did not reach etcd within its lease", time.Since(back).Round(100*time.Millisecond))
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// Two sidecars with one id (a rollout's new Pod with a fixed --id): the
// newer registration's record replaces the older's, and the older one's
// drain then marked it DRAINING under its own lease and deleted it, so
// the newer sidecar, alive and heartbeating, left the fleet for good (its
// lease was never lost, so it never registered again). The older one now
// changes and deletes the record only while it is still its own.
func TestAnOlderRegistrationsDrainLeavesTheNewerOnesRecord(t *testing.T) {
	e := testsrv.StartEtcd(t)
	ctx := context.Background()
	sink := newMemSink()
	startWatcher(t, EtcdConfig{Endpoints: []string{e.Endpoint}}, sink)
	cli := etcdClient(t, e.Endpoint)
	old := NewEtcdRegistrar(cli, "", 5*time.Second)
	if err := old.Register(ctx, rec("w1", "http://127.0.0.1:8100")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "the old sidecar discovered", func() bool { r, _ := sink.get("w1"); return r.URL == "http://127.0.0.1:8100" })
	newer := NewEtcdRegistrar(cli, "", 5*time.Second)
	if err := newer.Register(ctx, rec("w1", "http://127.0.0.1:8101")); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { newer.Deregister(context.Background()) })
	waitFor(t, 5*time.Second, "the new sidecar discovered", func() bool { r, _ := sink.get("w1"); return r.URL == "http://127.0.0.1:8101" })

	drained := rec("w1", "http://127.0.0.1:8100")
	drained.Status = fleet.StatusDraining
	if err := old.Update(ctx, drained); err != nil {
		t.Fatal(err)
	}
	if err := old.Deregister(ctx); err != nil {
		t.Fatal(err)
	}
	// A record put after the drain comes to the watcher after its events,
	// if any: once it is seen, they were applied.
	if _, err := cli.Put(ctx, DefaultEtcdPrefix+"mark", `{"id":"mark","url":"http://127.0.0.1:8109","models":["m"]}`); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "a record put after the drain", func() bool { _, ok := sink.get("mark"); return ok })
	if r, ok := sink.get("w1"); !ok || r.URL != "http://127.0.0.1:8101" || r.Status == fleet.StatusDraining {
		t.Fatalf("after the old sidecar drained, the fleet has w1 %v %+v; want the new sidecar's ACTIVE record", ok, r)
	}
	resp, err := cli.Get(ctx, DefaultEtcdPrefix+"w1")
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) != 1 || !strings.Contains(string(resp.Kvs[0].Value), "8101") {
		t.Fatalf("etcd holds %v for w1; want the new sidecar's record", resp.Kvs)
	}
}

// A record the fleet refuses (here its transport disagrees with the
// server's) is no worker, whether the watcher saw it in a watch event or
// in a list: the list counted it, so after a restart or a relist /health
// said "3 workers" and infera_discovery_workers was 3 for a fleet of 2,
// where the watch had said 2.
func TestARecordTheFleetRefusesIsNotCountedAfterAList(t *testing.T) {
	e := testsrv.StartEtcd(t)
	ctx := context.Background()
	cli := etcdClient(t, e.Endpoint)
	for _, kv := range [][2]string{
		{"/infera/workers/w1", `{"id":"w1","url":"http://127.0.0.1:8100","models":["m"]}`},
		{"/infera/workers/w2", `{"id":"w2","url":"http://127.0.0.1:8101","models":["m"],"request_transport":"nats"}`},
	} {
		if _, err := cli.Put(ctx, kv[0], kv[1]); err != nil {
			t.Fatal(err)
		}
	}
	fl := fleet.NewFleet(fleet.BreakerConfig{})
	t.Cleanup(fl.Close)
	fl.AddHook(&AgreementHook{RequestTransport: "http", KVTransport: "zmq"})
	w := startWatcher(t, EtcdConfig{Endpoints: []string{e.Endpoint}}, fl)
	if n := len(fl.View().All); n != 1 {
		t.Fatalf("the fleet has %d workers, want 1", n)
	}
	if _, detail := w.Health(); !strings.Contains(detail, "(1 workers") {
		t.Fatalf("health says %q for a fleet of 1", detail)
	}

	f := newFakeKube("tok")
	srv := startFakeKube(t, f)
	for i, ann := range []string{
		`{"id":"k1","url":"http://10.0.0.1:8100","models":["m"]}`,
		`{"id":"k2","url":"http://10.0.0.2:8100","models":["m"],"request_transport":"nats"}`,
	} {
		f.set(podSpec{ns: "ns", name: fmt.Sprintf("p%d", i), labels: workerLabels, phase: "Running", ready: true, ann: strp(ann)}, false)
	}
	kfl := fleet.NewFleet(fleet.BreakerConfig{})
	t.Cleanup(kfl.Close)
	kfl.AddHook(&AgreementHook{RequestTransport: "http", KVTransport: "zmq"})
	kw, err := NewKubeWatcher(&KubeConfig{Server: srv.URL, Token: "tok"}, KubeWatcherConfig{Namespace: "ns", LabelSelector: "app=infera,tier=worker"}, kfl)
	if err != nil {
		t.Fatal(err)
	}
	kw.Start()
	t.Cleanup(kw.Close)
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := kw.WaitSynced(wctx); err != nil {
		t.Fatal(err)
	}
	if n := len(kfl.View().All); n != 1 {
		t.Fatalf("the Kubernetes fleet has %d workers, want 1", n)
	}
	if _, detail := kw.Health(); !strings.Contains(detail, "(1 workers)") {
		t.Fatalf("Kubernetes health says %q for a fleet of 1", detail)
	}
}
