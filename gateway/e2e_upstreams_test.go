package gateway

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/alecthomas/kong"
	"github.com/infera/infera/classify"
	"github.com/infera/infera/config"
	"github.com/infera/infera/internal/testsrv"
	"github.com/infera/infera/upstream"
	"github.com/infera/infera/worker"
)

// End-to-end tests of docs/upstreams.md: split proxy, traffic mirroring,
// global scheduling and smart model selection, with real processes.
//
// Child processes: the test binary runs itself again as `infera serve`,
// `infera classify` or `infera worker` (the same flags, gateway, classifier
// and sidecar code main runs), so a test gets separate router processes (a
// second gateway playing an external API, two regions), a real classifier
// process and worker sidecars it can kill.

const childEnv = "INFERA_E2E_CHILD"

func TestMain(m *testing.M) {
	if role := os.Getenv(childEnv); role != "" {
		os.Exit(runChild(role))
	}
	os.Exit(m.Run())
}

// runChild is main for a child process: `infera <role> args...`, args from
// INFERA_E2E_ARGS (a JSON array).
func runChild(role string) int {
	var args []string
	if err := json.Unmarshal([]byte(os.Getenv("INFERA_E2E_ARGS")), &args); err != nil {
		fmt.Fprintln(os.Stderr, "child args:", err)
		return 2
	}
	slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo})))
	var cli struct {
		Serve    config.Serve `cmd:""`
		Classify classify.Cmd `cmd:""`
		Worker   worker.Cmd   `cmd:""`
	}
	p, err := kong.New(&cli, append(config.KongOptions(), kong.Name("infera"))...)
	if err == nil {
		_, err = p.Parse(append([]string{role}, args...))
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "infera:", err)
		return 2
	}
	switch role {
	case "serve":
		f := &cli.Serve
		g, err := New(f)
		if err != nil {
			slog.Error("fatal", "err", err)
			return 1
		}
		defer g.Close()
		ln, err := net.Listen("tcp", net.JoinHostPort(f.Host, strconv.Itoa(f.Port)))
		if err == nil {
			slog.Info("infera serving", "addr", ln.Addr().String()) // as main: where --port 0 bound
			err = g.Run(context.Background(), ln)
		}
		if err != nil {
			slog.Error("fatal", "err", err)
			return 1
		}
	case "classify":
		if err := cli.Classify.Run(); err != nil {
			slog.Error("fatal", "err", err)
			return 1
		}
	case "worker":
		if err := cli.Worker.Run(); err != nil {
			slog.Error("fatal", "err", err)
			return 1
		}
	default:
		return 2
	}
	return 0
}

// child is a running child process.
type child struct {
	url  string
	log  string
	cmd  *exec.Cmd
	done chan struct{}
}

