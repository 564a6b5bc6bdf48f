package discovery

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/infera/infera/fleet"
	"github.com/infera/infera/internal/testsrv"
	clientv3 "go.etcd.io/etcd/client/v3"
)

func etcdClient(t *testing.T, ep string) *clientv3.Client {
	t.Helper()
	cli, err := NewEtcdClient(EtcdConfig{Endpoints: []string{ep}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

func startWatcher(t *testing.T, cfg EtcdConfig, sink Sink) *EtcdWatcher {
	t.Helper()
	w, err := NewEtcdWatcher(cfg, nil, sink)
	if err != nil {
		t.Fatal(err)
	}
	w.Start()
	t.Cleanup(w.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := w.WaitSynced(ctx); err != nil {
		t.Fatal(err)
	}
	return w
}

func TestEtcdRegisterDiscover(t *testing.T) {
	e := testsrv.StartEtcd(t)
	ctx := context.Background()
	sink := newMemSink()
	w := startWatcher(t, EtcdConfig{Endpoints: []string{e.Endpoint}}, sink)
	cli := etcdClient(t, e.Endpoint)

	reg := NewEtcdRegistrar(cli, "", 5*time.Second)
	r1 := rec("w1", "http://127.0.0.1:8100")
	if err := reg.Register(ctx, r1); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "w1 discovered", func() bool { _, ok := sink.get("w1"); return ok })

	r1.Status = fleet.StatusDraining
	if err := reg.Update(ctx, r1); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "w1 draining", func() bool { r, _ := sink.get("w1"); return r.Status == fleet.StatusDraining })

	// Bad records never break the watcher.
	bad0 := statsFor(BackendEtcd).bad.Get()
	for _, kv := range [][2]string{
		{"/infera/workers/junk", "{not json"},
		{"/infera/workers/w9", `{"id":"other","url":"http://127.0.0.1:1"}`},
		{"/infera/workers/w8", `{"id":"w8","url":"ftp://x"}`},
		{"/infera/workers/w7", `{"id":"w7","url":"http://127.0.0.1:1","role":"chef"}`},
	} {
		if _, err := cli.Put(ctx, kv[0], kv[1]); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := cli.Put(ctx, "/infera/workers/w2", `{"id":"w2","url":"http://127.0.0.1:8101","models":["m"],"unknown_field":1}`); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "w2 discovered after bad records", func() bool { _, ok := sink.get("w2"); return ok })
	if got := statsFor(BackendEtcd).bad.Get() - bad0; got != 4 {
		t.Fatalf("bad records counted %d, want 4", got)
	}
	if sink.len() != 2 {
		t.Fatalf("sink has %d workers, want 2", sink.len())
	}
	// A known worker turning bad is removed.
	cli.Put(ctx, "/infera/workers/w2", `garbage`)
	waitFor(t, 5*time.Second, "w2 removed after turning bad", func() bool { _, ok := sink.get("w2"); return !ok })

	if err := reg.Deregister(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "w1 removed", func() bool { _, ok := sink.get("w1"); return !ok })
	if ok, detail := w.Health(); !ok || !strings.Contains(detail, "watching") {
		t.Fatalf("health %v %q", ok, detail)
	}
}

func TestEtcdLeaseExpiryAndRegrant(t *testing.T) {
	e := testsrv.StartEtcd(t)
	ctx := context.Background()
	sink := newMemSink()
	startWatcher(t, EtcdConfig{Endpoints: []string{e.Endpoint}}, sink)

	// A killed worker: its client dies without deregistering.
	wcli, err := NewEtcdClient(EtcdConfig{Endpoints: []string{e.Endpoint}})
	if err != nil {
		t.Fatal(err)
	}
	const ttl = 2 * time.Second
	reg := NewEtcdRegistrar(wcli, "", ttl)
	if err := reg.Register(ctx, rec("dead", "http://127.0.0.1:8100")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "worker discovered", func() bool { _, ok := sink.get("dead"); return ok })
	// Heartbeats keep it alive past the TTL.
	time.Sleep(ttl + 500*time.Millisecond)
	if _, ok := sink.get("dead"); !ok {
		t.Fatal("worker expired despite heartbeats")
	}
	wcli.Close() // kill: no more heartbeats, no deregistration
	killed := time.Now()
	waitFor(t, ttl+2*time.Second, "killed worker removed", func() bool { _, ok := sink.get("dead"); return !ok })
	t.Logf("killed worker removed after %v (ttl %v)", time.Since(killed).Round(10*time.Millisecond), ttl)

	// Lease lost while the worker lives (revoked): it registers again.
	cli := etcdClient(t, e.Endpoint)
	reg2 := NewEtcdRegistrar(cli, "", ttl)
	if err := reg2.Register(ctx, rec("alive", "http://127.0.0.1:8101")); err != nil {
		t.Fatal(err)
	}
	defer reg2.Deregister(ctx)
	waitFor(t, 5*time.Second, "alive discovered", func() bool { _, ok := sink.get("alive"); return ok })
	reg2.mu.Lock()
	lease := reg2.lease
	reg2.mu.Unlock()
	if _, err := cli.Revoke(ctx, lease); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "re-granted lease", func() bool {
		reg2.mu.Lock()
		defer reg2.mu.Unlock()
		return reg2.lease != lease
	})
	waitFor(t, 5*time.Second, "alive re-registered", func() bool { _, ok := sink.get("alive"); return ok })
}

func TestEtcdOutage(t *testing.T) {
	e := testsrv.StartEtcd(t)
	ctx := context.Background()
	sink := newMemSink()
	w := startWatcher(t, EtcdConfig{Endpoints: []string{e.Endpoint}, HealthInterval: 200 * time.Millisecond, RequestTimeout: 500 * time.Millisecond}, sink)
	cli := etcdClient(t, e.Endpoint)
	reg := NewEtcdRegistrar(cli, "", 10*time.Second)
	if err := reg.Register(ctx, rec("w1", "http://127.0.0.1:8100")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "w1 discovered", func() bool { _, ok := sink.get("w1"); return ok })

	// The sink's every state from the outage's start until w2, put after
	// it, is seen: the watcher is past the outage then, and every change
	// it made meanwhile (during the outage, at the recovery's relist) came
	// before w2 (one goroutine feeds the sink).
	mark := sink.mark()
	_, _, syncs := sink.calls("w1")
	e.Stop()
	waitFor(t, 5*time.Second, "health degraded", func() bool { ok, _ := w.Health(); return !ok })
	ok, detail := w.Health()
	if ok || !strings.Contains(detail, "last known list of 1 workers") {
		t.Fatalf("health during outage: %v %q", ok, detail)
	}
	if statsFor(BackendEtcd).healthy.Load() != 0 {
		t.Fatal("healthy gauge not 0 during outage")
	}

	e.Start()
	waitFor(t, 10*time.Second, "health restored", func() bool { ok, _ := w.Health(); return ok })
	waitFor(t, 10*time.Second, "the relist after the outage", func() bool { _, _, n := sink.calls("w1"); return n > syncs })
	cli2 := etcdClient(t, e.Endpoint)
	if _, err := cli2.Put(ctx, "/infera/workers/w2", `{"id":"w2","url":"http://127.0.0.1:8101","models":["m"]}`); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "watch resumed (w2 seen)", func() bool { _, ok := sink.get("w2"); return ok })
	lists := sink.listsSince(mark)
	for i, l := range lists {
		if l == "w1,w2" {
			break
		}
		if l != "w1" {
			t.Fatalf("the workers changed during the outage or at its relist: %q after call %d of %q, want w1 until w2 comes", l, i, lists)
		}
	}
	reg.Deregister(ctx)
	waitFor(t, 5*time.Second, "w1 deregistered after outage", func() bool { _, ok := sink.get("w1"); return !ok })
}

