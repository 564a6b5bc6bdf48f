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

	"github.com/infera/infera/engine"
)

// A stored Response is retrieved (GET /v1/responses/{id}) and cancelled
// (POST /v1/responses/{id}/cancel) through the router from the one engine
// of two that answered it, as vLLM serves both endpoints; an id the router
// does not know is answered 404 in vLLM's shape without asking an engine;
// the key is needed. The router served neither path (404 unknown path).
func TestAStoredResponseIsRetrievedAndCancelledOnTheEngineHoldingIt(t *testing.T) {
	_, e1 := startEngine(t, "--speedup", "50", "--native-protocols")
	_, e2 := startEngine(t, "--speedup", "50", "--native-protocols")
	cfg := filepath.Join(t.TempDir(), "infera.json")
	writeConfig(t, cfg, `{"protocol":{"responses_passthrough":true}}`)
	_, r := startServe(t, "--workers", e1+","+e2, "--api-key", "k", "--config", cfg)
	do := func(method, path, body string, key string) (int, string, http.Header) {
		t.Helper()
		req, _ := http.NewRequest(method, r+path, strings.NewReader(body))
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		if body != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var b strings.Builder
		buf := make([]byte, 4096)
		for {
			n, err := resp.Body.Read(buf)
			b.Write(buf[:n])
			if err != nil {
				break
			}
		}
		resp.Body.Close()
		return resp.StatusCode, b.String(), resp.Header
	}
	for i := 0; i < 4; i++ {
		code, body, h := do("POST", "/v1/responses", `{"model":"sim-model","input":"hello","max_output_tokens":4}`, "k")
		if code != 200 {
			t.Fatalf("create: %d %s", code, body)
		}
		var created struct{ ID, Status string }
		json.Unmarshal([]byte(body), &created)
		engine := h.Get("X-Infera-Engine-Id")
		for j := 0; j < 3; j++ {
			code, got, h := do("GET", "/v1/responses/"+created.ID, "", "k")
			if code != 200 || h.Get("X-Infera-Engine-Id") != engine {
				t.Fatalf("retrieve %s (from %s): %d from %q %s", created.ID, engine, code, h.Get("X-Infera-Engine-Id"), got)
			}
			var v struct{ ID string }
			json.Unmarshal([]byte(got), &v)
			if v.ID != created.ID || got != body {
				t.Fatalf("retrieve %s: %s, want %s", created.ID, got, body)
			}
		}
		// vLLM refuses to cancel a response that is not background.
		code, got, h := do("POST", "/v1/responses/"+created.ID+"/cancel", "", "k")
		if code != 400 || h.Get("X-Infera-Engine-Id") != engine || !strings.Contains(got, "Cannot cancel a synchronous response.") {
			t.Fatalf("cancel %s (from %s): %d from %q %s", created.ID, engine, code, h.Get("X-Infera-Engine-Id"), got)
		}
	}
	for _, c := range []struct{ method, path string }{{"GET", "/v1/responses/resp_unknown"}, {"POST", "/v1/responses/resp_unknown/cancel"}} {
		code, got, h := do(c.method, c.path, "", "k")
		if code != 404 || h.Get("X-Infera-Engine-Id") != "" ||
			got != `{"error":{"message":"Response with id 'resp_unknown' not found.","type":"invalid_request_error","param":"response_id","code":404}}` {
			t.Fatalf("%s %s: %d %q %s", c.method, c.path, code, h.Get("X-Infera-Engine-Id"), got)
		}
		if code, got, _ := do(c.method, c.path, "", ""); code != 401 {
			t.Fatalf("%s %s without the key: %d %s", c.method, c.path, code, got)
		}
	}
	if code, got, _ := do("POST", "/v1/responses/resp_x", "", "k"); code != 405 {
		t.Fatalf("POST retrieve: %d %s", code, got)
	}
}

