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
)

// A background Response is charged its estimate when it is created, and
// keeps it: the create is answered at once "queued" with "usage": null and
// the engine generates it afterwards, where the router reads no usage. The
// estimate is the prompt's plus max_output_tokens, or without it (and
// without the engine's max_model_len: the worker's models are given, so
// its /v1/models is not read) the router's default output estimate (1024
// tokens), not the prompt alone (the quota was charged ~15 tokens for a
// generation of up to the engine's default, so a user could generate
// without limit). Repeated creates are refused once the user's token quota
// is used.
func TestABackgroundResponseIsChargedItsEstimateAndTheQuotaRefusesMore(t *testing.T) {
	s1, e1 := startEngine(t, "--speedup", "50", "--native-protocols")
	key, hash := newKey(t)
	cfg := filepath.Join(t.TempDir(), "infera.json")
	writeConfig(t, cfg, fmt.Sprintf(`{"protocol":{"responses_passthrough":true},
		"user_limit": {"templates": [{"name": "t", "default": true,
			"quota": {"enabled": true, "windows": [{"period": "day", "max_tokens": 3000}]}}]},
		"users": [{"name": "bg-alice", "keys": [%q]}]}`, hash))
	_, r := startServe(t, "--workers", e1, "--worker-model", "sim-model", "--config", cfg)
	series := `infera_user_quota_tokens_total{user="bg-alice"}`
	create := func(body string) (int, map[string]any) {
		t.Helper()
		req, _ := http.NewRequest("POST", r+"/v1/responses", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+key)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var v map[string]any
		if err := json.Unmarshal(b, &v); err != nil {
			t.Fatalf("%d %s", resp.StatusCode, b)
		}
		return resp.StatusCode, v
	}
	// settle waits until the engine has completed n generations: a create
	// is answered while its generation may still be queued, not yet active.
	settle := func(n uint64) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); s1.Stats().Completed < n || s1.Stats().Active != 0; time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("the background generations do not end: %+v", s1.Stats())
			}
		}
	}
	const prompt = 40 // above the router's estimate of these small bodies' prompts
	// With max_output_tokens: its estimate, kept after the generation ends.
	code, v := create(`{"model":"sim-model","input":"hello","max_output_tokens":300,"background":true}`)
	if code != 200 || v["status"] != "queued" || v["usage"] != nil {
		t.Fatalf("create: %d %v", code, v)
	}
	settle(1)
	c1 := metricF(t, r, series)
	if c1 < 300 || c1 > 300+prompt {
		t.Fatalf("a background create with max_output_tokens 300 charged %v tokens, want its estimate (300 and its prompt's)", c1)
	}
	// Its retrieve, the Response ended with its usage, charges nothing
	// and gives nothing back.
	req, _ := http.NewRequest("GET", r+"/v1/responses/"+v["id"].(string), nil)
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(got), `"output_tokens":300`) {
		t.Fatalf("retrieve: %d %s", resp.StatusCode, got)
	}
	if c := metricF(t, r, series); c != c1 {
		t.Fatalf("the retrieve moved the charge from %v to %v", c1, c)
	}
	// Without: the default output estimate.
	code, v = create(`{"model":"sim-model","input":"hello","background":true}`)
	if code != 200 || v["status"] != "queued" {
		t.Fatalf("create: %d %v", code, v)
	}
	settle(2)
	c2 := metricF(t, r, series) - c1
	if c2 < 1024 || c2 > 1024+prompt {
		t.Fatalf("a background create without max_output_tokens charged %v tokens, want its estimate (1024 and its prompt's)", c2)
	}
	// 3000 - ~1350 used: one more fits, the next does not.
	code, v = create(`{"model":"sim-model","input":"hello","background":true}`)
	if code != 200 {
		t.Fatalf("third create: %d %v", code, v)
	}
	for i := 0; i < 3; i++ {
		code, v = create(`{"model":"sim-model","input":"hello","background":true}`)
		if e, _ := v["error"].(map[string]any); code != 429 || e["code"] != "quota_tokens_day" {
			t.Fatalf("create #%d past the quota: %d %v", i+4, code, v)
		}
	}
}

