package proxy

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/infera/infera/fleet"
	"github.com/valyala/fasthttp"
)

// A user with a models list may call only those models (names or '*'
// patterns, case-insensitive): any other gets 403 model_not_allowed in
// the client's shape (OpenAI's, Anthropic's on /v1/messages), on every
// inference endpoint, before anything is spent (the engine never sees it);
// /v1/models lists only what the user may call and /v1/models/{id} of
// another model is 404. A user without a list, and the global key, may
// call every model.
func TestUsersCallOnlyTheirModels(t *testing.T) {
	up := startUpstream(t, okHandler)
	ka, ha := mintKey(t)
	kb, hb := mintKey(t)
	f := defaultFlags()
	f.APIKey = "global-secret"
	r, _ := govRouter(t, f, fmt.Sprintf(`{
		"users": [{"name": "ann", "keys": [%q], "models": ["M", "qwen3-*"]}, {"name": "ben", "keys": [%q]}]}`, ha, hb), up.url)
	if errs := r.fl.Sync([]fleet.Record{{ID: "w0", URL: up.url, Models: []string{"m", "Qwen3-8B", "llama-3-70b"}}}); len(errs) > 0 {
		t.Fatal(errs)
	}
	chat := func(model string) string {
		return `{"model":"` + model + `","messages":[{"role":"user","content":"hi"}],"max_tokens":4}`
	}
	want(t, apiCall(t, r.url, ka, chat("m")), 200, "")
	want(t, apiCall(t, r.url, ka, chat("Qwen3-8B")), 200, "") // "qwen3-*", case aside
	hits := up.hits.Load()
	rej := apiCall(t, r.url, ka, chat("llama-3-70b"))
	want(t, rej, 403, "model_not_allowed")
	if !strings.Contains(rej.body, `"type":"permission_error"`) || !strings.Contains(rej.body, `"param":"model"`) || !strings.Contains(rej.body, "llama-3-70b") {
		t.Fatalf("refusal: %s", rej.body)
	}
	want(t, postPath(t, r.url, "/v1/completions", ka, `{"model":"llama-3-70b","prompt":"hi","max_tokens":2}`), 403, "model_not_allowed")
	want(t, postPath(t, r.url, "/v1/embeddings", ka, `{"model":"llama-3-70b","input":"hi"}`), 403, "model_not_allowed")
	want(t, postPath(t, r.url, "/v1/responses", ka, `{"model":"llama-3-70b","input":"hi"}`), 403, "model_not_allowed")
	// Anthropic's shape on /v1/messages.
	req, _ := http.NewRequest("POST", r.url+"/v1/messages", strings.NewReader(`{"model":"llama-3-70b","max_tokens":4,"messages":[{"role":"user","content":"hi"}]}`))
	req.Header.Set("x-api-key", ka)
	resp, b := sendReq(t, req)
	if resp.StatusCode != 403 || !strings.Contains(b, `"type":"error"`) || !strings.Contains(b, `"permission_error"`) {
		t.Fatalf("/v1/messages: %d %s", resp.StatusCode, b)
	}
	// count_tokens answered by the router (conversion mode) applies the
	// list too: it answered 200 with a count for a model the user may not
	// call, while passthrough mode refused it.
	for _, c := range []struct {
		model  string
		status int
	}{{"llama-3-70b", 403}, {"m", 200}} {
		req, _ = http.NewRequest("POST", r.url+"/v1/messages/count_tokens", strings.NewReader(`{"model":"`+c.model+`","messages":[{"role":"user","content":"hi"}]}`))
		req.Header.Set("x-api-key", ka)
		resp, b = sendReq(t, req)
		if resp.StatusCode != c.status || (c.status == 403 && (!strings.Contains(b, `"type":"error"`) || !strings.Contains(b, `"permission_error"`))) {
			t.Fatalf("/v1/messages/count_tokens of %s: %d %s", c.model, resp.StatusCode, b)
		}
	}
	if up.hits.Load() != hits {
		t.Fatalf("the engine saw %d refused requests", up.hits.Load()-hits)
	}

	listed := func(key string) []string {
		req, _ := http.NewRequest("GET", r.url+"/v1/models", nil)
		req.Header.Set("Authorization", "Bearer "+key)
		resp, b := sendReq(t, req)
		var l struct{ Data []struct{ ID string } }
		if resp.StatusCode != 200 || json.Unmarshal([]byte(b), &l) != nil {
			t.Fatalf("/v1/models: %d %s", resp.StatusCode, b)
		}
		var ids []string
		for _, d := range l.Data {
			ids = append(ids, d.ID)
		}
		return ids
	}
	if got := strings.Join(listed(ka), ","); got != "Qwen3-8B,m" && got != "m,Qwen3-8B" {
		t.Fatalf("ann's models: %s", got)
	}
	for _, k := range []string{kb, "global-secret"} {
		if got := listed(k); len(got) != 3 {
			t.Fatalf("every model for %s: %v", k[:3], got)
		}
	}
	retrieve := func(key, id string) int {
		req, _ := http.NewRequest("GET", r.url+"/v1/models/"+id, nil)
		req.Header.Set("Authorization", "Bearer "+key)
		resp, _ := sendReq(t, req)
		return resp.StatusCode
	}
	if retrieve(ka, "Qwen3-8B") != 200 || retrieve(ka, "llama-3-70b") != 404 || retrieve(kb, "llama-3-70b") != 200 {
		t.Fatal("models.retrieve does not follow the user's models")
	}

	// /debug/route and /tokenize do not tell ann that llama-3-70b exists
	// (/debug/route listed its workers): 404 as models.retrieve.
	for _, path := range []string{"/debug/route"} { // (/tokenize the same, with a tokenizer)
		want(t, postPath(t, r.url, path, ka, chat("llama-3-70b")), 404, "model_not_found")
		if got := postPath(t, r.url, path, kb, chat("llama-3-70b")); got.status == 404 {
			t.Fatalf("%s for a user without a list: %d %s", path, got.status, got.body)
		}
	}
	if got := postPath(t, r.url, "/debug/route", ka, chat("m")); got.status != 200 || !strings.Contains(got.body, `"candidates":["w0"]`) {
		t.Fatalf("/debug/route of an allowed model: %d %s", got.status, got.body)
	}

	want(t, apiCall(t, r.url, kb, chat("llama-3-70b")), 200, "")
	want(t, apiCall(t, r.url, "global-secret", chat("llama-3-70b")), 200, "")
	if n := metricFloat(t, r.url, "infera_model_not_allowed_total"); n < 5 {
		t.Fatalf("infera_model_not_allowed_total %v", n)
	}
}

