package engine

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/infera/infera/tokenizer"
)

type testEngine struct {
	srv  *Server
	base string
}

func startEngine(t *testing.T, mutate func(*Config)) *testEngine {
	t.Helper()
	tm := DefaultTimeModel()
	tm.Speedup = 20
	cfg := Config{
		ID:               "engine-test",
		Models:           []string{"sim-model", "other"},
		Core:             CoreConfig{BlockSize: 16, CapacityBlocks: 4096, MaxBatch: 16, MaxPrefillTokens: 8192, Time: tm},
		DefaultMaxTokens: 8,
		Fault:            Fault{Mode: FaultNone},
	}
	if mutate != nil {
		mutate(&cfg)
	}
	srv, err := NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return &testEngine{srv: srv, base: "http://" + ln.Addr().String()}
}

var testClient = &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{DisableCompression: true}}

func (e *testEngine) post(t *testing.T, path, body string) (int, []byte, http.Header) {
	t.Helper()
	resp, err := testClient.Post(e.base+path, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatalf("POST %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("POST %s: reading body: %v", path, err)
	}
	return resp.StatusCode, b, resp.Header
}

func (e *testEngine) get(t *testing.T, path string) (int, []byte) {
	t.Helper()
	resp, err := testClient.Get(e.base + path)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

func (e *testEngine) stats(t *testing.T) Stats {
	t.Helper()
	code, b := e.get(t, "/admin/stats")
	var s Stats
	if code != 200 || json.Unmarshal(b, &s) != nil {
		t.Fatalf("stats: %d %s", code, b)
	}
	return s
}

// waitStats polls stats until cond holds (bounded).
func (e *testEngine) waitStats(t *testing.T, what string, cond func(Stats) bool) Stats {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		s := e.stats(t)
		if cond(s) {
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s; stats %+v", what, s)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

type usageJSON struct {
	PromptTokens        int `json:"prompt_tokens"`
	CompletionTokens    int `json:"completion_tokens"`
	TotalTokens         int `json:"total_tokens"`
	PromptTokensDetails struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

type responseJSON struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	Model   string `json:"model"`
	Choices []struct {
		Index   int `json:"index"`
		Message *struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"message"`
		Delta *struct {
			Role    *string `json:"role"`
			Content *string `json:"content"`
		} `json:"delta"`
		Text         *string `json:"text"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *usageJSON `json:"usage"`
}

func chatPromptTokens(t *testing.T, msgs []tokenizer.Message, tools []byte) int {
	t.Helper()
	var tk tokenizer.Simple
	text, err := tk.RenderChat(nil, msgs, tools, true)
	if err != nil {
		t.Fatal(err)
	}
	return len(tk.Encode(nil, text))
}

func TestServerChatNonStream(t *testing.T) {
	e := startEngine(t, nil)
	body := `{"model":"sim-model","max_tokens":5,"messages":[{"role":"system","content":"be brief"},` +
		`{"role":"user","content":[{"type":"text","text":"hello "},{"type":"image_url","image_url":{"url":"x"}},{"type":"text","text":"world"}]}],` +
		`"tools":[{"type":"function","function":{"name":"f"}}]}`
	code, b, h := e.post(t, "/v1/chat/completions", body)
	if code != 200 {
		t.Fatalf("status %d: %s", code, b)
	}
	if got := h.Get("X-Infera-Engine-Id"); got != "engine-test" {
		t.Fatalf("engine id header %q", got)
	}
	var r responseJSON
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatalf("bad JSON %s: %v", b, err)
	}
	if !strings.HasPrefix(r.ID, "chatcmpl-") || r.Object != "chat.completion" || r.Model != "sim-model" || r.Created == 0 {
		t.Fatalf("head %+v", r)
	}
	if len(r.Choices) != 1 || r.Choices[0].Message == nil || r.Choices[0].Message.Role != "assistant" ||
		r.Choices[0].Message.Content != " The quick brown fox jumps" || *r.Choices[0].FinishReason != "length" {
		t.Fatalf("choices %s", b)
	}
	want := chatPromptTokens(t, []tokenizer.Message{{Role: "system", Content: "be brief"}, {Role: "user", Content: "hello world"}},
		[]byte(`[{"type":"function","function":{"name":"f"}}]`))
	if u := r.Usage; u == nil || u.PromptTokens != want || u.CompletionTokens != 5 || u.TotalTokens != want+5 {
		t.Fatalf("usage %+v, want prompt %d", r.Usage, want)
	}
}

func TestServerCompletionsPromptForms(t *testing.T) {
	e := startEngine(t, nil)
	f := func(prompt string, wantPrompt int) {
		t.Helper()
		code, b, _ := e.post(t, "/v1/completions", `{"model":"other","prompt":`+prompt+`}`)
		if code != 200 {
			t.Fatalf("prompt %s: status %d: %s", prompt, code, b)
		}
		var r responseJSON
		if err := json.Unmarshal(b, &r); err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(r.ID, "cmpl-") || r.Object != "text_completion" || r.Model != "other" ||
			len(r.Choices) != 1 || r.Choices[0].Text == nil || *r.Choices[0].Text == "" {
			t.Fatalf("response %s", b)
		}
		if r.Usage.PromptTokens != wantPrompt || r.Usage.CompletionTokens != 8 {
			t.Fatalf("prompt %s: usage %+v, want %d prompt tokens, 8 completion", prompt, r.Usage, wantPrompt)
		}
	}
	f(`"abcdefgh"`, 2)
	f(`"abcdefghi"`, 3)
	f(`["abcd"]`, 1)
	f(`[1,2,3,4,5]`, 5)
	f(`[[7,8]]`, 2)
	// A batch of prompts is refused (the first alone was answered, 200,
	// the others dropped), and a 404 is no malformed request.
	for _, batch := range []string{`["abcd","second"]`, `[[7,8],[9]]`} {
		if code, b, _ := e.post(t, "/v1/completions", `{"model":"other","prompt":`+batch+`}`); code != 400 || !strings.Contains(string(b), "one prompt per request") {
			t.Fatalf("batch %s: %d %s", batch, code, b)
		}
	}
	before := e.srv.badRequests.Load()
	if code, _, _ := e.post(t, "/v1/completions", `{"model":"nope","prompt":"x"}`); code != 404 || e.srv.badRequests.Load() != before {
		t.Fatalf("unknown model: %d, bad requests %d -> %d", code, before, e.srv.badRequests.Load())
	}
}

// readSSE reads an SSE body and returns the data payloads.
func readSSE(t *testing.T, r io.Reader) ([]string, error) {
	t.Helper()
	var out []string
	br := bufio.NewReader(r)
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			return out, err
		}
		line = strings.TrimRight(line, "\n")
		if line == "" {
			continue
		}
		if !strings.HasPrefix(line, "data: ") {
			t.Fatalf("bad SSE line %q", line)
		}
		out = append(out, strings.TrimPrefix(line, "data: "))
		if out[len(out)-1] == "[DONE]" {
			return out, nil
		}
	}
}

func TestServerStream(t *testing.T) {
	e := startEngine(t, nil)
	f := func(path, body string, chat, usage bool, n int) {
		t.Helper()
		resp, err := testClient.Post(e.base+path, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
			t.Fatalf("status %d content-type %q", resp.StatusCode, resp.Header.Get("Content-Type"))
		}
		data, err := readSSE(t, resp.Body)
		if err != nil {
			t.Fatalf("stream: %v after %q", err, data)
		}
		var text strings.Builder
		tokens, finals := 0, 0
		var gotUsage *usageJSON
		for _, d := range data[:len(data)-1] {
			var c responseJSON
			if err := json.Unmarshal([]byte(d), &c); err != nil {
				t.Fatalf("chunk %q: %v", d, err)
			}
			wantObj := "text_completion"
			if chat {
				wantObj = "chat.completion.chunk"
			}
			if c.Object != wantObj || c.Model != "sim-model" {
				t.Fatalf("chunk head %q", d)
			}
			if c.Usage != nil {
				if len(c.Choices) != 0 {
					t.Fatalf("usage chunk with choices %q", d)
				}
				gotUsage = c.Usage
				continue
			}
			ch := c.Choices[0]
			if ch.FinishReason != nil {
				finals++
				if *ch.FinishReason != "length" {
					t.Fatalf("finish reason %q", *ch.FinishReason)
				}
				continue
			}
			var piece string
			if chat {
				if ch.Delta == nil || ch.Delta.Content == nil {
					t.Fatalf("chat chunk without delta content %q", d)
				}
				if ch.Delta.Role != nil {
					continue // role chunk
				}
				piece = *ch.Delta.Content
			} else {
				piece = *ch.Text
			}
			tokens++
			text.WriteString(piece)
		}
		if tokens != n || finals != 1 {
			t.Fatalf("%d token chunks, %d finals, want %d, 1: %q", tokens, finals, n, data)
		}
		if want := string(appendFiller(nil, 0, n)); text.String() != want {
			t.Fatalf("text %q, want %q", text.String(), want)
		}
		if usage != (gotUsage != nil) {
			t.Fatalf("usage chunk presence %v, want %v", gotUsage != nil, usage)
		}
		if usage && (gotUsage.CompletionTokens != n || gotUsage.PromptTokens == 0) {
			t.Fatalf("usage %+v", gotUsage)
		}
	}
	f("/v1/chat/completions", `{"model":"sim-model","stream":true,"max_completion_tokens":6,"messages":[{"role":"user","content":"hi"}],"stream_options":{"include_usage":true}}`, true, true, 6)
	f("/v1/chat/completions", `{"stream":true,"max_tokens":3,"messages":[{"role":"user","content":"hi"}]}`, true, false, 3)
	f("/v1/completions", `{"model":"sim-model","stream":true,"max_tokens":4,"prompt":"once upon a time","stream_options":{"include_usage":true}}`, false, true, 4)
	f("/v1/completions", `{"stream":true,"prompt":[5,6,7]}`, false, false, 8)
	s := e.stats(t)
	if s.Completed != 4 || s.Aborted != 0 || s.GeneratedTokens != 21 || s.RequestsTotal != 4 {
		t.Fatalf("stats %+v", s)
	}
}

// streamTTFT sends a streaming completion and returns the time to the first
// token chunk and the reported usage.
func streamTTFT(t *testing.T, e *testEngine, body string) (time.Duration, usageJSON) {
	t.Helper()
	start := time.Now()
	resp, err := testClient.Post(e.base+"/v1/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	var ttft time.Duration
	var u usageJSON
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("stream: %v", err)
		}
		if !strings.HasPrefix(line, "data: ") {
			continue
		}
		if ttft == 0 {
			ttft = time.Since(start)
		}
		d := strings.TrimSpace(strings.TrimPrefix(line, "data: "))
		if d == "[DONE]" {
			return ttft, u
		}
		var c responseJSON
		if err := json.Unmarshal([]byte(d), &c); err != nil {
			t.Fatal(err)
		}
		if c.Usage != nil {
			u = *c.Usage
		}
	}
}

func TestServerPrefixCacheTTFT(t *testing.T) {
	e := startEngine(t, func(c *Config) { c.Core.Time.Speedup = 1 })
	// 2400 Simple tokens: 8 ms + 192 ms of prefill uncached, ~10 ms cached.
	prompt := strings.Repeat("abcdefghijklmnopqrstuvwxyz0123456789", 267)
	body := `{"stream":true,"max_tokens":1,"prompt":"` + prompt + `","stream_options":{"include_usage":true}}`
	ttft1, u1 := streamTTFT(t, e, body)
	ttft2, u2 := streamTTFT(t, e, body)
	if u1.PromptTokensDetails.CachedTokens != 0 || u2.PromptTokensDetails.CachedTokens == 0 || u1.PromptTokens != u2.PromptTokens {
		t.Fatalf("usage %+v then %+v", u1, u2)
	}
	if u2.PromptTokensDetails.CachedTokens < u2.PromptTokens-16 {
		t.Fatalf("cached %d of %d", u2.PromptTokensDetails.CachedTokens, u2.PromptTokens)
	}
	if ttft2 >= ttft1 {
		t.Fatalf("cached TTFT %v not below uncached %v", ttft2, ttft1)
	}
	t.Logf("TTFT uncached %v, cached %v", ttft1, ttft2)
	if s := e.stats(t); s.CachedPromptTokens != uint64(u2.PromptTokensDetails.CachedTokens) {
		t.Fatalf("stats cached prompt tokens %d", s.CachedPromptTokens)
	}
}

func TestServerModelsHealthMetrics(t *testing.T) {
	e := startEngine(t, nil)
	code, b := e.get(t, "/v1/models")
	var list struct {
		Object string `json:"object"`
		Data   []struct {
			ID     string `json:"id"`
			Object string `json:"object"`
		} `json:"data"`
	}
	if code != 200 || json.Unmarshal(b, &list) != nil || list.Object != "list" || len(list.Data) != 2 || list.Data[1].ID != "other" || list.Data[0].Object != "model" {
		t.Fatalf("models %d %s", code, b)
	}
	if code, b := e.get(t, "/health"); code != 200 || string(b) != `{"status":"ok"}` {
		t.Fatalf("health %d %s", code, b)
	}
	e.post(t, "/v1/completions", `{"prompt":"abcd","max_tokens":2}`)
	code, b = e.get(t, "/metrics")
	if code != 200 || !bytes.Contains(b, []byte(`infera_engine_completed_total{engine="engine-test"} 1`)) ||
		!bytes.Contains(b, []byte(`infera_engine_kv_blocks_capacity{engine="engine-test"} 4096`)) {
		t.Fatalf("metrics %d %s", code, b)
	}
}

func TestServerBadInput(t *testing.T) {
	e := startEngine(t, func(c *Config) { c.Core.CapacityBlocks = 8 })
	f := func(path, body string, wantCode int, wantMsg string) {
		t.Helper()
		code, b, _ := e.post(t, path, body)
		var er struct {
			Error struct {
				Message string  `json:"message"`
				Type    string  `json:"type"`
				Param   *string `json:"param"`
				Code    *string `json:"code"`
			} `json:"error"`
		}
		if code != wantCode || json.Unmarshal(b, &er) != nil || er.Error.Type != "invalid_request_error" ||
			!strings.Contains(er.Error.Message, wantMsg) || !bytes.Contains(b, []byte(`"param":null,"code":null`)) {
			t.Fatalf("%s %s: %d %s, want %d with %q", path, body, code, b, wantCode, wantMsg)
		}
	}
	chat, cmpl := "/v1/chat/completions", "/v1/completions"
	f(chat, `{`, 400, "cannot parse")
	f(chat, `{"model":"sim-model"}`, 400, "messages")
	f(chat, `{"messages":[]}`, 400, "messages")
	f(chat, `{"messages":[{"content":"x"}]}`, 400, "role")
	f(chat, `{"messages":[{"role":"user","content":5}]}`, 400, "content")
	f(chat, `{"messages":[{"role":"user","content":"x"}],"max_tokens":0}`, 400, "max_tokens")
	f(chat, `{"model":"nope","messages":[{"role":"user","content":"x"}]}`, 404, "does not exist")
	f(cmpl, `{"model":"sim-model"}`, 400, "prompt")
	f(cmpl, `{"prompt":""}`, 400, "zero tokens")
	f(cmpl, `{"prompt":[]}`, 400, "empty")
	f(cmpl, `{"prompt":[-1]}`, 400, "out of range")
	f(cmpl, `{"prompt":[1.5]}`, 400, "token id")
	f(cmpl, `{"prompt":[[["a"]]]}`, 400, "deeply")
	f(cmpl, `{"prompt":{}}`, 400, "prompt must be")
	f(cmpl, `{"prompt":"`+strings.Repeat("x", 4*200)+`"}`, 400, "KV blocks")
	f("/nope", `{}`, 404, "unknown path")
	resp, err := testClient.Get(e.base + chat)
	if err != nil || resp.StatusCode != 405 {
		t.Fatalf("GET chat: %v %v", resp, err)
	}
	resp.Body.Close()
	if s := e.stats(t); s.BadRequests != 14 || s.Submitted != 0 || s.Active != 0 { // the 400s, not the 404s
		t.Fatalf("stats %+v", s)
	}
}

func TestServerClientDisconnectAborts(t *testing.T) {
	e := startEngine(t, func(c *Config) { c.Core.Time.Speedup = 1 })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "POST", e.base+"/v1/chat/completions",
		strings.NewReader(`{"stream":true,"max_tokens":2000,"messages":[{"role":"user","content":"tell me a long story please"}]}`))
	resp, err := testClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(resp.Body)
	for got := 0; got < 3; {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasPrefix(line, "data: ") {
			got++
		}
	}
	if s := e.stats(t); s.Running != 1 || s.CacheBlocksUsed <= s.CacheBlocksCached {
		t.Fatalf("before disconnect: %+v", s)
	}
	cancel()
	resp.Body.Close()
	s := e.waitStats(t, "abort", func(s Stats) bool { return s.Aborted == 1 })
	if s.Running != 0 || s.Active != 0 || s.CacheBlocksUsed != s.CacheBlocksCached || s.Completed != 0 || s.GeneratedTokens >= 2000 {
		t.Fatalf("after disconnect: %+v", s)
	}
}

