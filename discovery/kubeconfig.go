package discovery

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
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
	// Namespace is the default namespace (service account or context).
	Namespace string
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
// token / tokenFile, client-certificate(-data) / client-key(-data) and the
// context namespace. Exec and auth-provider plugins are not supported.
func LoadKubeconfig(path string) (*KubeConfig, error) {
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

// ParseKubeconfig parses kubeconfig data; relative file paths are taken
// from dir.
func ParseKubeconfig(data []byte, dir string) (*KubeConfig, error) {
	var doc any
	hint := ""
	if t := bytes.TrimSpace(data); len(t) > 0 && t[0] == '{' {
		if err := json.Unmarshal(t, &doc); err != nil {
			return nil, fmt.Errorf("cannot parse JSON: %w", err)
		}
	} else {
		var err error
		if doc, err = parseYAML(data); err != nil {
			return nil, err
		}
		if usesFlowStyle(data) {
			hint = " (the file uses flow-style YAML, {...} or [...], which is read as plain strings: write it in block style, as kubectl config view --flatten prints it)"
		}
	}
	root, ok := doc.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("top level is not a mapping")
	}
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

func newKubeClient(kc *KubeConfig) (*kubeClient, error) {
	if kc == nil || kc.Server == "" {
		return nil, fmt.Errorf("kubernetes: no API server configured")
	}
	if !strings.HasPrefix(kc.Server, "https://") && !strings.HasPrefix(kc.Server, "http://") {
		return nil, fmt.Errorf("kubernetes: server %q must be http(s)://", kc.Server)
	}
	tc := &tls.Config{InsecureSkipVerify: kc.Insecure, MinVersion: tls.VersionTLS12}
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
	tr := &http.Transport{
		TLSClientConfig:     tc,
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
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
