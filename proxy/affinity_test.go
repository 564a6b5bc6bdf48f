package proxy

import (
	"testing"

	"github.com/infera/infera/config"
	"github.com/infera/infera/fleet"
)

// Session affinity on the header Claude Code sends by itself
// (X-Claude-Code-Session-Id). Claude Code sends its main model and a small
// model in the same session: the main model's turns stay on the worker
// that holds their KV cache. A turn for the small model re-bound the whole
// session to the small model's worker, and the next main-model turn was
// load balanced afresh (reason affinity-rebind) to another worker.
func TestAClaudeCodeSessionKeepsItsMainModelsWorkerAcrossModels(t *testing.T) {
	ups := []*upstream{startUpstream(t, okHandler), startUpstream(t, okHandler), startUpstream(t, okHandler)}
	cfg := config.Default()
	cfg.Debug.DecisionHeader = true
	cfg.SessionAffinity.Enabled = true
	cfg.SessionAffinity.Mode = "strong"
	cfg.SessionAffinity.Header = "X-Claude-Code-Session-Id"
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	r := startRouter(t, nil, cfg, ups[0].url, ups[1].url, ups[2].url)
	if errs := r.fl.Sync([]fleet.Record{
		{ID: "w0", URL: ups[0].url, Models: []string{"main"}},
		{ID: "w1", URL: ups[1].url, Models: []string{"main"}},
		{ID: "w2", URL: ups[2].url, Models: []string{"small"}},
	}); len(errs) > 0 {
		t.Fatal(errs)
	}
	hdr := map[string]string{"X-Claude-Code-Session-Id": "8c1f-session"}
	call := func(model string) (string, string) {
		resp, body := postWith(t, r.url+"/v1/chat/completions", `{"model":"`+model+`","messages":[{"role":"user","content":"hi"}],"max_tokens":4}`, hdr)
		if resp.StatusCode != 200 {
			t.Fatalf("%s: %d %s", model, resp.StatusCode, body)
		}
		return resp.Header.Get("X-Infera-Worker"), resp.Header.Get("X-Infera-Route")
	}
	home, _ := call("main")
	for turn := 0; turn < 3; turn++ {
		call("small")
		w, route := call("main")
		if w != home {
			t.Fatalf("main-model turn %d after a small-model turn went to %s (%s); the session's main model was on %s", turn, w, route, home)
		}
	}
}

// Session affinity with request rate limiting's seat queue. Both workers
// are at their one seat; a new session's first request queues. Its first
// lease (every candidate full: the gate is ignored; round-robin takes w1)
// is handed back while the request waits; w0 frees first and serves the
// request. The session's next turn must go to w0, which has its context.
// The handed-back lease used to bind the session to w1 and record its
// prompt there; the pick that served it then saw w1 as the bound worker
// whose seats were full (affinity-overloaded: binding kept), and the next
// turn went to w1 by affinity, a worker that never saw the session.
func TestAQueuedSessionIsBoundToTheWorkerThatServedIt(t *testing.T) {
	a, b := startHold(t), startHold(t)
	r, g := govRouter(t, nil, `{"rate_limit": {"scope": "instance", "prefill_concurrency": 1,
		"overlimit": "queue", "queue_size": 10, "queue_timeout_ms": 5000},
		"session_affinity": {"enabled": true, "mode": "strong"},
		"debug": {"decision_header": true}}`, a.url, b.url)
	ra := async(t, r.url, "", chatBody)
	waitUntil(t, "w0 busy", func() bool { return a.inflight.Load() == 1 })
	rb := async(t, r.url, "", chatBody)
	waitUntil(t, "both workers busy", func() bool { return a.inflight.Load() == 1 && b.inflight.Load() == 1 })
	hdr := map[string]string{"X-Session-Id": "conversation-1"}
	type res struct {
		worker, route string
		status        int
	}
	turn := func() res {
		resp, body := postWith(t, r.url+"/v1/chat/completions", chatBody, hdr)
		if resp.StatusCode != 200 {
			t.Errorf("%d %s", resp.StatusCode, body)
		}
		return res{resp.Header.Get("X-Infera-Worker"), resp.Header.Get("X-Infera-Route"), resp.StatusCode}
	}
	first := make(chan res, 1)
	go func() { first <- turn() }()
	waitUntil(t, "a queued request", func() bool { return g.QueueLength() == 1 })
	a.release <- struct{}{} // w0 frees first: the queued request goes there
	waitUntil(t, "the queued request on w0", func() bool { return a.hits.Load() == 2 && a.inflight.Load() == 1 })
	a.release <- struct{}{}
	f := <-first
	b.release <- struct{}{}
	want(t, <-ra, 200, "")
	want(t, <-rb, 200, "")
	if f.worker != "w0" {
		t.Fatalf("the session's first turn was served by %s (%s)", f.worker, f.route)
	}
	a.release <- struct{}{}
	b.release <- struct{}{}
	next := turn()
	if next.worker != f.worker {
		t.Fatalf("the session's second turn went to %s (%s); its first turn was served by %s (hits w0 %d, w1 %d)", next.worker, next.route, f.worker, a.hits.Load(), b.hits.Load())
	}
}
