package gateway

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/infera/infera/internal/testsrv"
)

// With 4 simulated engines publishing real KV events over ZMQ and a
// shared-prefix workload, kv-aware routing sends each conversation's
// follow-up turn to the engine holding its prefix, and the engines' reported
// cached tokens confirm it.
func TestE2EKVAwareRouting(t *testing.T) {
	var workers []string
	for i := 0; i < 4; i++ {
		_, url, ep := startKVEngine(t, "--speedup", "50", "--block-size", "16")
		workers = append(workers, fmt.Sprintf(`{"id":"e%d","url":%q,"models":["sim-model"],"kv_events_endpoint":%q,"block_size":16}`, i, url, ep))
	}
	cfgPath := filepath.Join(t.TempDir(), "infera.json")
	os.WriteFile(cfgPath, []byte(`{"workers":[`+strings.Join(workers, ",")+`],"debug":{"decision_header":true}}`), 0o644)
	rt, r := startServe(t, "--config", cfgPath, "--router-policy", "kv-aware", "--kv-event-transport", "zmq", "--kv-block-size", "16")
	waitRoutable(t, rt, 4)
	time.Sleep(200 * time.Millisecond) // SUB sockets connect

	type turn struct {
		worker string
		cached int
		prompt int
	}
	send := func(body string) turn {
		t.Helper()
		resp, b := doPost(t, r+"/v1/chat/completions", body)
		var cr chatResp
		if resp.StatusCode != 200 || json.Unmarshal(b, &cr) != nil {
			t.Fatalf("%d %s", resp.StatusCode, b)
		}
		return turn{resp.Header.Get("X-Infera-Worker"), cr.Usage.PromptTokensDetails.CachedTokens, cr.Usage.PromptTokens}
	}
	msg := func(role, content string) string {
		b, _ := json.Marshal(map[string]string{"role": role, "content": content})
		return string(b)
	}
	const convs = 8
	first := make([]turn, convs)
	for c := 0; c < convs; c++ {
		sys := fmt.Sprintf("You are assistant %d. %s", c, strings.Repeat(fmt.Sprintf("Rule %d: be precise and kind. ", c), 40))
		first[c] = send(`{"model":"sim-model","max_tokens":4,"messages":[` + msg("system", sys) + `,` + msg("user", "first question") + `]}`)
	}
	time.Sleep(300 * time.Millisecond) // events flushed and applied
	hits := 0
	for c := 0; c < convs; c++ {
		sys := fmt.Sprintf("You are assistant %d. %s", c, strings.Repeat(fmt.Sprintf("Rule %d: be precise and kind. ", c), 40))
		second := send(`{"model":"sim-model","max_tokens":4,"messages":[` + msg("system", sys) + `,` + msg("user", "first question") +
			`,` + msg("assistant", "an answer") + `,` + msg("user", "a follow-up question") + `]}`)
		if second.worker == first[c].worker {
			hits++
		}
		if second.worker == first[c].worker && second.cached < second.prompt/2 {
			t.Errorf("conversation %d: same engine but only %d of %d prompt tokens cached", c, second.cached, second.prompt)
		}
	}
	if hits != convs {
		t.Fatalf("kv-aware sent %d of %d follow-up turns to the engine holding their prefix", hits, convs)
	}
	resp, err := http.Get(r + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var sb strings.Builder
	buf := make([]byte, 64<<10)
	for {
		n, err := resp.Body.Read(buf)
		sb.Write(buf[:n])
		if err != nil {
			break
		}
	}
	if !strings.Contains(sb.String(), "infera_kv_events_applied_total") {
		t.Fatal("no KV event metrics")
	}

	// /debug/route explains a decision without sending it; /tokenize answers in vLLM's shape.
	before := 0
	for _, w := range rt.fleet.View().All {
		before += int(w.Load.Requests.Load())
	}
	resp2, b := doPost(t, r+"/debug/route", `{"model":"sim-model","messages":[{"role":"user","content":"`+strings.Repeat("hello ", 50)+`"}]}`)
	if resp2.StatusCode != 200 || !strings.Contains(string(b), `"block_hashes"`) || !strings.Contains(string(b), `"kv"`) {
		t.Fatalf("debug/route: %d %s", resp2.StatusCode, b)
	}
	resp2, b = doPost(t, r+"/tokenize", `{"model":"sim-model","prompt":"abcdefgh"}`)
	if resp2.StatusCode != 200 || !strings.Contains(string(b), `"count":2`) {
		t.Fatalf("tokenize: %d %s", resp2.StatusCode, b)
	}
}

// KV events relayed by the worker sidecars over NATS change routing exactly
// as over ZMQ: follow-up turns reach the engine holding their prefix.
func TestE2EKVEventsOverNATS(t *testing.T) {
	etcd := testsrv.StartEtcd(t)
	nsrv := testsrv.StartNATS(t)
	for i := 0; i < 3; i++ {
		_, url, ep := startKVEngine(t, "--speedup", "50")
		startWorker(t, "--id", fmt.Sprintf("n%d", i), "--engine-url", url, "--discovery-backend", "etcd", "--etcd-endpoint", etcd.Endpoint,
			"--request-transport", "http", "--kv-event-transport", "nats", "--nats-url", nsrv.URL, "--kv-events-endpoint", ep, "--block-size", "16")
	}
	cfgPath := filepath.Join(t.TempDir(), "infera.json")
	os.WriteFile(cfgPath, []byte(`{"debug":{"decision_header":true}}`), 0o644)
	rt, r := startServe(t, "--config", cfgPath, "--discovery-backend", "etcd", "--etcd-endpoint", etcd.Endpoint,
		"--request-transport", "http", "--kv-event-transport", "nats", "--nats-url", nsrv.URL, "--router-policy", "kv-aware")
	waitRoutable(t, rt, 3)
	time.Sleep(300 * time.Millisecond)
	body := func(c int, followUp bool) string {
		sys := fmt.Sprintf("System prompt %d. %s", c, strings.Repeat(fmt.Sprintf("Rule %d applies. ", c), 40))
		m := fmt.Sprintf(`{"role":"system","content":%q},{"role":"user","content":"q1"}`, sys)
		if followUp {
			m += `,{"role":"assistant","content":"a1"},{"role":"user","content":"q2"}`
		}
		return `{"model":"sim-model","max_tokens":3,"messages":[` + m + `]}`
	}
	const convs = 6
	first := make([]string, convs)
	for c := 0; c < convs; c++ {
		resp, b := doPost(t, r+"/v1/chat/completions", body(c, false))
		if resp.StatusCode != 200 {
			t.Fatalf("%d %s", resp.StatusCode, b)
		}
		first[c] = resp.Header.Get("X-Infera-Worker")
	}
	time.Sleep(300 * time.Millisecond)
	for c := 0; c < convs; c++ {
		resp, b := doPost(t, r+"/v1/chat/completions", body(c, true))
		var cr chatResp
		json.Unmarshal(b, &cr)
		if w := resp.Header.Get("X-Infera-Worker"); w != first[c] || cr.Usage.PromptTokensDetails.CachedTokens == 0 {
			t.Fatalf("conversation %d: follow-up went to %s (first turn on %s), cached %d", c, w, first[c], cr.Usage.PromptTokensDetails.CachedTokens)
		}
	}
}

// With the real Qwen3 tokenizer and chat template on both sides (router
// --router-tokenizer-path, engine --tokenizer), the router's block hashes
// match the engines' KV events: follow-up turns land where their prefix is.
func TestE2EKVAwareWithHFTokenizer(t *testing.T) {
	dir := filepath.Join("..", "testdata", "tokenizers", "qwen3")
	if _, err := os.Stat(filepath.Join(dir, "tokenizer.json")); err != nil {
		if os.Getenv("INFERA_REQUIRE_TOKENIZER") == "1" {
			t.Fatalf("tokenizer missing (make tokenizer): %v", err)
		}
		t.Skip("tokenizer not fetched; run make tokenizer")
	}
	var workers []string
	for i := 0; i < 2; i++ {
		_, url, ep := startKVEngine(t, "--speedup", "50", "--tokenizer", dir)
		workers = append(workers, fmt.Sprintf(`{"id":"q%d","url":%q,"models":["sim-model"],"kv_events_endpoint":%q,"block_size":16}`, i, url, ep))
	}
	cfgPath := filepath.Join(t.TempDir(), "infera.json")
	os.WriteFile(cfgPath, []byte(`{"workers":[`+strings.Join(workers, ",")+`],"debug":{"decision_header":true}}`), 0o644)
	rt, r := startServe(t, "--config", cfgPath, "--router-policy", "kv-aware", "--router-tokenizer-path", dir)
	waitRoutable(t, rt, 2)
	time.Sleep(200 * time.Millisecond)
	sys := strings.Repeat("You are a meticulous assistant who answers in French. ", 30)
	for c := 0; c < 4; c++ {
		first := fmt.Sprintf(`{"model":"sim-model","max_tokens":3,"messages":[{"role":"system","content":%q},{"role":"user","content":"Question %d?"}]}`, sys+fmt.Sprint(c), c)
		before := rt.kvIndex.Stats().Entries
		resp, b := doPost(t, r+"/v1/chat/completions", first)
		if resp.StatusCode != 200 {
			t.Fatalf("%d %s", resp.StatusCode, b)
		}
		w1 := resp.Header.Get("X-Infera-Worker")
		// The engine's KV event of the prompt (its blocks past the
		// system prompt the conversations share are new) reaches the
		// index: a fixed sleep was too short on a loaded machine.
		for deadline := time.Now().Add(10 * time.Second); rt.kvIndex.Stats().Entries <= before && time.Now().Before(deadline); {
			time.Sleep(10 * time.Millisecond)
		}
		follow := strings.Replace(first, `}]}`, `},{"role":"assistant","content":"Réponse."},{"role":"user","content":"Et ensuite ?"}]}`, 1)
		resp, b = doPost(t, r+"/v1/chat/completions", follow)
		var cr chatResp
		json.Unmarshal(b, &cr)
		if w2 := resp.Header.Get("X-Infera-Worker"); w2 != w1 || cr.Usage.PromptTokensDetails.CachedTokens < cr.Usage.PromptTokens/2 {
			t.Fatalf("conversation %d: first on %s, follow-up on %s with %d/%d cached", c, w1, w2, cr.Usage.PromptTokensDetails.CachedTokens, cr.Usage.PromptTokens)
		}
	}
	// /tokenize agrees with the engine's prompt token count.
	resp, b := doPost(t, r+"/tokenize", `{"model":"sim-model","messages":[{"role":"user","content":"Hello"}]}`)
	var tk struct {
		Count int `json:"count"`
	}
	if resp.StatusCode != 200 || json.Unmarshal(b, &tk) != nil || tk.Count == 0 {
		t.Fatalf("tokenize: %d %s", resp.StatusCode, b)
	}
	resp, b = doPost(t, r+"/v1/chat/completions", `{"model":"sim-model","max_tokens":1,"messages":[{"role":"user","content":"Hello"}]}`)
	var cr chatResp
	if resp.StatusCode != 200 || json.Unmarshal(b, &cr) != nil || cr.Usage.PromptTokens != tk.Count {
		t.Fatalf("router counts %d prompt tokens, engine %d (%s)", tk.Count, cr.Usage.PromptTokens, b)
	}
}

// Two sidecars started with one --id, each beside its own engine, relay
// KV events on one NATS subject; the first engine has been serving for a
// while when the second comes up. The router follows one engine's cache
// (here the second's: its relay is the newer, and its sidecar registered
// last, so etcd holds its record and requests reach it), drops the other's
// events, and says so on /metrics.
func TestE2ETwoSidecarsWithOneIDOverNATSIndexOneEngine(t *testing.T) {
	etcd := testsrv.StartEtcd(t)
	nsrv := testsrv.StartNATS(t)
	cfgPath := filepath.Join(t.TempDir(), "infera.json")
	os.WriteFile(cfgPath, []byte(`{}`), 0o644)
	rt, r := startServe(t, "--config", cfgPath, "--discovery-backend", "etcd", "--etcd-endpoint", etcd.Endpoint,
		"--request-transport", "http", "--kv-event-transport", "nats", "--nats-url", nsrv.URL, "--router-policy", "kv-aware")
	body := func(engine, c int) string {
		sys := fmt.Sprintf("Engine %d, conversation %d. %s", engine, c, strings.Repeat(fmt.Sprintf("Rule %d.%d applies. ", engine, c), 30))
		return fmt.Sprintf(`{"model":"sim-model","max_tokens":2,"messages":[{"role":"system","content":%q},{"role":"user","content":"q"}]}`, sys)
	}
	var urls []string
	serve := func(engine, c int) {
		t.Helper()
		if resp, b := doPost(t, urls[engine]+"/v1/chat/completions", body(engine, c)); resp.StatusCode != 200 {
			t.Fatalf("engine %d: %d %s", engine, resp.StatusCode, b)
		}
	}
	for i := 0; i < 2; i++ {
		_, url, ep := startKVEngine(t, "--speedup", "50")
		urls = append(urls, url)
		startWorker(t, "--id", "dup", "--engine-url", url, "--discovery-backend", "etcd", "--etcd-endpoint", etcd.Endpoint,
			"--request-transport", "http", "--kv-event-transport", "nats", "--nats-url", nsrv.URL, "--kv-events-endpoint", ep, "--block-size", "16")
		for j := 0; j < 500 && (rt.fleet.Get("dup") == nil || rt.fleet.Get("dup").URL != url); j++ {
			time.Sleep(10 * time.Millisecond)
		}
		if w := rt.fleet.Get("dup"); w == nil || w.URL != url {
			t.Fatalf("the router does not route worker dup to the sidecar registered last (%s)", url)
		}
		time.Sleep(300 * time.Millisecond) // the relay's SUB socket connects
		if i == 0 {
			for c := 0; c < 10; c++ { // engine 0 has been serving for a while
				serve(0, 100+c)
			}
		}
	}
	const convs = 12
	for c := 0; c < convs; c++ { // both engines serve: their events interleave
		serve(0, c)
		serve(1, c)
	}
	time.Sleep(500 * time.Millisecond) // events relayed and applied
	overlap := func(engine, c int) int {
		t.Helper()
		resp, b := doPost(t, r+"/debug/route", body(engine, c))
		var out struct {
			KV struct {
				Candidates []struct {
					Worker        string `json:"worker"`
					OverlapBlocks int    `json:"overlap_blocks"`
				} `json:"candidates"`
			} `json:"kv"`
		}
		if resp.StatusCode != 200 || json.Unmarshal(b, &out) != nil {
			t.Fatalf("debug/route: %d %s", resp.StatusCode, b)
		}
		for _, c := range out.KV.Candidates { // none when nothing is cached
			if c.Worker == "dup" {
				return c.OverlapBlocks
			}
		}
		return 0
	}
	var indexed [2]int
	for c := 0; c < convs; c++ {
		for e := 0; e < 2; e++ {
			if overlap(e, c) > 0 {
				indexed[e]++
			}
		}
	}
	resp, err := http.Get(r + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	mb, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var lines []string
	for _, l := range strings.Split(string(mb), "\n") {
		if strings.Contains(l, `worker="dup"`) && (strings.Contains(l, "resyncs") || strings.Contains(l, "gaps") || strings.Contains(l, "publisher")) {
			lines = append(lines, l)
		}
	}
	t.Logf("conversations indexed: engine 0 %d of %d, engine 1 %d of %d; %s", indexed[0], convs, indexed[1], convs, strings.Join(lines, ", "))
	if indexed[0] != 0 || indexed[1] != convs {
		t.Errorf("the index holds %d of engine 0's and %d of engine 1's %d conversations, want engine 1's only", indexed[0], indexed[1], convs)
	}
	if !strings.Contains(string(mb), `infera_kv_duplicate_publisher{worker="dup"} 1`) {
		t.Errorf("/metrics does not flag the duplicate publisher")
	}
}
