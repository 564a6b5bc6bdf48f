package proxy

import (
	"bytes"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/infera/infera/config"
	"github.com/infera/infera/mirror"
	"github.com/valyala/fasthttp"
)

// Two gateways that each mirror to the other bounced every copy back and
// forth until their queues dropped them: the mirror marks its copies
// (X-Infera-Mirror) but nothing read the mark. A request carrying it is
// served as any other and never mirrored again.
func TestAMirroredCopyIsNotMirroredAgain(t *testing.T) {
	var copies atomic.Int32
	target := startUpstream(t, func(ctx *fasthttp.RequestCtx) {
		copies.Add(1)
		okHandler(ctx)
	})
	up := startUpstream(t, okHandler)
	cfg := config.Default()
	cfg.Mirror = config.Mirror{Enabled: true, TargetAddress: target.url, SamplingRatio: 100,
		TimeoutMS: 5000, QueueSize: 16, Concurrency: 2, MaxBufferBytes: config.DefaultMirrorBufferBytes}
	m := mirror.New(mirror.Options{})
	t.Cleanup(m.Close)
	r := startRouterWith(t, nil, cfg, func(o *Options) { o.Mirror = m }, up.url)

	resp, b := postWith(t, r.url+"/v1/chat/completions", chatBody, map[string]string{mirror.MirrorHeader: "1"})
	if resp.StatusCode != 200 || b != okJSON {
		t.Fatalf("a mirrored copy: %d %s", resp.StatusCode, b)
	}
	if resp, b := postWith(t, r.url+"/v1/chat/completions", chatBody, nil); resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	waitFor(t, func() bool { return copies.Load() >= 1 }, "the client request's copy")
	time.Sleep(100 * time.Millisecond) // a second copy, if any, would be on its way
	if n := copies.Load(); n != 1 {
		t.Fatalf("the target got %d copies, want 1 (the client request's only)", n)
	}
	if up.hits.Load() != 2 {
		t.Fatalf("the engine served %d requests", up.hits.Load())
	}
}

// The Messages and Responses front doors are mirrored as the engine gets
// them: converted, as a chat request at /v1/chat/completions; passed
// through, as the client's bytes at /v1/messages and /v1/responses.
func TestMessagesAndResponsesAreMirroredAtTheEnginesPath(t *testing.T) {
	type copy struct{ path, body string }
	got := make(chan copy, 8)
	target := startUpstream(t, func(ctx *fasthttp.RequestCtx) {
		got <- copy{string(ctx.Path()), string(ctx.PostBody())}
		okHandler(ctx)
	})
	up := startUpstream(t, okHandler)
	const messages = `{"model":"m","max_tokens":4,"messages":[{"role":"user","content":"hi"}]}`
	const responses = `{"model":"m","input":"hi","max_output_tokens":4}`
	for _, pass := range []bool{false, true} {
		cfg := config.Default()
		cfg.Protocol.AnthropicPassthrough, cfg.Protocol.ResponsesPassthrough = pass, pass
		cfg.Mirror = config.Mirror{Enabled: true, TargetAddress: target.url, SamplingRatio: 100,
			TimeoutMS: 5000, QueueSize: 16, Concurrency: 1, MaxBufferBytes: config.DefaultMirrorBufferBytes}
		m := mirror.New(mirror.Options{})
		r := startRouterWith(t, nil, cfg, func(o *Options) { o.Mirror = m }, up.url)
		for _, c := range []struct{ path, body string }{{"/v1/messages", messages}, {"/v1/responses", responses}} {
			postWith(t, r.url+c.path, c.body, nil)
			var cp copy
			select {
			case cp = <-got:
			case <-time.After(5 * time.Second):
				t.Fatalf("passthrough %v: no copy of %s", pass, c.path)
			}
			if pass && (cp.path != c.path || cp.body != c.body) {
				t.Fatalf("passthrough: %s mirrored as %s %s, want the client's bytes at its path", c.path, cp.path, cp.body)
			}
			if !pass && (cp.path != "/v1/chat/completions" || !strings.Contains(cp.body, `"messages"`)) {
				t.Fatalf("converted: %s mirrored as %s %s, want the chat request", c.path, cp.path, cp.body)
			}
		}
		m.Close()
	}
}

// A mirrored copy carries the request's id (X-Request-Id: the client's
// when usable, else the router's own), and its log line names it
// (request_id), so the copy's answer can be compared with the live one:
// the access log, the engine's log and the target's log name the same
// request. The copy carried no id and the line only the mirror's own
// sequence number, so nothing joined a copy to the request it was made of.
func TestAMirroredCopyCarriesTheRequestsID(t *testing.T) {
	ids := make(chan string, 4)
	target := startUpstream(t, func(ctx *fasthttp.RequestCtx) {
		ids <- string(ctx.Request.Header.Peek("X-Request-Id"))
		okHandler(ctx)
	})
	up := startUpstream(t, okHandler)
	cfg := config.Default()
	cfg.Mirror = config.Mirror{Enabled: true, TargetAddress: target.url, SamplingRatio: 100, LogRecording: true,
		TimeoutMS: 5000, QueueSize: 16, Concurrency: 1, MaxBufferBytes: config.DefaultMirrorBufferBytes}
	var log syncBuf
	m := mirror.New(mirror.Options{Logger: slog.New(slog.NewTextHandler(&log, nil))})
	t.Cleanup(m.Close)
	r := startRouterWith(t, nil, cfg, func(o *Options) { o.Mirror = m }, up.url)
	for _, sent := range []string{"client-id-1", ""} {
		hdr := map[string]string{}
		if sent != "" {
			hdr["X-Request-Id"] = sent
		}
		resp, b := postWith(t, r.url+"/v1/chat/completions", chatBody, hdr)
		if resp.StatusCode != 200 {
			t.Fatalf("%d %s", resp.StatusCode, b)
		}
		id := resp.Header.Get("X-Request-Id")
		if id == "" || sent != "" && id != sent {
			t.Fatalf("the answer's id %q, sent %q", id, sent)
		}
		select {
		case got := <-ids:
			if got != id {
				t.Fatalf("the copy carried X-Request-Id %q, want the request's %q", got, id)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("no copy")
		}
		waitFor(t, func() bool { return strings.Contains(log.String(), "request_id="+id+" ") }, "the log line naming "+id)
	}
}

// syncBuf is a bytes.Buffer safe for a logger's goroutine and the test's.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
