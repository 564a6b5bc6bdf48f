// Package deploy holds the files operators install beside the binary: the
// systemd unit, the Grafana dashboard and the Prometheus alert rules. Its
// test keeps them true to the code.
package deploy

import (
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/alecthomas/kong"
	"github.com/infera/infera/config"
	"github.com/infera/infera/engine"
	"github.com/infera/infera/gateway"
	"github.com/infera/infera/internal/testsrv"
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
	eng := startEngine(t)
	var sc struct {
		Serve config.Serve `cmd:""`
	}
	p, _ := kong.New(&sc, append(config.KongOptions(), kong.Name("infera"))...)
	if _, err := p.Parse([]string{"serve", "--workers", "a=http://" + eng}); err != nil {
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

// Every system call the router makes while it serves (a worker with KV
// events over ZMQ, a request, a SIGHUP reload, the SIGTERM drain) is one
// the unit's SystemCallFilter= lines allow: a call they deny kills the
// process with SIGSYS. libzmq's I/O threads call sched_setscheduler
// (pthread_setschedparam, at start, aborting if it fails), which
// ~@resources denied: under the unit the router died with "Bad system
// call" as the first worker with a kv_events_endpoint was added, the
// unit's single-box setup, and Restart= brought it back to die again.
func TestTheUnitsSystemCallFilterAllowsWhatTheRouterCalls(t *testing.T) {
	for _, bin := range []string{"strace", "systemd-analyze"} {
		if _, err := exec.LookPath(bin); err != nil {
			if os.Getenv("INFERA_REQUIRE_SERVERS") == "1" {
				t.Fatalf("%s is not installed and INFERA_REQUIRE_SERVERS=1 (run make deps)", bin)
			}
			t.Skipf("%s is not installed (run make deps)", bin)
		}
	}
	allowed := unitSyscalls(t)

	dir := t.TempDir()
	bin := filepath.Join(dir, "infera")
	build := exec.Command("go", "build", "-o", bin, ".")
	build.Dir = ".."
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	eng := startEngine(t)
	cfg := filepath.Join(dir, "infera.json")
	// A KV event endpoint nothing publishes on: a port held and never
	// listened on (a port picked free could be another process's by the
	// time the router connects).
	os.WriteFile(cfg, []byte(fmt.Sprintf(`{"workers":[{"id":"e1","url":"http://%s","models":["sim-model"],"kv_events_endpoint":"tcp://%s"}]}`,
		eng, testsrv.NewFront(t).Addr)), 0o644)
	trace := filepath.Join(dir, "strace.out")
	cmd := exec.Command("strace", "-f", "-qq", "-o", trace, bin, "serve", "--host", "127.0.0.1", "--port", "0",
		"--admin-port", "0", "--config", cfg, "--router-policy", "kv-aware")
	logf, err := os.Create(filepath.Join(dir, "router.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	cmd.Stderr = logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // the router with strace, for the kill below
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var waitErr error
	exited := make(chan struct{})
	go func() { waitErr = cmd.Wait(); close(exited) }()
	defer func() {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) // a no-op once they ended
		<-exited
		if t.Failed() {
			b, _ := os.ReadFile(logf.Name())
			t.Logf("router log:\n%s", b)
		}
	}()
	// --port 0: the router says where it listens in its "infera serving"
	// line.
	url := ""
	for deadline := time.Now().Add(30 * time.Second); url == ""; time.Sleep(50 * time.Millisecond) {
		b, _ := os.ReadFile(logf.Name())
		for _, l := range strings.Split(string(b), "\n") {
			if _, a, ok := strings.Cut(l, `msg="infera serving" addr=`); ok {
				a, _, _ = strings.Cut(a, " ")
				url = "http://" + a
			}
		}
		select {
		case <-exited:
			if url == "" {
				t.Fatalf("the router exited while starting: %v", waitErr)
			}
		default:
		}
		if url == "" && time.Now().After(deadline) {
			t.Fatal("the router never said where it serves")
		}
	}
	var served bool
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline) && !served; time.Sleep(100 * time.Millisecond) {
		select {
		case <-exited:
			t.Fatalf("the router exited while starting: %v", waitErr)
		default:
		}
		resp, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(
			`{"model":"sim-model","stream":true,"max_tokens":4,"messages":[{"role":"user","content":"hello"}]}`))
		if err != nil {
			continue
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		served = resp.StatusCode == 200
	}
	if !served {
		t.Fatal("the router never answered")
	}
	pid := routerPID(t, trace)
	syscall.Kill(pid, syscall.SIGHUP)
	time.Sleep(300 * time.Millisecond)
	syscall.Kill(pid, syscall.SIGTERM)
	select {
	case <-exited:
		if waitErr != nil {
			t.Fatalf("strace: %v", waitErr)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the router did not stop")
	}
	b, err := os.ReadFile(trace)
	if err != nil {
		t.Fatal(err)
	}
	used := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^\d+ +([a-z0-9_]+)\(`).FindAllStringSubmatch(string(b), -1) {
		used[m[1]] = true
	}
	if !used["accept4"] && !used["accept"] {
		t.Fatalf("the trace holds no accept: %d calls", len(used))
	}
	for c := range used {
		if impossibleSyscall(c) {
			// strace lost track of a thread's syscall entry and exit (a
			// thread ending as the router stops, on a loaded machine)
			// and printed a register that holds no syscall number: seen
			// once as syscall_0x653d. No kernel has such a call.
			t.Logf("strace printed %s, no system call number: ignored", c)
			continue
		}
		if !allowed[c] {
			t.Errorf("the router calls %s, which the unit's SystemCallFilter= denies (the process would be killed with SIGSYS)", c)
		}
	}
}

// impossibleSyscall reports strace's name for an unknown system call
// number (syscall_0x<hex>) when the number is above any Linux system
// call's: x86_64 and arm64 number theirs below 1024. An unknown number in
// that range (a call newer than this strace) is a real call, and checked.
func impossibleSyscall(name string) bool {
	h, ok := strings.CutPrefix(name, "syscall_0x")
	if !ok {
		return false
	}
	n, err := strconv.ParseUint(h, 16, 64)
	return err == nil && n >= 1024
}

// unitSyscalls is the set of system calls the unit's SystemCallFilter=
// lines allow, applied in order as systemd does: the first line makes an
// allow list, a ~ line removes its calls, a later line adds its calls back.
func unitSyscalls(t *testing.T) map[string]bool {
	t.Helper()
	out, err := exec.Command("systemd-analyze", "syscall-filter").Output()
	if err != nil {
		t.Fatal(err)
	}
	groups := map[string][]string{}
	var cur string
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.TrimSpace(line)
		switch {
		case f == "" || strings.HasPrefix(f, "#"):
		case !strings.HasPrefix(line, " ") && strings.HasPrefix(f, "@"):
			cur = f
		case cur != "":
			groups[cur] = append(groups[cur], f)
		}
	}
	var expand func(name string, into map[string]bool, v bool)
	expand = func(name string, into map[string]bool, v bool) {
		if !strings.HasPrefix(name, "@") {
			into[name] = v
			return
		}
		if _, ok := groups[name]; !ok {
			t.Fatalf("unknown system call group %s", name)
		}
		for _, m := range groups[name] {
			expand(m, into, v)
		}
	}
	unit, err := os.ReadFile("infera.service")
	if err != nil {
		t.Fatal(err)
	}
	allowed := map[string]bool{}
	lines := regexp.MustCompile(`(?m)^SystemCallFilter=(.*)$`).FindAllStringSubmatch(string(unit), -1)
	if len(lines) == 0 || strings.HasPrefix(lines[0][1], "~") {
		t.Fatalf("the unit's SystemCallFilter= lines do not start with an allow list: %q", lines)
	}
	for _, l := range lines {
		v := !strings.HasPrefix(l[1], "~")
		for _, name := range strings.Fields(strings.TrimPrefix(l[1], "~")) {
			expand(name, allowed, v)
		}
	}
	return allowed
}

// routerPID is the pid of the router strace runs: the pid of the trace's
// first line, the router's execve.
func routerPID(t *testing.T, trace string) int {
	t.Helper()
	b, _ := os.ReadFile(trace)
	pid, err := strconv.Atoi(strings.Fields(string(b) + " x")[0])
	if err != nil {
		t.Fatalf("no pid in the trace: %q", b[:min(len(b), 200)])
	}
	return pid
}

// startEngine starts a simulated engine and returns its host:port.
func startEngine(t *testing.T) string {
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
	eln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	es, err := engine.NewServer(ecfg)
	if err != nil {
		t.Fatal(err)
	}
	go es.Serve(eln)
	t.Cleanup(func() { es.Close() })
	return eln.Addr().String()
}

// The install steps of docs/operations.md write /etc/default/infera, which
// holds the API key, readable by root alone: written with the usual umask
// (022) it was world-readable, so every local user could read the key.
func TestTheInstallStepsEnvironmentFileIsNotWorldReadable(t *testing.T) {
	doc, err := os.ReadFile("../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	var step string
	for _, line := range strings.Split(string(doc), "\n") {
		if strings.Contains(line, "> /etc/default/infera") {
			step = line
			break
		}
	}
	if step == "" {
		t.Fatal("docs/operations.md has no step writing /etc/default/infera")
	}
	env := filepath.Join(t.TempDir(), "infera")
	cmd := exec.Command("sh", "-c", "umask 022; "+strings.ReplaceAll(step, "/etc/default/infera", env))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", step, err, out)
	}
	fi, err := os.Stat(env)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		t.Fatalf("the install step %q writes the environment file with mode %v: its keys are readable by others", step, fi.Mode().Perm())
	}
	if b, _ := os.ReadFile(env); !strings.Contains(string(b), "INFERA_API_KEY=") {
		t.Fatalf("the step wrote %q", b)
	}
}

// The system call filter check ignores only the names strace gives numbers
// no kernel uses; a call newer than strace (an unknown number in range) is
// still checked.
func TestOnlyImpossibleSyscallNumbersAreIgnored(t *testing.T) {
	for name, want := range map[string]bool{
		"syscall_0x653d": true, "syscall_0x400": true,
		"syscall_0x3ff": false, "syscall_0x1c3": false, "read": false, "syscall_0xzz": false,
	} {
		if got := impossibleSyscall(name); got != want {
			t.Errorf("impossibleSyscall(%q) = %v, want %v", name, got, want)
		}
	}
}
