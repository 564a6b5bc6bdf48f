package discovery

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/infera/infera/fleet"
)

// fakeKube speaks the Kubernetes list/watch wire format for Pods: a PodList
// for GET .../pods, and for ?watch=1 a chunked stream of {"type","object"}
// JSON events, ERROR events carrying a Status (410 for an expired resource
// version) and BOOKMARKs.
type fakeKube struct {
	token string

	mu       sync.Mutex
	rv       int
	pods     map[string]map[string]any
	hist     []fakeEv
	minRV    int
	httpGone bool
	notify   chan struct{}
	kill     chan struct{}
	// gone, closed by outage, ends the open watches: an outage's
	// httptest.Server.Close waits for every handler running, and a
	// watch that reconnected between CloseClientConnections and Close
	// held it until its timeoutSeconds.
	gone chan struct{}
	// bookmarkEvery, when set, sends a BOOKMARK that often on an open
	// watch, as the API server does about every minute.
	bookmarkEvery time.Duration
	// noBookmarks sends no BOOKMARK at all, not even the one at the
	// start of a watch: an API server with its watch cache off.
	noBookmarks bool

	lists, watches atomic.Int64
}

type fakeEv struct {
	rv  int
	typ string
	obj map[string]any
}

func newFakeKube(token string) *fakeKube {
	return &fakeKube{token: token, rv: 100, pods: map[string]map[string]any{}, notify: make(chan struct{}), kill: make(chan struct{}), gone: make(chan struct{})}
}

type podSpec struct {
	ns, name string
	labels   map[string]string
	phase    string
	ready    bool
	ann      *string
	deleting bool
}

func strp(s string) *string { return &s }

func (f *fakeKube) podObj(p podSpec) map[string]any {
	md := map[string]any{"name": p.name, "namespace": p.ns, "uid": "uid-" + p.name,
		"resourceVersion": strconv.Itoa(f.rv), "labels": p.labels}
	if p.ann != nil {
		md["annotations"] = map[string]string{DefaultAnnotation: *p.ann, "other": "x"}
	}
	if p.deleting {
		md["deletionTimestamp"] = "2026-01-01T00:00:00Z"
	}
	ready := "False"
	if p.ready {
		ready = "True"
	}
	return map[string]any{"kind": "Pod", "apiVersion": "v1", "metadata": md,
		"spec": map[string]any{"containers": []any{map[string]any{"name": "engine", "image": "x"}}},
		"status": map[string]any{"phase": p.phase, "podIP": "10.0.0.1", "conditions": []any{
			map[string]any{"type": "PodScheduled", "status": "True"},
			map[string]any{"type": "Ready", "status": ready},
		}}}
}

// set adds or changes a pod; silent changes emit no watch event (as if the
// history had been compacted), so only a relist can see them.
func (f *fakeKube) set(p podSpec, silent bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rv++
	key := p.ns + "/" + p.name
	typ := "MODIFIED"
	if f.pods[key] == nil {
		typ = "ADDED"
	}
	obj := f.podObj(p)
	f.pods[key] = obj
	if !silent {
		f.emitLocked(typ, obj)
	}
}

func (f *fakeKube) del(ns, name string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rv++
	key := ns + "/" + name
	obj := f.pods[key]
	delete(f.pods, key)
	obj["metadata"].(map[string]any)["resourceVersion"] = strconv.Itoa(f.rv)
	f.emitLocked("DELETED", obj)
}

func (f *fakeKube) emitLocked(typ string, obj map[string]any) {
	f.hist = append(f.hist, fakeEv{f.rv, typ, obj})
	close(f.notify)
	f.notify = make(chan struct{})
}

// expire makes every resource version so far too old and breaks open
// watches with an ERROR 410 event (or HTTP 410 on the next watch).
func (f *fakeKube) expire(httpGone bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rv++
	f.minRV = f.rv
	f.httpGone = httpGone
	close(f.kill)
	f.kill = make(chan struct{})
}

// outage ends the open watches, and those that reconnect, before the
// test server is closed.
func (f *fakeKube) outage() { close(f.gone) }

