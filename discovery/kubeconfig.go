package discovery

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/infera/infera/internal/logx"
	"golang.org/x/net/http/httpproxy"
)

// In-cluster service-account files.
const (
	saDir       = "/var/run/secrets/kubernetes.io/serviceaccount"
	saTokenFile = saDir + "/token"
	saCAFile    = saDir + "/ca.crt"
	saNSFile    = saDir + "/namespace"
)

// KubeConfig is how to reach the Kubernetes API: the small subset of
// client-go's rest.Config that discovery needs.
type KubeConfig struct {
	// Server is the API base URL, e.g. https://10.0.0.1:443.
	Server string
	// Token is a bearer token; TokenFile, when set, is re-read every
	// minute (projected service-account tokens rotate) and after a 401.
	Token     string
	TokenFile string
	// CAData verifies the API server (PEM).
	CAData []byte
	// ClientCertData and ClientKeyData are a client certificate (PEM).
	ClientCertData, ClientKeyData []byte
	// Insecure skips server verification.
	Insecure bool
	// TLSServerName, when set, is the name the API server's certificate
	// is verified against (kubeconfig tls-server-name).
	TLSServerName string
	// ProxyURL, when set, is the proxy the API is reached through
	// (kubeconfig proxy-url: http, https or socks5); when empty,
	// HTTPS_PROXY/HTTP_PROXY/NO_PROXY apply, as in client-go.
	ProxyURL string
	// Namespace is the default namespace (service account or context).
	Namespace string
}

// NamespaceOrDefault is the namespace kubectl works in: the service
// account's or the context's, "default" when neither names one.
func (kc *KubeConfig) NamespaceOrDefault() string {
	if kc.Namespace == "" {
		return "default"
	}
	return kc.Namespace
}

// InClusterConfig builds a config from the Pod's service account and
// KUBERNETES_SERVICE_HOST/PORT.
func InClusterConfig() (*KubeConfig, error) {
	host, port := os.Getenv("KUBERNETES_SERVICE_HOST"), os.Getenv("KUBERNETES_SERVICE_PORT")
	if host == "" || port == "" {
		return nil, fmt.Errorf("not in a Kubernetes cluster: KUBERNETES_SERVICE_HOST/PORT unset (use --kubeconfig)")
	}
	ca, err := os.ReadFile(saCAFile)
	if err != nil {
		return nil, fmt.Errorf("cannot read service-account CA: %w", err)
	}
	if _, err := os.Stat(saTokenFile); err != nil {
		return nil, fmt.Errorf("cannot read service-account token: %w", err)
	}
	kc := &KubeConfig{Server: "https://" + net.JoinHostPort(host, port), TokenFile: saTokenFile, CAData: ca}
	if ns, err := os.ReadFile(saNSFile); err == nil {
		kc.Namespace = strings.TrimSpace(string(ns))
	}
	return kc, nil
}

// LoadKubeconfig reads the current context of a kubeconfig file (YAML or
// JSON): server, certificate-authority(-data), insecure-skip-tls-verify,
// tls-server-name, proxy-url, token / tokenFile, client-certificate(-data) / client-key(-data) and the
// context namespace. Exec and auth-provider plugins are not supported.
//
// path may be a list of files separated as in $KUBECONFIG (":" on Unix),
// read as kubectl reads it: files that do not exist are skipped, and the
// others merged, the first file to set current-context, or to name a
// context, cluster or user, winning (the whole entry: a later file's entry
// of the same name is not merged into it). Relative file paths are taken
// from the directory of the file that names them.
func LoadKubeconfig(path string) (*KubeConfig, error) {
	if !strings.ContainsRune(path, os.PathListSeparator) {
		path = expandHome(path)
		data, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("cannot read kubeconfig: %w", err)
		}
		kc, err := ParseKubeconfig(data, filepath.Dir(path))
		if err != nil {
			return nil, fmt.Errorf("kubeconfig %s: %w", path, err)
		}
		return kc, nil
	}
	var roots []map[string]any
	var read []string
	hint := ""
	seen := map[string]bool{}
	for _, p := range filepath.SplitList(path) {
		if p = expandHome(p); p == "" || seen[p] {
			continue
		}
		seen[p] = true
		data, err := os.ReadFile(p)
		if errors.Is(err, fs.ErrNotExist) {
			continue // as kubectl: a missing file of the list is skipped
		}
		if err != nil {
			return nil, fmt.Errorf("cannot read kubeconfig: %w", err)
		}
		root, h, err := decodeKubeconfig(data)
		if err != nil {
			return nil, fmt.Errorf("kubeconfig %s: %w", p, err)
		}
		absPaths(root, filepath.Dir(p))
		roots, read = append(roots, root), append(read, p)
		if hint == "" {
			hint = h
		}
	}
	if len(roots) == 0 {
		return nil, fmt.Errorf("cannot read kubeconfig: none of %q exists", path)
	}
	kc, err := kubeconfigFrom(mergeKubeconfigs(roots), "", hint)
	if err != nil {
		return nil, fmt.Errorf("kubeconfig %s: %w", strings.Join(read, string(os.PathListSeparator)), err)
	}
	return kc, nil
}

