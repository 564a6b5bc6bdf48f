package gateway

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/alecthomas/kong"
	"github.com/infera/infera/engine"
)

// startEngine runs a simulated engine in-process on a loopback port, built
// from the same flags as `infera engine`.
func startEngine(t *testing.T, args ...string) (*engine.Server, string) {
	t.Helper()
	s, url, _ := launchEngine(t, args...)
	return s, url
}

// startKVEngine is startEngine publishing KV events on a ZMQ endpoint the
// engine binds itself (tcp://127.0.0.1:*, a port ZMQ picks), returned as
// ep: a port picked free beforehand could be taken by another process
// before the engine binds it.
func startKVEngine(t *testing.T, args ...string) (s *engine.Server, url, ep string) {
	t.Helper()
	s, url, sink := launchEngine(t, append(args, "--kv-events-endpoint", "tcp://127.0.0.1:*")...)
	pub, ok := sink.(*engine.Publisher)
	if !ok || !strings.HasPrefix(pub.Endpoint(), "tcp://127.0.0.1:") || strings.HasSuffix(pub.Endpoint(), ":*") {
		t.Fatalf("the engine's KV event publisher: %T %v", sink, sink)
	}
	return s, url, pub.Endpoint()
}

// launchEngine is startEngine, also returning the engine's KV event sink
// (nil without --kv-events-endpoint).
func launchEngine(t *testing.T, args ...string) (*engine.Server, string, engine.KVEventSink) {
	t.Helper()
	var c struct {
		Engine engine.Cmd `cmd:""`
	}
	p, err := kong.New(&c, kong.Name("infera"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Parse(append([]string{"engine"}, args...)); err != nil {
		t.Fatal(err)
	}
	cfg, err := c.Engine.Config()
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.ID == "" || strings.HasPrefix(cfg.ID, "engine-") {
		cfg.ID = "engine-" + ln.Addr().String()
	}
	s, err := engine.NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	go s.Serve(ln)
	t.Cleanup(func() { s.Close() })
	return s, "http://" + ln.Addr().String(), cfg.Sink
}

// startServe runs the router exactly as `infera serve args...` wires it.
func startServe(t *testing.T, args ...string) (*Gateway, string) {
	t.Helper()
	f := parseServe(t, args...)
	rt, err := New(f)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go rt.Serve(ln)
	t.Cleanup(func() { rt.Shutdown(context.Background()); rt.Close() })
	return rt, "http://" + ln.Addr().String()
}

type chatResp struct {
	Choices []struct {
		Message struct {
			Content string `json:"content"`
		} `json:"message"`
		Text string `json:"text"`
	} `json:"choices"`
	Usage struct {
		PromptTokens        int `json:"prompt_tokens"`
		CompletionTokens    int `json:"completion_tokens"`
		PromptTokensDetails struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	} `json:"usage"`
}

func doPost(t *testing.T, url, body string) (*http.Response, []byte) {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, b
}

// Chat completions and completions, whole and streamed, round-robin over
// two engines, over both request transports.
func TestE2EStreamingAndNonStreaming(t *testing.T) {
	for _, transport := range []string{"http", "nats"} {
		t.Run(transport, func(t *testing.T) { testStreamingAndNonStreamingOver(t, transport) })
	}
}

func testStreamingAndNonStreamingOver(t *testing.T, transport string) {
	_, e1 := startEngine(t, "--speedup", "50")
	_, e2 := startEngine(t, "--speedup", "50")
	rt, r := startServe(t, append(overTransport(t, transport, e1, e2), "--router-policy", "round-robin")...)
	waitRoutable(t, rt, 2)

	seen := map[string]int{}
	for i := 0; i < 4; i++ {
		resp, b := doPost(t, r+"/v1/chat/completions", `{"model":"sim-model","max_tokens":5,"messages":[{"role":"user","content":"Hello, how are you today?"}]}`)
		var cr chatResp
		if resp.StatusCode != 200 || json.Unmarshal(b, &cr) != nil || cr.Usage.CompletionTokens != 5 || cr.Usage.PromptTokens == 0 {
			t.Fatalf("chat: %d %s", resp.StatusCode, b)
		}
		seen[resp.Header.Get("X-Infera-Engine-Id")]++
	}
	if len(seen) != 2 || seen[""] != 0 {
		t.Fatalf("round-robin over two engines served by %v", seen)
	}

	resp, b := doPost(t, r+"/v1/completions", `{"model":"sim-model","max_tokens":3,"prompt":"Once upon a time"}`)
	if resp.StatusCode != 200 || !strings.Contains(string(b), `"completion_tokens":3`) {
		t.Fatalf("completions: %d %s", resp.StatusCode, b)
	}

	resp, err := http.Post(r+"/v1/chat/completions", "application/json", strings.NewReader(
		`{"model":"sim-model","stream":true,"stream_options":{"include_usage":true},"max_tokens":6,"messages":[{"role":"user","content":"Stream please"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("stream content type %q", resp.Header.Get("Content-Type"))
	}
	sc := bufio.NewScanner(resp.Body)
	var events, content int
	var done, usage bool
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "data: ") {
			continue
		}
		events++
		if line == "data: [DONE]" {
			done = true
			continue
		}
		if strings.Contains(line, `"content":" `) {
			content++
		}
		if strings.Contains(line, `"completion_tokens":6`) {
			usage = true
		}
	}
	if !done || !usage || content != 6 {
		t.Fatalf("stream: events=%d content=%d done=%v usage=%v", events, content, done, usage)
	}
}

// A client that leaves five events into a 4,000-token stream has the
// engine stop generating, over both request transports.
func TestE2EClientDisconnectStopsGeneration(t *testing.T) {
	for _, transport := range []string{"http", "nats"} {
		t.Run(transport, func(t *testing.T) { testClientDisconnectStopsGenerationOver(t, transport) })
	}
}

func testClientDisconnectStopsGenerationOver(t *testing.T, transport string) {
	eng, e1 := startEngine(t, "--speedup", "5")
	rt, r := startServe(t, overTransport(t, transport, e1)...)
	waitRoutable(t, rt, 1)
	body := `{"model":"sim-model","stream":true,"max_tokens":4000,"messages":[{"role":"user","content":"long story"}]}`
	conn, err := net.Dial("tcp4", strings.TrimPrefix(r, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	br := bufio.NewReader(conn)
	for n := 0; n < 5; {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasPrefix(line, "data: ") {
			n++
		}
	}
	conn.Close()
	deadline := time.Now().Add(5 * time.Second)
	for eng.Stats().Aborted != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("engine never aborted: %+v", eng.Stats())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if st := eng.Stats(); st.GeneratedTokens >= 4000 || st.Completed != 0 || st.Active != 0 {
		t.Fatalf("engine kept generating: %+v", st)
	}
}

func TestE2EFailoverAndBreakerWithFaultInjection(t *testing.T) {
	bad, e1 := startEngine(t, "--speedup", "50", "--fault", "error", "--fault-status", "500")
	good, e2 := startEngine(t, "--speedup", "50")
	ln, _ := net.Listen("tcp4", "127.0.0.1:0")
	dead := "http://" + ln.Addr().String()
	ln.Close()
	rt, r := startServe(t, "--workers", "bad="+e1+",good="+e2+",dead="+dead, "--worker-model", "sim-model",
		"--router-policy", "round-robin", "--request-max-retries", "2", "--breaker-cooldown-s", "0.3", "--breaker-max-cooldown-s", "1")
	req := `{"model":"sim-model","max_tokens":2,"messages":[{"role":"user","content":"hi"}]}`
	for i := 0; i < 12; i++ {
		if resp, b := doPost(t, r+"/v1/chat/completions", req); resp.StatusCode != 200 {
			t.Fatalf("request %d: %d %s", i, resp.StatusCode, b)
		}
	}
	wb, wd := rt.fleet.Get("bad"), rt.fleet.Get("dead")
	if wb.Breaker.State() != 2 || wd.Breaker.State() != 2 {
		t.Fatalf("breakers: bad=%d dead=%d, want open", wb.Breaker.State(), wd.Breaker.State())
	}
	before := bad.Stats().RequestsTotal
	for i := 0; i < 5; i++ {
		doPost(t, r+"/v1/chat/completions", req)
	}
	if bad.Stats().RequestsTotal != before {
		t.Fatal("open worker still received requests")
	}
	// Heal the engine; after the cooldown the probe restores it.
	if err := bad.SetFault(engine.Fault{Mode: "none"}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(350 * time.Millisecond)
	for i := 0; i < 6; i++ {
		doPost(t, r+"/v1/chat/completions", req)
	}
	if wb.Breaker.State() != 0 || bad.Stats().Completed == 0 {
		t.Fatalf("healed worker not restored: state %d stats %+v", wb.Breaker.State(), bad.Stats())
	}
	if good.Stats().Completed == 0 {
		t.Fatal("good engine served nothing")
	}
}

func TestE2ETimeoutsAndConfigReload(t *testing.T) {
	_, e1 := startEngine(t, "--speedup", "50", "--fault", "hang")
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "infera.json")
	write := func(s string) {
		t.Helper()
		tmp := cfgPath + ".tmp"
		if err := os.WriteFile(tmp, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
		os.Rename(tmp, cfgPath)
	}
	write(`{"timeouts":{"non_stream_total_s":0.2,"stream_first_packet_s":0.2}}`)
	rt, r := startServe(t, "--workers", e1, "--config", cfgPath, "--config-poll", "20ms", "--request-max-retries", "0")
	req := `{"model":"sim-model","max_tokens":2,"messages":[{"role":"user","content":"hi"}]}`
	t0 := time.Now()
	resp, b := doPost(t, r+"/v1/chat/completions", req)
	if resp.StatusCode != 504 || time.Since(t0) > 2*time.Second {
		t.Fatalf("non-stream timeout: %d after %v: %s", resp.StatusCode, time.Since(t0), b)
	}
	resp, _ = doPost(t, r+"/v1/chat/completions", strings.Replace(req, `"max_tokens"`, `"stream":true,"max_tokens"`, 1))
	if resp.StatusCode != 504 {
		t.Fatalf("first-packet timeout: %d", resp.StatusCode)
	}
	// An invalid file is rejected; the old config keeps serving.
	write(`{"timeouts":{"non_stream_total_s":-5}}`)
	time.Sleep(100 * time.Millisecond)
	if rt.store.Load().Timeouts.NonStreamTotalSeconds != 0.2 {
		t.Fatal("invalid config was applied")
	}
	// A valid change applies without restart.
	write(`{"timeouts":{"non_stream_total_s":0.6}}`)
	for i := 0; rt.store.Load().Timeouts.NonStreamTotalSeconds != 0.6; i++ {
		if i > 200 {
			t.Fatal("valid config never applied")
		}
		time.Sleep(10 * time.Millisecond)
	}
	t0 = time.Now()
	resp, _ = doPost(t, r+"/v1/chat/completions", req)
	if el := time.Since(t0); resp.StatusCode != 504 || el < 500*time.Millisecond {
		t.Fatalf("reloaded timeout: %d after %v", resp.StatusCode, el)
	}
}

// The configuration center's scheduling features through the real router:
// each changes behaviour on a live reload.
func TestE2ESchedulingConfigReload(t *testing.T) {
	engA, eA := startEngine(t, "--speedup", "50", "--model", "Qwen2.5-72B-Instruct")
	engB, eB := startEngine(t, "--speedup", "50", "--model", "Qwen2.5-72B-Instruct")
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "infera.json")
	write := func(s string) {
		t.Helper()
		tmp := cfgPath + ".tmp"
		if err := os.WriteFile(tmp, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
		os.Rename(tmp, cfgPath)
	}
	write(`{"debug":{"decision_header":true},"model_routing":{"enabled":true,"fuzzy_match":true}}`)
	rt, r := startServe(t, "--workers", "a="+eA+",b="+eB, "--config", cfgPath, "--config-poll", "20ms",
		"--router-policy", "config", "--router-mode", "direct")
	waitCfg := func(cond func() bool) {
		t.Helper()
		for i := 0; !cond(); i++ {
			if i > 300 {
				t.Fatal("config never applied")
			}
			time.Sleep(10 * time.Millisecond)
		}
	}

	// Fuzzy model name: the engine receives its own name.
	resp, b := doPost(t, r+"/v1/chat/completions", `{"model":"qwen2.5_72b_instruct","max_tokens":2,"messages":[{"role":"user","content":"hi"}]}`)
	if resp.StatusCode != 200 || !strings.Contains(string(b), `"model":"Qwen2.5-72B-Instruct"`) {
		t.Fatalf("fuzzy: %d %s", resp.StatusCode, b)
	}
	if route := resp.Header.Get("X-Infera-Route"); !strings.Contains(route, "layer=") {
		t.Fatalf("decision header %q", route)
	}
	resp, b = doPost(t, r+"/v1/chat/completions", `{"model":"qwen2.5-72b-instrct","max_tokens":2,"messages":[{"role":"user","content":"hi"}]}`)
	if resp.StatusCode != 404 || !strings.Contains(string(b), "Qwen2.5-72B-Instruct") {
		t.Fatalf("unknown model: %d %s", resp.StatusCode, b)
	}

	// Direct mode: the named worker serves it.
	for i := 0; i < 3; i++ {
		req, _ := http.NewRequest("POST", r+"/v1/chat/completions", strings.NewReader(`{"model":"Qwen2.5-72B-Instruct","max_tokens":2,"messages":[{"role":"user","content":"hi"}]}`))
		req.Header.Set("x-worker-instance-id", "b")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 || resp.Header.Get("X-Infera-Worker") != "b" {
			t.Fatalf("direct: %d worker %q", resp.StatusCode, resp.Header.Get("X-Infera-Worker"))
		}
	}

	// Reload: require a session id, and a mapping alias.
	write(`{"session_affinity":{"enabled":true,"mode":"strong","require_session_id":true},
		"model_routing":{"enabled":true,"mappings":[{"pattern":"gpt-4*","services":["Qwen2.5-72B-Instruct"]}]},
		"debug":{"decision_header":true}}`)
	waitCfg(func() bool { return rt.store.Load().SessionAffinity.RequireSessionID })
	before := engA.Stats().RequestsTotal + engB.Stats().RequestsTotal
	resp, b = doPost(t, r+"/v1/chat/completions", `{"model":"gpt-4o","max_tokens":2,"messages":[{"role":"user","content":"hi"}]}`)
	if resp.StatusCode != 400 || engA.Stats().RequestsTotal+engB.Stats().RequestsTotal != before {
		t.Fatalf("require session: %d %s", resp.StatusCode, b)
	}
	served := map[string]int{}
	for i := 0; i < 6; i++ {
		req, _ := http.NewRequest("POST", r+"/v1/chat/completions", strings.NewReader(`{"model":"gpt-4o","max_tokens":2,"messages":[{"role":"user","content":"hi"}]}`))
		req.Header.Set("X-Session-Id", "s-42")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.Contains(string(body), `"model":"Qwen2.5-72B-Instruct"`) {
			t.Fatalf("mapped+session: %d %s", resp.StatusCode, body)
		}
		served[resp.Header.Get("X-Infera-Worker")]++
	}
	if len(served) != 1 {
		t.Fatalf("strong affinity spread one session over %v", served)
	}
	resp, err := http.Get(r + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	b, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(b), `"Qwen2.5-72B-Instruct"`) {
		t.Fatalf("models: %s", b)
	}
}

// Static workers in the config file follow reloads: added and removed
// without a restart, and a stream on a removed worker still completes.
func TestE2EConfigReloadWorkers(t *testing.T) {
	engA, eA := startEngine(t, "--speedup", "20")
	_, eB := startEngine(t, "--speedup", "20")
	cfgPath := filepath.Join(t.TempDir(), "infera.json")
	write := func(s string) {
		t.Helper()
		tmp := cfgPath + ".tmp"
		os.WriteFile(tmp, []byte(s), 0o644)
		os.Rename(tmp, cfgPath)
	}
	wa := fmt.Sprintf(`{"id":"a","url":%q,"models":["sim-model"]}`, eA)
	wb := fmt.Sprintf(`{"id":"b","url":%q,"models":["sim-model"]}`, eB)
	write(`{"workers":[` + wa + `]}`)
	rt, r := startServe(t, "--config", cfgPath, "--config-poll", "20ms", "--router-policy", "round-robin")
	if n := len(rt.fleet.View().Routable); n != 1 {
		t.Fatalf("routable %d", n)
	}
	write(`{"workers":[` + wa + `,` + wb + `]}`)
	for i := 0; len(rt.fleet.View().Routable) != 2; i++ {
		if i > 300 {
			t.Fatal("added worker never routable")
		}
		time.Sleep(10 * time.Millisecond)
	}
	// A long stream, pinned to a (the only worker until b's turn comes).
	var streamed string
	done := make(chan struct{})
	before := engA.Stats().Submitted
	go func() {
		defer close(done)
		for i := 0; i < 4; i++ {
			resp, err := http.Post(r+"/v1/chat/completions", "application/json", strings.NewReader(
				`{"model":"sim-model","stream":true,"max_tokens":40,"messages":[{"role":"user","content":"long"}]}`))
			if err != nil {
				return
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if engA.Stats().Submitted > before {
				streamed = string(b)
				return
			}
		}
	}()
	for engA.Stats().Active == 0 {
		time.Sleep(5 * time.Millisecond)
	}
	write(`{"workers":[` + wb + `]}`)
	for i := 0; rt.fleet.Get("a") != nil; i++ {
		if i > 300 {
			t.Fatal("removed worker still in the fleet")
		}
		time.Sleep(10 * time.Millisecond)
	}
	<-done
	if !strings.HasSuffix(streamed, "data: [DONE]\n\n") || strings.Contains(streamed, `"error"`) {
		t.Fatalf("stream on the removed worker was cut: %q", streamed)
	}
	if resp, b := doPost(t, r+"/v1/chat/completions", `{"model":"sim-model","max_tokens":2,"messages":[{"role":"user","content":"hi"}]}`); resp.StatusCode != 200 || resp.Header.Get("X-Infera-Engine-Id") == "" {
		t.Fatalf("after removal: %d %s", resp.StatusCode, b)
	}
}