// A background Response without max_output_tokens is estimated with the
// output estimate of the user's template (rate.default_output_tokens) when
// it sets one, as any request without max_tokens is: 3000 here, not the
// router's default of 1024 (the template's larger estimate was ignored, so
// a background create cost a third of a foreground one's reservation).
func TestABackgroundResponseIsEstimatedWithItsTemplatesDefaultOutput(t *testing.T) {
	s1, e1 := startEngine(t, "--speedup", "50", "--native-protocols")
	key, hash := newKey(t)
	cfg := filepath.Join(t.TempDir(), "infera.json")
	writeConfig(t, cfg, fmt.Sprintf(`{"protocol":{"responses_passthrough":true},
		"user_limit": {"templates": [{"name": "t", "default": true,
			"rate": {"enabled": true, "default_output_tokens": 3000},
			"quota": {"enabled": true, "windows": [{"period": "day", "max_tokens": 100000}]}}]},
		"users": [{"name": "bg-carol", "keys": [%q]}]}`, hash))
	_, r := startServe(t, "--workers", e1, "--config", cfg)
	req, _ := http.NewRequest("POST", r+"/v1/responses", strings.NewReader(`{"model":"sim-model","input":"hello","background":true}`))
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(b), `"queued"`) {
		t.Fatalf("create: %d %s", resp.StatusCode, b)
	}
	for deadline := time.Now().Add(10 * time.Second); s1.Stats().Completed < 1 || s1.Stats().Active != 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the background generation does not end: %+v", s1.Stats())
		}
	}
	const prompt = 40 // above the router's estimate of this small body's prompt
	if c := metricF(t, r, `infera_user_quota_tokens_total{user="bg-carol"}`); c < 3000 || c > 3000+prompt {
		t.Fatalf("a background create without max_output_tokens charged %v tokens, want its template's estimate (3000 and its prompt's)", c)
	}
}

// A user with a concurrency limit is refused a background Response (403
// background_not_allowed, param background): its generation would hold no
// slot, since the exchange ends at once and the router does not see the
// engine end it. The same request without background is served.
func TestABackgroundResponseIsRefusedToAUserWithAConcurrencyLimit(t *testing.T) {
	_, e1 := startEngine(t, "--speedup", "50", "--native-protocols")
	key, hash := newKey(t)
	cfg := filepath.Join(t.TempDir(), "infera.json")
	writeConfig(t, cfg, fmt.Sprintf(`{"protocol":{"responses_passthrough":true},
		"user_limit": {"templates": [{"name": "t", "default": true, "concurrency": {"enabled": true, "limit": 1}}]},
		"users": [{"name": "bg-bob", "keys": [%q]}]}`, hash))
	_, r := startServe(t, "--workers", e1, "--config", cfg)
	for _, c := range []struct {
		bg   string
		code int
	}{{`true`, 403}, {`"yes"`, 403}, {`false`, 200}} {
		req, _ := http.NewRequest("POST", r+"/v1/responses", strings.NewReader(`{"model":"sim-model","input":"hello","max_output_tokens":4,"background":`+c.bg+`}`))
		req.Header.Set("Authorization", "Bearer "+key)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var v struct {
			Error struct{ Type, Param, Code string }
		}
		json.Unmarshal(b, &v)
		if resp.StatusCode != c.code || c.code == 403 && (v.Error.Code != "background_not_allowed" || v.Error.Param != "background" || v.Error.Type != "permission_error") {
			t.Fatalf("background %s: %d %s, want %d", c.bg, resp.StatusCode, b, c.code)
		}
	}
}