// expandHome expands a leading ~ of a kubeconfig path to the home
// directory ($HOME, as client-go finds it). A shell expands only the
// first ~ of --kubeconfig ~/a:~/b, and none in a value it never saw (a
// config file, a manifest's env): the second file was read as ./~/b,
// missing, and silently skipped.
func expandHome(p string) string {
	if p != "~" && !strings.HasPrefix(p, "~/") {
		return p
	}
	home, err := os.UserHomeDir()
	if err != nil || home == "" {
		return p
	}
	return filepath.Join(home, p[1:])
}

// ParseKubeconfig parses kubeconfig data; relative file paths are taken
// from dir.
func ParseKubeconfig(data []byte, dir string) (*KubeConfig, error) {
	root, hint, err := decodeKubeconfig(data)
	if err != nil {
		return nil, err
	}
	return kubeconfigFrom(root, dir, hint)
}

// decodeKubeconfig parses kubeconfig data into its top-level mapping; hint
// is a note for errors about what the file may have meant.
func decodeKubeconfig(data []byte) (root map[string]any, hint string, err error) {
	var doc any
	if t := bytes.TrimSpace(data); len(t) > 0 && t[0] == '{' {
		if err := json.Unmarshal(t, &doc); err != nil {
			return nil, "", fmt.Errorf("cannot parse JSON: %w", err)
		}
	} else {
		if doc, err = parseYAML(data); err != nil {
			return nil, "", err
		}
		if usesFlowStyle(data) {
			hint = " (the file uses flow-style YAML, {...} or [...], which is read as plain strings: write it in block style, as kubectl config view --flatten prints it)"
		}
	}
	root, ok := doc.(map[string]any)
	if !ok {
		return nil, "", fmt.Errorf("top level is not a mapping")
	}
	return root, hint, nil
}

// kubeFilePaths are the file-path fields of a kubeconfig's entries.
var kubeFilePaths = map[string][]string{
	"clusters": {"certificate-authority"},
	"users":    {"client-certificate", "client-key", "tokenFile"},
}

// absPaths makes the relative file paths of root's entries relative to dir,
// as kubectl resolves them against the file that names them.
func absPaths(root map[string]any, dir string) {
	for list, fields := range kubeFilePaths {
		field := strings.TrimSuffix(list, "s")
		items, _ := root[list].([]any)
		for _, it := range items {
			m, _ := it.(map[string]any)
			f, _ := m[field].(map[string]any)
			for _, k := range fields {
				if v := str(f[k]); v != "" {
					f[k] = rel(dir, v)
				}
			}
		}
	}
}

// mergeKubeconfigs merges kubeconfig documents as kubectl merges the files
// of $KUBECONFIG: the first to set current-context, or to name a context,
// cluster or user, wins.
func mergeKubeconfigs(roots []map[string]any) map[string]any {
	out := map[string]any{}
	for _, list := range []string{"clusters", "contexts", "users"} {
		var merged []any
		named := map[string]bool{}
		for _, root := range roots {
			items, _ := root[list].([]any)
			for _, it := range items {
				m, _ := it.(map[string]any)
				if m == nil || named[str(m["name"])] {
					continue
				}
				named[str(m["name"])] = true
				merged = append(merged, it)
			}
		}
		if merged != nil {
			out[list] = merged
		}
	}
	for _, root := range roots {
		if cur := str(root["current-context"]); cur != "" {
			out["current-context"] = cur
			break
		}
	}
	return out
}

