package proxy

import (
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/infera/infera/config"
	"github.com/infera/infera/fleet"
	"github.com/infera/infera/mirror"
	"github.com/valyala/fasthttp"
)

const embedBody = `{"model":"m","input":["first text","second"],"encoding_format":"base64","dimensions":8,"user":"u-1"}`

func embedCall(t testing.TB, url, key, body string) apiResp {
	t.Helper()
	return postPath(t, url, "/v1/embeddings", key, body)
}

// tpmRouter is a router in front of an embedEngine whose one user (key)
// may spend 1000 tokens a minute.
func tpmRouter(t *testing.T) (*embedEngine, *testRouter, string) {
	eng := startEmbedEngine(t)
	key, hash := mintKey(t)
	f := defaultFlags()
	f.RequestMaxRetries = 0
	r, _ := govRouter(t, f, fmt.Sprintf(`{
		"user_limit": {"templates": [{"name": "t", "default": true, "rate": {"enabled": true, "tpm": 1000}}]},
		"users": [{"name": "alice", "keys": [%q]}]}`, hash), eng.url)
	return eng, r, key
}

// embedEngine answers embeddings with the given prompt_tokens and records
// what it received.
type embedEngine struct {
	*upstream
	mu     sync.Mutex
	paths  []string
	bodies []string
	tokens atomic.Int64
	// totalOnly: usage as older vLLM reranks report it, total_tokens alone.
	totalOnly atomic.Bool
}

func startEmbedEngine(t *testing.T) *embedEngine {
	e := &embedEngine{}
	e.tokens.Store(5)
	e.upstream = startUpstream(t, func(ctx *fasthttp.RequestCtx) {
		e.mu.Lock()
		e.paths = append(e.paths, string(ctx.Path()))
		e.bodies = append(e.bodies, string(ctx.PostBody()))
		e.mu.Unlock()
		ctx.SetContentType("application/json")
		if e.totalOnly.Load() {
			fmt.Fprintf(ctx, `{"id":"rerank-1","model":"m","usage":{"total_tokens":%d},"results":[{"index":0,"document":{"text":"a"},"relevance_score":0.5}]}`, e.tokens.Load())
			return
		}
		fmt.Fprintf(ctx, `{"object":"list","data":[{"object":"embedding","index":0,"embedding":"AACAPw=="}],"model":"m","usage":{"prompt_tokens":%d,"total_tokens":%d}}`,
			e.tokens.Load(), e.tokens.Load())
	})
	return e
}

func (e *embedEngine) seen() ([]string, []string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]string(nil), e.paths...), append([]string(nil), e.bodies...)
}

// POST /v1/embeddings goes through the request path: the body reaches the
// engine untouched at /v1/embeddings (no stream_options, nothing added),
// a worker that cannot be reached is retried on another, the engine's
// usage is counted, the model routing applies; a GET is 405.
func TestEmbeddingsAreRoutedLikeInference(t *testing.T) {
	eng := startEmbedEngine(t)
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "http://" + ln.Addr().String()
	ln.Close()
	f := defaultFlags()
	f.RouterPolicy = "round-robin"
	r := startRouter(t, f, nil, dead, eng.url)
	prompt0 := mPromptTokens.Get()
	for i := 0; i < 4; i++ {
		res := embedCall(t, r.url, "", embedBody)
		if res.status != 200 || !strings.Contains(res.body, `"object":"list"`) {
			t.Fatalf("request %d: %d %s", i, res.status, res.body)
		}
	}
	paths, bodies := eng.seen()
	if len(paths) != 4 {
		t.Fatalf("the live engine got %d requests, want all 4", len(paths))
	}
	for i := range paths {
		if paths[i] != "/v1/embeddings" || bodies[i] != embedBody {
			t.Fatalf("engine got %s %s", paths[i], bodies[i])
		}
	}
	if d := mPromptTokens.Get() - prompt0; d != 20 {
		t.Fatalf("prompt tokens counted %d, want 4 x 5", d)
	}
	if res := embedCall(t, r.url, "", strings.Replace(embedBody, `"m"`, `"unknown-model"`, 1)); res.status != 404 || res.code != "model_not_found" {
		t.Fatalf("unknown model: %+v", res)
	}
	req, _ := http.NewRequest("GET", r.url+"/v1/embeddings", nil)
	if res := do(t, req); res.status != 405 {
		t.Fatalf("GET: %+v", res)
	}
}