// startChild runs `infera <role> args... --host 127.0.0.1 --port port`
// and waits until it answers GET /health. With port 0 the child binds a
// port of its own and the address comes from its log (listenAddr): a port
// picked free beforehand could be taken by another process before the
// child binds it.
func startChild(t *testing.T, role string, port int, args ...string) *child {
	t.Helper()
	c := launchChild(t, role, "", role+".log", append(args, "--host", "127.0.0.1", "--port", strconv.Itoa(port)))
	if port != 0 {
		c.url = "http://127.0.0.1:" + strconv.Itoa(port)
	} else {
		c.url = "http://" + c.listenAddr(t)
	}
	deadline := time.Now().Add(30 * time.Second)
	hc := &http.Client{Timeout: 2 * time.Second} // a server that accepts and never answers must not hang the test
	for {
		resp, err := hc.Get(c.url + "/health")
		if err == nil {
			resp.Body.Close()
			return c
		}
		select {
		case <-c.done:
			b, _ := os.ReadFile(c.log)
			t.Fatalf("%s exited: %s", role, b)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not answering at %s", role, c.url)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// launchChild starts the test binary as `infera <role> args...`, its
// output in log (a file in the test's temporary directory); the child is
// stopped, and its log's tail shown on failure, when the test ends.
func launchChild(t *testing.T, role, url, log string, args []string) *child {
	t.Helper()
	js, _ := json.Marshal(args)
	c := &child{url: url, done: make(chan struct{}), log: filepath.Join(t.TempDir(), log)}
	lf, err := os.Create(c.log)
	if err != nil {
		t.Fatal(err)
	}
	c.cmd = exec.Command(os.Args[0], "-test.run=^$")
	c.cmd.Env = append(os.Environ(), childEnv+"="+role, "INFERA_E2E_ARGS="+string(js))
	c.cmd.Stdout, c.cmd.Stderr = lf, lf
	if err := c.cmd.Start(); err != nil {
		lf.Close()
		t.Fatal(err)
	}
	go func() {
		c.cmd.Wait()
		lf.Close()
		close(c.done)
	}()
	t.Cleanup(func() {
		c.stop()
		if t.Failed() {
			b, _ := os.ReadFile(c.log)
			if len(b) > 4000 {
				b = b[len(b)-4000:]
			}
			t.Logf("%s %s log:\n%s", role, c.url, b)
		}
	})
	return c
}

// stop sends SIGTERM and waits (SIGKILL after 10 s).
func (c *child) stop() {
	select {
	case <-c.done:
		return
	default:
	}
	c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.done:
	case <-time.After(10 * time.Second):
		c.cmd.Process.Kill()
		<-c.done
	}
}

// listenAddr waits for the line in which the child says where it listens
// ("infera serving" or "infera classify listening", with addr=) and
// returns the address.
func (c *child) listenAddr(t *testing.T) string {
	t.Helper()
	return c.loggedAddr(t, `msg="infera serving"`, `msg="infera classify listening"`)
}

// adminAddr waits for the line in which a router started with
// --admin-port=-1 says where its admin listener listens and returns its
// URL (http://host:port, https with TLS), without the trailing slash.
func (c *child) adminAddr(t *testing.T) string {
	t.Helper()
	return strings.TrimSuffix(c.loggedAddr(t, `msg="admin API and console listening"`), "/")
}

// loggedAddr waits for a log line holding one of msgs and returns the
// value of its addr= field.
func (c *child) loggedAddr(t *testing.T, msgs ...string) string {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		exited := false
		select {
		case <-c.done:
			exited = true // the log is complete
		default:
		}
		for _, line := range strings.Split(c.logText(), "\n") {
			if !slices.ContainsFunc(msgs, func(m string) bool { return strings.Contains(line, m) }) {
				continue
			}
			if _, a, ok := strings.Cut(line, " addr="); ok {
				a, _, _ = strings.Cut(a, " ")
				return a
			}
		}
		if exited {
			t.Fatalf("the child exited before it said where it listens (%s): %s", strings.Join(msgs, ", "), c.logText())
		}
		if time.Now().After(deadline) {
			t.Fatalf("the child did not say where it listens (%s) within 30 s: %s", strings.Join(msgs, ", "), c.logText())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (c *child) logText() string {
	b, _ := os.ReadFile(c.log)
	return string(b)
}

// writeConfig writes a config file atomically (routers poll it).
func writeConfig(t *testing.T, path, s string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(s), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func request(t *testing.T, url, body string, hdr map[string]string) (*http.Response, []byte) {
	t.Helper()
	req, _ := http.NewRequest("POST", url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, b
}

// metric returns the value of one series of url's /metrics ("" if absent).
func metric(t *testing.T, url, series string) string {
	t.Helper()
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			return v
		}
	}
	return ""
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func chatJSON(model, content string, maxTokens int, stream bool) string {
	s := ""
	if stream {
		s = `"stream":true,"stream_options":{"include_usage":true},`
	}
	return fmt.Sprintf(`{"model":%q,%s"max_tokens":%d,"messages":[{"role":"user","content":%q}]}`, model, s, maxTokens, content)
}

// readSSE reads a stream to its end: data events, whether [DONE] came, and
// whether a usage event came.
func readSSE(t *testing.T, r io.Reader) (events int, done, usage bool) {
	t.Helper()
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "data: ") {
			continue
		}
		events++
		switch {
		case line == "data: [DONE]":
			done = true
		case strings.Contains(line, `"completion_tokens"`):
			usage = true
		case strings.Contains(line, `"error"`):
			t.Fatalf("error event: %s", line)
		}
	}
	return events, done, usage
}

// Split proxy: a second `infera serve` plays the external API (behind its
// own key); prefix rules pick the proxy; a dead primary fails over to the
// failover entries in list order; streams pass through the external
// gateway; the client's credentials never reach it.
func TestE2ESplitProxyFailoverToAnotherGateway(t *testing.T) {
	_, eLocal := startEngine(t, "--speedup", "50", "--model", "local-model")
	engX, eX := startEngine(t, "--speedup", "50", "--model", "gpt-4o")
	engY, eY := startEngine(t, "--speedup", "50", "--model", "gpt-4o")
	ext := startChild(t, "serve", 0, "--workers", "x="+eX, "--api-key", "ext-key", "--router-policy", "round-robin")
	dead := "http://" + testsrv.NewFront(t).Addr // held, never up: connecting is refused
	cfgPath := filepath.Join(t.TempDir(), "infera.json")
	writeConfig(t, cfgPath, fmt.Sprintf(`{"debug":{"decision_header":true},
	  "split_proxy":{"enabled":true,"strategy":"prefix","proxies":[
	    {"name":"primary","address":%q,"api_key":"unused-key","model_rules":["gpt-*"]},
	    {"local":true,"model_rules":["local"]},
	    {"name":"gateway2","address":%q,"api_key":"ext-key","failover":true},
	    {"name":"engine-y","address":%q,"failover":true}]}}`, dead, ext.url+"/v1", eY))
	_, r := startServe(t, "--workers", "l="+eLocal, "--config", cfgPath, "--config-poll", "50ms",
		"--api-key", "client-key", "--router-policy", "round-robin")
	client := map[string]string{"Authorization": "Bearer client-key", "Cookie": "sid=secret"}

	// gpt-4o: the dead primary, then gateway2 (which accepts only its own
	// key: the client's could not have passed).
	resp, b := request(t, r+"/v1/chat/completions", chatJSON("gpt-4o", "hello", 3, false), client)
	if resp.StatusCode != 200 || resp.Header.Get("X-Infera-Upstream") != "split:gateway2" || resp.Header.Get("X-Infera-Engine-Id") != engX.Stats().ID {
		t.Fatalf("via gateway2: %d %s %v", resp.StatusCode, b, resp.Header)
	}
	var cr chatResp
	if json.Unmarshal(b, &cr) != nil || cr.Usage.CompletionTokens != 3 {
		t.Fatalf("answer %s", b)
	}
	// The external gateway refuses the client's key: proof that only the
	// proxy's key is sent.
	if resp, _ := request(t, ext.url+"/v1/chat/completions", chatJSON("gpt-4o", "x", 1, false), client); resp.StatusCode != 401 {
		t.Fatalf("external gateway accepted the client's key: %d", resp.StatusCode)
	}

	// A stream through the external gateway, relayed as from a local engine.
	req, _ := http.NewRequest("POST", r+"/v1/chat/completions", strings.NewReader(chatJSON("gpt-4o", "stream it", 8, true)))
	req.Header.Set("Authorization", "Bearer client-key")
	sresp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	events, done, usage := readSSE(t, sresp.Body)
	sresp.Body.Close()
	if sresp.StatusCode != 200 || sresp.Header.Get("Content-Type") != "text/event-stream" || !done || !usage || events < 9 {
		t.Fatalf("stream via gateway2: %d events=%d done=%v usage=%v", sresp.StatusCode, events, done, usage)
	}

	// Local models stay local.
	resp, b = request(t, r+"/v1/chat/completions", chatJSON("local-model", "hi", 2, false), client)
	if resp.StatusCode != 200 || resp.Header.Get("X-Infera-Worker") != "l" {
		t.Fatalf("local: %d %s %v", resp.StatusCode, b, resp.Header)
	}

	// gateway2 goes down: the next failover entry in list order serves.
	ext.stop()
	before := engY.Stats().Completed
	resp, b = request(t, r+"/v1/chat/completions", chatJSON("gpt-4o", "hello again", 2, false), client)
	if resp.StatusCode != 200 || resp.Header.Get("X-Infera-Upstream") != "split:engine-y" || engY.Stats().Completed != before+1 {
		t.Fatalf("via engine-y: %d %s %v", resp.StatusCode, b, resp.Header)
	}
	if v := metric(t, r, `infera_split_proxy_failures_total{proxy="gateway2"}`); v != "1" {
		t.Fatalf("gateway2 failures %q", v)
	}
}

// Traffic mirroring: a target that records what it received gets a copy of
// every request (100% sampling) with the target model and the mirror's
// token, nothing that identifies the client, and reads streams to their
// end; the router logs one line per mirrored request; a slow target does
// not slow the client.
func TestE2EMirrorTargetGetsCopiesWithoutClientCredentials(t *testing.T) {
	type got struct {
		header   http.Header
		body     string
		finished bool
	}
	var (
		mu   sync.Mutex
		seen []got
	)
	target := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		g := got{header: r.Header.Clone(), body: string(body)}
		if strings.Contains(g.body, `"stream":true`) {
			w.Header().Set("Content-Type", "text/event-stream")
			g.finished = true
			for i := 0; i < 5 && g.finished; i++ {
				_, err := fmt.Fprintf(w, "data: {\"choices\":[{\"delta\":{\"content\":\"t%d\"}}]}\n\n", i)
				w.(http.Flusher).Flush()
				g.finished = err == nil
				time.Sleep(20 * time.Millisecond)
			}
			fmt.Fprint(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":11,\"completion_tokens\":5}}\n\ndata: [DONE]\n\n")
		} else {
			time.Sleep(2500 * time.Millisecond) // a slow canary
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, `{"choices":[{"message":{"content":"ok"}}],"usage":{"prompt_tokens":9,"completion_tokens":2}}`)
		}
		mu.Lock()
		seen = append(seen, g)
		mu.Unlock()
	})}
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go target.Serve(ln)
	t.Cleanup(func() { target.Close() })

	_, e1 := startEngine(t, "--speedup", "50")
	cfgPath := filepath.Join(t.TempDir(), "infera.json")
	writeConfig(t, cfgPath, fmt.Sprintf(`{"mirror":{"enabled":true,"target_address":"http://%s","target_model":"canary-model",
	  "sampling_ratio":100,"auth_token":"mirror-token","timeout_ms":5000,"log_recording":true}}`, ln.Addr()))
	r := startChild(t, "serve", 0, "--workers", e1, "--config", cfgPath, "--api-key", "client-key")
	client := map[string]string{"Authorization": "Bearer client-key", "Cookie": "sid=cookie-secret",
		"X-Api-Key": "client-key", "OpenAI-Organization": "org-secret", "X-Forwarded-For": "10.9.8.7",
		"X-Session-Id": "sess-secret", "User-Agent": "test-sdk/1.0"}
	bodies := []string{chatJSON("sim-model", "first question", 3, false), chatJSON("sim-model", "second question", 2, false)}
	for _, body := range bodies {
		t0 := time.Now()
		resp, b := request(t, r.url+"/v1/chat/completions", body, client)
		if resp.StatusCode != 200 || !strings.Contains(string(b), `"model":"sim-model"`) {
			t.Fatalf("client answer: %d %s", resp.StatusCode, b)
		}
		if el := time.Since(t0); el > 1500*time.Millisecond {
			t.Fatalf("the slow mirror target slowed the client: %v", el)
		}
	}
	stream := chatJSON("sim-model", "stream question", 4, true)
	req, _ := http.NewRequest("POST", r.url+"/v1/chat/completions", strings.NewReader(stream))
	for k, v := range client {
		req.Header.Set(k, v)
	}
	sresp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if _, done, _ := readSSE(t, sresp.Body); !done || sresp.StatusCode != 200 {
		t.Fatalf("client stream: %d done=%v", sresp.StatusCode, done)
	}
	sresp.Body.Close()
	waitUntil(t, "three mirrored requests", func() bool { mu.Lock(); defer mu.Unlock(); return len(seen) == 3 })

	// X-Request-Id: the request's id (the router's own here), never a
	// credential.
	allowed := map[string]bool{"Content-Type": true, "Accept": true, "User-Agent": true, "X-Infera-Mirror": true,
		"Authorization": true, "Content-Length": true, "X-Request-Id": true}
	want := map[string]bool{}
	for _, b := range append(bodies, stream) {
		want[strings.Replace(b, `"model":"sim-model"`, `"model":"canary-model"`, 1)] = true
	}
	mu.Lock()
	defer mu.Unlock()
	for _, g := range seen {
		if !want[g.body] {
			t.Fatalf("mirrored body %s is not a client body with the target model", g.body)
		}
		if g.header.Get("Authorization") != "Bearer mirror-token" || g.header.Get("User-Agent") != "infera-mirror" {
			t.Fatalf("mirror headers %v", g.header)
		}
		for k, vs := range g.header {
			if !allowed[k] {
				t.Fatalf("mirror target got header %s: %v", k, vs)
			}
			for _, v := range vs {
				if strings.Contains(v, "secret") || strings.Contains(v, "client-key") || strings.Contains(v, "10.9.8.7") || strings.Contains(v, "test-sdk") {
					t.Fatalf("client identity reached the mirror target: %s: %s", k, v)
				}
			}
		}
		if strings.Contains(g.body, `"stream":true`) && !g.finished {
			t.Fatal("the mirrored stream was not read to its end")
		}
	}
	// One log line per mirrored request: status, latency, token counts.
	waitUntil(t, "three mirror log lines", func() bool { return strings.Count(r.logText(), "msg=mirror ") == 3 })
	for _, line := range strings.Split(r.logText(), "\n") {
		if !strings.Contains(line, "msg=mirror ") {
			continue
		}
		for _, f := range []string{"status=200", "result=ok", "latency_ms=", "target_model=canary-model", "prompt_tokens=", "completion_tokens="} {
			if !strings.Contains(line, f) {
				t.Fatalf("mirror log line without %s: %s", f, line)
			}
		}
		if strings.Contains(line, "secret") || strings.Contains(line, "mirror-token") {
			t.Fatalf("mirror log line leaks: %s", line)
		}
	}
}

