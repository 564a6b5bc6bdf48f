//go:build !race

package proxy

import (
	"io"
	"log/slog"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/infera/infera/fleet"
	"github.com/infera/infera/internal/testsrv"
	"github.com/valyala/fasthttp"
)

// TestNonStreamZeroAlloc proves the steady-state non-streaming request path
// (client -> router -> upstream -> router -> client, all in this process)
// allocates nothing per request in infera's code. The one allocation the
// bound allows is fasthttp's own: with StreamRequestBody (bodies are read
// incrementally, after authentication) its connection loop discards the
// rest of every request body through io.CopyN, which allocates one 24-byte
// io.LimitedReader (fasthttp v1.78 server.go, requestStream.discard).
func TestNonStreamZeroAlloc(t *testing.T) {
	for _, policy := range []string{"round-robin", "kv-aware"} {
		t.Run(policy, func(t *testing.T) { testZeroAlloc(t, policy, false) })
	}
	// With the access log on: the line is built in the request's pooled
	// buffer and appended to the log's.
	t.Run("access-log", func(t *testing.T) { testZeroAlloc(t, "round-robin", true) })
	// --log-level info under a handler that would take debug lines: the
	// router builds none (debuglog.go), in either policy.
	for _, policy := range []string{"round-robin", "kv-aware"} {
		t.Run("log-level-info/"+policy, func(t *testing.T) {
			old := slog.Default()
			slog.SetDefault(slog.New(slog.NewTextHandler(io.Discard, &slog.HandlerOptions{Level: slog.LevelDebug})))
			t.Cleanup(func() { slog.SetDefault(old) })
			testZeroAllocLevel(t, policy, false, "info")
		})
	}
}

// With --log-level debug the request's debug line is built (allocations
// are acceptable then): the check above holds because the level is read
// before anything is built, not because no line is logged.
func TestDebugLevelBuildsItsLineOnlyWhenOn(t *testing.T) {
	old := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(io.Discard, &slog.HandlerOptions{Level: slog.LevelDebug})))
	t.Cleanup(func() { slog.SetDefault(old) })
	if n := proxiedAllocs(t, "round-robin", false, "debug"); n < 2 {
		t.Fatalf("%.2f allocs per request with --log-level debug: no debug line was built", n)
	}
}

// With the real Qwen3 tokenizer and chat template, a chat with a system
// prompt, an assistant tool call, a tool result and tools is rendered,
// encoded and hashed without allocating, with chat_template_kwargs too (a
// client's enable_thinking with every request is parsed once).
func TestKVAwareQwen3ChatWithToolsZeroAlloc(t *testing.T) {
	dir := qwen3Dir(t)
	up := startUpstream(t, okHandler)
	f := defaultFlags()
	f.RouterPolicy, f.RouterTokenizerPath = "kv-aware", dir
	r := startRouter(t, f, nil, up.url)
	for _, kwargs := range []string{"", `"chat_template_kwargs":{"enable_thinking":false},`} {
		hc, req := benchClient(t, r.url, false)
		req.SetBodyString(`{"model":"m","max_tokens":8,` + kwargs + `"tools":[{"type":"function","function":{"name":"get_weather","description":"Weather in a city","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}],` +
			`"messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"What is the weather in Paris?"},` +
			`{"role":"assistant","content":"","tool_calls":[{"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]},` +
			`{"role":"tool","tool_call_id":"call_1","content":"18 C, clear"},{"role":"user","content":"And tomorrow?"}]}`)
		resp := fasthttp.AcquireResponse()
		do := func() {
			if err := hc.Do(req, resp); err != nil || resp.StatusCode() != 200 {
				t.Fatal(err, resp.StatusCode(), string(resp.Body()))
			}
		}
		for i := 0; i < 200; i++ {
			do()
		}
		if n := testing.AllocsPerRun(1000, do); n > 1.05 {
			t.Fatalf("%s: %.2f allocs per proxied request, want at most fasthttp's 1", kwargs, n)
		}
	}
}