// A null dimensions is no dimensions, as for encoding_format: vLLM and
// infera engine read it so, and the OpenAI Python SDK sends null for
// dimensions=None. The router refused it with 400 naming dimensions.
func TestAnEmbeddingsRequestWithNullDimensionsIsServed(t *testing.T) {
	eng := startEmbedEngine(t)
	r := startRouter(t, nil, nil, eng.url)
	body := `{"model":"m","input":"a","dimensions":null,"encoding_format":null}`
	if res := embedCall(t, r.url, "", body); res.status != 200 {
		t.Fatalf("%d %s", res.status, res.body)
	}
	if _, bodies := eng.seen(); len(bodies) != 1 || bodies[0] != body {
		t.Fatalf("the engine got %q", bodies)
	}
}

// Bodies that are not an embeddings request get OpenAI's 400 with the
// parameter named, and never reach the engine.
func TestMalformedEmbeddingsRequestsAreRefused(t *testing.T) {
	eng := startEmbedEngine(t)
	r := startRouter(t, nil, nil, eng.url)
	for body, param := range map[string]string{
		`{"model":"m"}`:                                                   "input",
		`{"model":"m","input":null}`:                                      "input",
		`{"model":"m","input":""}`:                                        "input",
		`{"model":"m","input":[]}`:                                        "input",
		`{"model":"m","input":["a",""]}`:                                  "input",
		`{"model":"m","input":[[]]}`:                                      "input",
		`{"model":"m","input":["a",1]}`:                                   "input",
		`{"model":"m","input":[1,"a"]}`:                                   "input",
		`{"model":"m","input":[[1],["a"]]}`:                               "input",
		`{"model":"m","input":[-1]}`:                                      "input",
		`{"model":"m","input":{"text":"a"}}`:                              "input",
		`{"model":"m","input":42}`:                                        "input",
		`{"model":"m","input":"a","input":"b"}`:                           "input",
		`{"model":"m","input":"a","encoding_format":"hex"}`:               "encoding_format",
		`{"model":"m","input":"a","dimensions":0}`:                        "dimensions",
		`{"model":"m","input":"a","dimensions":-3}`:                       "dimensions",
		`{"model":"m","input":"a","dimensions":"8"}`:                      "dimensions",
		`{"input":"a"}`:                                                   "model",
		`{"model":"","input":"a"}`:                                        "model",
		`{"model":"m","input":["` + strings.Repeat(`a","`, 2048) + `a"]}`: "input",
	} {
		res := embedCall(t, r.url, "", body)
		if res.status != 400 || !strings.Contains(res.body, `"param":"`+param+`"`) {
			t.Fatalf("%.80s: %d %s, want 400 naming %s", body, res.status, res.body, param)
		}
		checkOpenAIError(t, res.body)
	}
	for _, body := range []string{`{"model":"m","input":"a"`, `[1]`, `{"model":"m","input":"\xff"}`} {
		if res := embedCall(t, r.url, "", body); res.status != 400 {
			t.Fatalf("%q: %d", body, res.status)
		}
	}
	// At the limits: 2048 inputs, token ids, token-id arrays, null format.
	for _, body := range []string{
		`{"model":"m","input":["` + strings.Repeat(`a","`, 2047) + `a"]}`,
		`{"model":"m","input":[1,2,3]}`,
		`{"model":"m","input":[[1,2],[3]],"encoding_format":null}`,
		`{"model":"m","input":"a","stream":true,"max_tokens":"ignored"}`,
	} {
		if res := embedCall(t, r.url, "", body); res.status != 200 {
			t.Fatalf("%.80s: %d %s", body, res.status, res.body)
		}
	}
	if paths, _ := eng.seen(); len(paths) != 4 {
		t.Fatalf("the engine got %d requests, want only the 4 good ones", len(paths))
	}
}

// An embeddings request counts against its user's TPM with the input's
// estimate, reconciled with the engine's reported prompt_tokens.
func TestEmbeddingTokensCountAgainstTheUsersTPM(t *testing.T) {
	eng, r, key := tpmRouter(t)
	eng.tokens.Store(10)
	for i := 0; i < 5; i++ {
		want(t, embedCall(t, r.url, key, embedBody), 200, "")
	}
	eng.tokens.Store(3000) // the engine reports far more than the estimate
	want(t, embedCall(t, r.url, key, embedBody), 200, "")
	want(t, embedCall(t, r.url, key, embedBody), 429, "rate_limit_tpm")
	want(t, embedCall(t, r.url, "", embedBody), 401, "invalid_api_key")
}

