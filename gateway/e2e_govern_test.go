package gateway

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/infera/infera/govern"
	"github.com/infera/infera/internal/testsrv"
)

// End-to-end tests of docs/governance.md through the real router: users
// and their keys, quota templates (allowed periods in a timezone with DST,
// periodic quotas, concurrency, RPM/TPM reconciled from the engines' real
// usage), dry run, request rate limiting's seats and queues, and counters
// shared by two router processes through a real redis-server.

// govAnswer is one answer: status, the OpenAI error code and Retry-After.
type govAnswer struct {
	status      int
	code, retry string
	body        string
	usage       struct{ prompt, cached, completion int }
}

// govPost posts body to url's chat endpoint with Authorization: Bearer key
// (none when key is ""), and checks that an error is in OpenAI's shape.
func govPost(t *testing.T, url, key, body string) govAnswer {
	t.Helper()
	req, _ := http.NewRequest("POST", url+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	a := govAnswer{status: resp.StatusCode, retry: resp.Header.Get("Retry-After"), body: string(b)}
	var e struct {
		Error *struct {
			Message string  `json:"message"`
			Type    string  `json:"type"`
			Param   *string `json:"param"`
			Code    *string `json:"code"`
		} `json:"error"`
		Usage struct {
			PromptTokens        int `json:"prompt_tokens"`
			CompletionTokens    int `json:"completion_tokens"`
			PromptTokensDetails struct {
				CachedTokens int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(b, &e); err != nil && resp.StatusCode != 200 {
		t.Fatalf("%d: not JSON: %s", resp.StatusCode, b)
	}
	if resp.StatusCode >= 400 {
		if e.Error == nil || e.Error.Message == "" || e.Error.Type == "" || e.Error.Code == nil {
			t.Fatalf("%d: not an OpenAI error with a code: %s", resp.StatusCode, b)
		}
		a.code = *e.Error.Code
	}
	a.usage.prompt, a.usage.cached, a.usage.completion = e.Usage.PromptTokens, e.Usage.PromptTokensDetails.CachedTokens, e.Usage.CompletionTokens
	return a
}

func (a govAnswer) want(t *testing.T, status int, code string) {
	t.Helper()
	if a.status != status || a.code != code {
		t.Fatalf("got %d %q, want %d %q: %s", a.status, a.code, status, code, a.body)
	}
}

// retryAfter is the Retry-After of a, in seconds.
func (a govAnswer) retryAfter(t *testing.T) int {
	t.Helper()
	n, err := strconv.Atoi(a.retry)
	if err != nil || n <= 0 {
		t.Fatalf("Retry-After %q: %s", a.retry, a.body)
	}
	return n
}

func newKey(t *testing.T) (key, hash string) {
	t.Helper()
	k, h, err := govern.NewKey()
	if err != nil {
		t.Fatal(err)
	}
	return k, h
}

// metricF returns one series of url's /metrics as a number (0 if absent).
func metricF(t *testing.T, url, series string) float64 {
	t.Helper()
	f, _ := strconv.ParseFloat(metric(t, url, series), 64)
	return f
}

// Users, their keys, a daily request quota with Retry-After to the next
// local midnight, the global key beyond every limit, and a reload that
// raises the quota without a restart.
func TestE2EGovernUsersQuotaErrorsAndReload(t *testing.T) {
	clearOfMidnight(t, "UTC", 30*time.Second) // its day quota is counted whole
	_, eng := startEngine(t, "--speedup", "50")
	ka, ha := newKey(t)
	kb, hb := newKey(t)
	kx, _ := newKey(t)
	cfg := filepath.Join(t.TempDir(), "infera.json")
	write := func(maxRequests int) {
		writeConfig(t, cfg, fmt.Sprintf(`{
			"user_limit": {"timezone": "UTC", "templates": [{"name": "std", "default": true,
				"quota": {"enabled": true, "windows": [{"period": "day", "max_requests": %d}]}}]},
			"users": [{"name": "users-alice", "keys": [%q]}, {"name": "users-bob", "keys": [%q], "enabled": false}]}`,
			maxRequests, ha, hb))
	}
	write(3)
	rt, r := startServe(t, "--workers", eng, "--config", cfg, "--config-poll", "20ms", "--api-key", "admin-key")
	body := chatJSON("sim-model", "hello", 2, false)
	for i := 0; i < 3; i++ {
		govPost(t, r, ka, body).want(t, 200, "")
	}
	rej := govPost(t, r, ka, body)
	rej.want(t, 429, "quota_requests_day")
	now := time.Now().UTC()
	midnight := time.Date(now.Year(), now.Month(), now.Day()+1, 0, 0, 0, 0, time.UTC)
	if d := rej.retryAfter(t) - int(math.Ceil(midnight.Sub(now).Seconds())); d < -5 || d > 5 {
		t.Fatalf("Retry-After %s, want the %v until midnight UTC", rej.retry, midnight.Sub(now))
	}
	govPost(t, r, "admin-key", body).want(t, 200, "") // the global key: no user limits
	govPost(t, r, kb, body).want(t, 403, "user_disabled")
	govPost(t, r, kx, body).want(t, 401, "invalid_api_key")
	govPost(t, r, "", body).want(t, 401, "invalid_api_key")
	if a := govPost(t, r, kx, body); strings.Contains(a.body, kx[4:20]) {
		t.Fatalf("the key id is echoed: %s", a.body)
	}

	write(5)                                 // hot reload: two more today
	waitUntil(t, "the reload", func() bool { // published, and applied by the governor
		c := rt.store.Load()
		return c.UserLimit.Templates[0].Quota.Windows[0].MaxRequests == 5 && rt.gov.Applied() == c
	})
	govPost(t, r, ka, body).want(t, 200, "")
	govPost(t, r, ka, body).want(t, 200, "")
	govPost(t, r, ka, body).want(t, 429, "quota_requests_day")

	if v := metricF(t, r, `infera_user_requests_total{user="users-alice"}`); v != 5 {
		t.Fatalf("infera_user_requests_total %v, want 5", v)
	}
	if v := metricF(t, r, `infera_user_rejections_total{user="users-alice"}`); v != 2 {
		t.Fatalf("infera_user_rejections_total %v, want 2", v)
	}
	if v := metricF(t, r, `infera_user_limit_hits_total{rule="quota_requests_day",result="rejected"}`); v < 2 {
		t.Fatalf("quota hits %v, want at least 2", v)
	}
	if v := metricF(t, r, `infera_user_auth_failures_total{reason="disabled"}`); v < 1 {
		t.Fatalf("auth failures (disabled) %v", v)
	}
}

// holdStream starts a long stream through url and returns its response
// (open: the request holds its concurrency slot and seat until closed).
func holdStream(t *testing.T, url, key string) *http.Response {
	t.Helper()
	req, _ := http.NewRequest("POST", url+"/v1/chat/completions", strings.NewReader(chatJSON("sim-model", "a long story", 2000, true)))
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("hold: %v %v", resp, err)
	}
	buf := make([]byte, 1)
	if _, err := io.ReadFull(resp.Body, buf); err != nil { // the first token is in
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

// rawChat sends a chat request on a raw connection; closing it is the
// client leaving.
func rawChat(t *testing.T, url, key string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp4", strings.TrimPrefix(url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	body := chatJSON("sim-model", "queued", 2, false)
	fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", key, len(body), body)
	return c
}

// A user's queue and the engines' seat queue: a queued request whose
// client leaves is removed at once, never reaches the engine, and holds
// nothing afterwards.
func TestE2EGovernQueuedClientsThatLeave(t *testing.T) {
	engS, eng := startEngine(t) // real time: the held stream lasts ~24 s
	ka, ha := newKey(t)
	kb, hb := newKey(t)
	cfg := filepath.Join(t.TempDir(), "infera.json")
	writeConfig(t, cfg, fmt.Sprintf(`{
		"rate_limit": {"overall_concurrency": 1, "overlimit": "queue", "queue_size": 10, "queue_timeout_ms": 30000},
		"user_limit": {"templates": [{"name": "one-at-a-time", "concurrency": {"enabled": true, "limit": 1,
			"overlimit": "queue", "queue_size": 10, "queue_timeout_ms": 30000}}]},
		"users": [{"name": "leave-alice", "keys": [%q], "template": "one-at-a-time"}, {"name": "leave-bob", "keys": [%q]}]}`, ha, hb))
	_, r := startServe(t, "--workers", eng, "--config", cfg, "--router-policy", "round-robin")
	userQ := func() float64 { return metricF(t, r, "infera_user_limit_queue_length") }
	seatQ := func() float64 { return metricF(t, r, "infera_rate_limit_queue_length") }

	held := holdStream(t, r, ka) // alice's slot and the engine's one seat
	before := engS.Stats().RequestsTotal
	c := rawChat(t, r, ka) // alice's second request waits for her slot
	waitUntil(t, "alice queued", func() bool { return userQ() == 1 })
	t0 := time.Now()
	c.Close()
	waitUntil(t, "alice's queue empty", func() bool { return userQ() == 0 })
	el := time.Since(t0)

	c = rawChat(t, r, kb) // bob has no template: he waits for the seat
	waitUntil(t, "bob queued for a seat", func() bool { return seatQ() == 1 })
	t0 = time.Now()
	c.Close()
	waitUntil(t, "the seat queue empty", func() bool { return seatQ() == 0 })
	if el2 := time.Since(t0); el > 5*time.Second || el2 > 5*time.Second { // the queue timeouts are 30 s
		t.Fatalf("the leavers were removed after %v and %v", el, el2)
	}
	if n := engS.Stats().RequestsTotal; n != before {
		t.Fatalf("the engine got %d requests from clients that left", n-before)
	}
	held.Body.Close() // the stream ends: slot and seat are free
	body := chatJSON("sim-model", "hi", 2, false)
	waitUntil(t, "the seat freed", func() bool { return metricF(t, r, `infera_rate_limit_seats{counter="overall"}`) == 0 })
	govPost(t, r, ka, body).want(t, 200, "")
	govPost(t, r, kb, body).want(t, 200, "")
}

// Engine seats: a worker at its concurrency limit is passed over while
// another has a free seat; with every worker at its limit the request is
// refused (reject) with the code of the limit, and counted.
func TestE2EGovernSeatsSpreadAndRefuse(t *testing.T) {
	engA, eA := startEngine(t, "--speedup", "5")
	engB, eB := startEngine(t, "--speedup", "5")
	cfg := filepath.Join(t.TempDir(), "infera.json")
	writeConfig(t, cfg, `{"rate_limit": {"scope": "instance", "overall_concurrency": 1}}`)
	// kv-aware with the same prompt would send everything to one engine.
	_, r := startServe(t, "--workers", "a="+eA+",b="+eB, "--config", cfg)
	holdStream(t, r, "")
	holdStream(t, r, "")
	if engA.Stats().Active != 1 || engB.Stats().Active != 1 {
		t.Fatalf("two held streams on engines a %d, b %d: want one each", engA.Stats().Active, engB.Stats().Active)
	}
	hits := metricF(t, r, `infera_rate_limit_hits_total{rule="concurrency_overall",result="rejected"}`)
	a := govPost(t, r, "", chatJSON("sim-model", "a long story", 2, false))
	a.want(t, 429, "concurrency_overall")
	if a.retry != "" {
		t.Fatalf("Retry-After %q on a concurrency refusal", a.retry)
	}
	if v := metricF(t, r, `infera_rate_limit_hits_total{rule="concurrency_overall",result="rejected"}`); v != hits+1 {
		t.Fatalf("hits %v, want %v", v, hits+1)
	}
	if v := metricF(t, r, `infera_rate_limit_seats{counter="overall"}`); v != 2 {
		t.Fatalf("seats held %v, want 2", v)
	}
}

// The no-overshoot guarantee through the real router: 200 concurrent
// requests of one user against a quota of N requests admit exactly N;
// against a quota of T weighted tokens with max_tokens set, the tokens
// charged (from the engine's usage) never exceed T.
func TestE2EGovernNoOvershootUnder200ConcurrentRequests(t *testing.T) {
	clearOfMidnight(t, "UTC", 30*time.Second) // its day quota is counted whole
	_, eng := startEngine(t, "--speedup", "50", "--max-batch", "256")
	kr, hr := newKey(t)
	kt, ht := newKey(t)
	cfg := filepath.Join(t.TempDir(), "infera.json")
	writeConfig(t, cfg, fmt.Sprintf(`{
		"user_limit": {"templates": [
			{"name": "n", "quota": {"enabled": true, "windows": [{"period": "day", "max_requests": 37}]}},
			{"name": "t", "quota": {"enabled": true, "weights": {"input": 1, "output": 1, "cached": 1},
				"windows": [{"period": "month", "max_tokens": 1000}]}}]},
		"users": [{"name": "burst-requests", "keys": [%q], "template": "n"}, {"name": "burst-tokens", "keys": [%q], "template": "t"}]}`, hr, ht))
	// kv-aware (the default) tokenizes the prompt as the engine does: the
	// router's prompt estimate is exact, so with max_tokens set the
	// overshoot bound of docs/governance.md is zero.
	_, r := startServe(t, "--workers", eng, "--config", cfg)
	burst := func(key string, n int) map[int]int {
		var mu sync.Mutex
		got := map[int]int{}
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := 0; i < n; i++ {
			wg.Add(1)
			go func(i int) {
				defer wg.Done()
				<-start
				a := govPost(t, r, key, chatJSON("sim-model", fmt.Sprintf("request %d of the burst", i), 8, false))
				mu.Lock()
				got[a.status]++
				mu.Unlock()
			}(i)
		}
		close(start)
		wg.Wait()
		return got
	}
	if got := burst(kr, 200); got[200] != 37 || got[429] != 163 {
		t.Fatalf("request quota of 37 under 200 concurrent requests: %v", got)
	}
	got := burst(kt, 200)
	charged := metricF(t, r, `infera_user_quota_tokens_total{user="burst-tokens"}`)
	if charged > 1000 || got[200] == 0 || got[200]+got[429] != 200 {
		t.Fatalf("token quota of 1000: %v admitted, %v tokens charged", got, charged)
	}
	// Each request is ~20 tokens: the quota admits nearly as many as fit.
	if charged < 900 {
		t.Fatalf("only %v of 1000 tokens used by %d requests: admission too strict", charged, got[200])
	}
	t.Logf("token quota 1000: %d admitted, %v tokens charged", got[200], charged)
}

// TPM is pre-deducted with the estimate and reconciled with the usage the
// engine reports: the quota counter shows the engine's tokens, not the
// estimate, and the bucket runs dry after as many requests as real usage
// allows (with Retry-After); a stream with usage is reconciled too; a
// stream without usage keeps its estimate. Over both request transports.
func TestE2EGovernTPMReconciledFromRealUsage(t *testing.T) {
	for _, transport := range []string{"http", "nats"} {
		t.Run(transport, func(t *testing.T) { testTPMReconciledOver(t, transport) })
	}
}

func testTPMReconciledOver(t *testing.T, transport string) {
	_, eng := startEngine(t, "--speedup", "50", "--default-max-tokens", "150")
	key, hash := newKey(t)
	cfg := filepath.Join(t.TempDir(), "infera.json")
	writeConfig(t, cfg, fmt.Sprintf(`{
		"user_limit": {"templates": [{"name": "t", "default": true,
			"quota": {"enabled": true, "weights": {"input": 1, "output": 1, "cached": 1},
				"windows": [{"period": "day", "max_tokens": 100000000}]},
			"rate": {"enabled": true, "tpm": 1000, "default_output_tokens": 10}}]},
		"users": [{"name": "tpm-erin", "keys": [%q]}]}`, hash))
	rt, r := startServe(t, append(overTransport(t, transport, eng), "--config", cfg)...)
	waitRoutable(t, rt, 1)
	charged := func() float64 { return metricF(t, r, `infera_user_quota_tokens_total{user="tpm-erin"}`) }
	// Without max_tokens the router reserves prompt + 10; the engine
	// writes 150.
	noMax := `{"model":"sim-model","messages":[{"role":"user","content":"tell me"}]}`
	a := govPost(t, r, key, noMax)
	a.want(t, 200, "")
	real := a.usage.prompt + a.usage.completion
	if a.usage.completion != 150 || charged() != float64(real) {
		t.Fatalf("charged %v, want the engine's %d (usage %+v)", charged(), real, a.usage)
	}
	// The bucket holds 1000 a minute: the estimate (~15) would let ~60
	// requests in, the real usage (~160) lets 6.
	n := 1
	var rej govAnswer
	for ; n < 20; n++ {
		if rej = govPost(t, r, key, noMax); rej.status != 200 {
			break
		}
	}
	rej.want(t, 429, "rate_limit_tpm")
	if n < 5 || n > 7 {
		t.Fatalf("refused after %d requests of ~%d tokens against 1000 TPM", n, real)
	}
	if s := rej.retryAfter(t); s > 60 {
		t.Fatalf("Retry-After %d s for a bucket refilling 1000 a minute", s)
	}

	// Streams, on a second user: with include_usage the stream's usage
	// is charged; without, the estimate stays.
	k2, h2 := newKey(t)
	writeConfig(t, cfg, fmt.Sprintf(`{
		"user_limit": {"templates": [{"name": "t", "default": true,
			"quota": {"enabled": true, "weights": {"input": 1, "output": 1, "cached": 1},
				"windows": [{"period": "day", "max_tokens": 100000000}]},
			"rate": {"enabled": true, "tpm": 1000000, "default_output_tokens": 10}}]},
		"users": [{"name": "stream-frank", "keys": [%q]}]}`, h2))
	// Published and applied by the governor: polled with the new key, each
	// 401 before the reload would be a wrong key, and ten lock the
	// loopback out (--auth-lockout-failures).
	waitUntil(t, "the reload", func() bool {
		c := rt.store.Load()
		return len(c.Users) == 1 && c.Users[0].Name == "stream-frank" && rt.gov.Applied() == c
	})
	govPost(t, r, k2, chatJSON("sim-model", "x", 1, false)).want(t, 200, "")
	charged2 := func() float64 { return metricF(t, r, `infera_user_quota_tokens_total{user="stream-frank"}`) }
	c0 := charged2()
	streamed := func(usage bool) string {
		req := `{"model":"sim-model","stream":true,"max_tokens":40,"messages":[{"role":"user","content":"stream it"}]}`
		if usage {
			req = `{"model":"sim-model","stream":true,"stream_options":{"include_usage":true},"max_tokens":40,"messages":[{"role":"user","content":"stream it"}]}`
		}
		hr, _ := http.NewRequest("POST", r+"/v1/chat/completions", strings.NewReader(req))
		hr.Header.Set("Authorization", "Bearer "+k2)
		resp, err := http.DefaultClient.Do(hr)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("stream: %v %v", resp, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return string(b)
	}
	s := streamed(true)
	i := strings.LastIndex(s, `"prompt_tokens":`)
	if i < 0 {
		t.Fatalf("no usage in the stream: %s", s)
	}
	var p int
	fmt.Sscanf(s[i+len(`"prompt_tokens":`):], "%d", &p)
	if d := charged2() - c0; d != float64(p+40) {
		t.Fatalf("a stream with usage charged %v, want the engine's %d", d, p+40)
	}
	c1 := charged2()
	streamed(false)
	// The estimate: the router's prompt estimate + 40 (max_tokens), the
	// same prompt as before (the router tokenizes like the engine).
	if d := charged2() - c1; d != float64(p+40) {
		t.Fatalf("a stream without usage charged %v, want its estimate %d", d, p+40)
	}
}

// Dry run: per template and globally (user_limit.dry_run), and for the
// engines' seats (rate_limit.dry_run): rules are evaluated and counted as
// dry_run hits, nothing is refused.
func TestE2EGovernDryRunCountsButBlocksNothing(t *testing.T) {
	_, eng := startEngine(t, "--speedup", "5")
	ka, ha := newKey(t)
	kb, hb := newKey(t)
	cfg := filepath.Join(t.TempDir(), "infera.json")
	writeConfig(t, cfg, fmt.Sprintf(`{
		"rate_limit": {"overall_concurrency": 1, "dry_run": true},
		"user_limit": {"templates": [
			{"name": "observe", "dry_run": true, "rate": {"enabled": true, "rpm": 1}},
			{"name": "enforce", "rate": {"enabled": true, "rpm": 1}}]},
		"users": [{"name": "dry-gina", "keys": [%q], "template": "observe"}, {"name": "dry-hank", "keys": [%q], "template": "enforce"}]}`, ha, hb))
	rt, r := startServe(t, "--workers", eng, "--config", cfg, "--config-poll", "20ms")
	rpmDry := func() float64 {
		return metricF(t, r, `infera_user_limit_hits_total{rule="rate_limit_rpm",result="dry_run"}`)
	}
	seatDry := func() float64 {
		return metricF(t, r, `infera_rate_limit_hits_total{rule="concurrency_overall",result="dry_run"}`)
	}
	d0, s0 := rpmDry(), seatDry()
	body := chatJSON("sim-model", "hi", 2, false)
	for i := 0; i < 4; i++ {
		govPost(t, r, ka, body).want(t, 200, "")
	}
	if d := rpmDry() - d0; d != 3 {
		t.Fatalf("rpm dry-run hits %v, want 3", d)
	}
	govPost(t, r, kb, body).want(t, 200, "")
	govPost(t, r, kb, body).want(t, 429, "rate_limit_rpm") // not in dry run
	// The seats' dry run: a second stream over the limit of 1 passes.
	holdStream(t, r, ka)
	holdStream(t, r, ka)
	if d := seatDry() - s0; d != 1 {
		t.Fatalf("seat dry-run hits %v, want 1", d)
	}
	// The global switch puts the enforcing template in dry run too.
	writeConfig(t, cfg, fmt.Sprintf(`{
		"rate_limit": {"overall_concurrency": 1, "dry_run": true},
		"user_limit": {"dry_run": true, "templates": [
			{"name": "observe", "dry_run": true, "rate": {"enabled": true, "rpm": 1}},
			{"name": "enforce", "rate": {"enabled": true, "rpm": 1}}]},
		"users": [{"name": "dry-gina", "keys": [%q], "template": "observe"}, {"name": "dry-hank", "keys": [%q], "template": "enforce"}]}`, ha, hb))
	// The store publishes the config, then the governor applies it.
	waitUntil(t, "the reload", func() bool { c := rt.store.Load(); return c.UserLimit.DryRun && rt.gov.Applied() == c })
	govPost(t, r, kb, body).want(t, 200, "")
}

// governed starts a router whose governance runs on clk, with the config
// document js, and returns its URL.
func governed(t *testing.T, clk *testClock, js string, args ...string) string {
	t.Helper()
	cfg := filepath.Join(t.TempDir(), "infera.json")
	writeConfig(t, cfg, js)
	governClock = clk.now
	t.Cleanup(func() { governClock = nil })
	_, r := startServe(t, append(args, "--config", cfg)...)
	governClock = nil
	return r
}

// testClock is an injectable clock.
type testClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *testClock) now() time.Time  { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *testClock) set(t time.Time) { c.mu.Lock(); c.t = t; c.mu.Unlock() }

// Allowed calling periods and quota windows in Europe/Berlin across the
// start of summer time (Sunday 2025-03-30, 02:00 CET -> 03:00 CEST): a
// period across midnight as two segments, the next allowed time named in
// the 403 (and in Retry-After) even when it falls in the skipped hour, and
// a day that lasts 23 hours.
func TestE2EGovernTimezoneDSTAndCrossMidnight(t *testing.T) {
	_, eng := startEngine(t, "--speedup", "50")
	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		t.Fatal(err)
	}
	at := func(s string) time.Time {
		v, err := time.ParseInLocation("2006-01-02 15:04:05", s, berlin)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	kn, hn := newKey(t)
	ke, he := newKey(t)
	kd, hd := newKey(t)
	clk := &testClock{t: at("2025-03-28 21:59:30")}
	r := governed(t, clk, fmt.Sprintf(`{
		"user_limit": {"timezone": "Europe/Berlin", "templates": [
			{"name": "night", "periods": {"enabled": true, "segments": [
				{"days": ["fri"], "start": "22:00", "end": "23:59"},
				{"days": ["sat"], "start": "00:00", "end": "02:00"}]}},
			{"name": "early", "periods": {"enabled": true, "segments": [{"days": ["sun"], "start": "02:00", "end": "04:00"}]}},
			{"name": "daily", "quota": {"enabled": true, "windows": [{"period": "day", "max_requests": 1}]}}]},
		"users": [{"name": "tz-night", "keys": [%q], "template": "night"},
			{"name": "tz-early", "keys": [%q], "template": "early"},
			{"name": "tz-daily", "keys": [%q], "template": "daily"}]}`, hn, he, hd), "--workers", eng)
	body := chatJSON("sim-model", "hi", 2, false)

	// Friday 21:59:30: 30 s before the period opens.
	a := govPost(t, r, kn, body)
	a.want(t, 403, "outside_allowed_period")
	if !strings.Contains(a.body, "next allowed at 2025-03-28 22:00 CET (Europe/Berlin)") || a.retryAfter(t) != 30 {
		t.Fatalf("before the period: Retry-After %s, %s", a.retry, a.body)
	}
	for _, s := range []string{"2025-03-28 22:00:00", "2025-03-28 23:59:59", "2025-03-29 00:00:00", "2025-03-29 02:00:59"} {
		clk.set(at(s))
		if a := govPost(t, r, kn, body); a.status != 200 {
			t.Fatalf("%s (inside fri 22:00-23:59 + sat 00:00-02:00): %d %s", s, a.status, a.body)
		}
	}
	// Saturday 02:01: the next period is next Friday, in summer time.
	clk.set(at("2025-03-29 02:01:00"))
	a = govPost(t, r, kn, body)
	a.want(t, 403, "outside_allowed_period")
	next := at("2025-04-04 22:00:00")
	if !strings.Contains(a.body, "next allowed at 2025-04-04 22:00 CEST (Europe/Berlin)") || a.retryAfter(t) != int(next.Sub(clk.now()).Seconds()) {
		t.Fatalf("after the period: Retry-After %s (want %v), %s", a.retry, next.Sub(clk.now()), a.body)
	}

	// Sunday 02:00 does not exist on 2025-03-30: the period opens at 03:00
	// CEST, 3 real hours after Saturday 23:00 CET.
	clk.set(at("2025-03-29 23:00:00"))
	a = govPost(t, r, ke, body)
	a.want(t, 403, "outside_allowed_period")
	if !strings.Contains(a.body, "next allowed at 2025-03-30 03:00 CEST (Europe/Berlin)") || a.retryAfter(t) != 3*3600 {
		t.Fatalf("across the DST gap: Retry-After %s, %s", a.retry, a.body)
	}
	clk.set(at("2025-03-30 03:30:00"))
	govPost(t, r, ke, body).want(t, 200, "")

	// The 23-hour day: one request at 01:30 CET, the next refused at
	// 03:30 CEST (the same local day) until midnight, 20.5 real hours on.
	clk.set(at("2025-03-30 01:30:00"))
	govPost(t, r, kd, body).want(t, 200, "")
	clk.set(at("2025-03-30 03:30:00"))
	a = govPost(t, r, kd, body)
	a.want(t, 429, "quota_requests_day")
	if a.retryAfter(t) != int(at("2025-03-31 00:00:00").Sub(clk.now()).Seconds()) || a.retryAfter(t) != 20*3600+1800 {
		t.Fatalf("Retry-After %s, want 20.5 h to the local midnight", a.retry)
	}
	clk.set(at("2025-03-31 00:00:00"))
	govPost(t, r, kd, body).want(t, 200, "")
}

// Two router processes sharing one redis-server enforce one set of
// counters: a user's daily quota (also under 200 concurrent requests
// spread over both), and the gateway's concurrency seats.
func TestE2EGovernRedisTwoRoutersShareOneQuota(t *testing.T) {
	clearOfMidnight(t, "UTC", 30*time.Second) // its day quota is counted whole
	rd := testsrv.StartRedis(t)
	_, eng := startEngine(t, "--speedup", "50", "--max-batch", "256")
	ks, hs := newKey(t)
	kc, hc := newKey(t)
	cfg := filepath.Join(t.TempDir(), "infera.json")
	// on_state_error closed: a Redis error refuses (503) instead of
	// admitting uncounted, so nothing here may overshoot.
	writeConfig(t, cfg, fmt.Sprintf(`{
		"user_limit": {"on_state_error": "closed", "templates": [
			{"name": "ten", "quota": {"enabled": true, "windows": [{"period": "day", "max_requests": 10}]}},
			{"name": "burst", "quota": {"enabled": true, "windows": [{"period": "day", "max_requests": 50}]}}]},
		"users": [{"name": "shared-ivy", "keys": [%q], "template": "ten"}, {"name": "shared-jack", "keys": [%q], "template": "burst"}]}`, hs, hc))
	args := []string{"--workers", "e1=" + eng, "--config", cfg, "--state", rd.URL, "--router-policy", "round-robin"}
	r1 := startChild(t, "serve", 0, args...).url
	r2 := startChild(t, "serve", 0, args...).url
	body := chatJSON("sim-model", "hi", 2, false)
	ok := 0
	for i := 0; i < 16; i++ {
		r := []string{r1, r2}[i%2]
		a := govPost(t, r, ks, body)
		switch {
		case a.status == 200:
			ok++
		case a.code != "quota_requests_day" || a.retry == "":
			t.Fatalf("request %d on router %d: %d %s", i, i%2+1, a.status, a.body)
		}
	}
	if ok != 10 {
		t.Fatalf("%d requests admitted by two routers sharing a quota of 10", ok)
	}

	var mu sync.Mutex
	got := map[int]int{}
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := 0; i < 200; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			<-start
			a := govPost(t, []string{r1, r2}[i%2], kc, body)
			mu.Lock()
			got[a.status]++
			mu.Unlock()
		}(i)
	}
	close(start)
	wg.Wait()
	// No overshoot, ever; exactly the quota unless Redis calls failed (a
	// router starved of CPU, as under -race on a loaded machine, lets
	// calls pass their 2 s deadline: those requests are refused, 503).
	errs := metricF(t, r1, `infera_governance_state_fail_total{mode="closed"}`) + metricF(t, r2, `infera_governance_state_fail_total{mode="closed"}`)
	if got[200] > 50 || got[200]+got[429]+got[503] != 200 || (errs == 0 && got[200] != 50) || float64(got[503]) > errs {
		t.Fatalf("quota of 50 under 200 concurrent requests over two routers: %v (refused for state store errors: %v)", got, errs)
	}
	if errs > 0 {
		t.Logf("%v requests refused for state store errors: %v", errs, got)
	}
	if v, err := rd.Do("EXISTS", "infera:{u:shared-jack}"); err != nil || v != "1" {
		t.Fatalf("the counters are not in Redis: %q %v", v, err)
	}
}

// Seats in Redis: with scope gateway, a request held open on one router
// takes the one seat both routers share.
func TestE2EGovernRedisTwoRoutersShareSeats(t *testing.T) {
	rd := testsrv.StartRedis(t)
	_, eng := startEngine(t, "--speedup", "5")
	cfg := filepath.Join(t.TempDir(), "infera.json")
	writeConfig(t, cfg, `{"rate_limit": {"scope": "gateway", "overall_concurrency": 1}}`)
	args := []string{"--workers", "e1=" + eng, "--config", cfg, "--state", rd.URL}
	r1 := startChild(t, "serve", 0, args...).url
	r2 := startChild(t, "serve", 0, args...).url
	held := holdStream(t, r1, "")
	body := chatJSON("sim-model", "hi", 2, false)
	govPost(t, r2, "", body).want(t, 429, "concurrency_overall")
	govPost(t, r1, "", body).want(t, 429, "concurrency_overall")
	held.Body.Close() // the client leaves: the seat is given back
	waitUntil(t, "the shared seat freed", func() bool { return govPost(t, r2, "", body).status == 200 })
}

// Seats in Redis across a hot reload of rate_limit.scope: a stream held
// through one router on engine e1 under the instance scope counts on the
// gateway scope both routers switch to, so the other router is refused
// on engine e2 until the stream ends.
func TestE2EGovernRedisScopeReloadCountsTheSeatsInFlight(t *testing.T) {
	rd := testsrv.StartRedis(t)
	_, e1 := startEngine(t) // real time: the held stream lasts about 25 s, far past the test
	_, e2 := startEngine(t, "--speedup", "5")
	cfg := filepath.Join(t.TempDir(), "infera.json")
	writeConfig(t, cfg, `{"rate_limit": {"scope": "instance", "overall_concurrency": 1}}`)
	r1 := startChild(t, "serve", 0, "--workers", "e1="+e1, "--config", cfg, "--state", rd.URL).url
	r2 := startChild(t, "serve", 0, "--workers", "e2="+e2, "--config", cfg, "--state", rd.URL).url
	held := holdStream(t, r1, "")
	body := chatJSON("sim-model", "hi", 2, false)
	govPost(t, r2, "", body).want(t, 200, "") // another instance: a seat of its own
	reloads := func(r string) float64 { return metricF(t, r, `infera_config_reloads_total{result="ok"}`) }
	before1, before2 := reloads(r1), reloads(r2)
	writeConfig(t, cfg, `{"rate_limit": {"scope": "gateway", "overall_concurrency": 1}}`)
	waitUntil(t, "both routers reloaded", func() bool { return reloads(r1) > before1 && reloads(r2) > before2 })
	waitUntil(t, "the held seat counted on the gateway scope", func() bool {
		return govPost(t, r2, "", body).status == 429
	})
	govPost(t, r2, "", body).want(t, 429, "concurrency_overall")
	held.Body.Close() // the client leaves: the seat is given back on both scopes
	waitUntil(t, "the gateway seat freed", func() bool { return govPost(t, r2, "", body).status == 200 })
}

// With Redis, a request costs the router one round trip to it: the user's
// admission and the request's seat run in one script, and the previous
// request's ends (seats given back, reconciliation) ride in the same
// pipeline, ahead of it. So a client sending one request after another,
// with a concurrency of 1 of its own and on the engine, is never refused;
// and a refusal of the deferred admission still answers in OpenAI's shape.
func TestE2EGovernRedisOneRoundTripPerRequest(t *testing.T) {
	clearOfMidnight(t, "UTC", 30*time.Second) // its day quota is counted whole
	rd := testsrv.StartRedis(t)
	_, eng := startEngine(t, "--speedup", "50")
	k, h := newKey(t)
	cfg := filepath.Join(t.TempDir(), "infera.json")
	writeConfig(t, cfg, fmt.Sprintf(`{
		"rate_limit": {"overall_concurrency": 1, "prefill_concurrency": 1},
		"user_limit": {"on_state_error": "closed", "templates": [
			{"name": "one", "concurrency": {"enabled": true, "limit": 1},
			 "rate": {"enabled": true, "rpm": 100000, "tpm": 100000000},
			 "quota": {"enabled": true, "windows": [{"period": "day", "max_requests": 41}]}}]},
		"users": [{"name": "seq-kim", "keys": [%q], "template": "one"}]}`, h))
	// Ends wait up to 1 s for the next request to carry them (default
	// 2 ms, which a request of this loaded machine may exceed now and then:
	// its ends then go alone, one round trip more).
	r := startChild(t, "serve", 0, "--workers", "e1="+eng, "--config", cfg, "--state", rd.URL, "--state-end-delay", "1s").url
	body := chatJSON("sim-model", "hi", 2, false)
	govPost(t, r, k, body).want(t, 200, "")
	trips := func() float64 { return metricF(t, r, "infera_governance_state_round_trips_total") }
	waitUntil(t, "the first request's ends sent alone", func() bool { return trips() == 2 })
	before := trips()
	const n = 40
	for i := 0; i < n; i++ {
		govPost(t, r, k, body).want(t, 200, "")
	}
	// The last request's ends may have been sent alone already
	// (--state-end-delay).
	if got := trips() - before; got < n || got > n+1 {
		t.Fatalf("%d requests took %v round trips to Redis, want %d (+1)", n, got, n)
	}
	govPost(t, r, k, body).want(t, 429, "quota_requests_day") // 41 used
}

// A request queued for a seat on the only worker its model is routed to
// stops waiting when a reload removes that worker, and is picked again:
// it gets the 503 no_workers a new request gets, at once, not the 429
// of its queue timeout (30 s here), nor a 503 when the held stream ends;
// a worker the reload adds to the service serves it. Both backends.
func TestE2EGovernAQueuedRequestWhoseWorkersLeavePicksAgain(t *testing.T) {
	rd := testsrv.StartRedis(t)
	for _, state := range []string{"", rd.URL} {
		t.Run("state="+state, func(t *testing.T) {
			_, e1 := startEngine(t)
			_, e2 := startEngine(t) // real time: the held stream lasts ~24 s
			_, e3 := startEngine(t, "--speedup", "5")
			conf := func(workers string) string {
				return `{"workers": [` + workers + `],
					"model_routing": {"enabled": true, "mappings": [{"pattern": "sim-*", "services": ["B"]}]},
					"rate_limit": {"scope": "instance", "overall_concurrency": 1, "overlimit": "queue", "queue_timeout_ms": 30000}}`
			}
			w1 := fmt.Sprintf(`{"id": "e1", "url": %q, "models": ["sim-model"], "service": "A"}`, e1)
			w2 := fmt.Sprintf(`{"id": "e2", "url": %q, "models": ["sim-model"], "service": "B"}`, e2)
			w3 := fmt.Sprintf(`{"id": "e3", "url": %q, "models": ["sim-model"], "service": "B"}`, e3)
			cfg := filepath.Join(t.TempDir(), "infera.json")
			writeConfig(t, cfg, conf(w1+","+w2))
			args := []string{"--config", cfg, "--config-poll", "100ms"}
			if state != "" {
				args = append(args, "--state", state)
			}
			_, r := startServe(t, args...)
			seatQ := func() float64 { return metricF(t, r, "infera_rate_limit_queue_length") }
			body := chatJSON("sim-model", "queued", 2, false)
			for _, c := range []struct {
				workers string
				status  int
				code    string
			}{{w1, 503, "no_workers"}, {w1 + "," + w3, 200, ""}} {
				writeConfig(t, cfg, conf(w1+","+w2))
				waitUntil(t, "e2 back", func() bool { return govPost(t, r, "", body).status == 200 })
				held := holdStream(t, r, "") // e2's one seat
				got := make(chan govAnswer, 1)
				go func() { got <- govPost(t, r, "", body) }()
				waitUntil(t, "queued for e2's seat", func() bool { return seatQ() == 1 })
				t0 := time.Now()
				writeConfig(t, cfg, conf(c.workers))
				select {
				case a := <-got:
					a.want(t, c.status, c.code)
					if el := time.Since(t0); el > 5*time.Second {
						t.Fatalf("the queued request was answered %v after the reload", el)
					}
				case <-time.After(15 * time.Second):
					t.Fatalf("the queued request still waits 15 s after the reload removed its worker")
				}
				if n := seatQ(); n != 0 {
					t.Fatalf("%v requests still queued", n)
				}
				held.Body.Close()
			}
		})
	}
}

// A request queued for a seat whose user a reload disables is refused at
// once with the 403 a new request of the user gets; it was served when
// the seat freed, after the user was disabled. Both backends.
func TestE2EGovernAQueuedRequestOfAUserAReloadDisablesIsRefused(t *testing.T) {
	rd := testsrv.StartRedis(t)
	for _, state := range []string{"", rd.URL} {
		t.Run("state="+state, func(t *testing.T) {
			engS, eng := startEngine(t) // real time: the held stream lasts ~24 s
			ka, ha := newKey(t)
			conf := func(enabled bool) string {
				return fmt.Sprintf(`{"rate_limit": {"overall_concurrency": 1, "overlimit": "queue", "queue_timeout_ms": 30000},
					"users": [{"name": "queued-carol", "keys": [%q], "enabled": %v}]}`, ha, enabled)
			}
			cfg := filepath.Join(t.TempDir(), "infera.json")
			writeConfig(t, cfg, conf(true))
			args := []string{"--workers", eng, "--config", cfg, "--config-poll", "100ms"}
			if state != "" {
				args = append(args, "--state", state)
			}
			_, r := startServe(t, args...)
			seatQ := func() float64 { return metricF(t, r, "infera_rate_limit_queue_length") }
			held := holdStream(t, r, ka)
			before := engS.Stats().RequestsTotal
			got := make(chan govAnswer, 1)
			go func() { got <- govPost(t, r, ka, chatJSON("sim-model", "queued", 2, false)) }()
			waitUntil(t, "queued for the seat", func() bool { return seatQ() == 1 })
			writeConfig(t, cfg, conf(false))
			select {
			case a := <-got:
				a.want(t, 403, "user_disabled")
			case <-time.After(10 * time.Second):
				held.Body.Close()
				t.Fatalf("the disabled user's queued request still waits 10 s after the reload: %+v", <-got)
			}
			if n := seatQ(); n != 0 {
				t.Fatalf("%v requests still queued", n)
			}
			if n := engS.Stats().RequestsTotal; n != before {
				t.Fatalf("the engine got %d requests of the disabled user", n-before)
			}
			held.Body.Close()
		})
	}
}
