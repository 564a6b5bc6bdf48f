package discovery

import (
	"os"
	"path/filepath"
	"strings"
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
