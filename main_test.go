package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/alecthomas/kong"
	"github.com/infera/infera/config"
)

// parseServe parses `infera serve args...` with a fresh CLI value.
func parseServe(t *testing.T, args ...string) *config.Serve {
	t.Helper()
	var c struct {
		Serve serveCmd `cmd:""`
	}
	p, err := kong.New(&c, append(config.KongOptions(), kong.Name("infera"), kong.Exit(func(int) { t.Fatal("exit") }))...)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Parse(append([]string{"serve"}, args...)); err != nil {
		t.Fatalf("parse %v: %v", args, err)
	}
	return &c.Serve.Serve
}

// The routing doc's defaults: Kubernetes discovery, requests and KV events
// over NATS; static workers (plain engines) mean static discovery over
// http and zmq unless the knobs are set.
func TestServeFlagDefaults(t *testing.T) {
	f := parseServe(t)
	f.ResolveBackends(false)
	if f.DiscoveryBackend != "kubernetes" || f.RequestTransport != "nats" || f.KVEventTransport != "nats" {
		t.Fatalf("routing defaults: %s %s %s", f.DiscoveryBackend, f.RequestTransport, f.KVEventTransport)
	}
	f = parseServe(t, "--workers", "http://127.0.0.1:8100")
	f.ResolveBackends(true)
	if f.DiscoveryBackend != "static" || f.RequestTransport != "http" || f.KVEventTransport != "zmq" {
		t.Fatalf("with static workers: %s %s %s", f.DiscoveryBackend, f.RequestTransport, f.KVEventTransport)
	}
	f = parseServe(t, "--discovery-backend", "etcd", "--kv-event-transport", "zmq")
	f.ResolveBackends(false)
	if f.DiscoveryBackend != "etcd" || f.RequestTransport != "nats" || f.KVEventTransport != "zmq" {
		t.Fatalf("etcd, kv zmq: %s %s %s", f.DiscoveryBackend, f.RequestTransport, f.KVEventTransport)
	}
	t.Setenv("INFERA_REQUEST_TRANSPORT", "http")
	f = parseServe(t, "--discovery-backend", "static")
	f.ResolveBackends(true)
	if f.RequestTransport != "http" || f.KVEventTransport != "zmq" {
		t.Fatalf("static: %s %s", f.RequestTransport, f.KVEventTransport)
	}
	for flag, set := range map[string]func(f *config.Serve){
		"--discovery-backend":  func(f *config.Serve) { f.DiscoveryBackend = "consul" },
		"--request-transport":  func(f *config.Serve) { f.RequestTransport = "grpc" },
		"--kv-event-transport": func(f *config.Serve) { f.KVEventTransport = "kafka" },
	} {
		f := parseServe(t)
		set(f)
		if err := f.Validate(); err == nil || !strings.Contains(err.Error(), flag) {
			t.Fatalf("%s: %v", flag, err)
		}
	}
	f = parseServe(t)
	if f.Port != 8000 ||
		f.RouterMode != "auto" || f.RouterPolicy != "kv-aware" || f.KVOverlapWeight != 1.0 ||
		f.NatsReqIdleTimeout != 900*time.Second || f.NatsReqMaxDuration != 0 || f.NatsReqMaxPending != 0 ||
		f.RequestMaxRetries != 1 || f.BreakerFailureThreshold != 3 || f.BreakerCooldownS != 5 || f.BreakerMaxCooldownS != 60 {
		t.Fatalf("defaults: %+v", f)
	}
}

