package proxy

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/infera/infera/config"
	"github.com/infera/infera/fleet"
	"github.com/valyala/fasthttp"
)

// GET /v1/models/{id} (the SDKs' models.retrieve) answered 404
// unknown_path: a client checking its model before use failed against
// every model the gateway serves. It answers the model object for a served
// id (ids with slashes included) and OpenAI's model_not_found otherwise.
func TestAServedModelCanBeRetrievedByID(t *testing.T) {
	up := startUpstream(t, okHandler)
	r := startRouter(t, nil, nil, up.url)
	if err := r.fl.Upsert(fleet.Record{ID: "w9", URL: up.url, Models: []string{"Qwen/Qwen3-8B"}}); err != nil {
		t.Fatal(err)
	}
	get := func(method, path string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(method, r.url+path, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp.StatusCode, string(b)
	}
	for path, id := range map[string]string{"/v1/models/m": "m", "/v1/models/Qwen/Qwen3-8B": "Qwen/Qwen3-8B", "/v1/models/Qwen%2FQwen3-8B": "Qwen/Qwen3-8B"} {
		code, b := get("GET", path)
		if want := `{"id":"` + id + `","object":"model","created":0,"owned_by":"infera","type":"model","display_name":"` + id +
			`","created_at":"1970-01-01T00:00:00Z"}`; code != 200 || b != want {
			t.Fatalf("%s: %d %s, want %s", path, code, b, want)
		}
	}
	code, b := get("GET", "/v1/models/gpt-nope")
	if code != 404 || !strings.Contains(b, `"code":"model_not_found"`) || !strings.Contains(b, "gpt-nope") {
		t.Fatalf("unknown model: %d %s", code, b)
	}
	checkOpenAIError(t, b)
	code, b = get("GET", "/v1/models/"+strings.Repeat("x", 1000))
	if code != 404 || strings.Contains(b, strings.Repeat("x", 300)) {
		t.Fatalf("long id: %d, %d bytes echoed", code, len(b))
	}
	if code, b = get("DELETE", "/v1/models/m"); code != 405 {
		t.Fatalf("DELETE: %d %s", code, b)
	}
	checkOpenAIError(t, b)
}

// An unknown model in a body was echoed whole in the 404's message (a
// megabyte model name came back as a megabyte error). It is cut to 256
// bytes there as in GET /v1/models/{id}, on a character boundary.
func TestAnUnknownModelIsEchoedAtMost256Bytes(t *testing.T) {
	up := startUpstream(t, okHandler)
	r := startRouter(t, nil, nil, up.url)
	long := strings.Repeat("é", 200) // 400 bytes: the cut falls inside no character
	code, b := post(t, r.url+"/v1/chat/completions", `{"model":"`+long+`","messages":[{"role":"user","content":"x"}]}`)
	if code != 404 || !strings.Contains(b, `"code":"model_not_found"`) {
		t.Fatalf("%d %s", code, b)
	}
	checkOpenAIError(t, b)
	if !strings.Contains(b, "`"+strings.Repeat("é", 128)+"`") {
		t.Fatalf("the model is not shown cut to 256 bytes: %s", b)
	}
	long = "x" + strings.Repeat("é", 200) // the cut falls inside a character
	if _, b = post(t, r.url+"/v1/chat/completions", `{"model":"`+long+`","messages":[{"role":"user","content":"x"}]}`); !strings.Contains(b, "`x"+strings.Repeat("é", 127)+"`") {
		t.Fatalf("the cut character is not dropped: %s", b)
	}
}

// model_routing.default_model serves a request that names no model, as
// the config documents: the engine gets the default model in the body.
// Without a default model it stays a 400.
func TestADefaultModelServesARequestWithoutAModel(t *testing.T) {
	var rec recorder
	up := startUpstream(t, func(ctx *fasthttp.RequestCtx) { rec.record(ctx); okHandler(ctx) })
	cfg := config.Default()
	cfg.ModelRouting.Enabled = true
	cfg.ModelRouting.DefaultModel = "m"
	r := startRouter(t, nil, cfg, up.url)
	for _, body := range []string{
		`{"messages":[{"role":"user","content":"no model"}],"max_tokens":4}`,
		` { "stream" : false , "messages":[{"role":"user","content":"spaced"}]}`,
	} {
		resp, b := postWith(t, r.url+"/v1/chat/completions", body, nil)
		if resp.StatusCode != 200 {
			t.Fatalf("%s: %d %s", body, resp.StatusCode, b)
		}
		all := rec.all()
		var got map[string]any
		if err := json.Unmarshal([]byte(all[len(all)-1].body), &got); err != nil || got["model"] != "m" || got["messages"] == nil {
			t.Fatalf("%s: the engine got %s (%v)", body, all[len(all)-1].body, err)
		}
	}
	r2 := startRouter(t, nil, nil, up.url)
	if resp, b := postWith(t, r2.url+"/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}]}`, nil); resp.StatusCode != 400 || !strings.Contains(b, "you must provide a model parameter") {
		t.Fatalf("without a default model: %d %s", resp.StatusCode, b)
	}
}
