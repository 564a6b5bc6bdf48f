package proxy

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/infera/infera/config"
	"github.com/infera/infera/fleet"
	"github.com/valyala/fasthttp"
)

func TestResponseByIDKind(t *testing.T) {
	f := func(path string, kind int, id string, ok bool) {
		t.Helper()
		k, i, o := responseByIDKind([]byte(path))
		if k != kind || string(i) != id || o != ok {
			t.Fatalf("%q: %d %q %v, want %d %q %v", path, k, i, o, kind, id, ok)
		}
	}
	f("/v1/responses", 0, "", false)
	f("/v1/responses/", 0, "", false)
	f("/v1/responses/resp_1", kindResponseGet, "resp_1", true)
	f("/v1/responses/resp_1/cancel", kindResponseCancel, "resp_1", true)
	f("/v1/responses//cancel", 0, "", false)
	f("/v1/responses/a/b", 0, "", false)
	f("/v1/responses/resp_1/input_items", 0, "", false)
	f("/v1/responsesx/resp_1", 0, "", false)
}

// A retrieve is pinned to the engine holding its response as a follow-up
// is: behind its open breaker it is answered 503 worker_breaker_open, on
// a draining engine 410 response_draining (param response_id), and never
// sent to the other engine, which can only answer 404.
func TestARetrieveIsPinnedToTheEngineHoldingItsResponse(t *testing.T) {
	h := &holdUpstream{release: make(chan struct{}, 10)}
	a, b := storingResponsesEngineHold(t, "a", false, h), storingResponsesEngineHold(t, "b", false, h)
	cfg := config.Default()
	cfg.Protocol.ResponsesPassthrough = true
	f := defaultFlags()
	f.BreakerFailureThreshold, f.BreakerCooldownS = 1, 30
	r := startRouter(t, f, cfg, a.url, b.url)
	get := func(id string) (int, string) {
		t.Helper()
		resp, err := http.Get(r.url + "/v1/responses/" + id)
		if err != nil {
			t.Fatal(err)
		}
		got, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp.StatusCode, string(got)
	}
	var ids [2]string
	for i := range ids {
		resp, got := postH(t, r.url+"/v1/responses", `{"model":"m","input":"x"}`, nil)
		var v struct{ ID string }
		json.Unmarshal([]byte(got), &v)
		if resp.StatusCode != 200 || v.ID == "" {
			t.Fatalf("%d %s", resp.StatusCode, got)
		}
		ids[i] = v.ID
	}
	if ids[0][:6] == ids[1][:6] {
		t.Fatalf("both on one engine: %v", ids)
	}
	for i := 0; i < 4; i++ {
		for _, id := range ids {
			if code, got := get(id); code != 200 || !strings.Contains(got, `"id":"`+id+`"`) {
				t.Fatalf("retrieve %s: %d %s", id, code, got)
			}
		}
	}
	// ids[0]'s engine fails: its breaker opens.
	if resp, got := postH(t, r.url+"/v1/responses", `{"model":"m","input":"busy","previous_response_id":"`+ids[0]+`"}`, nil); resp.StatusCode != 503 {
		t.Fatalf("busy: %d %s", resp.StatusCode, got)
	}
	up := a
	if strings.HasPrefix(ids[0], "resp_a") {
		up = b
	}
	before := up.hits.Load()
	if code, got := get(ids[0]); code != 503 || !strings.Contains(got, `"worker_breaker_open"`) || !strings.Contains(got, "holding the response") {
		t.Fatalf("retrieve behind an open breaker: %d %s", code, got)
	}
	if up.hits.Load() != before {
		t.Fatal("the retrieve reached the other engine")
	}
	// ids[1]'s engine drains.
	w, u := "w0", a.url
	if strings.HasPrefix(ids[1], "resp_b") {
		w, u = "w1", b.url
	}
	if err := r.fl.Upsert(fleet.Record{ID: w, URL: u, Models: []string{"m"}, Status: fleet.StatusDraining}); err != nil {
		t.Fatal(err)
	}
	code, got := get(ids[1])
	var e struct {
		Error struct{ Param, Code string }
	}
	json.Unmarshal([]byte(got), &e)
	if code != 410 || e.Error.Code != "response_draining" || e.Error.Param != "response_id" {
		t.Fatalf("retrieve on a draining engine: %d %s", code, got)
	}
}

// A retrieve whose engine left the fleet is answered 404 by the router:
// the response left with it, and no other engine is asked.
func TestARetrieveWhoseEngineLeftIsNotFound(t *testing.T) {
	a, b := storingResponsesEngine(t, "a"), storingResponsesEngine(t, "b")
	cfg := config.Default()
	cfg.Protocol.ResponsesPassthrough = true
	r := startRouter(t, nil, cfg, a.url, b.url)
	resp, got := postH(t, r.url+"/v1/responses", `{"model":"m","input":"x"}`, nil)
	var v struct{ ID string }
	json.Unmarshal([]byte(got), &v)
	if resp.StatusCode != 200 || v.ID == "" {
		t.Fatalf("%d %s", resp.StatusCode, got)
	}
	w, other := "w0", b
	if strings.HasPrefix(v.ID, "resp_b") {
		w, other = "w1", a
	}
	r.fl.Remove(w)
	before := other.hits.Load()
	g, err := http.Get(r.url + "/v1/responses/" + v.ID)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(g.Body)
	g.Body.Close()
	if g.StatusCode != 404 || string(body) != `{"error":{"message":"Response with id '`+v.ID+`' not found.","type":"invalid_request_error","param":"response_id","code":404}}` {
		t.Fatalf("%d %s", g.StatusCode, body)
	}
	if other.hits.Load() != before {
		t.Fatal("the retrieve was sent to the other engine")
	}
}

// A background Response's create is charged its estimate for good even
// when the engine's queued answer carries a usage object (vLLM's is null):
// that usage is not the generation's, which comes later where the router
// reads no usage, so it is neither reconciled with nor counted in the
// usage metrics. Without max_output_tokens the estimate's output is the
// router's default (1024).
func TestABackgroundCreateKeepsItsEstimate(t *testing.T) {
	up := startUpstream(t, func(ctx *fasthttp.RequestCtx) {
		ctx.SetContentType("application/json")
		ctx.SetBodyString(`{"id":"resp_bg1","object":"response","status":"queued","background":true,"output":[],"usage":{"input_tokens":3,"output_tokens":0,"total_tokens":3}}`)
	})
	key, hash := mintKey(t)
	r, _ := govRouter(t, nil, fmt.Sprintf(`{"protocol": {"responses_passthrough": true},
		"user_limit": {"templates": [{"name": "t", "default": true,
			"quota": {"enabled": true, "windows": [{"period": "day", "max_tokens": 100000}]}}]},
		"users": [{"name": "bg-carol", "keys": [%q]}]}`, hash), up.url)
	before := metricFloat(t, r.url, `infera_usage_tokens_total{kind="prompt"}`)
	body := `{"model":"m","input":"hello there","background":true}`
	want(t, postPath(t, r.url, "/v1/responses", key, body), 200, "")
	if got, est := metricFloat(t, r.url, `infera_user_quota_tokens_total{user="bg-carol"}`), float64(coarseTokens([]byte(body))+1024); got != est {
		t.Fatalf("charged %v tokens, want the estimate %v", got, est)
	}
	if got := metricFloat(t, r.url, `infera_usage_tokens_total{kind="prompt"}`); got != before {
		t.Fatalf("the queued answer's usage was counted: prompt tokens %v -> %v", before, got)
	}
}