func TestServeFlagPrecedence(t *testing.T) {
	t.Setenv("INFERA_REQUEST_MAX_RETRIES", "4")
	t.Setenv("INFERA_BREAKER_COOLDOWN_S", "7.5")
	t.Setenv("INFERA_NATS_REQ_IDLE_TIMEOUT", "30s")
	t.Setenv("NATS_URL", "nats://127.0.0.1:4222")
	f := parseServe(t)
	if f.RequestMaxRetries != 4 || f.BreakerCooldownS != 7.5 || f.NatsReqIdleTimeout != 30*time.Second || f.NatsURL != "nats://127.0.0.1:4222" {
		t.Fatalf("env: %+v", f)
	}
	t.Setenv("INFERA_K8S_LABEL_SELECTOR", "app=x")
	if f := parseServe(t); f.K8sLabelSelector != "app=x" {
		t.Fatalf("k8s selector env: %q", f.K8sLabelSelector)
	}
	if f := parseServe(t, "--k8s-label-selector", "app=y"); f.K8sLabelSelector != "app=y" {
		t.Fatalf("k8s selector flag: %q", f.K8sLabelSelector)
	}
	f = parseServe(t, "--request-max-retries", "0")
	if f.RequestMaxRetries != 0 {
		t.Fatalf("flag must beat env: %d", f.RequestMaxRetries)
	}
}

// The routing doc writes duration variables in plain seconds.
func TestDurationFlagsAcceptPlainSeconds(t *testing.T) {
	t.Setenv("INFERA_NATS_REQ_IDLE_TIMEOUT", "900")
	if f := parseServe(t); f.NatsReqIdleTimeout != 900*time.Second {
		t.Fatalf("INFERA_NATS_REQ_IDLE_TIMEOUT=900: %v", f.NatsReqIdleTimeout)
	}
	if f := parseServe(t, "--nats-req-max-duration", "2.5"); f.NatsReqMaxDuration != 2500*time.Millisecond {
		t.Fatalf("--nats-req-max-duration 2.5: %v", f.NatsReqMaxDuration)
	}
	if f := parseServe(t, "--header-timeout", "15s"); f.HeaderTimeout != 15*time.Second {
		t.Fatalf("--header-timeout 15s: %v", f.HeaderTimeout)
	}
}

// A bad flag or environment value prints one line naming it, not the
// whole usage.
func TestBadFlagPrintsOneLine(t *testing.T) {
	for _, tc := range []struct {
		args []string
		env  string
		want string
	}{
		{[]string{"serve", "--port", "eighty"}, "", "--port"},
		{[]string{"serve", "--router-policy", "fastest"}, "", "router-policy"},
		{[]string{"serve"}, "INFERA_NATS_REQ_IDLE_TIMEOUT=forever", "duration"},
		{[]string{"serve", "--no-such-flag"}, "", "no-such-flag"},
	} {
		if tc.env != "" {
			k, v, _ := strings.Cut(tc.env, "=")
			t.Setenv(k, v)
		}
		var out bytes.Buffer
		if code := run(tc.args, &out); code != 2 {
			t.Fatalf("%v %s: exit %d", tc.args, tc.env, code)
		}
		s := strings.TrimRight(out.String(), "\n")
		if strings.Count(s, "\n") != 0 || !strings.Contains(s, tc.want) {
			t.Fatalf("%v %s: printed %q, want one line naming %q", tc.args, tc.env, s, tc.want)
		}
	}
}

// `infera key new` mints a key whose hash the config accepts for a user.
func TestKeyCommandIsMounted(t *testing.T) {
	var out, errOut bytes.Buffer
	cli.Key.New.Stdout = &out
	t.Cleanup(func() { cli.Key.New.Stdout = nil })
	if code := run([]string{"key", "new", "--json", "--user", "grace"}, &errOut); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	var got struct {
		Key, Hash string
		User      json.RawMessage
	}
	if err := json.Unmarshal(out.Bytes(), &got); err != nil || !strings.HasPrefix(got.Key, "ifr_") {
		t.Fatalf("%v: %s", err, out.String())
	}
	if _, err := config.Parse([]byte(`{"users":[` + string(got.User) + `]}`)); err != nil {
		t.Fatalf("the printed user entry does not parse: %v: %s", err, got.User)
	}
}

