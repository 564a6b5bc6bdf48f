package gateway

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/alecthomas/kong"
	"github.com/infera/infera/config"
)

// parseServe parses `infera serve args...` with a fresh CLI value, exactly
// as main does.
func parseServe(t *testing.T, args ...string) *config.Serve {
	t.Helper()
	var c struct {
		Serve config.Serve `cmd:""`
	}
	p, err := kong.New(&c, append(config.KongOptions(), kong.Name("infera"), kong.Exit(func(int) { t.Fatal("exit") }))...)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Parse(append([]string{"serve"}, args...)); err != nil {
		t.Fatalf("parse %v: %v", args, err)
	}
	return &c.Serve
}

// Two static workers given the same id in --workers (INFERA_WORKERS) refuse
// the start, as the config file's do ("duplicate id"): the second was
// dropped without a word, half the intended fleet missing.
func TestADuplicateWorkerIDInTheWorkersFlagRefusesTheStart(t *testing.T) {
	f := parseServe(t, "--workers", "a=http://127.0.0.1:18901,a=http://127.0.0.1:18902",
		"--worker-model", "sim-model", "--admin-port", "0")
	g, err := New(f)
	if err == nil {
		n := g.Workers()
		g.Close()
		t.Fatalf("--workers with id a twice started with %d worker(s); want a start-up error naming the duplicate id (as the config file's workers get)", n)
	}
	if !strings.Contains(err.Error(), `id "a" is given twice`) {
		t.Fatalf("error %q does not name the id", err)
	}
}

// A config file worker with the id of one of --workers refuses the start
// (and a reload that brings one is refused): it was dropped without a
// word, its url never served, and edits to it did nothing.
func TestAConfigWorkerWithAWorkersFlagIDRefusesTheStart(t *testing.T) {
	path := filepath.Join(t.TempDir(), "infera.json")
	os.WriteFile(path, []byte(`{"workers":[{"id":"a","url":"http://127.0.0.1:18903","models":["sim-model"]}]}`), 0o644)
	f := parseServe(t, "--workers", "a=http://127.0.0.1:18901", "--worker-model", "sim-model",
		"--config", path, "--config-poll", "0", "--admin-port", "0")
	g, err := New(f)
	if err == nil {
		w := g.Fleet().Get("a")
		g.Close()
		t.Fatalf("config worker a (http://127.0.0.1:18903) and --workers a=http://127.0.0.1:18901 both accepted; serving %s only. Want a start-up error naming the clash", w.URL)
	}
}

// A --workers entry the fleet cannot take (not http or https) refuses the
// start, as the same worker in the config file does: it was logged and
// skipped, and the router started with no worker.
func TestAnUnusableWorkersFlagEntryRefusesTheStart(t *testing.T) {
	f := parseServe(t, "--workers", "ftp://127.0.0.1:18901", "--worker-model", "sim-model", "--admin-port", "0")
	g, err := New(f)
	if err == nil {
		n := g.Workers()
		g.Close()
		t.Fatalf("--workers ftp://127.0.0.1:18901 started with %d workers; want a start-up error as the config file gets", n)
	}
	if !strings.Contains(err.Error(), "--workers") {
		t.Fatalf("error %q does not name --workers", err)
	}
}

