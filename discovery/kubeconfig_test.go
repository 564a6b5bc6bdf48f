package discovery

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// KUBECONFIG given as a list (a:b, as kubectl takes it) was read as one
// path: "cannot read kubeconfig: open a:b: no such file or directory", and
// the router could not start. The files are now merged as kubectl merges
// them: missing ones skipped, the first to set current-context or to name
// a context, cluster or user winning (the whole entry), relative paths
// taken from the file that names them.
func TestKubeconfigListIsMergedAsKubectlMergesIt(t *testing.T) {
	d1, d2 := t.TempDir(), t.TempDir()
	write := func(dir, name, body string) string {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	pem := "-----BEGIN CERTIFICATE-----\nMA==\n-----END CERTIFICATE-----\n"
	write(d1, "ca.pem", pem)
	a := write(d1, "a.yaml", `current-context: ctx-a
contexts:
- name: ctx-a
  context:
    cluster: c1
    user: u1
    namespace: ns-a
clusters:
- name: c1
  cluster:
    server: https://first:6443
    certificate-authority: ca.pem
users:
- name: u1
  user:
    token: first
`)
	b := write(d2, "b.yaml", `current-context: ctx-b
contexts:
- name: ctx-a
  context:
    cluster: c2
    user: u2
- name: ctx-b
  context:
    cluster: c2
    user: u2
clusters:
- name: c1
  cluster:
    server: https://second:6443
    insecure-skip-tls-verify: true
- name: c2
  cluster:
    server: https://c2:6443
users:
- name: u1
  user:
    token: second
- name: u2
  user:
    tokenFile: tok
`)
	missing := filepath.Join(d1, "missing.yaml")
	sep := string(os.PathListSeparator)

	kc, err := LoadKubeconfig(a + sep + missing + sep + b)
	if err != nil {
		t.Fatal(err)
	}
	if kc.Server != "https://first:6443" || kc.Token != "first" || kc.Namespace != "ns-a" || string(kc.CAData) != pem || kc.Insecure {
		t.Fatalf("first file wins: %+v", kc)
	}
	// b first: its current context, and a's entries only where b names none.
	kc, err = LoadKubeconfig(missing + sep + b + sep + sep + a)
	if err != nil {
		t.Fatal(err)
	}
	if kc.Server != "https://c2:6443" || kc.TokenFile != filepath.Join(d2, "tok") || kc.Namespace != "" {
		t.Fatalf("b first: %+v", kc)
	}
	// A file without current-context leaves it to a later one; its user
	// entry is read with paths relative to its own directory.
	u := write(d1, "users.yaml", "users:\n- name: u2\n  user:\n    tokenFile: mytok\n")
	kc, err = LoadKubeconfig(u + sep + b)
	if err != nil {
		t.Fatal(err)
	}
	if kc.Server != "https://c2:6443" || kc.TokenFile != filepath.Join(d1, "mytok") {
		t.Fatalf("users first: %+v", kc)
	}
	// Every file missing: an error naming the list.
	if _, err := LoadKubeconfig(missing + sep + filepath.Join(d2, "nope")); err == nil || !strings.Contains(err.Error(), "missing.yaml") {
		t.Fatalf("all missing: %v", err)
	}
	// A file that exists but does not parse is an error, as in kubectl.
	bad := write(d2, "bad.yaml", "- a list\n")
	if _, err := LoadKubeconfig(a + sep + bad); err == nil || !strings.Contains(err.Error(), "bad.yaml") {
		t.Fatalf("a bad file: %v", err)
	}
	// One path is read as before: a missing one is an error.
	if _, err := LoadKubeconfig(missing); err == nil {
		t.Fatal("a single missing kubeconfig was accepted")
	}
}

// A kubeconfig's tls-server-name and proxy-url were parsed past and
// ignored: the API server's certificate was checked against the server
// url's host (a TLS error where kubectl connects), and the API was reached
// directly, not through the cluster's proxy. Both now apply.
func TestKubeconfigTLSServerNameAndProxyURLApply(t *testing.T) {
	f := newFakeKube("tok")
	f.set(podSpec{ns: "infera", name: "p1", labels: workerLabels, phase: "Running", ready: true, ann: strp(recJSON("w1"))}, false)
	tlsSrv := httptest.NewTLSServer(f) // its certificate names example.com and 127.0.0.1
	defer tlsSrv.Close()
	ca := base64.StdEncoding.EncodeToString(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: tlsSrv.Certificate().Raw}))
	dir := t.TempDir()
	load := func(cluster string) (*KubeConfig, error) {
		t.Helper()
		p := filepath.Join(dir, "kubeconfig")
		doc := "current-context: x\ncontexts:\n- name: x\n  context:\n    cluster: c\n    user: u\n    namespace: infera\n" +
			"clusters:\n- name: c\n  cluster:\n" + cluster + "users:\n- name: u\n  user:\n    token: tok\n"
		if err := os.WriteFile(p, []byte(doc), 0o600); err != nil {
			t.Fatal(err)
		}
		return LoadKubeconfig(p)
	}
	list := func(kc *KubeConfig) error {
		t.Helper()
		w, err := NewKubeWatcher(kc, KubeWatcherConfig{Namespace: "infera"}, newMemSink())
		if err != nil {
			return err
		}
		return w.list(context.Background())
	}
	tlsCluster := func(name string) string {
		return fmt.Sprintf("    server: %s\n    certificate-authority-data: %s\n    tls-server-name: %s\n", tlsSrv.URL, ca, name)
	}
	kc, err := load(tlsCluster("not-the-api.example"))
	if err != nil {
		t.Fatal(err)
	}
	if err := list(kc); err == nil || !strings.Contains(err.Error(), "not-the-api.example") {
		t.Fatalf("a tls-server-name the certificate does not name: %v", err)
	}
	kc, err = load(tlsCluster("example.com"))
	if err != nil {
		t.Fatal(err)
	}
	if err := list(kc); err != nil {
		t.Fatalf("tls-server-name example.com: %v", err)
	}

	var proxied atomic.Int64
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.IsAbs() { // absolute-form: a request for a proxy
			proxied.Add(1)
		}
		f.ServeHTTP(w, r)
	}))
	defer proxy.Close()
	// The API server's url does not resolve: only the proxy reaches it.
	kc, err = load(fmt.Sprintf("    server: http://kube-api.invalid:6443\n    proxy-url: %s\n", proxy.URL))
	if err != nil {
		t.Fatal(err)
	}
	if err := list(kc); err != nil || proxied.Load() == 0 {
		t.Fatalf("through proxy-url: %v, %d requests proxied", err, proxied.Load())
	}
	kc, err = load("    server: http://kube-api.invalid:6443\n    proxy-url: ftp://user:pw@proxy\n")
	if err != nil {
		t.Fatal(err)
	}
	if err := list(kc); err == nil || !strings.Contains(err.Error(), "proxy-url") || strings.Contains(err.Error(), "pw") {
		t.Fatalf("an unusable proxy-url: %v", err)
	}
}

