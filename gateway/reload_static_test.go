package gateway

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/infera/infera/config"
	"github.com/infera/infera/internal/testsrv"
)

// A reload that lists static workers without models does not wait for
// their /v1/models: the static backend asked each one under the config
// store's lock, up to 3 s apiece for a worker that accepts and never
// answers (a hung engine, a node that drops packets), so the reload, a
// SIGHUP's READY=1, admin API reads and every later change hook
// (governance, global scheduling) waited that long, the new config
// already serving. A worker that answers still learns its models at once.
func TestReloadDoesNotWaitForStaticWorkersModels(t *testing.T) {
	hung, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var held []net.Conn
	go func() {
		for {
			c, err := hung.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			held = append(held, c) // read nothing, answer nothing
			mu.Unlock()
		}
	}()
	defer func() {
		hung.Close()
		mu.Lock()
		for _, c := range held {
			c.Close()
		}
		mu.Unlock()
	}()
	_, e1 := startEngine(t, "--speedup", "50")
	_, e2 := startEngine(t, "--speedup", "50")
	path := filepath.Join(t.TempDir(), "infera.json")
	os.WriteFile(path, []byte(`{"workers":[{"id":"a","url":"`+e1+`","models":["sim-model"]}]}`), 0o644)
	g, _ := startServe(t, "--config", path, "--config-poll", "0", "--router-policy", "round-robin")
	os.WriteFile(path, []byte(`{"workers":[{"id":"a","url":"`+e1+`","models":["sim-model"]},`+
		`{"id":"h1","url":"http://`+hung.Addr().String()+`"},{"id":"h2","url":"http://localhost:`+strconv.Itoa(hung.Addr().(*net.TCPAddr).Port)+`"},`+
		`{"id":"b","url":"`+e2+`"}]}`), 0o644)
	start := time.Now()
	if ok, err := g.Store().Reload(); !ok || err != nil {
		t.Fatalf("reload: %v %v", ok, err)
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("the reload took %v: it waited for the hung workers' /v1/models", d.Round(time.Millisecond))
	}
	deadline := time.Now().Add(3 * time.Second)
	for len(g.Fleet().View().ByModel["sim-model"]) != 2 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := len(g.Fleet().View().ByModel["sim-model"]); n != 2 {
		t.Fatalf("%d workers serve sim-model 3 s after the reload, want a and b (b's models asked)", n)
	}
	if w := g.Fleet().Get("h1"); w == nil || len(w.Models) != 0 {
		t.Fatalf("h1: %v, want listed without models", w)
	}
}

// With --request-transport nats a static worker whose id cannot be a NATS
// subject token (a dot, a wildcard) is unreachable, and the fleet skips it.
// A reload listing one is refused whole, naming it: it was accepted, its
// other settings swapped in, and the worker silently missing.
func TestReloadRefusesAStaticWorkerThisServerCannotReach(t *testing.T) {
	nsrv := testsrv.StartNATS(t)
	_, e1 := startEngine(t, "--speedup", "50")
	path := filepath.Join(t.TempDir(), "infera.json")
	os.WriteFile(path, []byte(`{"workers":[{"id":"a","url":"`+e1+`","models":["sim-model"]}]}`), 0o644)
	g, _ := startServe(t, "--config", path, "--config-poll", "0", "--router-policy", "round-robin",
		"--request-transport", "nats", "--nats-url", nsrv.URL)
	os.WriteFile(path, []byte(`{"debug":{"decision_header":true},"workers":[{"id":"a","url":"`+e1+`","models":["sim-model"]},`+
		`{"id":"b.1","url":"`+e1+`","models":["sim-model"]}]}`), 0o644)
	_, err := g.Store().Reload()
	var fe *config.FieldError
	if !errors.As(err, &fe) || fe.Path != "workers[1]" {
		t.Fatalf("reload: %v, want refused at workers[1]", err)
	}
	if g.Store().Version() != 1 || g.Store().Load().Debug.DecisionHeader {
		t.Fatal("the refused reload was applied")
	}
}