// testZeroAlloc: under kv-aware (the default policy) the chat prompt is also
// decoded, rendered, tokenized, hashed and matched against the KV index.
func testZeroAlloc(t *testing.T, policy string, accessLog bool) {
	testZeroAllocLevel(t, policy, accessLog, "")
}

// testZeroAllocLevel is testZeroAlloc at --log-level level.
func testZeroAllocLevel(t *testing.T, policy string, accessLog bool, level string) {
	if n := proxiedAllocs(t, policy, accessLog, level); n > 1.05 {
		t.Fatalf("%.2f allocs per proxied request, want at most fasthttp's 1", n)
	}
}

// proxiedAllocs measures the allocations per proxied non-streaming request.
func proxiedAllocs(t *testing.T, policy string, accessLog bool, level string) float64 {
	up := startUpstream(t, okHandler)
	f := defaultFlags()
	f.RouterPolicy, f.LogLevel = policy, level
	var r *testRouter
	if accessLog {
		l := NewAccessLog(io.Discard)
		t.Cleanup(func() { l.Close() })
		r = startRouterWith(t, f, nil, func(o *Options) { o.AccessLog = l }, up.url)
	} else {
		r = startRouter(t, f, nil, up.url)
	}
	hc, req := benchClient(t, r.url, false)
	resp := fasthttp.AcquireResponse()
	do := func() {
		if err := hc.Do(req, resp); err != nil || resp.StatusCode() != 200 {
			t.Fatal(err, resp.StatusCode())
		}
	}
	for i := 0; i < 200; i++ { // warm pools and connections
		do()
	}
	return testing.AllocsPerRun(2000, do)
}

// Embeddings, rerank and score requests allocate nothing in the router in
// steady state (fasthttp's one allocation per request aside), under the
// default kv-aware policy, which does not tokenize their input.
func TestEmbeddingsZeroAlloc(t *testing.T) {
	const answer = `{"object":"list","data":[{"object":"embedding","index":0,"embedding":"AACAPw=="}],"model":"m","usage":{"prompt_tokens":5,"total_tokens":5}}`
	up := startUpstream(t, func(ctx *fasthttp.RequestCtx) {
		ctx.SetContentType("application/json")
		ctx.SetBodyString(answer)
	})
	f := defaultFlags()
	f.RouterPolicy = "kv-aware"
	r := startRouter(t, f, nil, up.url)
	hc, req := benchClient(t, r.url, false)
	resp := fasthttp.AcquireResponse()
	do := func() {
		if err := hc.Do(req, resp); err != nil || resp.StatusCode() != 200 {
			t.Fatal(err, resp.StatusCode())
		}
	}
	for path, body := range map[string]string{
		"/v1/embeddings": `{"model":"m","input":[[1,2,3],[4,5]],"encoding_format":"base64"}`,
		"/v1/rerank":     rerankBody,
		"/score":         scoreBody,
	} {
		req.SetRequestURI(r.url + path)
		req.SetBodyString(body)
		for i := 0; i < 200; i++ {
			do()
		}
		if n := testing.AllocsPerRun(1000, do); n > 1.05 {
			t.Fatalf("%s: %.2f allocs per request, want at most fasthttp's 1", path, n)
		}
	}
}

// Learning an answer's escaped id decodes it on the stack: an id already
// kept (a Response answered again, a stream's later events) costs nothing,
// whole or streamed.
func TestLearningAnEscapedResponseIDDoesNotAllocate(t *testing.T) {
	var a respAffinity
	w := &fleet.Worker{ID: "a", URL: "http://10.0.0.1:8000", Addr: "10.0.0.1:8000"}
	a.learn([]byte(`{"id":"resp_Abc"}`), w, respCred{user: "u"}, 0)
	for _, head := range []string{
		`{"id":"resp_\u0041bc","object":"response"}`,
		"event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"\\u0072esp_Abc\"",
		`{"id":"` + strings.Repeat(`\u0078`, 129) + `"}`,       // decodes past respIDMax
		`{"id":"resp_\u0041` + strings.Repeat("x", 300) + `"}`, // one escape, decodes past respIDMax
	} {
		b := []byte(head)
		if n := testing.AllocsPerRun(100, func() { a.learn(b, w, respCred{user: "u"}, 0) }); n != 0 {
			t.Fatalf("%s: %v allocations", head, n)
		}
	}
	if n := a.n.Load(); n != 1 {
		t.Fatalf("%d ids kept, want 1", n)
	}
}