// Every entry of a kubeconfig list has its leading ~ expanded, not only
// the first (which a shell expands): ~/b was read as ./~/b, missing, and
// skipped without a word, so its context was never read.
func TestKubeconfigListExpandsEveryTilde(t *testing.T) {
	home := t.TempDir()
	t.Setenv("HOME", home)
	write := func(name, doc string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(home, name), []byte(doc), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("a", "clusters:\n- name: c\n  cluster:\n    server: https://10.0.0.1:6443\n")
	write("b", "current-context: x\ncontexts:\n- name: x\n  context:\n    cluster: c\n    namespace: from-b\n")
	for _, path := range []string{"~/a:~/b", home + "/a:~/b", "~/b:~/a"} {
		kc, err := LoadKubeconfig(path)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if kc.Server != "https://10.0.0.1:6443" || kc.Namespace != "from-b" {
			t.Fatalf("%s: server %q namespace %q, want both files read", path, kc.Server, kc.Namespace)
		}
	}
	write("c", "current-context: x\ncontexts:\n- name: x\n  context:\n    cluster: c\nclusters:\n- name: c\n  cluster:\n    server: https://10.0.0.2:6443\n")
	if kc, err := LoadKubeconfig("~/c"); err != nil || kc.Server != "https://10.0.0.2:6443" {
		t.Fatalf("~/c: %+v, %v", kc, err)
	}
}

// connectProxy is a loopback CONNECT proxy that tunnels every target to
// to (a loopback address), counting the targets it was asked for.
type connectProxy struct {
	ln      net.Listener
	to      string
	mu      sync.Mutex
	targets []string
}

func newConnectProxy(t *testing.T, to string) *connectProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &connectProxy{ln: ln, to: to}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go p.serve(c)
		}
	}()
	t.Cleanup(func() { ln.Close() })
	return p
}