// Global scheduling: two regions, two `infera serve` processes, each with
// its own simulated engines, listing each other. A forwards to B what it
// has no worker for and what arrives while its only worker is at its
// concurrency limit; a forwarded request is never forwarded back, even when
// B is saturated too.
func TestE2EGlobalSchedulingTwoRegions(t *testing.T) {
	engA, eA := startEngine(t, "--model", "shared")
	engB, eB := startEngine(t, "--model", "shared")
	engBOnly, eBOnly := startEngine(t, "--speedup", "50", "--model", "b-only")
	// Each region's config names the other's URL, so one of them must be
	// known before that region starts: A reaches B through a front (a
	// port the test holds from now on); both routers bind ports of their
	// own (--port 0) and the front relays to B once B says where it is.
	// A port picked free for B could be taken before B binds it.
	frontB := testsrv.NewFront(t)
	dir := t.TempDir()
	region := func(name, member, memberURL, memberKey string) string {
		p := filepath.Join(dir, name+".json")
		writeConfig(t, p, fmt.Sprintf(`{"debug":{"decision_header":true},"rate_limit":{"overall_concurrency":1},
		  "global_scheduling":{"enabled":true,"poll_interval_ms":50,"stale_after_ms":2000,"min_free":0,
		    "members":[{"name":%q,"url":%q,"api_key":%q}]}}`, member, memberURL, memberKey))
		return p
	}
	urlA := startChild(t, "serve", 0, "--workers", "a1="+eA, "--config", region("a", "b", "http://"+frontB.Addr, "key-b"),
		"--api-key", "key-a", "--router-policy", "round-robin").url
	urlB := startChild(t, "serve", 0, "--workers", "b1="+eB+",b2="+eBOnly, "--config", region("b", "a", urlA, "key-a"),
		"--api-key", "key-b", "--router-policy", "round-robin").url
	frontB.Up(strings.TrimPrefix(urlB, "http://"))
	keyA := map[string]string{"Authorization": "Bearer key-a"}
	keyB := map[string]string{"Authorization": "Bearer key-b"}

	// The capacity endpoint is authenticated like inference.
	if resp, err := http.Get(urlB + upstream.CapacityPath); err != nil || resp.StatusCode != 401 {
		t.Fatalf("capacity without key: %v %v", resp, err)
	}
	capacity := func(url, key string) upstream.Capacity {
		req, _ := http.NewRequest("GET", url+upstream.CapacityPath, nil)
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		c, err := upstream.ParseCapacity(body)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("capacity: %d %s %v", resp.StatusCode, body, err)
		}
		return c
	}
	waitUntil(t, "both regions polled", func() bool {
		return metric(t, urlA, `infera_global_member_free{member="b"}`) == "2" &&
			metric(t, urlB, `infera_global_member_free{member="a"}`) == "1"
	})

	// 1. No worker for the model in A: B serves it.
	resp, body := request(t, urlA+"/v1/chat/completions", chatJSON("b-only", "hello", 2, false), keyA)
	if resp.StatusCode != 200 || resp.Header.Get("X-Infera-Upstream") != "global:b" || engBOnly.Stats().Completed != 1 {
		t.Fatalf("b-only via A: %d %s %v", resp.StatusCode, body, resp.Header)
	}

	// 2. A's only worker at its limit (a long stream held open): B serves.
	hold := func(url string, key map[string]string) *http.Response {
		req, _ := http.NewRequest("POST", url+"/v1/chat/completions", strings.NewReader(chatJSON("shared", "a long story", 3000, true)))
		for k, v := range key {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("hold: %v %v", resp, err)
		}
		t.Cleanup(func() { resp.Body.Close() })
		return resp
	}
	hold(urlA, keyA)
	if c := capacity(urlA, "key-a"); c.Free != 0 || c.Inflight != 1 {
		t.Fatalf("A's capacity while held: %+v", c)
	}
	bBefore, aBefore := engB.Stats().Submitted, engA.Stats().Submitted
	resp, body = request(t, urlA+"/v1/chat/completions", chatJSON("shared", "short", 2, false), keyA)
	if resp.StatusCode != 200 || resp.Header.Get("X-Infera-Upstream") != "global:b" || engB.Stats().Submitted != bBefore+1 || engA.Stats().Submitted != aBefore {
		t.Fatalf("saturated A: %d %s %v", resp.StatusCode, body, resp.Header)
	}

	// 3. B saturated too: A still forwards (min_free 0); B never sends it
	// back to A, and its own worker is at its limit: request rate limiting
	// refuses it there (docs/governance.md), and A, whose worker is at its
	// limit too, answers the refusal.
	hold(urlB, keyB)
	waitUntil(t, "A sees B saturated", func() bool { return metric(t, urlA, `infera_global_member_free{member="b"}`) == "1" })
	bBefore = engB.Stats().Submitted
	resp, body = request(t, urlA+"/v1/chat/completions", chatJSON("shared", "short again", 2, false), keyA)
	if resp.StatusCode != 429 || !strings.Contains(string(body), `"code":"concurrency_overall"`) ||
		engA.Stats().Submitted != aBefore || engB.Stats().Submitted != bBefore {
		t.Fatalf("both saturated: %d %s %v", resp.StatusCode, body, resp.Header)
	}
	if v := metric(t, urlA, `infera_global_forwarded_total{member="b"}`); v != "3" {
		t.Fatalf("A forwarded %s, want 3", v)
	}
	if v := metric(t, urlB, `infera_global_forwarded_total{member="a"}`); v != "0" {
		t.Fatalf("B forwarded %s back, want 0", v)
	}
	if v := metric(t, urlB, `infera_global_hop_kept_total`); v != "1" {
		t.Fatalf("B kept %s hop requests, want 1", v)
	}
}