// sendReq sends req and returns the answer and its body.
func sendReq(t *testing.T, req *http.Request) (*http.Response, string) {
	t.Helper()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var sb strings.Builder
	buf := make([]byte, 4096)
	for {
		n, err := resp.Body.Read(buf)
		sb.Write(buf[:n])
		if err != nil {
			break
		}
	}
	return resp, sb.String()
}

// With model routing, a name that resolves to another served model (a
// fuzzy match, or the default model for an unknown name) needs that model
// allowed too: a pattern cannot open the default model.
func TestModelRoutingCannotLeadAUserToAModelOutsideItsList(t *testing.T) {
	up := startUpstream(t, okHandler)
	ka, ha := mintKey(t)
	kb, hb := mintKey(t)
	r, _ := govRouter(t, nil, fmt.Sprintf(`{
		"model_routing": {"enabled": true, "default_model": "m", "fuzzy_match": true},
		"users": [{"name": "ann", "keys": [%q], "models": ["zzz*", "qwen3_8b"]}, {"name": "ben", "keys": [%q], "models": ["zzz*", "m", "Qwen3-8B"]}]}`, ha, hb), up.url)
	if errs := r.fl.Sync([]fleet.Record{{ID: "w0", URL: up.url, Models: []string{"m", "Qwen3-8B"}}}); len(errs) > 0 {
		t.Fatal(errs)
	}
	chat := func(model string) string {
		return `{"model":"` + model + `","messages":[{"role":"user","content":"hi"}],"max_tokens":4}`
	}
	want(t, apiCall(t, r.url, ka, chat("zzz-unknown")), 403, "model_not_allowed") // the default model m
	want(t, apiCall(t, r.url, ka, chat("qwen3_8b")), 403, "model_not_allowed")    // fuzzy: Qwen3-8B
	want(t, apiCall(t, r.url, kb, chat("zzz-unknown")), 200, "")
	want(t, apiCall(t, r.url, kb, chat("qwen3_8b")), 403, "model_not_allowed") // the name asked for is not listed
	want(t, apiCall(t, r.url, kb, chat("Qwen3-8B")), 200, "")
}