func (p *connectProxy) serve(c net.Conn) {
	defer c.Close()
	br := bufio.NewReader(c)
	req, err := http.ReadRequest(br)
	if err != nil || req.Method != http.MethodConnect {
		return
	}
	p.mu.Lock()
	p.targets = append(p.targets, req.Host)
	p.mu.Unlock()
	up, err := net.Dial("tcp", p.to)
	if err != nil {
		io.WriteString(c, "HTTP/1.1 502 Bad Gateway\r\n\r\n")
		return
	}
	defer up.Close()
	io.WriteString(c, "HTTP/1.1 200 Connection established\r\n\r\n")
	go func() { io.Copy(up, br); up.Close() }()
	io.Copy(c, up)
}

func (p *connectProxy) seen() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.targets...)
}

// HTTPS_PROXY/HTTP_PROXY/NO_PROXY apply to the Kubernetes API, as in
// client-go, and a kubeconfig proxy-url wins over them: they were
// ignored, and the API dialled directly where kubectl went through the
// proxy.
func TestKubeAPIIsReachedThroughTheProxyOfTheEnvironment(t *testing.T) {
	for _, k := range []string{"HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "NO_PROXY", "no_proxy", "REQUEST_METHOD"} {
		t.Setenv(k, "")
		os.Unsetenv(k)
	}
	f := newFakeKube("tok")
	f.set(podSpec{ns: "infera", name: "p1", labels: workerLabels, phase: "Running", ready: true, ann: strp(recJSON("w1"))}, false)
	tlsSrv := httptest.NewTLSServer(f) // its certificate names example.com
	defer tlsSrv.Close()
	proxy := newConnectProxy(t, tlsSrv.Listener.Addr().String())
	ca := base64.StdEncoding.EncodeToString(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: tlsSrv.Certificate().Raw}))
	// The API server's name does not resolve: only a proxy reaches it
	// (and a loopback address is never proxied, as net/http has it).
	load := func(extra string) *KubeConfig {
		t.Helper()
		doc := "current-context: x\ncontexts:\n- name: x\n  context:\n    cluster: c\n    user: u\n    namespace: infera\n" +
			"clusters:\n- name: c\n  cluster:\n    server: https://kube-api.invalid:6443\n    certificate-authority-data: " + ca +
			"\n    tls-server-name: example.com\n" + extra + "users:\n- name: u\n  user:\n    token: tok\n"
		kc, err := ParseKubeconfig([]byte(doc), "")
		if err != nil {
			t.Fatal(err)
		}
		return kc
	}
	list := func(kc *KubeConfig) error {
		t.Helper()
		w, err := NewKubeWatcher(kc, KubeWatcherConfig{Namespace: "infera"}, newMemSink())
		if err != nil {
			t.Fatal(err)
		}
		return w.list(context.Background())
	}

	t.Setenv("HTTPS_PROXY", "http://"+proxy.ln.Addr().String())
	if err := list(load("")); err != nil {
		t.Fatalf("through HTTPS_PROXY: %v", err)
	}
	if got := proxy.seen(); len(got) == 0 || got[0] != "kube-api.invalid:6443" {
		t.Fatalf("CONNECT targets %q, want kube-api.invalid:6443", got)
	}

	// NO_PROXY names the API server: dialled directly (asked of the
	// transport, so that nothing is dialled here).
	t.Setenv("NO_PROXY", ".invalid")
	c, err := newKubeClient(load(""))
	if err != nil {
		t.Fatal(err)
	}
	req := httptest.NewRequest(http.MethodGet, "https://kube-api.invalid:6443/api/v1/pods", nil)
	if u, err := c.hc.Transport.(*http.Transport).Proxy(req); u != nil || err != nil {
		t.Fatalf("NO_PROXY=.invalid: proxy %v, %v; want none", u, err)
	}
	os.Unsetenv("NO_PROXY")

	// proxy-url wins over HTTPS_PROXY, which now leads nowhere.
	dead, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadAddr := dead.Addr().String()
	dead.Close()
	t.Setenv("HTTPS_PROXY", "http://"+deadAddr)
	before := len(proxy.seen())
	if err := list(load("    proxy-url: http://" + proxy.ln.Addr().String() + "\n")); err != nil {
		t.Fatalf("proxy-url with HTTPS_PROXY elsewhere: %v", err)
	}
	if len(proxy.seen()) == before {
		t.Fatal("proxy-url was not used")
	}
}