// Smart model selection with `infera classify` as a real process: each
// tier's requests reach the tier's model; a classifier slower than
// timeout_ms gives the fallback tier, in bounded time.
func TestE2ESmartModelSelectionTiersAndTimeoutFallback(t *testing.T) {
	engines := map[string]string{}
	for _, m := range []string{"tiny", "mid", "big"} {
		_, u := startEngine(t, "--speedup", "50", "--model", m)
		engines[m] = u
	}
	cls := startChild(t, "classify", 0, "--api-key", "cls-key")
	slow := startChild(t, "classify", 0, "--api-key", "cls-key", "--delay", "2s")
	cfgPath := filepath.Join(t.TempDir(), "infera.json")
	smart := func(url string, timeoutMS int, fallback string) string {
		return fmt.Sprintf(`{"debug":{"decision_header":true},"smart_model_selection":{"enabled":true,
		  "classifier_url":%q,"classifier_api_key":"cls-key","timeout_ms":%d,"fallback_tier":%q,
		  "match_models":["auto"],"tiers":{"L1":"tiny","L2":"mid","L3":"big"}}}`, url+classify.ClassifyPath, timeoutMS, fallback)
	}
	writeConfig(t, cfgPath, smart(cls.url, 1000, "L2"))
	rt, r := startServe(t, "--workers", "tiny="+engines["tiny"]+",mid="+engines["mid"]+",big="+engines["big"],
		"--config", cfgPath, "--config-poll", "20ms", "--router-policy", "round-robin")
	check := func(content, wantTier, wantWorker string, within time.Duration) {
		t.Helper()
		t0 := time.Now()
		resp, b := request(t, r+"/v1/chat/completions", chatJSON("auto", content, 2, false), nil)
		if el := time.Since(t0); el > within {
			t.Fatalf("%q took %v", content, el)
		}
		if resp.StatusCode != 200 || resp.Header.Get("X-Infera-Tier") != wantTier || resp.Header.Get("X-Infera-Worker") != wantWorker ||
			!strings.Contains(string(b), `"model":"`+wantWorker+`"`) {
			t.Fatalf("%q: %d %s tier %q worker %q", content, resp.StatusCode, b, resp.Header.Get("X-Infera-Tier"), resp.Header.Get("X-Infera-Worker"))
		}
	}
	// The classifier's metrics are process-wide: compare with their values now.
	count := func(series string) int {
		n, _ := strconv.Atoi(metric(t, r, series))
		return n
	}
	l3, timeouts, l3Fallbacks := count(`infera_smart_selection_total{tier="L3",source="classifier"}`),
		count(`infera_classifier_requests_total{result="timeout"}`), count(`infera_smart_selection_total{tier="L3",source="fallback"}`)
	check("hi there", "L1", "tiny", 5*time.Second)
	check("please debug this function", "L2", "mid", 5*time.Second)
	check("prove this theorem step by step", "L3", "big", 5*time.Second)
	check(strings.Repeat("a long question ", 500), "L3", "big", 5*time.Second)
	// A model outside match_models is not classified.
	resp, b := request(t, r+"/v1/chat/completions", chatJSON("mid", "prove it", 2, false), nil)
	if resp.StatusCode != 200 || resp.Header.Get("X-Infera-Tier") != "" || resp.Header.Get("X-Infera-Worker") != "mid" {
		t.Fatalf("unmatched model: %d %s %v", resp.StatusCode, b, resp.Header)
	}
	if v := count(`infera_smart_selection_total{tier="L3",source="classifier"}`) - l3; v != 2 {
		t.Fatalf("L3 by classifier: %d", v)
	}

	// The slow classifier: timeout_ms 150, fallback L1.
	writeConfig(t, cfgPath, smart(slow.url, 150, "L1"))
	waitUntil(t, "reload", func() bool { return rt.store.Load().SmartModelSelection.FallbackTier == "L1" })
	check("prove this theorem step by step", "L1", "tiny", time.Second)
	if v := count(`infera_classifier_requests_total{result="timeout"}`) - timeouts; v != 1 {
		t.Fatalf("timeouts: %d", v)
	}
	// The classifier down: fallback too.
	cls.stop()
	writeConfig(t, cfgPath, smart(cls.url, 150, "L3"))
	waitUntil(t, "reload", func() bool { return rt.store.Load().SmartModelSelection.FallbackTier == "L3" })
	check("hi", "L3", "big", time.Second)
	if v := count(`infera_smart_selection_total{tier="L3",source="fallback"}`) - l3Fallbacks; v != 1 {
		t.Fatalf("L3 fallbacks: %d", v)
	}
}

