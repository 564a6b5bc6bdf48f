package gateway

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/infera/infera/engine"
	"github.com/infera/infera/internal/testsrv"
)

// Two router processes sharing Redis (--state) share their table of stored
// Responses: a response created through router A is retrieved, cancelled
// (a background one) and continued (a streamed previous_response_id
// follow-up) through router B on the engine that holds it; a restarted
// router finds it too; another user's retrieve and follow-up are 404 as on
// one router, and so is a response whose engine the router's fleet lacks; Redis keeps the engine and the user's name, no key, for a
// day; an id B fetched once is not asked of Redis again; with Redis down,
// an id B does not know is 404 and counted, while A still serves the ids
// it knows. Before, B answered 404 for every id A had created (the table
// was each router's memory).
func TestRoutersSharingRedisShareTheirStoredResponses(t *testing.T) {
	rd := testsrv.StartStoppableRedis(t)
	s1, e1 := startEngine(t, "--native-protocols") // real time: 12 ms a token
	s2, e2 := startEngine(t, "--native-protocols")
	engines := map[string]*engine.Server{s1.ID(): s1, s2.ID(): s2}
	alice, ah := newKey(t)
	bob, bh := newKey(t)
	cfg := filepath.Join(t.TempDir(), "infera.json")
	writeConfig(t, cfg, fmt.Sprintf(`{"protocol":{"responses_passthrough":true},
		"users": [{"name": "sh-alice", "keys": [%q]}, {"name": "sh-bob", "keys": [%q]}]}`, ah, bh))
	serve := func() *child {
		return startChild(t, "serve", 0, "--workers", "e1="+e1+",e2="+e2, "--config", cfg, "--state", rd.URL,
			"--router-policy", "round-robin")
	}
	ra, rb := serve(), serve()
	do := func(r *child, method, path, body, key string) (int, string, string) {
		t.Helper()
		req, _ := http.NewRequest(method, r.url+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+key)
		if body != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp.StatusCode, string(b), resp.Header.Get("X-Infera-Engine-Id")
	}
	found := func(r *child) float64 {
		return metricF(t, r.url, `infera_protocol_response_state_lookups_total{result="found"}`)
	}

	// Four stored responses through A: round-robin puts two on each engine.
	type stored struct{ id, engine, body string }
	var made []stored
	for i := 0; i < 4; i++ {
		code, body, from := do(ra, "POST", "/v1/responses", `{"model":"sim-model","input":"hello","max_output_tokens":4}`, alice)
		var v struct{ ID string }
		json.Unmarshal([]byte(body), &v)
		if code != 200 || engines[from] == nil || !strings.HasPrefix(v.ID, "resp_") {
			t.Fatalf("create through A: %d from %q %s", code, from, body)
		}
		made = append(made, stored{v.ID, from, body})
	}
	if made[0].engine == made[1].engine {
		t.Fatalf("round-robin put both responses on %s", made[0].engine)
	}
	rec, err := rd.Do("GET", "infera:resp:"+made[0].id)
	if err != nil || !strings.Contains(rec, `"user":"sh-alice"`) || !strings.Contains(rec, `"worker":"e`) ||
		strings.Contains(rec, alice) || strings.Contains(rec, ah) {
		t.Fatalf("the record in Redis: %q %v", rec, err)
	}
	ttl, err := rd.Do("PTTL", "infera:resp:"+made[0].id)
	if ms, _ := strconv.Atoi(ttl); err != nil || ms > 86400000 || ms < 86000000 {
		t.Fatalf("the record's TTL: %s ms %v, want a day", ttl, err)
	}

	// Through B: retrieved from the engine holding it, the same bytes.
	for _, m := range made {
		if code, got, from := do(rb, "GET", "/v1/responses/"+m.id, "", alice); code != 200 || from != m.engine || got != m.body {
			t.Fatalf("retrieve %s through B (held by %s): %d from %q %s", m.id, m.engine, code, from, got)
		}
	}
	if got := found(rb); got != float64(len(made)) {
		t.Fatalf("B found %v ids in Redis, want %d", got, len(made))
	}
	for _, m := range made { // kept in B's memory now: no round trip
		if code, _, from := do(rb, "GET", "/v1/responses/"+m.id, "", alice); code != 200 || from != m.engine {
			t.Fatalf("retrieve %s through B again: %d from %q", m.id, code, from)
		}
	}
	if got := found(rb); got != float64(len(made)) {
		t.Fatalf("B asked Redis again for ids it knew: %v found", got)
	}
	if got := found(ra); got != 0 {
		t.Fatalf("A asked Redis for ids it learned itself: %v found", got)
	}

	// Another user's retrieve, cancel and follow-up: 404 as the engine's.
	notFound := "Response with id '" + made[1].id + "' not found."
	for _, c := range []struct{ method, path, body string }{
		{"GET", "/v1/responses/" + made[1].id, ""},
		{"POST", "/v1/responses/" + made[1].id + "/cancel", ""},
		{"POST", "/v1/responses", `{"model":"sim-model","input":"and?","max_output_tokens":4,"previous_response_id":"` + made[1].id + `"}`},
	} {
		if code, got, from := do(rb, c.method, c.path, c.body, bob); code != 404 || from != "" || !strings.Contains(got, notFound) {
			t.Fatalf("bob's %s %s through B: %d from %q %s", c.method, c.path, code, from, got)
		}
	}

	// A streamed follow-up through a third router, which knows none of
	// them: each goes to the engine holding its previous response (the
	// other engine would answer 404).
	rc := serve()
	for _, m := range made {
		code, got, from := do(rc, "POST", "/v1/responses",
			`{"model":"sim-model","input":"and then?","max_output_tokens":4,"stream":true,"previous_response_id":"`+m.id+`"}`, alice)
		ended := strings.Contains(got, "event: response.completed") || strings.Contains(got, "event: response.incomplete")
		if code != 200 || from != m.engine || !ended || !strings.Contains(got, `"previous_response_id":"`+m.id+`"`) {
			t.Fatalf("streamed follow-up of %s (held by %s) through C: %d from %q %s", m.id, m.engine, code, from, got)
		}
	}

	// A router whose fleet lacks an engine answers its responses 404: the
	// record names an engine that is not there (a vLLM store is the
	// engine's memory).
	rd1 := startChild(t, "serve", 0, "--workers", "e1="+e1, "--config", cfg, "--state", rd.URL)
	for _, m := range made {
		want := 200
		if m.engine != s1.ID() {
			want = 404
		}
		if code, got, _ := do(rd1, "GET", "/v1/responses/"+m.id, "", alice); code != want {
			t.Fatalf("retrieve %s (held by %s) through a router serving only %s: %d %s, want %d", m.id, m.engine, s1.ID(), code, got, want)
		}
	}

	// A background response created through A is cancelled through B on
	// the engine running it.
	code, body, holder := do(ra, "POST", "/v1/responses", `{"model":"sim-model","input":"hello","max_output_tokens":5000,"background":true}`, alice)
	var bg struct{ ID, Status string }
	json.Unmarshal([]byte(body), &bg)
	if code != 200 || bg.Status != "queued" || engines[holder] == nil {
		t.Fatalf("background create through A: %d from %q %s", code, holder, body)
	}
	code, body, from := do(rb, "POST", "/v1/responses/"+bg.ID+"/cancel", "", alice)
	if code != 200 || from != holder || !strings.Contains(body, `"status":"cancelled"`) {
		t.Fatalf("cancel through B (running on %s): %d from %q %s", holder, code, from, body)
	}
	for deadline := time.Now().Add(10 * time.Second); engines[holder].Stats().Aborted != 1; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the cancelled generation still runs: %+v", engines[holder].Stats())
		}
	}

	// The OpenAI Node SDK's responses.retrieve through B.
	if node, dir, ok := nodeSDKIfInstalled(t, "openai"); ok {
		ids := []string{made[0].id, made[1].id, bg.ID}
		runSDKScript(t, node, dir, "retrieve.mjs", rb.url, alice, "INFERA_RESPONSE_IDS="+strings.Join(ids, ","))
	}

	// A restarted router finds them (its memory is empty).
	ra.stop()
	ra = serve()
	for _, m := range made {
		if code, got, from := do(ra, "GET", "/v1/responses/"+m.id, "", alice); code != 200 || from != m.engine || got != m.body {
			t.Fatalf("retrieve %s through the restarted A: %d from %q %s", m.id, code, from, got)
		}
	}

	// Redis down: an id B never saw is 404 and counted; A still serves the
	// one it created from its memory.
	code, body, holder = do(ra, "POST", "/v1/responses", `{"model":"sim-model","input":"late","max_output_tokens":4}`, alice)
	var late struct{ ID string }
	json.Unmarshal([]byte(body), &late)
	if code != 200 || late.ID == "" {
		t.Fatalf("create through A: %d %s", code, body)
	}
	rd.Stop()
	lookupErrors := `infera_protocol_response_state_errors_total{op="lookup"}`
	if code, got, from := do(rb, "GET", "/v1/responses/"+late.ID, "", alice); code != 404 || from != "" ||
		!strings.Contains(got, "Response with id '"+late.ID+"' not found.") {
		t.Fatalf("retrieve through B with Redis down: %d from %q %s", code, from, got)
	}
	if got := metricF(t, rb.url, lookupErrors); got != 1 {
		t.Fatalf("%s = %v on B, want 1", lookupErrors, got)
	}
	if code, _, from := do(ra, "GET", "/v1/responses/"+late.ID, "", alice); code != 200 || from != holder {
		t.Fatalf("retrieve through A, which created it, with Redis down: %d from %q", code, from)
	}
	if got := metricF(t, ra.url, lookupErrors); got != 0 {
		t.Fatalf("A asked the Redis that is down for an id it knew: %s = %v", lookupErrors, got)
	}
}

// nodeSDKIfInstalled is nodeSDK for a test whose other checks run without
// the SDKs: ok is false when they are not installed (a failure with
// INFERA_REQUIRE_SDK=1).
func nodeSDKIfInstalled(t *testing.T, modules ...string) (node, dir string, ok bool) {
	t.Helper()
	dir = filepath.Join("..", "scripts", "sdk")
	node, err := exec.LookPath("node")
	for _, m := range modules {
		if _, e := os.Stat(filepath.Join(dir, "node_modules", m)); e != nil && err == nil {
			err = e
		}
	}
	if err != nil {
		if os.Getenv("INFERA_REQUIRE_SDK") == "1" {
			t.Fatalf("node or scripts/sdk/node_modules missing (run make deps): %v", err)
		}
		t.Logf("the OpenAI Node SDK's retrieve is not checked: %v", err)
		return "", "", false
	}
	return node, dir, true
}
