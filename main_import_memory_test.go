package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/infera/infera/govern"
)

const importTestAdminKey = "test-admin-key-0123456789"

// routerChild is `infera serve` run by the test binary in a process of its
// own (TestMain), on loopback.
type routerChild struct {
	url, adminURL string // http://host:port of the front door and of the admin API
	out           *logBuffer
	stop          func() // kills the router and waits for it (also at the test's end)
}

// logBuffer is a child's output, written by exec's copying goroutine while
// the test reads it.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// addr returns the addr= field of the first log line with msg ("" until
// there is one).
func (l *logBuffer) addr(msg string) string {
	for _, line := range strings.Split(l.String(), "\n") {
		if !strings.Contains(line, `msg="`+msg+`"`) {
			continue
		}
		if _, a, ok := strings.Cut(line, " addr="); ok {
			a, _, _ = strings.Cut(a, " ")
			return a
		}
	}
	return ""
}

// startRouter starts a router on the config file cfg, with its admin API,
// at the default GOGC, and waits (at most 20 s) until it serves /metrics.
// The front door and the admin listener bind ports of their own (--port
// 0, --admin-port=-1) and the router's log says which: a port picked free
// beforehand could be taken by another process before the router binds it.
func startRouter(t *testing.T, cfg string) *routerChild {
	t.Helper()
	r := &routerChild{out: &logBuffer{}}
	js, _ := json.Marshal([]string{"serve", "--host", "127.0.0.1", "--port", "0",
		"--admin-port=-1", "--admin-key", importTestAdminKey, "--config", cfg,
		"--request-transport", "http", "--kv-event-transport", "zmq", "--discovery-backend", "static"})
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	env := []string{"INFERA_MAIN_CHILD_ARGS=" + string(js)}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "GOGC=") && !strings.HasPrefix(kv, "GOMEMLIMIT=") {
			env = append(env, kv)
		}
	}
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = r.out, r.out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	r.stop = sync.OnceFunc(func() { cmd.Process.Kill(); <-done })
	t.Cleanup(r.stop)
	deadline := time.Now().Add(20 * time.Second)
	for {
		if r.url == "" {
			if a := r.out.addr("infera serving"); a != "" {
				r.url = "http://" + a
			}
		}
		if r.adminURL == "" {
			r.adminURL = strings.TrimSuffix(r.out.addr("admin API and console listening"), "/")
		}
		if r.url != "" && r.adminURL != "" {
			if _, err := r.heap(); err == nil {
				return r
			}
		}
		select {
		case <-done:
			t.Fatalf("the router exited: %s", r.out)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("the router does not answer: %s", r.out)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// heap is go_memstats_heap_alloc_bytes of the router's /metrics.
func (r *routerChild) heap() (uint64, error) {
	resp, err := http.Get(r.url + "/metrics")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "go_memstats_heap_alloc_bytes "); ok {
			f, err := strconv.ParseFloat(v, 64)
			return uint64(f), err
		}
	}
	return 0, fmt.Errorf("no go_memstats_heap_alloc_bytes in /metrics")
}

// admin sends an admin API request and returns the body of its 200 answer.
func (r *routerChild) admin(t *testing.T, method, path string, body []byte) []byte {
	t.Helper()
	req, err := http.NewRequest(method, r.adminURL+path, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+importTestAdminKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%s %s: %d %.300s", method, path, resp.StatusCode, b)
	}
	return b
}

// TestARoutersHeapPeaksBelowFourTimesAnImportsBody measures, as
// docs/admin.md tells it, what the import of the export of 50,000 users
// (about 12 MB) costs a router at the default GOGC: `infera serve
// --config` on `{}`, the export POSTed to its admin API over loopback, the
// heap (go_memstats_heap_alloc_bytes of /metrics) polled every 3 ms. Its
// peak above the heap before the import was 4.2x to 4.4x the body while
// the governance made every user's counters when it compiled the config
// (4.7x to 5.0x in the measurements of the docs); 3.4x to 3.7x since they
// are made at a user's first request. An import whose body stays
// reachable after its decode peaks at 4.4x to 5.6x (a collection finds the
// body and the config live and sets the next goal at twice that; seen
// with a runtime.KeepAlive of the body at the end of postImport): the
// body is unreachable once decoded, and every one of three imports, each
// on a fresh router, must peak below 4x (3.24x to 3.85x in 60 imports,
// 18 of them two tests at once), but 3.40x to 4.85x with three tests at
// once (6 of 36 at 4x or above): an import now runs the collector at
// GOGC=25 (3.19x to 3.57x, the same 36).
func TestARoutersHeapPeaksBelowFourTimesAnImportsBody(t *testing.T) {
	if testing.Short() {
		t.Skip("builds 50,000 users and runs two routers")
	}
	if raceEnabled {
		t.Skip("measures memory, which the race detector changes")
	}
	dir := t.TempDir()
	// The export comes from a router serving 50,000 users, as an operator
	// makes it.
	var sb strings.Builder
	sb.WriteString(`{"user_limit":{"templates":[{"name":"standard","rate":{"enabled":true,"rpm":60}}]},"users":[`)
	for i := range 50000 {
		if i > 0 {
			sb.WriteByte(',')
		}
		_, h, err := govern.NewKey()
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&sb, `{"name":"user-%05d@example.com","template":"standard","keys":[%q]}`, i, h)
	}
	sb.WriteString("]}")
	full := filepath.Join(dir, "full.json")
	if err := os.WriteFile(full, []byte(sb.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	src := startRouter(t, full)
	export := src.admin(t, "GET", "/api/backup/export", nil)
	// Each import is measured on a fresh router: a router's peak depends
	// on when its collections run, and every one must stay below 4x.
	n := uint64(len(export))
	for try := range 3 {
		peak := importPeak(t, export)
		t.Logf("try %d: peak %d above the heap before (%.2fx the body)", try+1, peak, float64(peak)/float64(n))
		if peak >= 4*n {
			t.Errorf("try %d: the router's heap grew by %.2fx the body during the import: want below 4x", try+1, float64(peak)/float64(n))
		}
	}
}

// importPeak starts a router on a config file of its own holding `{}`,
// imports export through its admin API, and returns how far its heap rose
// above what it was before, polled every 3 ms; the router is stopped before
// it returns.
func importPeak(t *testing.T, export []byte) uint64 {
	t.Helper()
	cfg := filepath.Join(t.TempDir(), "infera.json")
	if err := os.WriteFile(cfg, []byte(`{}`), 0o600); err != nil {
		t.Fatal(err)
	}
	r := startRouter(t, cfg)
	defer r.stop()
	time.Sleep(300 * time.Millisecond) // its start settled
	before, err := r.heap()
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var top uint64
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			if h, err := r.heap(); err == nil {
				top = max(top, h)
			}
			select {
			case <-stop:
				return
			case <-time.After(3 * time.Millisecond):
			}
		}
	}()
	start := time.Now()
	r.admin(t, "POST", "/api/backup/import", export)
	took := time.Since(start)
	time.Sleep(100 * time.Millisecond)
	close(stop)
	wg.Wait()
	t.Logf("body %d bytes, imported in %v: heap %d before, peak %d", len(export), took.Round(time.Millisecond), before, top)
	return top - min(before, top)
}