func TestEtcdCompactionRelists(t *testing.T) {
	e := testsrv.StartEtcd(t)
	ctx := context.Background()
	cli := etcdClient(t, e.Endpoint)
	if _, err := cli.Put(ctx, "/infera/workers/w1", `{"id":"w1","url":"http://127.0.0.1:8100","models":["m"]}`); err != nil {
		t.Fatal(err)
	}
	sink := newMemSink()
	w, err := NewEtcdWatcher(EtcdConfig{Endpoints: []string{e.Endpoint}}, nil, sink)
	if err != nil {
		t.Fatal(err)
	}
	lists := 0
	w.afterList = func() {
		lists++
		if lists != 1 {
			return
		}
		// Between list and watch: change the prefix and compact past the
		// listed revision, so the watch from rev+1 is compacted.
		cli.Delete(ctx, "/infera/workers/w1")
		cli.Put(ctx, "/infera/workers/w2", `{"id":"w2","url":"http://127.0.0.1:8101","models":["m"]}`)
		resp, err := cli.Put(ctx, "/other/key", "x")
		if err != nil {
			t.Error(err)
			return
		}
		if _, err := cli.Compact(ctx, resp.Header.Revision, clientv3.WithCompactPhysical()); err != nil {
			t.Error(err)
		}
	}
	relists0 := statsFor(BackendEtcd).relists.Get()
	w.Start()
	defer w.Close()
	waitFor(t, 10*time.Second, "relist after compaction", func() bool {
		_, has2 := sink.get("w2")
		_, has1 := sink.get("w1")
		return has2 && !has1
	})
	if statsFor(BackendEtcd).relists.Get() == relists0 {
		t.Fatal("no relist counted")
	}
}

func TestEtcdFeedsFleet(t *testing.T) {
	e := testsrv.StartEtcd(t)
	ctx := context.Background()
	fl := fleet.NewFleet(fleet.BreakerConfig{})
	defer fl.Close()
	startWatcher(t, EtcdConfig{Endpoints: []string{e.Endpoint}}, fl)
	cli := etcdClient(t, e.Endpoint)
	reg := NewEtcdRegistrar(cli, "", 5*time.Second)
	r := rec("f1", "http://127.0.0.1:8100")
	if err := reg.Register(ctx, r); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "routable", func() bool { return len(fl.View().Routable) == 1 })
	r.Status = fleet.StatusDraining
	reg.Update(ctx, r)
	waitFor(t, 5*time.Second, "draining not routable", func() bool {
		v := fl.View()
		return len(v.Routable) == 0 && len(v.All) == 1
	})
	reg.Deregister(ctx)
	waitFor(t, 5*time.Second, "gone", func() bool { return len(fl.View().All) == 0 })
}

func TestNewBackend(t *testing.T) {
	e := testsrv.StartEtcd(t)
	sink := newMemSink()
	b, err := StartSynced(Options{Backend: "etcd", EtcdEndpoints: []string{" " + e.Endpoint + ", "}}, sink, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if ok, detail := b.Health(); !ok {
		t.Fatal(detail)
	}
	if _, err := New(Options{Backend: "static"}, sink); err == nil {
		t.Fatal("want error for static")
	}
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	if _, err := New(Options{Backend: "kubernetes"}, sink); err == nil {
		t.Fatal("want error outside a cluster without --kubeconfig")
	}
}