// A background Response without max_output_tokens, whose user template
// sets no output estimate, is estimated with what its engine may generate:
// the max_model_len the engine's /v1/models tells (vLLM's ModelCard; here
// the simulated engine's 200 blocks of 16 tokens, 3200) less the prompt's
// estimate, so its charge, prompt and output, is 3200 tokens. It was
// charged the router's default output estimate (1024 and the prompt's),
// though vLLM's default max_tokens is max_model_len less the prompt.
// Through a NATS or etcd worker sidecar the same number travels in the
// worker's record (max_model_len).
func TestABackgroundResponseIsEstimatedWithWhatTheModelsContextLeaves(t *testing.T) {
	s1, e1 := startEngine(t, "--speedup", "50", "--native-protocols", "--kv-capacity-blocks", "200")
	resp, err := http.Get(e1 + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	models, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(models), `"max_model_len":3200`) {
		t.Fatalf("the engine's /v1/models: %s", models)
	}
	key, hash := newKey(t)
	cfg := filepath.Join(t.TempDir(), "infera.json")
	writeConfig(t, cfg, fmt.Sprintf(`{"protocol":{"responses_passthrough":true},
		"user_limit": {"templates": [{"name": "t", "default": true,
			"quota": {"enabled": true, "windows": [{"period": "day", "max_tokens": 100000}]}}]},
		"users": [{"name": "bg-dave", "keys": [%q]}]}`, hash))
	_, r := startServe(t, "--workers", e1, "--config", cfg)
	series := `infera_user_quota_tokens_total{user="bg-dave"}`
	create := func(body string) {
		t.Helper()
		req, _ := http.NewRequest("POST", r+"/v1/responses", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+key)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.Contains(string(b), `"queued"`) {
			t.Fatalf("create: %d %s", resp.StatusCode, b)
		}
		for deadline := time.Now().Add(10 * time.Second); s1.Stats().Active != 0; time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("the background generation does not end: %+v", s1.Stats())
			}
		}
	}
	create(`{"model":"sim-model","input":"hello","background":true}`)
	if c := metricF(t, r, series); c != 3200 {
		t.Fatalf("a background create without max_output_tokens charged %v tokens, want the model's max_model_len (3200: its prompt's estimate and the output left)", c)
	}
	// With max_output_tokens, that limit.
	create(`{"model":"sim-model","input":"hello","max_output_tokens":300,"background":true}`)
	const prompt = 40 // above the router's estimate of this small body's prompt
	if c := metricF(t, r, series) - 3200; c < 300 || c > 300+prompt {
		t.Fatalf("a background create with max_output_tokens 300 charged %v tokens, want 300 and its prompt's", c)
	}
}

// A background Response without max_output_tokens for an alias that model
// routing sends by service (a model mapping, or a canary rule) is
// estimated with the max_model_len of the workers of those services, the
// largest of them (its engine may be any of them, and the charge is never
// settled: a smaller one would leave output uncharged): 3200, of the
// engine of 200 blocks beside one of 100 (1600). No worker serves the
// alias by name, so none was found and it was charged the router's
// default output estimate (1024 and its prompt's).
func TestABackgroundResponseForAnAliasIsEstimatedWithItsServicesContext(t *testing.T) {
	s1, e1 := startEngine(t, "--speedup", "50", "--native-protocols", "--kv-capacity-blocks", "200")
	s2, e2 := startEngine(t, "--speedup", "50", "--native-protocols", "--kv-capacity-blocks", "100")
	key, hash := newKey(t)
	cfg := filepath.Join(t.TempDir(), "infera.json")
	writeConfig(t, cfg, fmt.Sprintf(`{"protocol":{"responses_passthrough":true},
		"workers": [{"id": "long", "url": %q, "service": "svc-long"}, {"id": "short", "url": %q, "service": "svc-short"}],
		"model_routing": {"enabled": true, "mappings": [{"pattern": "house-*", "services": ["svc-long", "svc-short"]}]},
		"canary": {"enabled": true, "rules": [{"model": "canary-model", "targets": [{"service": "svc-long", "weight": 1}, {"service": "svc-short", "weight": 1}]}]},
		"user_limit": {"templates": [{"name": "t", "default": true,
			"quota": {"enabled": true, "windows": [{"period": "day", "max_tokens": 100000}]}}]},
		"users": [{"name": "bg-erin", "keys": [%q]}]}`, e1, e2, hash))
	_, r := startServe(t, "--config", cfg)
	series := `infera_user_quota_tokens_total{user="bg-erin"}`
	charged := 0.0
	for _, model := range []string{"house-assistant", "canary-model"} {
		req, _ := http.NewRequest("POST", r+"/v1/responses", strings.NewReader(`{"model":"`+model+`","input":"hello","background":true}`))
		req.Header.Set("Authorization", "Bearer "+key)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.Contains(string(b), `"queued"`) {
			t.Fatalf("create %s: %d %s", model, resp.StatusCode, b)
		}
		for deadline := time.Now().Add(10 * time.Second); s1.Stats().Active != 0 || s2.Stats().Active != 0; time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("the background generation does not end: %+v %+v", s1.Stats(), s2.Stats())
			}
		}
		c := metricF(t, r, series)
		if c-charged != 3200 {
			t.Fatalf("a background create for %s without max_output_tokens charged %v tokens, want its services' largest max_model_len (3200)", model, c-charged)
		}
		charged = c
	}
}

