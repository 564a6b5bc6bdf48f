package proxy

import (
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/infera/infera/config"
)

// hungServer is a TCP server that accepts connections, reads what it is
// sent and never answers: an external API that hangs.
type hungServer struct {
	url   string
	conns atomic.Int64
}

func startHungServer(t *testing.T) *hungServer {
	t.Helper()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h := &hungServer{url: "http://" + ln.Addr().String()}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			h.conns.Add(1)
			go func() {
				defer c.Close()
				io.Copy(io.Discard, c) // until the router closes it
			}()
		}
	}()
	t.Cleanup(func() { ln.Close(); <-done })
	return h
}

// An external split entry that never answers holds a non-streamed request
// only for split_proxy.non_stream_first_byte_ms: then the attempt fails as
// the entry's timeout, and the entry is left out of the weighted draw for
// split_proxy.timeout_backoff_ms, its share going to the other entries.
// The request's only bound used to be timeouts.non_stream_total_s (900 s),
// whose expiry counts as the request's own deadline, not the entry's
// fault: each request drawn to the entry waited 900 s and got 504, and the
// entry kept being drawn.
func TestAHungExternalEntryIsBoundedAndLeftOutOfTheWeightedDraw(t *testing.T) {
	hung := startHungServer(t)
	local := startUpstream(t, okHandler)
	cfg := splitConfig(config.SplitWeight,
		config.Proxy{Local: true, Weight: 1},
		config.Proxy{Name: "hung", Address: hung.url, Weight: 1},
	)
	cfg.SplitProxy.NonStreamFirstByteMS = 300
	r := startRouterWith(t, nil, cfg, nil, local.url)
	cl := &http.Client{Timeout: 5 * time.Second}
	timeouts := 0
	for i := 0; i < 12; i++ {
		start := time.Now()
		resp, err := cl.Post(r.url+"/v1/chat/completions", "application/json", strings.NewReader(chatBody))
		if err != nil {
			t.Fatalf("request %d after %v: %v", i, time.Since(start), err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		took := time.Since(start)
		switch resp.StatusCode {
		case 200:
		case 504:
			timeouts++
			if took < 300*time.Millisecond || took > 3*time.Second || !strings.Contains(string(b), `"code":"timeout"`) {
				t.Fatalf("request %d: 504 after %v: %s", i, took, b)
			}
		default:
			t.Fatalf("request %d: %d %s", i, resp.StatusCode, b)
		}
	}
	if timeouts != 1 || hung.conns.Load() != 1 || local.hits.Load() != 11 {
		t.Fatalf("%d timeouts, the hung entry got %d connections, local %d requests; want 1, 1, 11",
			timeouts, hung.conns.Load(), local.hits.Load())
	}
	if v := metricValue(t, r.url, `infera_split_proxy_backoff_state{proxy="hung"}`); v != "2" {
		t.Fatalf("the hung entry's backoff state %q, want 2 (out)", v)
	}
}

// When a hung external entry is the only one a request may go to, the
// client gets a timeout after the entry's first-byte bound, then, while
// the entry is out, 503 no_upstreams, each in the shape of the API it
// called (Anthropic's on /v1/messages, OpenAI's elsewhere); once the
// backoff is over one request tries the entry again.
func TestAClientOfAHungExternalEntryGetsItsAPIsErrorShape(t *testing.T) {
	hung := startHungServer(t)
	cfg := splitConfig(config.SplitPrefix,
		config.Proxy{Local: true},
		config.Proxy{Name: "hung", Address: hung.url, ModelRules: []string{"gpt"}},
	)
	cfg.SplitProxy.NonStreamFirstByteMS = 200
	cfg.SplitProxy.TimeoutBackoffMS, cfg.SplitProxy.TimeoutMaxBackoffMS = 1000, 1000
	r := startRouterWith(t, nil, cfg, nil, deadURL(t))
	const msgBody = `{"model":"gpt-4o","max_tokens":8,"messages":[{"role":"user","content":"hi"}]}`
	cl := &http.Client{Timeout: 5 * time.Second}
	send := func(path, body string) (int, map[string]any, time.Duration) {
		t.Helper()
		start := time.Now()
		resp, err := cl.Post(r.url+path, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatalf("%s after %v: %v", path, time.Since(start), err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var v map[string]any
		if err := json.Unmarshal(b, &v); err != nil {
			t.Fatalf("%s: %d %q: %v", path, resp.StatusCode, b, err)
		}
		return resp.StatusCode, v, time.Since(start)
	}
	anthropic := func(v map[string]any, typ string) bool {
		e, _ := v["error"].(map[string]any)
		return v["type"] == "error" && e != nil && e["type"] == typ && e["message"] != ""
	}
	openai := func(v map[string]any, code string) bool {
		e, _ := v["error"].(map[string]any)
		return v["type"] == nil && e != nil && e["code"] == code
	}
	code, v, took := send("/v1/messages", msgBody)
	if code != 504 || !anthropic(v, "timeout_error") || took > 3*time.Second {
		t.Fatalf("/v1/messages on the hung entry: %d %v after %v", code, v, took)
	}
	if code, v, _ := send("/v1/messages", msgBody); code != 503 || !anthropic(v, "overloaded_error") {
		t.Fatalf("/v1/messages with the entry out: %d %v", code, v)
	}
	if code, v, _ := send("/v1/chat/completions", gptBody); code != 503 || !openai(v, "no_upstreams") {
		t.Fatalf("/v1/chat/completions with the entry out: %d %v", code, v)
	}
	if n := hung.conns.Load(); n != 1 {
		t.Fatalf("the hung entry got %d connections while out, want 1", n)
	}
	time.Sleep(1100 * time.Millisecond)
	if code, v, _ := send("/v1/chat/completions", gptBody); code != 504 || !openai(v, "timeout") || hung.conns.Load() != 2 {
		t.Fatalf("the trial after the backoff: %d %v, %d connections", code, v, hung.conns.Load())
	}
}