// compact makes every resource version so far too old, as etcd's
// compaction does, leaving open watches running: the next watch from an
// older resource version is answered 410 (an HTTP status with httpGone,
// else an ERROR event).
func (f *fakeKube) compact(httpGone bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rv++
	f.minRV = f.rv
	f.httpGone = httpGone
}

func matches(sel string, labels map[string]string) bool {
	if sel == "" {
		return true
	}
	for _, term := range strings.Split(sel, ",") {
		k, v, _ := strings.Cut(term, "=")
		if labels[k] != v {
			return false
		}
	}
	return true
}

func objMatches(obj map[string]any, ns, sel string) bool {
	md := obj["metadata"].(map[string]any)
	if ns != "" && md["namespace"] != ns {
		return false
	}
	l, _ := md["labels"].(map[string]string)
	return matches(sel, l)
}

func writeStatus(w http.ResponseWriter, code int, reason, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(map[string]any{"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code, "reason": reason, "message": msg})
}

func (f *fakeKube) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	token := f.token // a test may rotate it
	f.mu.Unlock()
	if r.Header.Get("Authorization") != "Bearer "+token {
		writeStatus(w, 401, "Unauthorized", "bad token")
		return
	}
	parts := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
	var ns string
	switch {
	case len(parts) == 3 && parts[0] == "api" && parts[2] == "pods":
	case len(parts) == 5 && parts[2] == "namespaces" && parts[4] == "pods":
		ns = parts[3]
	case len(parts) == 6 && parts[2] == "namespaces" && parts[4] == "pods" && r.Method == http.MethodPatch:
		f.patch(w, r, parts[3], parts[5])
		return
	default:
		writeStatus(w, 404, "NotFound", r.URL.Path)
		return
	}
	sel := r.URL.Query().Get("labelSelector")
	if r.URL.Query().Get("watch") == "1" || r.URL.Query().Get("watch") == "true" {
		f.watch(w, r, ns, sel)
		return
	}
	f.lists.Add(1)
	f.mu.Lock()
	items := []any{}
	for _, obj := range f.pods {
		if objMatches(obj, ns, sel) {
			items = append(items, obj)
		}
	}
	rv := f.rv
	f.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(map[string]any{"kind": "PodList", "apiVersion": "v1",
		"metadata": map[string]any{"resourceVersion": strconv.Itoa(rv)}, "items": items})
}

func (f *fakeKube) patch(w http.ResponseWriter, r *http.Request, ns, name string) {
	if r.Header.Get("Content-Type") != "application/merge-patch+json" {
		writeStatus(w, 415, "UnsupportedMediaType", r.Header.Get("Content-Type"))
		return
	}
	var p struct {
		Metadata struct {
			Annotations map[string]*string `json:"annotations"`
		} `json:"metadata"`
	}
	if err := json.NewDecoder(r.Body).Decode(&p); err != nil {
		writeStatus(w, 400, "BadRequest", err.Error())
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	obj := f.pods[ns+"/"+name]
	if obj == nil {
		writeStatus(w, 404, "NotFound", name)
		return
	}
	f.rv++
	md := obj["metadata"].(map[string]any)
	anns, _ := md["annotations"].(map[string]string)
	if anns == nil {
		anns = map[string]string{}
	}
	for k, v := range p.Metadata.Annotations {
		if v == nil {
			delete(anns, k)
		} else {
			anns[k] = *v
		}
	}
	md["annotations"] = anns
	md["resourceVersion"] = strconv.Itoa(f.rv)
	f.emitLocked("MODIFIED", obj)
	json.NewEncoder(w).Encode(obj)
}

func (f *fakeKube) watch(w http.ResponseWriter, r *http.Request, ns, sel string) {
	f.watches.Add(1)
	from, err := strconv.Atoi(r.URL.Query().Get("resourceVersion"))
	if err != nil {
		writeStatus(w, 400, "BadRequest", "resourceVersion")
		return
	}
	timeout, _ := strconv.Atoi(r.URL.Query().Get("timeoutSeconds"))
	// The kill channel is taken with the check of from: an expire after
	// the check must end this watch. Taken again in the loop below, one
	// that came while the head and the first BOOKMARK were sent was
	// missed, and the watch stayed open (with no event, as the changes
	// of an expiry are silent) until its timeoutSeconds, minutes.
	f.mu.Lock()
	gone, httpGone, minRV, kill := from < f.minRV, f.httpGone, f.minRV, f.kill
	f.mu.Unlock()
	if gone && httpGone {
		writeStatus(w, 410, "Expired", fmt.Sprintf("too old resource version: %d (%d)", from, minRV))
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Transfer-Encoding", "chunked")
	w.WriteHeader(200)
	fl := w.(http.Flusher)
	send := func(typ string, obj any) {
		b, _ := json.Marshal(map[string]any{"type": typ, "object": obj})
		w.Write(append(b, '\n'))
		fl.Flush()
	}
	gone410 := map[string]any{"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 410, "reason": "Expired", "message": "too old resource version"}
	if gone {
		send("ERROR", gone410)
		return
	}
	f.mu.Lock()
	if !f.noBookmarks {
		send("BOOKMARK", map[string]any{"kind": "Pod", "apiVersion": "v1", "metadata": map[string]any{"resourceVersion": strconv.Itoa(from)}})
	}
	f.mu.Unlock()
	end := time.After(time.Duration(timeout) * time.Second)
	var tick <-chan time.Time
	f.mu.Lock()
	if f.bookmarkEvery > 0 && !f.noBookmarks {
		t := time.NewTicker(f.bookmarkEvery)
		defer t.Stop()
		tick = t.C
	}
	f.mu.Unlock()
	for {
		f.mu.Lock()
		var evs []fakeEv
		for _, ev := range f.hist {
			if ev.rv > from && objMatches(ev.obj, ns, sel) {
				evs = append(evs, ev)
			}
		}
		if n := len(f.hist); n > 0 && f.hist[n-1].rv > from {
			from = f.hist[n-1].rv
		}
		// Encode under the lock: objects are mutated by patch.
		lines := make([][]byte, 0, len(evs))
		for _, ev := range evs {
			b, _ := json.Marshal(map[string]any{"type": ev.typ, "object": ev.obj})
			lines = append(lines, append(b, '\n'))
		}
		notify := f.notify
		f.mu.Unlock()
		for _, l := range lines {
			w.Write(l)
			fl.Flush()
		}
		select {
		case <-notify:
		case <-tick:
			send("BOOKMARK", map[string]any{"kind": "Pod", "apiVersion": "v1", "metadata": map[string]any{"resourceVersion": strconv.Itoa(from)}})
		case <-kill:
			send("ERROR", gone410)
			return
		case <-end:
			return
		case <-r.Context().Done():
			return
		case <-f.gone:
			return
		}
	}
}

func startFakeKube(t *testing.T, f *fakeKube) *httptest.Server {
	t.Helper()
	s := httptest.NewServer(f)
	t.Cleanup(s.Close)
	return s
}

func recJSON(id string) string {
	return fmt.Sprintf(`{"id":%q,"url":"http://10.0.0.1:8100","models":["m"],"role":"mixed","status":"ACTIVE"}`, id)
}

var workerLabels = map[string]string{"app": "infera", "tier": "worker"}

func TestKubeListWatch(t *testing.T) {
	f := newFakeKube("s3cret")
	srv := startFakeKube(t, f)
	ready := func(name string, ann *string) podSpec {
		return podSpec{ns: "infera", name: name, labels: workerLabels, phase: "Running", ready: true, ann: ann}
	}
	f.set(ready("p1", strp(recJSON("w1"))), false)
	f.set(podSpec{ns: "infera", name: "p2", labels: workerLabels, phase: "Pending", ann: strp(recJSON("w2"))}, false)
	f.set(ready("p3", strp(`{"id":"w3","url":"nope"}`)), false)
	f.set(ready("p4", nil), false)
	f.set(podSpec{ns: "infera", name: "p5", labels: map[string]string{"app": "other"}, phase: "Running", ready: true, ann: strp(recJSON("w5"))}, false)
	f.set(podSpec{ns: "elsewhere", name: "p6", labels: workerLabels, phase: "Running", ready: true, ann: strp(recJSON("w6"))}, false)

	sink := newMemSink()
	bad0 := statsFor(BackendKubernetes).bad.Get()
	w, err := NewKubeWatcher(&KubeConfig{Server: srv.URL, Token: "s3cret"}, KubeWatcherConfig{Namespace: "infera", LabelSelector: "app=infera,tier=worker"}, sink)
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
	if _, ok := sink.get("w1"); !ok || sink.len() != 1 {
		t.Fatalf("after list: %v", sink.m)
	}
	if got := statsFor(BackendKubernetes).bad.Get() - bad0; got != 1 {
		t.Fatalf("bad records %d, want 1 (p3)", got)
	}
	has := func(id string) func() bool { return func() bool { _, ok := sink.get(id); return ok } }
	not := func(c func() bool) func() bool { return func() bool { return !c() } }

	f.set(ready("p2", strp(recJSON("w2"))), false)
	waitFor(t, 5*time.Second, "p2 turning ready adds w2", has("w2"))

	p1 := ready("p1", strp(recJSON("w1")))
	p1.ready = false
	f.set(p1, false)
	waitFor(t, 5*time.Second, "p1 NotReady removes w1", not(has("w1")))

	f.set(ready("p7", strp(recJSON("w7"))), false)
	waitFor(t, 5*time.Second, "p7 added", has("w7"))
	p7 := ready("p7", strp(recJSON("w7")))
	p7.deleting = true
	f.set(p7, false)
	waitFor(t, 5*time.Second, "terminating p7 removed", not(has("w7")))

	// Record id changes on the same pod.
	f.set(ready("p2", strp(recJSON("w2b"))), false)
	waitFor(t, 5*time.Second, "p2 renamed", func() bool { return has("w2b")() && !has("w2")() })
	f.del("infera", "p2")
	waitFor(t, 5*time.Second, "p2 deleted", not(has("w2b")))

	// 410 as an ERROR event: changes made while the history is gone are
	// only seen by relisting.
	lists := f.lists.Load()
	f.set(ready("p8", strp(recJSON("w8"))), true)
	f.expire(false)
	waitFor(t, 5*time.Second, "relist after ERROR 410 finds w8", has("w8"))
	if f.lists.Load() == lists {
		t.Fatal("no relist happened")
	}

	// 410 as an HTTP status on the watch request.
	lists = f.lists.Load()
	p8 := ready("p8", strp(recJSON("w8")))
	p8.ready = false
	f.set(p8, true)
	f.expire(true)
	waitFor(t, 5*time.Second, "relist after HTTP 410 drops NotReady w8", not(has("w8")))
	if f.lists.Load() == lists {
		t.Fatal("no relist happened")
	}
	if ok, detail := w.Health(); !ok {
		t.Fatalf("health: %s", detail)
	}

	// API outage: the last list is kept and health degrades.
	f.set(ready("p9", strp(recJSON("w9"))), false)
	waitFor(t, 5*time.Second, "w9", has("w9"))
	n := sink.len()
	f.outage()
	srv.CloseClientConnections()
	srv.Close()
	waitFor(t, 5*time.Second, "health degraded", func() bool { ok, _ := w.Health(); return !ok })
	if _, detail := w.Health(); !strings.Contains(detail, fmt.Sprintf("last known list of %d workers", n)) {
		t.Fatalf("detail %q", detail)
	}
	if sink.len() != n {
		t.Fatal("fleet changed during the outage")
	}
}

func TestKubeUnauthorized(t *testing.T) {
	f := newFakeKube("right")
	srv := startFakeKube(t, f)
	w, err := NewKubeWatcher(&KubeConfig{Server: srv.URL, Token: "wrong"}, KubeWatcherConfig{}, newMemSink())
	if err != nil {
		t.Fatal(err)
	}
	w.Start()
	defer w.Close()
	waitFor(t, 5*time.Second, "unhealthy", func() bool { _, d := w.Health(); return strings.Contains(d, "401") })
}

func TestKubeconfigTLSAndRegistrar(t *testing.T) {
	f := newFakeKube("tok")
	srv := httptest.NewTLSServer(f)
	defer srv.Close()
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "token"), []byte("tok\n"), 0o600)
	kcfg := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- cluster:
    certificate-authority-data: %s
    server: %s   # the fake API
  name: fake
contexts:
- context:
    cluster: fake
    namespace: infera
    user: "me"
  name: ctx
current-context: ctx
preferences: {}
users:
- name: me
  user:
    tokenFile: token
`, base64.StdEncoding.EncodeToString(ca), srv.URL)
	path := filepath.Join(dir, "kubeconfig")
	os.WriteFile(path, []byte(kcfg), 0o600)
	kc, err := LoadKubeconfig(path)
	if err != nil {
		t.Fatal(err)
	}
	if kc.Namespace != "infera" || kc.Server != srv.URL || kc.TokenFile != filepath.Join(dir, "token") {
		t.Fatalf("parsed %+v", kc)
	}
	f.set(podSpec{ns: "infera", name: "p1", labels: workerLabels, phase: "Running", ready: true}, false)
	sink := newMemSink()
	w, err := NewKubeWatcher(kc, KubeWatcherConfig{Namespace: kc.Namespace, LabelSelector: "app=infera"}, sink)
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
	reg, err := NewKubeRegistrar(kc, "infera", "p1", "")
	if err != nil {
		t.Fatal(err)
	}
	r := rec("w1", "http://10.0.0.1:8100")
	if err := reg.Register(ctx, r); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "registered via annotation", func() bool { _, ok := sink.get("w1"); return ok })
	r.Status = "DRAINING"
	if err := reg.Update(ctx, r); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "draining", func() bool { g, _ := sink.get("w1"); return g.Status == "DRAINING" })
	if err := reg.Deregister(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "deregistered", func() bool { _, ok := sink.get("w1"); return !ok })
	if _, err := NewKubeRegistrar(kc, "infera", "", ""); err == nil {
		t.Fatal("want error without pod name")
	}
}

func TestParseKubeconfig(t *testing.T) {
	f := func(doc string, want KubeConfig, wantErr string) {
		t.Helper()
		kc, err := ParseKubeconfig([]byte(doc), "/d")
		if wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), wantErr) {
				t.Fatalf("err %v, want %q", err, wantErr)
			}
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		if kc.Server != want.Server || kc.Token != want.Token || kc.TokenFile != want.TokenFile ||
			kc.Namespace != want.Namespace || kc.Insecure != want.Insecure || string(kc.CAData) != string(want.CAData) {
			t.Fatalf("got %+v, want %+v", kc, want)
		}
	}
	f(`
clusters:
  - name: a
    cluster:
      server: https://a:6443/
      insecure-skip-tls-verify: true
  - name: b
    cluster: {server: x}
contexts:
- name: c
  context:
    cluster: 'a'
    user: u
current-context: "c"
users:
- name: u
  user:
    token: abc#not-a-comment
`, KubeConfig{Server: "https://a:6443", Token: "abc#not-a-comment", Insecure: true}, "")
	f(`{"clusters":[{"name":"a","cluster":{"server":"https://j","certificate-authority-data":"`+base64.StdEncoding.EncodeToString([]byte("CA"))+`"}}],
	   "contexts":[{"name":"c","context":{"cluster":"a","user":"u","namespace":"ns"}}],"current-context":"c",
	   "users":[{"name":"u","user":{"tokenFile":"t"}}]}`, KubeConfig{Server: "https://j", CAData: []byte("CA"), Namespace: "ns", TokenFile: "/d/t"}, "")
	f("clusters:\n- name: a\n  cluster:\n    server: https://only\nusers:\n- name: u\n  user:\n    token: t\n", KubeConfig{Server: "https://only", Token: "t"}, "")
	f("current-context: nope\n", KubeConfig{}, `current-context "nope" not found`)
	// Flow style (which kubectl reads) is named in the error, not only a
	// cluster "" not found.
	f("clusters:\n- cluster: {server: \"http://127.0.0.1:1\"}\n  name: a\ncontexts:\n- context: {cluster: a, user: u}\n  name: c\ncurrent-context: c\n",
		KubeConfig{}, "flow-style YAML")
	f("clusters:\n- name: a\n  cluster:\n    server: s\ncontexts:\n- name: c\n  context:\n    cluster: a\n    user: u\ncurrent-context: c\nusers:\n- name: u\n  user:\n    exec:\n      command: aws\n", KubeConfig{}, "not supported")
	f("a: b\n   c: d\n", KubeConfig{}, "yaml line 2")
	f("- just\n- a list\n", KubeConfig{}, "not a mapping")
	f("key: |\n  block\n", KubeConfig{}, "block scalars")
}

func FuzzParseKubeconfig(f *testing.F) {
	f.Add([]byte("clusters:\n- name: a\n  cluster:\n    server: https://a\n"))
	f.Add([]byte(`{"clusters":[]}`))
	f.Add([]byte("a:\n- b: c\n  d:\n  - 'e''f'\n  - \"g\\n\"\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		ParseKubeconfig(data, "")
	})
}

// Two Ready Pods advertising one worker id (a rollout with a fixed --id):
// each relist gave the fleet both records, and the second replaced the
// first, so the worker was made anew (KV entries, breaker, counters reset)
// twice per relist. A relist now keeps the Pod the fleet holds.
func TestKubeRelistWithTwoPodsOfOneIDKeepsTheWorker(t *testing.T) {
	f := newFakeKube("tok")
	srv := startFakeKube(t, f)
	pod := func(name, ip string) podSpec {
		return podSpec{ns: "infera", name: name, labels: workerLabels, phase: "Running", ready: true,
			ann: strp(fmt.Sprintf(`{"id":"w","url":"http://%s:8100","models":["m"],"status":"ACTIVE"}`, ip))}
	}
	f.set(pod("p1", "10.0.0.1"), false)
	f.set(pod("p2", "10.0.0.2"), false)
	fl := fleet.NewFleet(fleet.BreakerConfig{})
	defer fl.Close()
	w, err := NewKubeWatcher(&KubeConfig{Server: srv.URL, Token: "tok"}, KubeWatcherConfig{}, fl)
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
		t.Fatal("no worker w after the first list")
	}
	for i := 0; i < 5; i++ {
		watches := f.watches.Load()
		f.expire(false)
		waitFor(t, 5*time.Second, "relist and watch again", func() bool { return f.watches.Load() > watches })
		if got := fl.Get("w"); got != w0 {
			t.Fatalf("relist %d made worker w anew (%s, was %s)", i+1, got.URL, w0.URL)
		}
	}
}

// Two Pods advertising one engine under two ids (a copied --advertise-url,
// a Service url given to every worker) made two workers of it: the engine
// took two shares of the traffic under two breakers. The router (over
// HTTP) now routes to one of them, and the other joins when the first
// leaves, by a watch event or a relist.
func TestKubeTwoPodsAdvertisingOneEngineAreRoutedOnce(t *testing.T) {
	f := newFakeKube("tok")
	srv := startFakeKube(t, f)
	pod := func(name, id string) podSpec {
		return podSpec{ns: "infera", name: name, labels: workerLabels, phase: "Running", ready: true,
			ann: strp(fmt.Sprintf(`{"id":%q,"url":"http://10.0.0.9:8100","models":["m"],"status":"ACTIVE"}`, id))}
	}
	f.set(pod("p1", "a"), false)
	f.set(pod("p2", "b"), false)
	fl := fleet.NewFleet(fleet.BreakerConfig{})
	defer fl.Close()
	fl.OneWorkerPerEngine()
	w, err := NewKubeWatcher(&KubeConfig{Server: srv.URL, Token: "tok"}, KubeWatcherConfig{}, fl)
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
	if n := len(fl.View().All); n != 1 {
		t.Fatalf("after the list: %d workers for one engine, want 1", n)
	}
	held := fl.View().All[0].ID
	other, otherPod, heldPod := "b", "p2", "p1"
	if held == "b" {
		other, otherPod, heldPod = "a", "p1", "p2"
	}
	f.del("infera", heldPod)
	waitFor(t, 5*time.Second, other+" joins when "+held+"'s Pod is deleted", func() bool {
		v := fl.View()
		return len(v.All) == 1 && v.All[0].ID == other
	})
	// A third Pod on that engine waits; a relist that no longer lists the
	// routed Pod routes it at once. A Pod of another engine, added after
	// it, joins: its event came after p3's, which was applied by then.
	f.set(pod("p3", "c"), false)
	p4 := pod("p4", "d")
	p4.ann = strp(`{"id":"d","url":"http://10.0.0.8:8100","models":["m"],"status":"ACTIVE"}`)
	f.set(p4, false)
	waitFor(t, 5*time.Second, "d, of another engine, joins", func() bool { return fl.Get("d") != nil })
	if fl.Get("c") != nil || fl.Get(other) == nil {
		t.Fatalf("p3 joined beside %s", other)
	}
	f.del("infera", "p4")
	waitFor(t, 5*time.Second, "d leaves with its Pod", func() bool { return fl.Get("d") == nil })
	f.mu.Lock()
	f.rv++
	delete(f.pods, "infera/"+otherPod) // silently: only a relist sees it
	f.mu.Unlock()
	f.expire(false)
	waitFor(t, 5*time.Second, "c joins after the relist", func() bool {
		v := fl.View()
		return len(v.All) == 1 && v.All[0].ID == "c"
	})
	p3 := pod("p3", "c")
	p3.deleting = true
	f.set(p3, false)
	waitFor(t, 5*time.Second, "terminating p3 removed", func() bool { return len(fl.View().All) == 0 })
}

// A token file rotated to a new token, the old one refused at once (a
// service account re-created, a kubeconfig tokenFile rewritten by a
// credentials tool): the client kept the old token until a minute after it
// last read the file, so discovery was down up to a minute. A 401 now makes
// the next request read the file again, as client-go does.
func TestKubeARotatedTokenFileIsReadAgainOnUnauthorized(t *testing.T) {
	f := newFakeKube("old")
	srv := startFakeKube(t, f)
	tf := filepath.Join(t.TempDir(), "token")
	os.WriteFile(tf, []byte("old\n"), 0o600)
	f.set(podSpec{ns: "infera", name: "p1", labels: workerLabels, phase: "Running", ready: true, ann: strp(recJSON("w1"))}, false)
	sink := newMemSink()
	w, err := NewKubeWatcher(&KubeConfig{Server: srv.URL, TokenFile: tf}, KubeWatcherConfig{}, sink)
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
	f.mu.Lock()
	f.token = "new"
	f.mu.Unlock()
	os.WriteFile(tf, []byte("new\n"), 0o600)
	lists := f.lists.Load()
	f.set(podSpec{ns: "infera", name: "p2", labels: workerLabels, phase: "Running", ready: true, ann: strp(recJSON("w2"))}, true)
	f.expire(false) // the open watch ends: the next list sends the token
	waitFor(t, 5*time.Second, "the relist with the rotated token finds w2", func() bool {
		_, ok := sink.get("w2")
		return ok && f.lists.Load() > lists
	})
	if ok, detail := w.Health(); !ok {
		t.Fatalf("health: %s", detail)
	}
}

// A kubeconfig whose context names no namespace means "default", as
// kubectl reads it: discovery watched every namespace instead, and routed
// to the worker Pods of any namespace the selector matched (a staging
// copy of the fleet), or failed with 403 under a namespaced Role.
func TestKubeconfigWithoutANamespaceWatchesTheDefaultOne(t *testing.T) {
	f := newFakeKube("tok")
	srv := startFakeKube(t, f)
	f.set(podSpec{ns: "default", name: "p1", labels: workerLabels, phase: "Running", ready: true, ann: strp(recJSON("prod"))}, false)
	f.set(podSpec{ns: "staging", name: "p1", labels: workerLabels, phase: "Running", ready: true, ann: strp(recJSON("staging"))}, false)
	path := filepath.Join(t.TempDir(), "kubeconfig")
	os.WriteFile(path, []byte(fmt.Sprintf("clusters:\n- name: c\n  cluster:\n    server: %s\ncontexts:\n- name: x\n  context:\n    cluster: c\n    user: u\ncurrent-context: x\nusers:\n- name: u\n  user:\n    token: tok\n", srv.URL)), 0o600)
	sink := newMemSink()
	b, err := StartSynced(Options{Backend: BackendKubernetes, Kubeconfig: path, K8sLabelSelector: "app=infera"}, sink, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if _, ok := sink.get("staging"); ok || sink.len() != 1 {
		t.Fatalf("workers %v, want prod's alone", sink.m)
	}
	if _, detail := b.Health(); !strings.Contains(detail, "namespace default") {
		t.Fatalf("health %q", detail)
	}
	// "all" still watches every namespace.
	sink2 := newMemSink()
	b2, err := StartSynced(Options{Backend: BackendKubernetes, Kubeconfig: path, K8sNamespace: "all", K8sLabelSelector: "app=infera"}, sink2, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer b2.Close()
	if sink2.len() != 2 {
		t.Fatalf("all namespaces: workers %v", sink2.m)
	}
}

// The sidecar's patch of its Pod (the record, DRAINING, the removal) is
// sent again when it fails for a passing reason: a 503 from an API server
// restarting, a 401 after the token file rotated. It was sent once: the
// DRAINING mark was lost and the router kept routing to a draining worker
// (seen with a rotated token: "cannot mark DRAINING: ... 401").
func TestKubeRegistrarRetriesAPatchThatFailedForAPassingReason(t *testing.T) {
	f := newFakeKube("tok")
	var fail atomic.Int64 // PATCHes to answer 503
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPatch && fail.Add(-1) >= 0 {
			writeStatus(w, 503, "ServiceUnavailable", "apiserver is shutting down")
			return
		}
		f.ServeHTTP(w, r)
	}))
	defer srv.Close()
	f.set(podSpec{ns: "infera", name: "p1", labels: workerLabels, phase: "Running", ready: true}, false)
	tf := filepath.Join(t.TempDir(), "token")
	os.WriteFile(tf, []byte("tok"), 0o600)
	kc := &KubeConfig{Server: srv.URL, TokenFile: tf}
	sink := newMemSink()
	w, err := NewKubeWatcher(&KubeConfig{Server: srv.URL, Token: "tok"}, KubeWatcherConfig{Namespace: "infera"}, sink)
	if err != nil {
		t.Fatal(err)
	}
	w.Start()
	defer w.Close()
	reg, err := NewKubeRegistrar(kc, "infera", "p1", "")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	r := rec("w1", "http://10.0.0.1:8100")
	fail.Store(2)
	if err := reg.Register(ctx, r); err != nil {
		t.Fatalf("register through two 503s: %v", err)
	}
	waitFor(t, 5*time.Second, "registered", func() bool { _, ok := sink.get("w1"); return ok })

	// The token rotates, the old one refused at once: the DRAINING mark
	// gets a 401, reads the file again and is sent again.
	reg.c.bearer() // the old token cached
	f.mu.Lock()
	f.token = "tok2"
	f.mu.Unlock()
	os.WriteFile(tf, []byte("tok2"), 0o600)
	r.Status = fleet.StatusDraining
	if err := reg.Update(ctx, r); err != nil {
		t.Fatalf("DRAINING after the token rotated: %v", err)
	}
	f.mu.Lock()
	f.token = "tok" // the watcher's
	f.mu.Unlock()
	waitFor(t, 5*time.Second, "draining", func() bool { g, _ := sink.get("w1"); return g.Status == fleet.StatusDraining })

	// A refusal that will not pass (403: RBAC) is not retried.
	f.mu.Lock()
	f.token = "tok"
	f.mu.Unlock()
	os.WriteFile(tf, []byte("tok"), 0o600)
	fail.Store(1)
	if err := reg.Deregister(ctx); err != nil {
		t.Fatalf("deregister through a 503: %v", err)
	}
	waitFor(t, 5*time.Second, "deregistered", func() bool { _, ok := sink.get("w1"); return !ok })
	forbidden := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		writeStatus(w, 403, "Forbidden", `pods "p1" is forbidden: User "x" cannot patch resource "pods"`)
	}))
	defer forbidden.Close()
	reg2, _ := NewKubeRegistrar(&KubeConfig{Server: forbidden.URL, Token: "t"}, "infera", "p1", "")
	start := time.Now()
	if err := reg2.Register(ctx, rec("w1", "http://10.0.0.1:8100")); err == nil || !strings.Contains(err.Error(), "forbidden") {
		t.Fatalf("403: %v", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("a 403 was retried for %v", d)
	}
}