// A bad value that came from an INFERA_* variable names the variable (never
// the value: it may be a key): an operator whose unit reads an environment
// file saw only a flag they never typed.
func TestABadValueFromTheEnvironmentNamesItsVariable(t *testing.T) {
	for _, env := range []string{"INFERA_PORT=99999", "INFERA_LOG_LEVEL=verbose", "INFERA_ROUTER_POLICY=fastest",
		"INFERA_REQUEST_TRANSPORT=grpc", "INFERA_KV_BLOCK_SIZE=0"} {
		k, v, _ := strings.Cut(env, "=")
		t.Run(k, func(t *testing.T) {
			t.Setenv(k, v)
			var out bytes.Buffer
			if code := run([]string{"serve"}, &out); code != 2 || !strings.Contains(out.String(), "(from "+k+")") {
				t.Fatalf("exit %d, printed %q; want exit 2 naming %s", code, out.String(), k)
			}
		})
	}
}

// A key with white space around it (a newline from a Kubernetes secret made
// with --from-file) is refused at start, without echoing it: no client
// could present it (header values lose it), and every request got 401.
func TestAKeyWithWhiteSpaceAroundItRefusesTheStart(t *testing.T) {
	for _, k := range []string{"INFERA_API_KEY", "INFERA_ADMIN_KEY"} {
		t.Run(k, func(t *testing.T) {
			t.Setenv(k, "sk-0123456789abcdef0123\n")
			var out bytes.Buffer
			if code := run([]string{"serve"}, &out); code != 2 || !strings.Contains(out.String(), "white space") ||
				strings.Contains(out.String(), "0123456789abcdef") {
				t.Fatalf("exit %d, printed %q", code, out.String())
			}
		})
	}
}

// A bad value from the environment is not printed (it may be a key, and
// the line goes to the journal): kong's message held it twice,
// `got "sk-..." (from envar INFERA_X="sk-...")`.
func TestABadValueFromTheEnvironmentIsNotPrinted(t *testing.T) {
	for _, env := range []string{"INFERA_NATS_REQ_MAX_PENDING=sk-secret-0123456789", "INFERA_BODY_TIMEOUT=sk-secret-0123456789",
		"INFERA_LOG_LEVEL=sk-secret-0123456789"} {
		k, v, _ := strings.Cut(env, "=")
		t.Run(k, func(t *testing.T) {
			t.Setenv(k, v)
			var out bytes.Buffer
			if code := run([]string{"serve"}, &out); code != 2 || strings.Contains(out.String(), "secret-0123456789") ||
				!strings.Contains(out.String(), "(from "+k+")") {
				t.Fatalf("exit %d, printed %q", code, out.String())
			}
		})
	}
}

// The wrong-key lockout is off by default (behind a proxy or NAT every
// client has one address, and one stale key would lock them all out);
// turned on, its window defaults to a minute, and a window outside 1s to
// 24h is refused at start, naming the flag.
func TestTheWrongKeyLockoutIsOffByDefault(t *testing.T) {
	f := parseServe(t)
	if f.AuthLockoutFailures != 0 || f.AuthLockoutWindow != time.Minute {
		t.Fatalf("defaults: %d within %v", f.AuthLockoutFailures, f.AuthLockoutWindow)
	}
	t.Setenv("INFERA_AUTH_LOCKOUT_FAILURES", "10")
	if f := parseServe(t); f.AuthLockoutFailures != 10 {
		t.Fatalf("INFERA_AUTH_LOCKOUT_FAILURES=10: %d", f.AuthLockoutFailures)
	}
	for _, w := range []string{"0", "500ms", "48h"} {
		var out bytes.Buffer
		if code := run([]string{"serve", "--auth-lockout-failures", "5", "--auth-lockout-window", w}, &out); code != 2 ||
			!strings.Contains(out.String(), "--auth-lockout-window") {
			t.Fatalf("--auth-lockout-window %s: exit %d, printed %q", w, code, out.String())
		}
	}
	parseServe(t, "--auth-lockout-failures", "0", "--auth-lockout-window", "0") // off: any window
}