// Under kv-aware routing (the default) an embeddings request is decided by
// the load balancer: neither the KV layer nor the prefix index sees its
// input, and the prefix index records nothing of it.
func TestEmbeddingsAreRoutedByLoadNotByPrefix(t *testing.T) {
	eng := startEmbedEngine(t)
	f := defaultFlags()
	f.RouterPolicy = "kv-aware"
	cfg := config.Default()
	cfg.Debug.DecisionHeader = true
	r := startRouter(t, f, cfg, eng.url, eng.url)
	body := `{"model":"m","input":"` + strings.Repeat("a shared long document ", 200) + `"}`
	for i := 0; i < 3; i++ {
		req, _ := http.NewRequest("POST", r.url+"/v1/embeddings", strings.NewReader(body))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("X-Infera-Route"), "layer=lb") {
			t.Fatalf("request %d: %d, route %q", i, resp.StatusCode, resp.Header.Get("X-Infera-Route"))
		}
	}
	if n := r.srv.sched.Stats().PrefixBlocks; n != 0 {
		t.Fatalf("the prefix index recorded %d blocks of embeddings inputs", n)
	}
}

// With the split proxy on, an embedding whose local fleet fails goes to an
// external upstream at its /v1/embeddings, the body as the client sent it.
func TestEmbeddingsFailOverToASplitExternalUpstream(t *testing.T) {
	var rec recorder
	ext := startUpstream(t, func(ctx *fasthttp.RequestCtx) {
		rec.record(ctx)
		ctx.SetContentType("application/json")
		ctx.SetBodyString(`{"object":"list","data":[{"object":"embedding","index":0,"embedding":[1]}],"model":"m","usage":{"prompt_tokens":1,"total_tokens":1}}`)
	})
	cfg := splitConfig(config.SplitWeight,
		config.Proxy{Local: true, Weight: 1},
		config.Proxy{Name: "ext", Address: ext.url + "/base", Failover: true},
	)
	r := startRouterWith(t, nil, cfg, nil, deadURL(t))
	body := `{"model":"m","input":["x","y"],"user":"u"}`
	resp, b := postWith(t, r.url+"/v1/embeddings", body, nil)
	if resp.StatusCode != 200 || resp.Header.Get("X-Infera-Upstream") != "split:ext" {
		t.Fatalf("dead local -> ext: %d %s %v", resp.StatusCode, b, resp.Header)
	}
	got := rec.all()
	if len(got) != 1 || got[0].uri != "/base/v1/embeddings" || got[0].body != body {
		t.Fatalf("external upstream got %+v", got)
	}
}

// Mirroring copies a sampled embedding to the target's /v1/embeddings.
func TestEmbeddingsAreMirroredAtTheirPath(t *testing.T) {
	var rec recorder
	target := startUpstream(t, func(ctx *fasthttp.RequestCtx) { rec.record(ctx); okHandler(ctx) })
	eng := startEmbedEngine(t)
	cfg := config.Default()
	cfg.Mirror = config.Mirror{Enabled: true, TargetAddress: target.url, SamplingRatio: 100,
		TimeoutMS: 5000, QueueSize: 16, Concurrency: 2, MaxBufferBytes: config.DefaultMirrorBufferBytes}
	m := mirror.New(mirror.Options{})
	t.Cleanup(m.Close)
	r := startRouterWith(t, nil, cfg, func(o *Options) { o.Mirror = m }, eng.url)
	body := `{"model":"m","input":"mirror me"}`
	want(t, embedCall(t, r.url, "", body), 200, "")
	waitFor(t, func() bool { return len(rec.all()) == 1 }, "the embedding's copy")
	if got := rec.all()[0]; got.uri != "/v1/embeddings" || got.body != body {
		t.Fatalf("the mirror target got %+v", got)
	}
}

// On a prefill/decode fleet an embedding goes whole to a mixed worker,
// never to a PD pair; with no mixed worker it is refused, not split.
func TestEmbeddingsOnAPDFleetGoToAMixedWorkerOnly(t *testing.T) {
	var pd atomic.Int64
	legs := func(ctx *fasthttp.RequestCtx) { pd.Add(1); okHandler(ctx) }
	p, d := startUpstream(t, legs), startUpstream(t, legs)
	mixed := startEmbedEngine(t)
	cfg := pdConfig(t, func(c *config.Config) { c.PD.Mode = "vllm" })
	r := startPDRouter(t, nil, cfg, pdWorker("p", p.url, "prefill", ""), pdWorker("d", d.url, "decode", ""),
		fleet.Record{ID: "mixed", URL: mixed.url, Models: []string{"m"}})
	for i := 0; i < 4; i++ {
		want(t, embedCall(t, r.url, "", `{"model":"m","input":"whole"}`), 200, "")
	}
	r2 := startPDRouter(t, nil, cfg, pdWorker("p", p.url, "prefill", ""), pdWorker("d", d.url, "decode", ""))
	if res := embedCall(t, r2.url, "", `{"model":"m","input":"whole"}`); res.status < 400 {
		t.Fatalf("no mixed worker: %d %s", res.status, res.body)
	}
	if n := pd.Load(); n != 0 {
		t.Fatalf("prefill/decode workers got %d embeddings requests", n)
	}
}