// Two static workers whose urls name one engine refuse the start, naming
// both ids, wherever they come from (--workers twice, --workers and the
// config file, the config file twice), and a reload that brings one is
// refused: each became a worker, so the engine took two shares of the
// traffic under two breakers and two load counters, each seeing half its
// load.
func TestTwoStaticWorkersNamingOneEngineRefuseTheStart(t *testing.T) {
	refused := func(what string, cfg string, workers string, want ...string) {
		t.Helper()
		args := []string{"--worker-model", "sim-model", "--admin-port", "0", "--request-transport", "http", "--kv-event-transport", "zmq"}
		if workers != "" {
			args = append(args, "--workers", workers)
		}
		if cfg != "" {
			path := filepath.Join(t.TempDir(), "infera.json")
			os.WriteFile(path, []byte(cfg), 0o644)
			args = append(args, "--config", path, "--config-poll", "0")
		}
		g, err := New(parseServe(t, args...))
		if err == nil {
			n := g.Workers()
			g.Close()
			t.Fatalf("%s: started with %d workers for one engine; want a start-up error naming both ids", what, n)
		}
		for _, w := range want {
			if !strings.Contains(err.Error(), w) {
				t.Fatalf("%s: error %q does not name %s", what, err, w)
			}
		}
	}
	refused("--workers twice", "", "a=http://127.0.0.1:18901,b=http://127.0.0.1:18901/v1/", `"a"`, `"b"`)
	refused("--workers and the config file", `{"workers":[{"id":"a","url":"http://127.0.0.1:18901","models":["sim-model"]}]}`,
		"http://127.0.0.1:18901", `"a"`, `"http://127.0.0.1:18901"`, "workers[0].url")
	refused("the config file twice", `{"workers":[{"id":"a","url":"http://LOCALHOST:80","models":["sim-model"]},{"id":"b","url":"http://localhost","models":["sim-model"]}]}`,
		"", `"a"`, `"b"`, "workers[1].url")

	// A reload that brings one is refused; the fleet keeps its worker.
	path := filepath.Join(t.TempDir(), "infera.json")
	os.WriteFile(path, []byte(`{"workers":[{"id":"a","url":"http://127.0.0.1:18902","models":["sim-model"]}]}`), 0o644)
	g, err := New(parseServe(t, "--workers", "w=http://127.0.0.1:18901", "--worker-model", "sim-model", "--admin-port", "0",
		"--request-transport", "http", "--kv-event-transport", "zmq", "--config", path, "--config-poll", "0"))
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	os.WriteFile(path, []byte(`{"workers":[{"id":"a","url":"http://127.0.0.1:18901","models":["sim-model"]}]}`), 0o644)
	if _, err := g.Store().Reload(); err == nil || !strings.Contains(err.Error(), `"w"`) {
		t.Fatalf("reload naming w's engine for a: err %v, want it refused naming w", err)
	}
	if n := g.Workers(); n != 2 || g.Fleet().Get("a").URL != "http://127.0.0.1:18902" {
		t.Fatalf("after the refused reload: %d workers, a at %s", n, g.Fleet().Get("a").URL)
	}
}

// --trusted-proxies comes from the flag or INFERA_TRUSTED_PROXIES, comma
// separated; a malformed entry refuses the start, naming it.
func TestTrustedProxiesComeFromTheFlagOrTheEnvironmentAndAreChecked(t *testing.T) {
	t.Setenv("INFERA_TRUSTED_PROXIES", "10.0.0.0/8, 2001:db8::/32")
	if f := parseServe(t); strings.Join(f.TrustedProxies, "|") != "10.0.0.0/8| 2001:db8::/32" {
		t.Fatalf("from the environment: %q", f.TrustedProxies)
	}
	if f := parseServe(t, "--trusted-proxies", "192.0.2.7,::1"); strings.Join(f.TrustedProxies, "|") != "192.0.2.7|::1" {
		t.Fatalf("the flag over the environment: %q", f.TrustedProxies)
	}
	// kong runs Serve.Validate while parsing, as main does.
	var c struct {
		Serve config.Serve `cmd:""`
	}
	p, err := kong.New(&c, append(config.KongOptions(), kong.Name("infera"), kong.Exit(func(int) { t.Fatal("exit") }))...)
	if err != nil {
		t.Fatal(err)
	}
	_, err = p.Parse([]string{"serve", "--trusted-proxies", "10.0.0.0/8,lb.internal", "--admin-port", "0"})
	if err == nil || !strings.Contains(err.Error(), "--trusted-proxies") || !strings.Contains(err.Error(), `"lb.internal" is not an IP address`) {
		t.Fatalf("--trusted-proxies lb.internal: %v; want an error naming the flag and the entry", err)
	}
	// gateway.New (an embedding caller) checks it too.
	c.Serve.TrustedProxies = []string{"10.0.0.1/8"}
	if g, err := New(&c.Serve); err == nil || !strings.Contains(err.Error(), "10.0.0.0/8") {
		if g != nil {
			g.Close()
		}
		t.Fatalf("gateway.New with --trusted-proxies 10.0.0.1/8: %v; want an error offering 10.0.0.0/8", err)
	}
}
