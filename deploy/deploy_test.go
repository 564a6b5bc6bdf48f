// Package deploy holds the files operators install beside the binary: the
// systemd unit, the Grafana dashboard and the Prometheus alert rules. Its
// test keeps them true to the code.
package deploy

import (
	"encoding/json"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/alecthomas/kong"
	"github.com/infera/infera/config"
	"github.com/infera/infera/engine"
	"github.com/infera/infera/gateway"
)

var metricRef = regexp.MustCompile(`infera_[a-z0-9_]+`)

// referenced returns the metric names an expression file uses, without the
// histogram series suffixes.
func referenced(t *testing.T, path string) map[string]bool {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, m := range metricRef.FindAllString(string(b), -1) {
		for _, suf := range []string{"_bucket", "_sum", "_count"} {
			if strings.HasSuffix(m, suf) && (strings.Contains(m, "seconds") || strings.Contains(m, "ratio")) {
				m = strings.TrimSuffix(m, suf)
			}
		}
		if m == "infera_router" { // the dashboard uid
			continue
		}
		out[m] = true
	}
	return out
}

// defined returns the metric names the code defines: every full name
// written in the Go sources, plus every name a running router exports.
func defined(t *testing.T) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	lit := regexp.MustCompile("[\"`](infera_[a-z0-9_]+)[\"`{]")
	filepath.WalkDir("..", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() && (d.Name() == "node_modules" || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return nil
		}
		b, _ := os.ReadFile(p)
		for _, m := range lit.FindAllStringSubmatch(string(b), -1) {
			out[m[1]] = true
		}
		return nil
	})
	for _, n := range liveMetrics(t) {
		out[n] = true
	}
	return out
}

// liveMetrics starts a kv-aware router in front of a simulated engine,
// sends a request, and lists the metric names on its /metrics.
func liveMetrics(t *testing.T) []string {
	t.Helper()
	var ec struct {
		Engine engine.Cmd `cmd:""`
	}
	p, _ := kong.New(&ec, append(config.KongOptions(), kong.Name("infera"))...)
	if _, err := p.Parse([]string{"engine", "--speedup", "100"}); err != nil {
		t.Fatal(err)
	}
	ecfg, err := ec.Engine.Config()
	if err != nil {
		t.Fatal(err)
	}
	eln, _ := net.Listen("tcp4", "127.0.0.1:0")
	es, err := engine.NewServer(ecfg)
	if err != nil {
		t.Fatal(err)
	}
	go es.Serve(eln)
	defer es.Close()
	var sc struct {
		Serve config.Serve `cmd:""`
	}
	p, _ = kong.New(&sc, append(config.KongOptions(), kong.Name("infera"))...)
	if _, err := p.Parse([]string{"serve", "--workers", "a=http://" + eln.Addr().String()}); err != nil {
		t.Fatal(err)
	}
	g, err := gateway.New(&sc.Serve)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	ln, _ := net.Listen("tcp4", "127.0.0.1:0")
	go g.Serve(ln)
	url := "http://" + ln.Addr().String()
	resp, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(
		`{"model":"sim-model","max_tokens":2,"messages":[{"role":"user","content":"hello"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	resp, err = http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var names []string
	for _, line := range strings.Split(string(b), "\n") {
		if m := metricRef.FindString(line); m != "" && strings.HasPrefix(line, m) {
			names = append(names, strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(m, "_bucket"), "_sum"), "_count"))
		}
	}
	return names
}

func TestDashboardAndAlertsReferenceExistingMetrics(t *testing.T) {
	have := defined(t)
	for _, f := range []string{"grafana/infera.json", "prometheus/alerts.yml"} {
		for m := range referenced(t, f) {
			if !have[m] {
				t.Errorf("%s references %s, which no code defines", f, m)
			}
		}
	}
}

func TestDashboardIsValidGrafanaJSON(t *testing.T) {
	b, err := os.ReadFile("grafana/infera.json")
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Title  string `json:"title"`
		UID    string `json:"uid"`
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatal(err)
	}
	if d.Title == "" || d.UID == "" || len(d.Panels) < 10 {
		t.Fatalf("dashboard: %q %q %d panels", d.Title, d.UID, len(d.Panels))
	}
	for _, p := range d.Panels {
		if p.Title == "" || len(p.Targets) == 0 || p.Targets[0].Expr == "" {
			t.Fatalf("panel %q has no query", p.Title)
		}
	}
}

func TestAlertRulesAreWellFormed(t *testing.T) {
	b, err := os.ReadFile("prometheus/alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	alerts := regexp.MustCompile(`(?m)^      - alert: (\w+)\n        (?:#.*\n        )*expr: (.+)$`).FindAllStringSubmatch(string(b), -1)
	if n := strings.Count(string(b), "- alert:"); n != len(alerts) || n < 6 {
		t.Fatalf("%d alerts, %d with an expr", n, len(alerts))
	}
	for _, want := range []string{"InferaWorkerBreakerTrippingWhileActive", "InferaHighErrorRate", "InferaSlowFirstToken", "InferaKVEventGaps", "InferaConfigReloadFailed"} {
		if !strings.Contains(string(b), "alert: "+want+"\n") {
			t.Fatalf("missing alert %s", want)
		}
	}
}

func TestSystemdUnitIsNotifyWithHardening(t *testing.T) {
	b, err := os.ReadFile("infera.service")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"Type=notify", "ExecReload=/bin/kill -HUP $MAINPID", "WatchdogSec=", "DynamicUser=yes",
		"ProtectSystem=strict", "NoNewPrivileges=yes", "KillSignal=SIGTERM"} {
		if !strings.Contains(string(b), "\n"+want) {
			t.Fatalf("unit lacks %q", want)
		}
	}
}
