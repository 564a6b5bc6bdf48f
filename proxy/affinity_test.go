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