// Looking up a previous_response_id decodes its escapes on the stack.
func TestLookingUpAnEscapedPreviousResponseIDDoesNotAllocate(t *testing.T) {
	var a respAffinity
	w := &fleet.Worker{ID: "a", URL: "http://10.0.0.1:8000", Addr: "10.0.0.1:8000"}
	a.learn([]byte(`{"id":"resp_Abc"}`), w, respCred{user: "u"}, 0)
	for _, body := range []string{
		`{"model":"m","previous_response_id":"resp_Abc"}`,
		`{"model":"m","previous_response_id":"resp_\u0041bc"}`,
		`{"model":"m","previous_response_id":"` + strings.Repeat(`\u0078`, 128) + `"}`,
		// A client's id of 300 bytes with one escape: past respIDMax once
		// decoded, it was decoded onto the heap on every request.
		`{"model":"m","previous_response_id":"resp_\u0041` + strings.Repeat("x", 300) + `"}`,
		`{"model":"m","previous_response_id":"` + strings.Repeat("x", 700) + `\n"}`,
	} {
		b := []byte(body)
		if n := testing.AllocsPerRun(100, func() { a.lookupRef(b) }); n != 0 {
			t.Fatalf("%s: %v allocations", body, n)
		}
	}
}

// A request with the right key allocates nothing for the wrong-key
// lockout: with no lockout in force (one atomic load), and with another
// address locked out (its shard's lookup).
func TestARightKeyIsCheckedWithoutAllocating(t *testing.T) {
	up := startUpstream(t, okHandler)
	f := defaultFlags()
	f.APIKey, f.AuthLockoutFailures, f.AuthLockoutWindow = "sk-right-0123456789", 3, time.Minute
	r := startRouter(t, f, nil, up.url)
	hc, req := benchClient(t, r.url, false)
	req.Header.Set("Authorization", "Bearer "+f.APIKey)
	resp := fasthttp.AcquireResponse()
	do := func() {
		if err := hc.Do(req, resp); err != nil || resp.StatusCode() != 200 {
			t.Fatal(err, resp.StatusCode())
		}
	}
	for i := 0; i < 200; i++ {
		do()
	}
	if n := testing.AllocsPerRun(2000, do); n > 1.05 {
		t.Fatalf("no lockout in force: %.2f allocs per request, want at most fasthttp's 1", n)
	}
	for i := 0; i < 3; i++ {
		r.srv.fails.Failed(netip.MustParseAddr("10.1.2.3"))
	}
	if _, ok := r.srv.fails.Locked(netip.MustParseAddr("10.1.2.3")); !ok {
		t.Fatal("the other address is not locked")
	}
	if n := testing.AllocsPerRun(2000, do); n > 1.05 {
		t.Fatalf("another address locked out: %.2f allocs per request, want at most fasthttp's 1", n)
	}
}