// kubeconfigFrom resolves a kubeconfig document's current context;
// relative file paths are taken from dir.
func kubeconfigFrom(root map[string]any, dir, hint string) (*KubeConfig, error) {
	cur := str(root["current-context"])
	ctx := named(root["contexts"], cur, "context")
	if ctx == nil {
		if cur != "" {
			return nil, fmt.Errorf("current-context %q not found%s", cur, hint)
		}
		// No context: use the only cluster and user, if any.
		ctx = map[string]any{"cluster": firstName(root["clusters"]), "user": firstName(root["users"])}
	}
	cl := named(root["clusters"], str(ctx["cluster"]), "cluster")
	if cl == nil {
		return nil, fmt.Errorf("cluster %q not found%s", str(ctx["cluster"]), hint)
	}
	kc := &KubeConfig{Server: strings.TrimRight(str(cl["server"]), "/"), Namespace: str(ctx["namespace"])}
	if kc.Server == "" {
		return nil, fmt.Errorf("cluster %q has no server%s", str(ctx["cluster"]), hint)
	}
	kc.Insecure = str(cl["insecure-skip-tls-verify"]) == "true"
	// Both were ignored: the API server's certificate was checked against
	// the server's host (a TLS error where kubectl connects), and the API
	// reached directly instead of through the cluster's proxy.
	kc.TLSServerName = str(cl["tls-server-name"])
	kc.ProxyURL = str(cl["proxy-url"])
	var err error
	if kc.CAData, err = dataOrFile(cl, "certificate-authority", dir); err != nil {
		return nil, err
	}
	if u := named(root["users"], str(ctx["user"]), "user"); u != nil {
		if u["exec"] != nil || u["auth-provider"] != nil {
			return nil, fmt.Errorf("user %q: exec and auth-provider credentials are not supported; use a token or client certificate", str(ctx["user"]))
		}
		kc.Token = str(u["token"])
		if tf := str(u["tokenFile"]); tf != "" {
			kc.TokenFile = rel(dir, tf)
		}
		if kc.ClientCertData, err = dataOrFile(u, "client-certificate", dir); err != nil {
			return nil, err
		}
		if kc.ClientKeyData, err = dataOrFile(u, "client-key", dir); err != nil {
			return nil, err
		}
	}
	return kc, nil
}

func str(v any) string {
	switch v := v.(type) {
	case string:
		return v
	case bool:
		return strconv.FormatBool(v)
	case float64:
		return strconv.FormatFloat(v, 'g', -1, 64)
	}
	return ""
}

func rel(dir, p string) string {
	if p == "" || filepath.IsAbs(p) || dir == "" {
		return p
	}
	return filepath.Join(dir, p)
}

// named finds {name: n, <field>: {...}} in a list and returns the field.
func named(list any, n, field string) map[string]any {
	items, _ := list.([]any)
	for _, it := range items {
		m, _ := it.(map[string]any)
		if m != nil && str(m["name"]) == n {
			f, _ := m[field].(map[string]any)
			if f == nil {
				f = map[string]any{}
			}
			return f
		}
	}
	return nil
}

func firstName(list any) string {
	items, _ := list.([]any)
	if len(items) == 1 {
		if m, _ := items[0].(map[string]any); m != nil {
			return str(m["name"])
		}
	}
	return ""
}

func dataOrFile(m map[string]any, key, dir string) ([]byte, error) {
	if d := str(m[key+"-data"]); d != "" {
		b, err := base64.StdEncoding.DecodeString(strings.TrimSpace(d))
		if err != nil {
			return nil, fmt.Errorf("%s-data is not base64: %w", key, err)
		}
		return b, nil
	}
	if f := str(m[key]); f != "" {
		b, err := os.ReadFile(rel(dir, f))
		if err != nil {
			return nil, fmt.Errorf("cannot read %s: %w", key, err)
		}
		return b, nil
	}
	return nil, nil
}

// kubeClient is a minimal REST client for the Kubernetes API.
type kubeClient struct {
	base string
	hc   *http.Client
	kc   *KubeConfig

	mu        sync.Mutex
	token     string
	tokenRead time.Time
}

// kubeKeepAlive is the TCP keepalive of connections to the API server.
var kubeKeepAlive = net.KeepAliveConfig{Enable: true, Idle: 15 * time.Second, Interval: 5 * time.Second, Count: 3}