// On a long-context model (the simulated engine's default: 8192 blocks of
// 16 tokens, max_model_len 131072) a background Response without
// max_output_tokens is charged the whole context, 131072 tokens, whatever
// it generates: the charge is never settled, and vLLM's default
// max_tokens is what the context leaves, so anything less would let
// output go uncharged. A user with a daily quota of 200000 tokens gets one
// such create, and the next is refused (429 quota_tokens_day) while one
// with max_output_tokens is served. The operator's bound is the template's
// output estimate, rate.default_output_tokens with rate.enabled (RPM and
// TPM may stay 0, no limit): hot-reloaded, the next create is charged it
// (2000 and its prompt), and output beyond it is not charged.
func TestABackgroundResponseOnALongContextIsChargedItsContextUnlessTheTemplateBoundsIt(t *testing.T) {
	clearOfMidnight(t, "UTC", 30*time.Second) // its day quota is counted whole
	s1, e1 := startEngine(t, "--speedup", "50", "--native-protocols")
	key, hash := newKey(t)
	cfg := filepath.Join(t.TempDir(), "infera.json")
	write := func(rate string) {
		writeConfig(t, cfg, fmt.Sprintf(`{"protocol":{"responses_passthrough":true},
			"user_limit": {"timezone": "UTC", "templates": [{"name": "t", "default": true, %s
				"quota": {"enabled": true, "windows": [{"period": "day", "max_tokens": 200000}]}}]},
			"users": [{"name": "bg-frank", "keys": [%q]}]}`, rate, hash))
	}
	write("")
	rt, r := startServe(t, "--workers", e1, "--config", cfg, "--config-poll", "20ms")
	series := `infera_user_quota_tokens_total{user="bg-frank"}`
	create := func(body string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest("POST", r+"/v1/responses", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+key)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		for deadline := time.Now().Add(10 * time.Second); s1.Stats().Active != 0; time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("the background generation does not end: %+v", s1.Stats())
			}
		}
		return resp.StatusCode, string(b)
	}
	const bg = `{"model":"sim-model","input":"hello","background":true}`
	if code, b := create(bg); code != 200 || !strings.Contains(b, `"queued"`) {
		t.Fatalf("create: %d %s", code, b)
	}
	if c := metricF(t, r, series); c != 131072 {
		t.Fatalf("a background create without max_output_tokens charged %v tokens, want the model's max_model_len (131072)", c)
	}
	if code, b := create(bg); code != 429 || !strings.Contains(b, "quota_tokens_day") {
		t.Fatalf("a second create without max_output_tokens past the quota's 200000: %d %s, want 429 quota_tokens_day", code, b)
	}
	if code, b := create(`{"model":"sim-model","input":"hello","max_output_tokens":300,"background":true}`); code != 200 {
		t.Fatalf("a create with max_output_tokens 300: %d %s", code, b)
	}
	before := metricF(t, r, series)
	write(`"rate": {"enabled": true, "default_output_tokens": 2000},`)
	waitUntil(t, "the reload", func() bool {
		c := rt.store.Load()
		return c.UserLimit.Templates[0].Rate.Enabled && rt.gov.Applied() == c
	})
	if code, b := create(bg); code != 200 {
		t.Fatalf("a create without max_output_tokens under the template's estimate: %d %s", code, b)
	}
	const prompt = 40 // above the router's estimate of this small body's prompt
	if c := metricF(t, r, series) - before; c < 2000 || c > 2000+prompt {
		t.Fatalf("a background create without max_output_tokens charged %v tokens under an output estimate of 2000, want 2000 and its prompt's", c)
	}
}