// With the lockout shared through Redis (--state redis), a request with
// the right key neither allocates for it nor asks Redis: with no lockout
// in force, and with another address locked out through Redis.
func TestARightKeyCostsNoAllocationNorRedisCallWithASharedLockout(t *testing.T) {
	rd := testsrv.StartRedis(t)
	up := startUpstream(t, okHandler)
	f := lockoutFlags(3, time.Minute)
	r, _ := sharedLockoutRouter(t, f, rd.URL, up.url)
	other, _ := sharedLockoutRouter(t, f, rd.URL, up.url)
	hc, req := benchClient(t, r.url, false)
	req.Header.Set("Authorization", "Bearer "+f.APIKey)
	resp := fasthttp.AcquireResponse()
	do := func() {
		if err := hc.Do(req, resp); err != nil || resp.StatusCode() != 200 {
			t.Fatal(err, resp.StatusCode())
		}
	}
	for i := 0; i < 200; i++ {
		do()
	}
	trips := metrics.GetOrCreateCounter("infera_governance_state_round_trips_total")
	before := trips.Get()
	if n := testing.AllocsPerRun(2000, do); n > 1.05 {
		t.Fatalf("no lockout in force: %.2f allocs per request, want at most fasthttp's 1", n)
	}
	if got := trips.Get() - before; got != 0 {
		t.Fatalf("no lockout in force: right keys cost %d Redis round trips, want 0", got)
	}
	for i := 0; i < 3; i++ {
		chatFrom(t, "127.9.5.1", other.url, "sk-guess")
	}
	for deadline := time.Now().Add(2 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if _, ok := r.srv.fails.Locked(netip.MustParseAddr("127.9.5.1")); ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the lockout another router began did not reach this one")
		}
	}
	mid := trips.Get()
	if n := testing.AllocsPerRun(2000, do); n > 1.05 {
		t.Fatalf("another address locked out: %.2f allocs per request, want at most fasthttp's 1", n)
	}
	if got := trips.Get() - mid; got != 0 {
		t.Fatalf("another address locked out: right keys cost %d Redis round trips, want 0", got)
	}
}

// Behind --trusted-proxies, finding the client in X-Forwarded-For (for
// the lockout and the access log) allocates nothing either: the header
// is read in place, over several lines.
func TestAClientBehindATrustedProxyIsFoundWithoutAllocating(t *testing.T) {
	up := startUpstream(t, okHandler)
	f := defaultFlags()
	f.APIKey, f.AuthLockoutFailures, f.AuthLockoutWindow = "sk-right-0123456789", 3, time.Minute
	f.TrustedProxies = []string{"10.0.0.0/8", "127.0.0.1", "2001:db8:ffff::/48"}
	l := NewAccessLog(io.Discard)
	t.Cleanup(func() { l.Close() })
	r := startRouterWith(t, f, nil, func(o *Options) { o.AccessLog = l }, up.url)
	hc, req := benchClient(t, r.url, false)
	req.Header.Set("Authorization", "Bearer "+f.APIKey)
	req.Header.Add("X-Forwarded-For", "198.51.100.1, [2001:db8::7]:5555")
	req.Header.Add("X-Forwarded-For", "10.1.1.1, 2001:db8:ffff::1")
	resp := fasthttp.AcquireResponse()
	do := func() {
		if err := hc.Do(req, resp); err != nil || resp.StatusCode() != 200 {
			t.Fatal(err, resp.StatusCode())
		}
	}
	for i := 0; i < 200; i++ {
		do()
	}
	if n := testing.AllocsPerRun(2000, do); n > 1.05 {
		t.Fatalf("%.2f allocs per request, want at most fasthttp's 1", n)
	}
	for i := 0; i < 3; i++ {
		r.srv.fails.Failed(netip.MustParseAddr("10.1.2.3"))
	}
	if n := testing.AllocsPerRun(2000, do); n > 1.05 {
		t.Fatalf("another address locked out: %.2f allocs per request, want at most fasthttp's 1", n)
	}
	// The requests measured were the header's client's: locking its /64
	// out refuses them.
	for i := 0; i < 3; i++ {
		r.srv.fails.Failed(netip.MustParseAddr("2001:db8::"))
	}
	if err := hc.Do(req, resp); err != nil || resp.StatusCode() != 429 {
		t.Fatalf("2001:db8::/64 locked out: %v %d, want 429", err, resp.StatusCode())
	}
}
