package admin

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/infera/infera/config"
)

const testKey = "test-admin-key-0123456789"

// env is an admin behind a real loopback HTTP server.
type env struct {
	t     testing.TB
	a     *Admin
	store *config.Store
	srv   *httptest.Server
	path  string // config file, if any
}

type envOpts struct {
	file        string // initial config file content ("" = no file)
	filePath    string // an existing config file to start from (file unset)
	fileMtime   time.Time
	snapshotDir string
	state       string
	key         string
	sealKey     string
	fleet       Fleet
	backup      *config.Backup
	// syncInterval is how often a Redis replica compares versions
	// (0: 200 ms).
	syncInterval time.Duration
	// trustedProxies is Options.TrustedProxies (--trusted-proxies).
	trustedProxies []string
}

func newEnv(t testing.TB, o envOpts) *env {
	t.Helper()
	e := &env{t: t}
	var err error
	if o.file != "" || o.filePath != "" {
		e.path = o.filePath
		if o.file != "" {
			e.path = filepath.Join(t.TempDir(), "infera.json")
			if err := os.WriteFile(e.path, []byte(o.file), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		if !o.fileMtime.IsZero() {
			if err := os.Chtimes(e.path, o.fileMtime, o.fileMtime); err != nil {
				t.Fatal(err)
			}
		}
		key := o.key
		if key == "" {
			key = testKey
		}
		// As the gateway opens it (gateway.New): admin writes seal the
		// file's literal secrets.
		e.store, err = config.OpenWith(e.path, FileSecretCodec(&config.Serve{AdminKey: key, AdminSealKey: o.sealKey}))
		if err != nil {
			t.Fatal(err)
		}
	} else {
		e.store = config.NewStore("", nil)
	}
	if o.key == "" {
		o.key = testKey
	}
	opts := Options{Store: e.store, Key: o.key, SealKey: o.sealKey, State: o.state, SnapshotDir: o.snapshotDir, Fleet: o.fleet, SyncInterval: 200 * time.Millisecond,
		TrustedProxies: o.trustedProxies}
	if o.syncInterval != 0 {
		opts.SyncInterval = o.syncInterval
	}
	if o.backup != nil {
		b := *o.backup
		opts.Backup = func(*config.Config) config.Backup { return b }
	}
	e.a, err = New(opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.a.Start(); err != nil {
		t.Fatal(err)
	}
	e.srv = httptest.NewServer(e.a.Handler())
	t.Cleanup(func() {
		e.srv.Close()
		e.a.Close()
	})
	return e
}

type resp struct {
	status int
	etag   string
	body   []byte
	hdr    http.Header
}

func (r resp) json(t testing.TB) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(r.body, &m); err != nil {
		t.Fatalf("not a JSON object (%d): %s", r.status, r.body)
	}
	return m
}

// errPath returns the error's path and message.
func (r resp) errPath(t testing.TB) (string, string) {
	t.Helper()
	var e errorJSON
	if err := json.Unmarshal(r.body, &e); err != nil {
		t.Fatalf("not an error body (%d): %s", r.status, r.body)
	}
	return e.Error.Path, e.Error.Message
}

func (e *env) do(method, path, body string, hdr ...string) resp {
	e.t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, e.srv.URL+path, rd)
	if err != nil {
		e.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+testKey)
	for i := 0; i+1 < len(hdr); i += 2 {
		if hdr[i+1] == "" {
			req.Header.Del(hdr[i])
			continue
		}
		req.Header.Set(hdr[i], hdr[i+1])
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer res.Body.Close()
	data, _ := io.ReadAll(res.Body)
	return resp{status: res.StatusCode, etag: res.Header.Get("ETag"), body: data, hdr: res.Header}
}

func (e *env) etag() string {
	e.t.Helper()
	r := e.do("GET", "/api/version", "")
	if r.status != 200 || r.etag == "" {
		e.t.Fatalf("version: %d %s", r.status, r.body)
	}
	return r.etag
}

// put writes a section with the current ETag and expects want.
func (e *env) put(section, body string, want int) resp {
	e.t.Helper()
	r := e.do("PUT", "/api/config/"+section, body, "If-Match", e.etag())
	if r.status != want {
		e.t.Fatalf("PUT %s %s: got %d, want %d: %s", section, body, r.status, want, r.body)
	}
	return r
}

// logBuffer captures slog output for the test's duration.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

func captureLogs(t *testing.T) *logBuffer {
	lb := &logBuffer{}
	old := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(io.MultiWriter(lb, os.Stderr), nil)))
	t.Cleanup(func() { slog.SetDefault(old) })
	return lb
}

// fakeFleet is a Fleet for tests.
type fakeFleet struct {
	mu      sync.Mutex
	workers []WorkerInfo
	rules   []RuleHit
}

func (f *fakeFleet) Workers() []WorkerInfo {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]WorkerInfo(nil), f.workers...)
}

func (f *fakeFleet) RuleHits() []RuleHit {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]RuleHit(nil), f.rules...)
}

func newEnvStore() *config.Store { return config.NewStore("", nil) }