// With users configured, a stored Response is its user's: another user's
// retrieve or cancel of its id is answered 404 as an unknown id, without
// reaching the engine. A retrieve counts as a request and costs the user
// no tokens (it generates nothing; the Response's usage was charged when
// it was created).
func TestAStoredResponseIsItsUsersAndItsRetrieveCostsNoTokens(t *testing.T) {
	_, e1 := startEngine(t, "--speedup", "50", "--native-protocols")
	_, e2 := startEngine(t, "--speedup", "50", "--native-protocols")
	alice, ah := newKey(t)
	bob, bh := newKey(t)
	cfg := filepath.Join(t.TempDir(), "infera.json")
	writeConfig(t, cfg, fmt.Sprintf(`{"protocol":{"responses_passthrough":true},
		"user_limit": {"templates": [{"name": "t", "default": true,
			"quota": {"enabled": true, "windows": [{"period": "day", "max_tokens": 100000000}]}}]},
		"users": [{"name": "rs-alice", "keys": [%q]}, {"name": "rs-bob", "keys": [%q]}]}`, ah, bh))
	_, r := startServe(t, "--workers", e1+","+e2, "--config", cfg)
	do := func(method, path, body, key string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(method, r+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp.StatusCode, string(b)
	}
	code, body := do("POST", "/v1/responses", `{"model":"sim-model","input":"hello","max_output_tokens":4}`, alice)
	if code != 200 {
		t.Fatalf("create: %d %s", code, body)
	}
	var created struct{ ID string }
	json.Unmarshal([]byte(body), &created)
	charged := metricF(t, r, `infera_user_quota_tokens_total{user="rs-alice"}`)
	requests := metricF(t, r, `infera_user_requests_total{user="rs-alice"}`)
	if charged == 0 {
		t.Fatal("the create charged no tokens")
	}
	for i := 0; i < 3; i++ {
		if code, got := do("GET", "/v1/responses/"+created.ID, "", alice); code != 200 || got != body {
			t.Fatalf("alice's retrieve: %d %s", code, got)
		}
	}
	if got := metricF(t, r, `infera_user_quota_tokens_total{user="rs-alice"}`); got != charged {
		t.Fatalf("retrieves charged %v tokens", got-charged)
	}
	if got := metricF(t, r, `infera_user_requests_total{user="rs-alice"}`); got != requests+3 {
		t.Fatalf("requests %v, want %v", got, requests+3)
	}
	for _, c := range []struct{ method, path string }{{"GET", "/v1/responses/" + created.ID}, {"POST", "/v1/responses/" + created.ID + "/cancel"}} {
		if code, got := do(c.method, c.path, "", bob); code != 404 || !strings.Contains(got, "Response with id '"+created.ID+"' not found.") {
			t.Fatalf("bob's %s %s: %d %s", c.method, c.path, code, got)
		}
	}
}

// A follow-up naming another user's stored response is answered 404 as
// the engine answers an id it does not hold, and reaches no engine: the
// engine holding it would continue that conversation for the other user,
// handing them its content. The owner's follow-up goes on as before.
func TestAFollowUpOfAnotherUsersResponseIsNotFound(t *testing.T) {
	_, e1 := startEngine(t, "--speedup", "50", "--native-protocols")
	_, e2 := startEngine(t, "--speedup", "50", "--native-protocols")
	alice, ah := newKey(t)
	bob, bh := newKey(t)
	cfg := filepath.Join(t.TempDir(), "infera.json")
	writeConfig(t, cfg, fmt.Sprintf(`{"protocol":{"responses_passthrough":true},
		"users": [{"name": "fu-alice", "keys": [%q]}, {"name": "fu-bob", "keys": [%q]}]}`, ah, bh))
	_, r := startServe(t, "--workers", e1+","+e2, "--config", cfg)
	do := func(body, key string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest("POST", r+"/v1/responses", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp.StatusCode, string(b)
	}
	code, body := do(`{"model":"sim-model","input":"my secret plan","max_output_tokens":4}`, alice)
	if code != 200 {
		t.Fatalf("create: %d %s", code, body)
	}
	var created struct{ ID string }
	json.Unmarshal([]byte(body), &created)
	before := metricF(t, r, `infera_user_requests_total{user="fu-bob"}`)
	for _, stream := range []string{"false", "true"} {
		follow := `{"model":"sim-model","input":"and then?","max_output_tokens":4,"stream":` + stream + `,"previous_response_id":"` + created.ID + `"}`
		if code, got := do(follow, bob); code != 404 || !strings.Contains(got, "Response with id '"+created.ID+"' not found.") {
			t.Fatalf("bob's follow-up of alice's response (stream %s): %d %s", stream, code, got)
		}
		if code, got := do(follow, alice); code != 200 {
			t.Fatalf("alice's follow-up (stream %s): %d %s", stream, code, got)
		}
	}
	if got := metricF(t, r, `infera_user_requests_total{user="fu-bob"}`); got != before {
		t.Fatalf("bob's refused follow-ups were counted as %v requests", got-before)
	}
}

// A background Response goes through the router as vLLM serves one: the
// create is answered at once "queued" by the engine that runs it; a
// retrieve, a cancel and a retrieve again go to that engine, which answers
// it queued while it generates it, stops it on the cancel (the engine
// aborts the sequence) and answers it "cancelled" from then on; a second
// cancel is vLLM's 400. The simulated engine refused "background": true
// (400), so the router's retrieve and cancel could not be tested on a
// response that is running.
func TestABackgroundResponseIsCancelledOnItsEngineThroughTheRouter(t *testing.T) {
	s1, e1 := startEngine(t, "--native-protocols") // real time: 12 ms a token
	s2, e2 := startEngine(t, "--native-protocols")
	engines := map[string]*engine.Server{s1.ID(): s1, s2.ID(): s2}
	cfg := filepath.Join(t.TempDir(), "infera.json")
	writeConfig(t, cfg, `{"protocol":{"responses_passthrough":true}}`)
	_, r := startServe(t, "--workers", e1+","+e2, "--api-key", "k", "--config", cfg)
	do := func(method, path, body string) (int, map[string]any, string) {
		t.Helper()
		req, _ := http.NewRequest(method, r+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer k")
		if body != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var v map[string]any
		if err := json.Unmarshal(b, &v); err != nil {
			t.Fatalf("%s %s: %d %s", method, path, resp.StatusCode, b)
		}
		return resp.StatusCode, v, resp.Header.Get("X-Infera-Engine-Id")
	}
	start := time.Now()
	code, created, holder := do("POST", "/v1/responses", `{"model":"sim-model","input":"hello","max_output_tokens":5000,"background":true}`)
	id, _ := created["id"].(string)
	if code != 200 || created["status"] != "queued" || created["background"] != true || !strings.HasPrefix(id, "resp_") || engines[holder] == nil {
		t.Fatalf("create: %d from %q %v", code, holder, created)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("the create took %v: the router or the engine waited for the generation", d)
	}
	eng := engines[holder]
	for deadline := time.Now().Add(10 * time.Second); eng.Stats().Running != 1; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the background generation is not running on its engine")
		}
	}
	if code, v, from := do("GET", "/v1/responses/"+id, ""); code != 200 || from != holder || v["status"] != "queued" {
		t.Fatalf("retrieve while generating: %d from %q %v", code, from, v)
	}
	code, cancelled, from := do("POST", "/v1/responses/"+id+"/cancel", "")
	if code != 200 || from != holder || cancelled["status"] != "cancelled" || cancelled["id"] != id {
		t.Fatalf("cancel: %d from %q %v", code, from, cancelled)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if st := eng.Stats(); st.Aborted == 1 && st.Active == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the cancelled generation still runs: %+v", eng.Stats())
		}
	}
	if d := time.Since(start); d > 30*time.Second {
		t.Fatalf("cancelled after %v: the generation was not cut short", d)
	}
	if code, v, from := do("GET", "/v1/responses/"+id, ""); code != 200 || from != holder || v["status"] != "cancelled" {
		t.Fatalf("retrieve after the cancel: %d from %q %v", code, from, v)
	}
	if code, v, from := do("POST", "/v1/responses/"+id+"/cancel", ""); code != 400 || from != holder ||
		!strings.Contains(fmt.Sprint(v["error"]), "Cannot cancel a synchronous response.") {
		t.Fatalf("second cancel: %d from %q %v", code, from, v)
	}
}