// Weight splitting does not look at models: smart model selection with it
// is refused at start and at reload, naming the way out.
func TestE2ESmartSelectionWithWeightSplitRefused(t *testing.T) {
	const msg = `switch split_proxy.strategy to "prefix" or disable split_proxy`
	bad := `{"smart_model_selection":{"enabled":true,"classifier_url":"http://127.0.0.1:8090/v1/classify",
	  "tiers":{"L1":"a","L2":"b","L3":"c"}},
	  "split_proxy":{"enabled":true,"strategy":"weight","proxies":[{"local":true,"weight":1}]}}`
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "bad.json")
	writeConfig(t, cfgPath, bad)
	_, err := New(parseServe(t, "--config", cfgPath))
	if err == nil || !strings.Contains(err.Error(), "smart_model_selection.enabled") || !strings.Contains(err.Error(), msg) {
		t.Fatalf("start with smart selection + weight split: %v", err)
	}
	// A running router refuses it at reload and keeps its config.
	_, e1 := startEngine(t, "--speedup", "50")
	good := filepath.Join(dir, "good.json")
	writeConfig(t, good, `{"split_proxy":{"enabled":true,"strategy":"weight","proxies":[{"local":true,"weight":1}]}}`)
	rt, r := startServe(t, "--workers", e1, "--config", good)
	writeConfig(t, good, bad)
	if _, err := rt.store.Reload(); err == nil || !strings.Contains(err.Error(), msg) {
		t.Fatalf("reload: %v", err)
	}
	if rt.store.Load().SmartModelSelection.Enabled {
		t.Fatal("the refused config was applied")
	}
	if resp, b := request(t, r+"/v1/chat/completions", chatJSON("sim-model", "hi", 2, false), nil); resp.StatusCode != 200 {
		t.Fatalf("after the refused reload: %d %s", resp.StatusCode, b)
	}
	// The prefix strategy is accepted.
	writeConfig(t, good, strings.Replace(bad, `"strategy":"weight"`, `"strategy":"prefix"`, 1))
	if _, err := rt.store.Reload(); err != nil {
		t.Fatalf("prefix: %v", err)
	}
}

