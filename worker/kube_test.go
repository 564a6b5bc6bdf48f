package worker

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"testing"
)

// fakeKubeAPI records the paths of the patches it is sent.
type fakeKubeAPI struct {
	mu      sync.Mutex
	patched []string
}

func (f *fakeKubeAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodPatch {
		f.mu.Lock()
		f.patched = append(f.patched, r.URL.Path)
		f.mu.Unlock()
	}
	w.Header().Set("Content-Type", "application/json")
	w.Write([]byte(`{}`))
}

func (f *fakeKubeAPI) paths() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.patched...)
}

// writeKubeconfig writes a kubeconfig for server whose context names
// namespace (none when empty).
func writeKubeconfig(t *testing.T, p, server, namespace string) {
	t.Helper()
	doc := "current-context: x\ncontexts:\n- name: x\n  context:\n    cluster: c\n    user: u\n"
	if namespace != "" {
		doc += "    namespace: " + namespace + "\n"
	}
	doc += "clusters:\n- name: c\n  cluster:\n    server: " + server + "\nusers:\n- name: u\n  user:\n    token: tok\n"
	if err := os.WriteFile(p, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
}

// unsetEnv unsets key for the test.
func unsetEnv(t *testing.T, key string) {
	t.Helper()
	t.Setenv(key, "")
	os.Unsetenv(key)
}

// A sidecar without POD_NAMESPACE, given a kubeconfig whose context names
// no namespace, registers in "default", as the router watches it (and
// kubectl reads it); it was refused, asking for POD_NAMESPACE.
func TestTheSidecarsNamespaceIsDefaultWhenTheContextNamesNone(t *testing.T) {
	unsetEnv(t, "POD_NAMESPACE")
	unsetEnv(t, "INFERA_KUBECONFIG")
	api := &fakeKubeAPI{}
	srv := httptest.NewServer(api)
	defer srv.Close()
	dir := t.TempDir()
	p := filepath.Join(dir, "kubeconfig")
	register := func(args ...string) {
		t.Helper()
		s := &Sidecar{c: parse(t, append([]string{"--discovery-backend", "kubernetes", "--kubeconfig", p, "--pod-name", "x"}, args...)...)}
		if err := s.connectDiscovery(); err != nil {
			t.Fatalf("connectDiscovery %v: %v", args, err)
		}
		if err := s.reg.Deregister(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	writeKubeconfig(t, p, srv.URL, "")
	register()
	writeKubeconfig(t, p, srv.URL, "team-a")
	register()
	register("--pod-namespace", "team-b")
	want := []string{"/api/v1/namespaces/default/pods/x", "/api/v1/namespaces/team-a/pods/x", "/api/v1/namespaces/team-b/pods/x"}
	if got := api.paths(); len(got) != len(want) || got[0] != want[0] || got[1] != want[1] || got[2] != want[2] {
		t.Fatalf("patched %q, want %q", got, want)
	}
}

// --kubeconfig ~/a:~/b reads both files: the flag was typed as a path, so
// only the first ~ was expanded and ~/b skipped as missing.
func TestTheSidecarsKubeconfigListExpandsEveryTilde(t *testing.T) {
	unsetEnv(t, "POD_NAMESPACE")
	unsetEnv(t, "INFERA_KUBECONFIG")
	home := t.TempDir()
	t.Setenv("HOME", home)
	api := &fakeKubeAPI{}
	srv := httptest.NewServer(api)
	defer srv.Close()
	if err := os.WriteFile(filepath.Join(home, "a"), []byte("clusters:\n- name: c\n  cluster:\n    server: "+srv.URL+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(home, "b"), []byte("current-context: x\ncontexts:\n- name: x\n  context:\n    cluster: c\n    namespace: from-b\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	s := &Sidecar{c: parse(t, "--discovery-backend", "kubernetes", "--kubeconfig", "~/a:~/b", "--pod-name", "x")}
	if err := s.connectDiscovery(); err != nil {
		t.Fatal(err)
	}
	if err := s.reg.Deregister(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := api.paths(); len(got) != 1 || got[0] != "/api/v1/namespaces/from-b/pods/x" {
		t.Fatalf("patched %q, want /api/v1/namespaces/from-b/pods/x", got)
	}
}
