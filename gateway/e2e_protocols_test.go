package gateway

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// End-to-end tests of the protocol front doors (docs/protocols.md) through
// `infera serve` and simulated engines.

// waitConfig waits until the gateway's snapshot satisfies cond.
func waitConfig(t *testing.T, g *Gateway, cond func() bool) {
	t.Helper()
	for i := 0; !cond(); i++ {
		if i > 300 {
			t.Fatal("config never applied")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// In passthrough mode the router forwards /v1/messages to the engine's own
// /v1/messages: an engine that does not serve it answers 404 (relayed),
// one that does answers; in conversion mode the same engine without
// native protocols serves the request through chat completions.
func TestE2EPassthroughReachesTheEnginesOwnPath(t *testing.T) {
	_, plain := startEngine(t, "--speedup", "50")
	_, native := startEngine(t, "--speedup", "50", "--native-protocols")
	cfgPath := filepath.Join(t.TempDir(), "infera.json")
	writeConfig(t, cfgPath, `{"protocol":{"anthropic_passthrough":true}}`)
	_, rPlain := startServe(t, "--workers", plain, "--config", cfgPath)
	_, rNative := startServe(t, "--workers", native, "--config", cfgPath)
	req := `{"model":"sim-model","max_tokens":3,"messages":[{"role":"user","content":"hi"}]}`
	resp, b := doPost(t, rPlain+"/v1/messages", req)
	if resp.StatusCode != 404 || !strings.Contains(string(b), "unknown path") {
		t.Fatalf("passthrough to an engine without /v1/messages: %d %s", resp.StatusCode, b)
	}
	resp, b = doPost(t, rNative+"/v1/messages", req)
	if resp.StatusCode != 200 || !strings.Contains(string(b), `"type":"message"`) {
		t.Fatalf("passthrough to an engine with /v1/messages: %d %s", resp.StatusCode, b)
	}
	// count_tokens is the engine's too.
	resp, b = doPost(t, rNative+"/v1/messages/count_tokens", `{"model":"sim-model","messages":[{"role":"user","content":"hi"}]}`)
	if resp.StatusCode != 200 || !strings.HasPrefix(string(b), `{"input_tokens":`) {
		t.Fatalf("count_tokens: %d %s", resp.StatusCode, b)
	}
	_, rConv := startServe(t, "--workers", plain)
	resp, b = doPost(t, rConv+"/v1/messages", req)
	if resp.StatusCode != 200 || !strings.Contains(string(b), `"type":"message"`) {
		t.Fatalf("conversion: %d %s", resp.StatusCode, b)
	}
}

// Routing sees through the protocol: under kv-aware routing with real KV
// events, the follow-up turn of a conversation held over the Anthropic
// Messages API (or the Responses API) lands on the engine that holds its
// prefix, as a chat completions follow-up does, and the engine reports
// the prefix cached. A conversation may even change front doors: the
// converted prompts render alike.
func TestE2EProtocolFollowUpLandsOnThePrefixHolder(t *testing.T) {
	var workers []string
	for i := 0; i < 4; i++ {
		_, url, ep := startKVEngine(t, "--speedup", "50", "--block-size", "16")
		workers = append(workers, fmt.Sprintf(`{"id":"e%d","url":%q,"models":["sim-model"],"kv_events_endpoint":%q,"block_size":16}`, i, url, ep))
	}
	cfgPath := filepath.Join(t.TempDir(), "infera.json")
	writeConfig(t, cfgPath, `{"workers":[`+strings.Join(workers, ",")+`],"debug":{"decision_header":true}}`)
	rt, r := startServe(t, "--config", cfgPath, "--router-policy", "kv-aware", "--kv-event-transport", "zmq", "--kv-block-size", "16")
	waitRoutable(t, rt, 4)
	time.Sleep(200 * time.Millisecond) // SUB sockets connect

	type turn struct {
		worker         string
		cached, prompt int
	}
	str := func(s string) string {
		b, _ := json.Marshal(s)
		return string(b)
	}
	anthropic := func(sys string, msgs ...string) turn {
		t.Helper()
		var m []string
		for i, c := range msgs {
			role := "user"
			if i%2 == 1 {
				role = "assistant"
			}
			m = append(m, `{"role":"`+role+`","content":`+str(c)+`}`)
		}
		resp, b := doPost(t, r+"/v1/messages", `{"model":"sim-model","max_tokens":4,"system":`+str(sys)+`,"messages":[`+strings.Join(m, ",")+`]}`)
		var out struct {
			Usage struct {
				Input     int `json:"input_tokens"`
				CacheRead int `json:"cache_read_input_tokens"`
			} `json:"usage"`
		}
		if resp.StatusCode != 200 || json.Unmarshal(b, &out) != nil {
			t.Fatalf("%d %s", resp.StatusCode, b)
		}
		return turn{resp.Header.Get("X-Infera-Worker"), out.Usage.CacheRead, out.Usage.Input + out.Usage.CacheRead}
	}
	responses := func(sys string, msgs ...string) turn {
		t.Helper()
		var items []string
		for i, c := range msgs {
			role := "user"
			if i%2 == 1 {
				role = "assistant"
			}
			items = append(items, `{"role":"`+role+`","content":`+str(c)+`}`)
		}
		resp, b := doPost(t, r+"/v1/responses", `{"model":"sim-model","max_output_tokens":4,"instructions":`+str(sys)+`,"input":[`+strings.Join(items, ",")+`]}`)
		var out struct {
			Usage struct {
				Input   int `json:"input_tokens"`
				Details struct {
					Cached int `json:"cached_tokens"`
				} `json:"input_tokens_details"`
			} `json:"usage"`
		}
		if resp.StatusCode != 200 || json.Unmarshal(b, &out) != nil {
			t.Fatalf("%d %s", resp.StatusCode, b)
		}
		return turn{resp.Header.Get("X-Infera-Worker"), out.Usage.Details.Cached, out.Usage.Input}
	}
	sys := func(c int) string {
		return fmt.Sprintf("You are assistant %d. %s", c, strings.Repeat(fmt.Sprintf("Rule %d: be precise and kind. ", c), 40))
	}
	const convs = 8
	first := make([]turn, convs)
	for c := 0; c < convs; c++ {
		if c%2 == 0 {
			first[c] = anthropic(sys(c), "first question")
		} else {
			first[c] = responses(sys(c), "first question")
		}
	}
	time.Sleep(300 * time.Millisecond) // events flushed and applied
	hits := 0
	for c := 0; c < convs; c++ {
		var second turn
		switch c % 4 {
		case 0, 1: // follow-up through the same door
			if c%2 == 0 {
				second = anthropic(sys(c), "first question", "an answer", "a follow-up question")
			} else {
				second = responses(sys(c), "first question", "an answer", "a follow-up question")
			}
		default: // the other door
			if c%2 == 0 {
				second = responses(sys(c), "first question", "an answer", "a follow-up question")
			} else {
				second = anthropic(sys(c), "first question", "an answer", "a follow-up question")
			}
		}
		if second.worker == first[c].worker {
			hits++
			if second.cached < second.prompt/2 {
				t.Errorf("conversation %d: same engine but only %d of %d prompt tokens cached", c, second.cached, second.prompt)
			}
		}
	}
	if hits != convs {
		t.Fatalf("kv-aware sent %d of %d protocol follow-up turns to the engine holding their prefix", hits, convs)
	}
}

// streamChat streams a chat completion and returns the raw SSE body.
func streamChat(t *testing.T, url, body string) string {
	t.Helper()
	resp, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || !strings.HasSuffix(string(b), "data: [DONE]\n\n") {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	return string(b)
}

// promptTokensMetric reads the router's prompt token counter.
func promptTokensMetric(t *testing.T, url string) int {
	t.Helper()
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, `infera_usage_tokens_total{kind="prompt"} `); ok {
			var n int
			fmt.Sscan(v, &n)
			return n
		}
	}
	return 0
}

// The router always asks the engine for streaming usage (the simulated
// engine sends it only when asked) and accounts it; the usage chunk reaches
// a client that did not ask only with force_stream_usage, switched live.
func TestE2EStreamUsageForcedOnReload(t *testing.T) {
	_, e := startEngine(t, "--speedup", "50")
	cfgPath := filepath.Join(t.TempDir(), "infera.json")
	writeConfig(t, cfgPath, `{}`)
	rt, r := startServe(t, "--workers", e, "--config", cfgPath, "--config-poll", "20ms")
	notAsked := `{"model":"sim-model","stream":true,"max_tokens":3,"messages":[{"role":"user","content":"count me"}]}`
	asked := strings.Replace(notAsked, `"stream":true`, `"stream":true,"stream_options":{"include_usage":true}`, 1)

	before := promptTokensMetric(t, r)
	if b := streamChat(t, r, notAsked); strings.Contains(b, `"usage"`) {
		t.Fatalf("usage relayed to a client that did not ask: %s", b)
	}
	if after := promptTokensMetric(t, r); after <= before {
		t.Fatalf("the router did not account the stream's usage: %d -> %d", before, after)
	}
	if b := streamChat(t, r, asked); !strings.Contains(b, `"completion_tokens":3`) {
		t.Fatalf("usage not relayed to a client that asked: %s", b)
	}
	writeConfig(t, cfgPath, `{"protocol":{"force_stream_usage":true}}`)
	waitConfig(t, rt, func() bool { return rt.store.Load().Protocol.ForceStreamUsage })
	if b := streamChat(t, r, notAsked); !strings.Contains(b, `"completion_tokens":3`) {
		t.Fatalf("force_stream_usage: no usage chunk: %s", b)
	}
}

// Reasoning modes, switched live, against an engine that reasons when asked
// (reasoning_effort, or chat_template_kwargs.enable_thinking).
func TestE2EReasoningModesOnReload(t *testing.T) {
	_, e := startEngine(t, "--speedup", "50", "--reasoning")
	cfgPath := filepath.Join(t.TempDir(), "infera.json")
	writeConfig(t, cfgPath, `{}`)
	rt, r := startServe(t, "--workers", e, "--config", cfgPath, "--config-poll", "20ms")
	chat := func(effort string) bool {
		t.Helper()
		resp, b := doPost(t, r+"/v1/chat/completions", `{"model":"sim-model","max_tokens":4,"reasoning_effort":"`+effort+`","messages":[{"role":"user","content":"think"}]}`)
		if resp.StatusCode != 200 {
			t.Fatalf("%d %s", resp.StatusCode, b)
		}
		return strings.Contains(string(b), `"reasoning_content"`)
	}
	thinking := func() bool {
		t.Helper()
		resp, b := doPost(t, r+"/v1/messages", `{"model":"sim-model","max_tokens":4,"thinking":{"type":"enabled","budget_tokens":2048},"messages":[{"role":"user","content":"think"}]}`)
		if resp.StatusCode != 200 {
			t.Fatalf("%d %s", resp.StatusCode, b)
		}
		return strings.Contains(string(b), `"type":"thinking"`)
	}
	reasoningItem := func() bool {
		t.Helper()
		resp, b := doPost(t, r+"/v1/responses", `{"model":"sim-model","max_output_tokens":4,"reasoning":{"effort":"low"},"input":"think"}`)
		if resp.StatusCode != 200 {
			t.Fatalf("%d %s", resp.StatusCode, b)
		}
		return strings.Contains(string(b), `"type":"reasoning"`)
	}
	set := func(mode, extra string) {
		t.Helper()
		writeConfig(t, cfgPath, `{"protocol":{"reasoning_effort_mode":"`+mode+`"`+extra+`}}`)
		waitConfig(t, rt, func() bool { return rt.store.Load().Protocol.ReasoningEffortMode == mode })
	}
	type want struct{ high, minimal, thinking, item bool }
	check := func(name string, w want) {
		t.Helper()
		got := want{chat("high"), chat("minimal"), thinking(), reasoningItem()}
		if got != w {
			t.Fatalf("%s: got %+v, want %+v", name, got, w)
		}
	}
	// passthrough: the engine gets reasoning_effort (Anthropic thinking as
	// the effort its budget maps to).
	check("passthrough", want{high: true, minimal: false, thinking: true, item: true})
	set("drop", "")
	check("drop", want{})
	set("map", `,"reasoning_map":{"target":"enable_thinking","thinking_off_efforts":["none","minimal","low"]}`)
	check("map, low is off", want{high: true}) // a 2048-token budget is low
	set("map", `,"reasoning_map":{"target":"enable_thinking","thinking_off_efforts":["none"]}`)
	waitConfig(t, rt, func() bool { return len(rt.store.Load().Protocol.ReasoningMap.ThinkingOffEfforts) == 1 })
	check("map, only none is off", want{high: true, minimal: true, thinking: true, item: true})
}