func TestServerFaults(t *testing.T) {
	e := startEngine(t, func(c *Config) { c.Fault = Fault{Mode: FaultError, Status: 503} })
	chatBody := `{"max_tokens":3,"messages":[{"role":"user","content":"hi"}]}`
	setFault := func(body string) {
		t.Helper()
		code, b, _ := e.post(t, "/admin/fault", body)
		if code != 200 {
			t.Fatalf("set fault %s: %d %s", body, code, b)
		}
	}

	t.Run("error", func(t *testing.T) {
		code, b, _ := e.post(t, "/v1/chat/completions", chatBody)
		if code != 503 || !bytes.Contains(b, []byte(`"type":"server_error"`)) {
			t.Fatalf("error fault: %d %s", code, b)
		}
		if code, b := e.get(t, "/admin/fault"); code != 200 || !bytes.Contains(b, []byte(`"mode":"error"`)) || !bytes.Contains(b, []byte(`"status":503`)) {
			t.Fatalf("GET fault %d %s", code, b)
		}
		setFault(`{"mode":"error"}`)
		if code, _, _ := e.post(t, "/v1/completions", `{"prompt":"abcd"}`); code != 500 {
			t.Fatalf("default error status %d", code)
		}
		setFault(`{"mode":"none"}`)
		if code, b, _ := e.post(t, "/v1/chat/completions", chatBody); code != 200 {
			t.Fatalf("after clearing: %d %s", code, b)
		}
		if code, _, _ := e.post(t, "/admin/fault", `{"mode":"explode"}`); code != 400 {
			t.Fatalf("bad fault accepted: %d", code)
		}
		if code, _, _ := e.post(t, "/admin/fault", `{"mode":"error","rate":2}`); code != 400 {
			t.Fatalf("bad rate accepted: %d", code)
		}
	})

	t.Run("rate", func(t *testing.T) {
		pattern := func() string {
			setFault(`{"mode":"error","status":502,"rate":0.5,"seed":42}`)
			var b strings.Builder
			for i := 0; i < 24; i++ {
				code, _, _ := e.post(t, "/v1/completions", `{"prompt":"abcd","max_tokens":1}`)
				if code == 502 {
					b.WriteByte('x')
				} else if code == 200 {
					b.WriteByte('.')
				} else {
					t.Fatalf("status %d", code)
				}
			}
			return b.String()
		}
		p1, p2 := pattern(), pattern()
		if p1 != p2 || !strings.Contains(p1, "x") || !strings.Contains(p1, ".") {
			t.Fatalf("rate patterns %q %q", p1, p2)
		}
		setFault(`{"mode":"none"}`)
	})

	t.Run("health-fail", func(t *testing.T) {
		setFault(`{"mode":"health-fail"}`)
		if code, _ := e.get(t, "/health"); code != 503 {
			t.Fatalf("health %d", code)
		}
		if code, _, _ := e.post(t, "/v1/completions", `{"prompt":"abcd","max_tokens":1}`); code != 200 {
			t.Fatalf("inference under health-fail: %d", code)
		}
		setFault(`{"mode":"none"}`)
		if code, _ := e.get(t, "/health"); code != 200 {
			t.Fatalf("health %d", code)
		}
	})

	t.Run("slow", func(t *testing.T) {
		body := `{"prompt":"abcd","max_tokens":20}`
		st := e.stats(t)
		start := time.Now()
		e.post(t, "/v1/completions", body)
		fast := time.Since(start)
		setFault(`{"mode":"slow","factor":5}`)
		start = time.Now()
		e.post(t, "/v1/completions", body)
		slow := time.Since(start)
		setFault(`{"mode":"none"}`)
		// Simulated: 20 steps of ~0.6 ms at speedup 20 vs 3 ms slowed.
		if slow < 2*fast {
			t.Fatalf("slow fault: %v vs %v unslowed", slow, fast)
		}
		if s := e.stats(t); s.Completed != st.Completed+2 {
			t.Fatalf("stats %+v", s)
		}
	})

	t.Run("close-mid-stream", func(t *testing.T) {
		setFault(`{"mode":"close-mid-stream","after_tokens":3}`)
		st := e.stats(t)
		ended := st.Aborted + st.Completed
		resp, err := testClient.Post(e.base+"/v1/chat/completions", "application/json",
			strings.NewReader(`{"stream":true,"max_tokens":50,"messages":[{"role":"user","content":"hi"}]}`))
		if err != nil {
			t.Fatal(err)
		}
		data, err := readSSE(t, resp.Body)
		resp.Body.Close()
		if err == nil {
			t.Fatalf("stream completed despite fault: %q", data)
		}
		if len(data) != 4 { // role chunk + 3 tokens
			t.Fatalf("got %d chunks before close, want 4: %q", len(data), data)
		}
		// Non-stream: the connection closes with no response.
		_, err = testClient.Post(e.base+"/v1/completions", "application/json", strings.NewReader(`{"prompt":"abcd","max_tokens":10}`))
		if err == nil {
			t.Fatal("non-stream request answered despite close-mid-stream")
		}
		setFault(`{"mode":"none"}`)
		// Both were cut; a sequence that finished before its handler looked
		// counts as completed rather than aborted.
		e.waitStats(t, "aborts", func(s Stats) bool { return s.Aborted+s.Completed == ended+2 && s.Active == 0 })
	})

	t.Run("hang", func(t *testing.T) {
		setFault(`{"mode":"hang"}`)
		// A client that gives up: the hung handler notices and leaves.
		c := &http.Client{Timeout: 200 * time.Millisecond}
		if _, err := c.Post(e.base+"/v1/completions", "application/json", strings.NewReader(`{"prompt":"abcd"}`)); err == nil {
			t.Fatal("hung request answered")
		}
		e.waitStats(t, "hung handler to leave", func(s Stats) bool { return s.Hung == 0 })
		// A hung request resumes when the fault is cleared.
		var wg sync.WaitGroup
		var code int
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := testClient.Post(e.base+"/v1/completions", "application/json", strings.NewReader(`{"prompt":"abcd","max_tokens":2}`))
			if err == nil {
				code = resp.StatusCode
				resp.Body.Close()
			}
		}()
		e.waitStats(t, "request to hang", func(s Stats) bool { return s.Hung == 1 })
		setFault(`{"mode":"none"}`)
		wg.Wait()
		if code != 200 {
			t.Fatalf("resumed request: status %d", code)
		}
	})
}

