package proxy

import (
	"net/http"
	"strings"
	"testing"

	"github.com/infera/infera/config"
)

const (
	rerankBody = `{"model":"m","query":"what is deep learning","documents":["deep learning is",{"text":"the cat"}],"top_n":1,"return_documents":true}`
	scoreBody  = `{"model":"m","text_1":"what is deep learning","text_2":["deep learning is","the cat"]}`
)

// Rerank (/v1/rerank, /rerank, /v2/rerank) and score (/v1/score, /score)
// go through the request path like embeddings: the body reaches the engine
// untouched at /v1/rerank or /v1/score, decided by load (never the KV
// layer or the prefix index), counted; malformed bodies get OpenAI's 400
// naming the parameter and never reach the engine.
func TestRerankAndScoreAreRoutedLikeEmbeddings(t *testing.T) {
	eng := startEmbedEngine(t)
	f := defaultFlags()
	f.RouterPolicy = "kv-aware"
	cfg := config.Default()
	cfg.Debug.DecisionHeader = true
	r := startRouter(t, f, cfg, eng.url)
	for path, want := range map[string]string{"/v1/rerank": "/v1/rerank", "/rerank": "/v1/rerank", "/v2/rerank": "/v1/rerank",
		"/v1/score": "/v1/score", "/score": "/v1/score"} {
		body := rerankBody
		if strings.Contains(path, "score") {
			body = scoreBody
		}
		req, _ := http.NewRequest("POST", r.url+path, strings.NewReader(body))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("X-Infera-Route"), "layer=lb") {
			t.Fatalf("%s: %d, route %q", path, resp.StatusCode, resp.Header.Get("X-Infera-Route"))
		}
		paths, bodies := eng.seen()
		if got := paths[len(paths)-1]; got != want || bodies[len(bodies)-1] != body {
			t.Fatalf("%s reached the engine at %s with %s", path, got, bodies[len(bodies)-1])
		}
	}
	if n := r.srv.sched.Stats().PrefixBlocks; n != 0 {
		t.Fatalf("the prefix index recorded %d blocks", n)
	}
	before, _ := eng.seen()
	for body, param := range map[string]string{
		`{"model":"m","documents":["a"]}`:                                                 "query",
		`{"model":"m","query":"","documents":["a"]}`:                                      "query",
		`{"model":"m","query":["q"],"documents":["a"]}`:                                   "query",
		`{"model":"m","query":"q"}`:                                                       "documents",
		`{"model":"m","query":"q","documents":[]}`:                                        "documents",
		`{"model":"m","query":"q","documents":"a"}`:                                       "documents",
		`{"model":"m","query":"q","documents":[1]}`:                                       "documents",
		`{"model":"m","query":"q","documents":["a"],"top_n":-1}`:                          "top_n",
		`{"model":"m","query":"q","documents":["a"],"documents":["b"]}`:                   "documents",
		`{"query":"q","documents":["a"]}`:                                                 "model",
		`{"model":"m","query":"q","documents":[` + strings.Repeat(`"a",`, 1000) + `"a"]}`: "documents",
	} {
		if res := postPath(t, r.url, "/v1/rerank", "", body); res.status != 400 || !strings.Contains(res.body, `"param":"`+param+`"`) {
			t.Fatalf("rerank %.70s: %d %s, want 400 naming %s", body, res.status, res.body, param)
		}
	}
	for body, param := range map[string]string{
		`{"model":"m","text_2":"a"}`:                              "text_1",
		`{"model":"m","text_1":"","text_2":"a"}`:                  "text_1",
		`{"model":"m","text_1":["a",""],"text_2":["b","c"]}`:      "text_1",
		`{"model":"m","text_1":"a"}`:                              "text_2",
		`{"model":"m","text_1":"a","text_2":[]}`:                  "text_2",
		`{"model":"m","text_1":"a","text_2":[1]}`:                 "text_2",
		`{"model":"m","text_1":["a","b"],"text_2":["c","d","e"]}`: "text_1",
	} {
		if res := postPath(t, r.url, "/v1/score", "", body); res.status != 400 || !strings.Contains(res.body, `"param":"`+param+`"`) {
			t.Fatalf("score %.70s: %d %s, want 400 naming %s", body, res.status, res.body, param)
		}
	}
	if after, _ := eng.seen(); len(after) != len(before) {
		t.Fatalf("%d malformed bodies reached the engine", len(after)-len(before))
	}
}

// A rerank request counts against its user's TPM with no output estimate
// (1024 would not fit in 1000), reconciled with the engine's usage.
func TestRerankTokensCountAgainstTheUsersTPM(t *testing.T) {
	eng, r, key := tpmRouter(t)
	eng.tokens.Store(10)
	for i := 0; i < 3; i++ {
		want(t, postPath(t, r.url, "/v1/rerank", key, rerankBody), 200, "")
		want(t, postPath(t, r.url, "/score", key, scoreBody), 200, "")
	}
	eng.tokens.Store(3000)
	want(t, postPath(t, r.url, "/v1/rerank", key, rerankBody), 200, "")
	want(t, postPath(t, r.url, "/v1/rerank", key, rerankBody), 429, "rate_limit_tpm")
}

// Older vLLM reranks report usage as {"total_tokens":N} alone (no
// prompt_tokens): N is read as the prompt tokens, so the user's TPM is
// reconciled with it. It was not read: the router's small estimate stood,
// and a 3,000-token rerank left a 1,000 TPM bucket open.
func TestRerankUsageWithOnlyTotalTokensCountsAgainstTheUsersTPM(t *testing.T) {
	eng, r, key := tpmRouter(t)
	eng.totalOnly.Store(true)
	eng.tokens.Store(3000)
	want(t, postPath(t, r.url, "/v1/rerank", key, rerankBody), 200, "")
	want(t, postPath(t, r.url, "/v1/rerank", key, rerankBody), 429, "rate_limit_tpm")
}