func newKubeClient(kc *KubeConfig) (*kubeClient, error) {
	if kc == nil || kc.Server == "" {
		return nil, fmt.Errorf("kubernetes: no API server configured")
	}
	if !strings.HasPrefix(kc.Server, "https://") && !strings.HasPrefix(kc.Server, "http://") {
		return nil, fmt.Errorf("kubernetes: server %q must be http(s)://", kc.Server)
	}
	tc := &tls.Config{InsecureSkipVerify: kc.Insecure, MinVersion: tls.VersionTLS12, ServerName: kc.TLSServerName}
	if len(kc.CAData) > 0 {
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(kc.CAData) {
			return nil, fmt.Errorf("kubernetes: CA data holds no PEM certificate")
		}
		tc.RootCAs = pool
	}
	if len(kc.ClientCertData) > 0 || len(kc.ClientKeyData) > 0 {
		cert, err := tls.X509KeyPair(kc.ClientCertData, kc.ClientKeyData)
		if err != nil {
			return nil, fmt.Errorf("kubernetes: bad client certificate: %w", err)
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	// Without proxy-url, HTTPS_PROXY/HTTP_PROXY/NO_PROXY apply, as in
	// client-go (net/http's ProxyFromEnvironment, read here rather than
	// once per process); they were ignored, and the API dialled directly
	// where kubectl went through the proxy.
	envProxy := httpproxy.FromEnvironment().ProxyFunc()
	proxy := func(r *http.Request) (*url.URL, error) { return envProxy(r.URL) }
	if kc.ProxyURL != "" {
		u, err := url.Parse(kc.ProxyURL)
		if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https" && u.Scheme != "socks5") {
			return nil, fmt.Errorf("kubernetes: proxy-url %q: want http://, https:// or socks5://host:port", logx.RedactURL(kc.ProxyURL))
		}
		proxy = http.ProxyURL(u)
	}
	tr := &http.Transport{
		Proxy:           proxy,
		TLSClientConfig: tc,
		// A watch may rightly stay quiet for its whole timeoutSeconds
		// (no changes, no bookmarks), so a dead API server is noticed
		// by TCP keepalive: a peer that answers no probe is dropped
		// within 30 s of its last byte (15 s idle, 3 probes 5 s apart).
		// The KeepAlive of 30 s this had (30 s idle, then Go's 9
		// probes 15 s apart) took 165 s.
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAliveConfig: kubeKeepAlive}).DialContext,
		TLSHandshakeTimeout: 5 * time.Second,
		MaxIdleConnsPerHost: 4,
		IdleConnTimeout:     90 * time.Second,
	}
	return &kubeClient{base: strings.TrimRight(kc.Server, "/"), hc: &http.Client{Transport: tr}, kc: kc}, nil
}

func (c *kubeClient) bearer() string {
	if c.kc.TokenFile == "" {
		return c.kc.Token
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.token == "" || time.Since(c.tokenRead) > time.Minute {
		if b, err := os.ReadFile(c.kc.TokenFile); err == nil {
			c.token, c.tokenRead = strings.TrimSpace(string(b)), time.Now()
		}
	}
	return c.token
}

// do sends req with the credentials. On a 401 the token file is read
// again by the next request, as client-go does: a token rotated with the
// old one refused at once (a re-created service account, a kubeconfig
// tokenFile a credentials tool rewrote) was kept for up to a minute, and
// discovery was down meanwhile.
func (c *kubeClient) do(req *http.Request) (*http.Response, error) {
	resp, err := c.hc.Do(c.newRequest(req))
	if err == nil && resp.StatusCode == http.StatusUnauthorized && c.kc.TokenFile != "" {
		c.mu.Lock()
		c.tokenRead = time.Time{}
		c.mu.Unlock()
	}
	return resp, err
}

func (c *kubeClient) newRequest(req *http.Request) *http.Request {
	if t := c.bearer(); t != "" {
		req.Header.Set("Authorization", "Bearer "+t)
	}
	req.Header.Set("Accept", "application/json")
	req.Header.Set("User-Agent", "infera-discovery")
	return req
}

// usesFlowStyle reports whether a YAML document holds a non-empty flow
// collection as a value or a sequence item.
func usesFlowStyle(data []byte) bool {
	for _, l := range bytes.Split(data, []byte("\n")) {
		l = bytes.TrimSpace(l)
		if bytes.HasPrefix(l, []byte("- ")) {
			l = bytes.TrimSpace(l[2:])
		}
		if i := bytes.Index(l, []byte(": ")); i >= 0 {
			l = bytes.TrimSpace(l[i+2:])
		}
		if len(l) > 2 && (l[0] == '{' || l[0] == '[') {
			return true
		}
	}
	return false
}