func TestServerClose(t *testing.T) {
	e := startEngine(t, func(c *Config) { c.Core.Time.Speedup = 1 })
	done := make(chan error, 1)
	go func() {
		resp, err := testClient.Post(e.base+"/v1/completions", "application/json", strings.NewReader(`{"prompt":"abcd","max_tokens":60000}`))
		if err == nil {
			resp.Body.Close()
		}
		done <- err
	}()
	e.waitStats(t, "running", func(s Stats) bool { return s.Running == 1 })
	if err := e.srv.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("in-flight request not released by Close")
	}
}

func netListen() (net.Listener, error) { return net.Listen("tcp", "127.0.0.1:0") }

// TestServerDisconnectWhileWaiting: a client that leaves while its request is
// queued (stream) or generating (non-stream) gets its sequence aborted, even
// though nothing was written to it.
func TestServerDisconnectWhileWaiting(t *testing.T) {
	e := startEngine(t, func(c *Config) { c.Core.Time.Speedup = 1; c.Core.MaxBatch = 1 })
	// Occupy the only batch slot with a long non-stream request.
	ctx1, cancel1 := context.WithCancel(context.Background())
	defer cancel1()
	go func() {
		req, _ := http.NewRequestWithContext(ctx1, "POST", e.base+"/v1/completions", strings.NewReader(`{"prompt":"abcd","max_tokens":3000}`))
		if resp, err := testClient.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	e.waitStats(t, "first running", func(s Stats) bool { return s.Running == 1 })
	ctx2, cancel2 := context.WithCancel(context.Background())
	defer cancel2()
	go func() {
		req, _ := http.NewRequestWithContext(ctx2, "POST", e.base+"/v1/completions", strings.NewReader(`{"prompt":"efgh","stream":true,"max_tokens":5}`))
		if resp, err := testClient.Do(req); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}()
	e.waitStats(t, "second queued", func(s Stats) bool { return s.Queued == 1 })
	cancel2()
	e.waitStats(t, "queued stream aborted", func(s Stats) bool { return s.Aborted == 1 && s.Queued == 0 && s.Running == 1 })
	cancel1()
	s := e.waitStats(t, "non-stream aborted", func(s Stats) bool { return s.Aborted == 2 && s.Active == 0 })
	if s.Completed != 0 || s.CacheBlocksUsed != s.CacheBlocksCached {
		t.Fatalf("stats %+v", s)
	}
}

// A chat that turns the generation prompt off, or continues its final
// message (an Anthropic prefill, converted), is prompted as vLLM renders it:
// no generation prompt, and the final message cut after its content. The
// engine always rendered the generation prompt, so its prompt_tokens (and
// its KV blocks) were not vLLM's.
func TestAContinuedFinalMessageIsPromptedAsVLLMRendersIt(t *testing.T) {
	e := startEngine(t, func(c *Config) { c.NativeProtocols = true })
	count := func(text string) int { return len(tokenizer.Simple{}.Encode(nil, []byte(text))) }
	const user = `{"role":"user","content":"What is the capital of France?"}`
	for _, c := range []struct{ path, body, want string }{
		{"/v1/chat/completions", `{"max_tokens":1,"add_generation_prompt":false,"messages":[` + user + `]}`,
			"<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"},
		{"/v1/chat/completions", `{"max_tokens":1,"add_generation_prompt":false,"continue_final_message":true,"messages":[` + user + `,{"role":"assistant","content":"The capital is "}]}`,
			"<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\nThe capital is"},
		{"/v1/messages/count_tokens", `{"model":"sim-model","messages":[` + user + `,{"role":"assistant","content":"The capital is "}]}`,
			"<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\nThe capital is"},
	} {
		code, b, _ := e.post(t, c.path, c.body)
		want := `"prompt_tokens":` + strconv.Itoa(count(c.want)) + `,`
		if c.path == "/v1/messages/count_tokens" {
			want = `{"input_tokens":` + strconv.Itoa(count(c.want)) + `}`
		}
		if code != 200 || !strings.Contains(string(b), want) {
			t.Fatalf("%s %s: %d %s, want %s", c.path, c.body, code, b, want)
		}
	}
}