// blackholeAddr returns a loopback address whose listen queue is full: a
// connect to it hangs (SYNs are dropped) until the dialer gives up.
func blackholeAddr(t *testing.T) string {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Listen(fd, 0); err != nil {
		t.Fatal(err)
	}
	sa, _ := syscall.Getsockname(fd)
	addr := fmt.Sprintf("127.0.0.1:%d", sa.(*syscall.SockaddrInet4).Port)
	for i := 0; i < 2; i++ { // fill the accept queue (never accepted)
		c, err := net.DialTimeout("tcp4", addr, 300*time.Millisecond)
		if err != nil {
			break
		}
		t.Cleanup(func() { c.Close() })
	}
	if c, err := net.DialTimeout("tcp4", addr, 300*time.Millisecond); err == nil {
		c.Close()
		t.Fatal("the listen queue is not full")
	}
	return addr
}

// The mirror dials its target within --connect-timeout, as the router
// dials workers: a target that never accepts costs a mirrored request the
// router's connect timeout (here 300 ms), not a fixed 3 s, even when
// mirror.timeout_ms allows much more.
func TestE2EMirrorDialHonoursConnectTimeout(t *testing.T) {
	hole := blackholeAddr(t)
	_, e1 := startEngine(t, "--speedup", "50")
	cfgPath := filepath.Join(t.TempDir(), "infera.json")
	writeConfig(t, cfgPath, fmt.Sprintf(`{"mirror":{"enabled":true,"target_address":"http://%s",
	  "sampling_ratio":100,"timeout_ms":20000}}`, hole))
	r := startChild(t, "serve", 0, "--workers", e1, "--config", cfgPath, "--connect-timeout", "300ms")
	const series = `infera_mirror_requests_total{result="timeout"}`
	before := metric(t, r.url, series)
	t0 := time.Now()
	resp, b := request(t, r.url+"/v1/chat/completions", chatJSON("sim-model", "hello", 2, false), nil)
	if resp.StatusCode != 200 {
		t.Fatalf("client answer: %d %s", resp.StatusCode, b)
	}
	for metric(t, r.url, series) == before {
		if time.Since(t0) > 10*time.Second {
			t.Fatal("the mirrored request to a target that never accepts did not end")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if el := time.Since(t0); el > 1500*time.Millisecond {
		t.Fatalf("the mirror gave up dialing after %v, not within --connect-timeout 300ms", el)
	}
	if got := metric(t, r.url, series); got != "1" {
		t.Fatalf("%s = %q, want 1", series, got)
	}
}