// A user may call only "gpt-4o", an alias a canary rule splits between
// service "cheap" and a canary service with no worker yet; model routing
// has default_model "big" (a model the user may not call). Every request
// must reach "cheap". Access control checks the served model of a
// default-model fallback (allowsModel), but ServedModel used to answer ""
// as soon as a canary rule matched the name; when the rule's turn fell on
// the empty service, route fell through to model routing, where "gpt-4o"
// is unmatched and became the default model: the user's request was
// served by "big". With no canary worker at all the name falls through
// for every request, and access control refuses it.
func TestACanaryFallThroughDoesNotServeAModelTheUserMayNotCall(t *testing.T) {
	small, big := startUpstream(t, okHandler), startUpstream(t, okHandler)
	ka, ha := mintKey(t)
	f := defaultFlags()
	f.APIKey = "global-secret"
	r, _ := govRouter(t, f, fmt.Sprintf(`{
		"users": [{"name": "ann", "keys": [%q], "models": ["gpt-4o"]}],
		"model_routing": {"enabled": true, "default_model": "big"},
		"canary": {"enabled": true, "rules": [{"model": "gpt-4o", "targets": [{"service": "cheap", "weight": 1}, {"service": "cheap-canary", "weight": 1}]}]}}`, ha), small.url, big.url)
	if errs := r.fl.Sync([]fleet.Record{
		{ID: "w0", URL: small.url, Service: "cheap", Models: []string{"small"}},
		{ID: "w1", URL: big.url, Models: []string{"big"}},
	}); len(errs) > 0 {
		t.Fatal(errs)
	}
	gpt4o := `{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}],"max_tokens":4}`
	// Control: the default model itself is refused.
	want(t, apiCall(t, r.url, ka, `{"model":"big","messages":[{"role":"user","content":"hi"}],"max_tokens":4}`), 403, "model_not_allowed")
	for i := 0; i < 4; i++ {
		apiCall(t, r.url, ka, gpt4o)
	}
	if n := big.hits.Load(); n > 0 {
		t.Fatalf("%d of ann's 4 requests for gpt-4o were served by model big, which ann may not call (small got %d)", n, small.hits.Load())
	}
	if n := small.hits.Load(); n != 4 {
		t.Fatalf("cheap's worker served %d of ann's 4 requests for gpt-4o", n)
	}
	// Neither service has a worker: gpt-4o falls through to the default
	// model, which ann may not call.
	if errs := r.fl.Sync([]fleet.Record{{ID: "w1", URL: big.url, Models: []string{"big"}}}); len(errs) > 0 {
		t.Fatal(errs)
	}
	want(t, apiCall(t, r.url, ka, gpt4o), 403, "model_not_allowed")
	if n := big.hits.Load(); n > 0 {
		t.Fatalf("gpt-4o with no canary worker was served by model big, which ann may not call")
	}
}

// Smart model selection's choice must be on the user's list too; a
// refused request's admission is refunded.
func TestSmartSelectionCannotLeadAUserToAModelOutsideItsList(t *testing.T) {
	cls := startUpstream(t, func(ctx *fasthttp.RequestCtx) {
		ctx.SetContentType("application/json")
		ctx.SetBodyString(`{"tier":"L3"}`)
	})
	up := startUpstream(t, okHandler)
	ka, ha := mintKey(t)
	kb, hb := mintKey(t)
	r, _ := govRouter(t, nil, fmt.Sprintf(`{
		"smart_model_selection": {"enabled": true, "classifier_url": %q, "match_models": ["auto"], "tiers": {"L1": "m", "L2": "m", "L3": "big"}},
		"user_limit": {"templates": [{"name": "t", "default": true, "rate": {"enabled": true, "rpm": 2}}]},
		"users": [{"name": "ann", "keys": [%q], "models": ["auto", "m"]}, {"name": "ben", "keys": [%q], "models": ["auto", "big"]}]}`, cls.url+"/classify", ha, hb), up.url)
	if errs := r.fl.Sync([]fleet.Record{{ID: "w0", URL: up.url, Models: []string{"m", "big"}}}); len(errs) > 0 {
		t.Fatal(errs)
	}
	auto := `{"model":"auto","messages":[{"role":"user","content":"prove the Riemann hypothesis"}],"max_tokens":4}`
	for range 3 { // refunded: the RPM of 2 never refuses
		rej := apiCall(t, r.url, ka, auto)
		want(t, rej, 403, "model_not_allowed")
		if !strings.Contains(rej.body, "big") || !strings.Contains(rej.body, "smart model selection") {
			t.Fatalf("refusal: %s", rej.body)
		}
	}
	want(t, apiCall(t, r.url, ka, chatBody), 200, "")
	want(t, apiCall(t, r.url, kb, auto), 200, "")
}
