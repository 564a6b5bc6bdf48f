package proxy

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/infera/infera/config"
	"github.com/valyala/fasthttp"
)

// seenRequest is what a fake external entry saw of a request.
type seenRequest struct {
	method, uri, auth, forwards string
}

// storingResponsesEntry is an external OpenAI-compatible API behind a split
// proxy entry that stores Responses: it makes them (ids resp_<name>_<n>),
// retrieves them (a stream of their events with ?stream=true) and cancels
// them, as OpenAI and vLLM serve /v1/responses/{id} and .../cancel, and
// answers 401 to any key but key. seen lists the requests it got.
func storingResponsesEntry(t *testing.T, name, key string) (*upstream, func() []seenRequest) {
	var mu sync.Mutex
	var seen []seenRequest
	stored := map[string]bool{}
	n := 0
	up := startUpstream(t, func(ctx *fasthttp.RequestCtx) {
		mu.Lock()
		defer mu.Unlock()
		seen = append(seen, seenRequest{method: string(ctx.Method()), uri: string(ctx.RequestURI()),
			auth: string(ctx.Request.Header.Peek("Authorization")), forwards: string(ctx.Request.Header.Peek("X-Infera-Forwards"))})
		ctx.SetContentType("application/json")
		if string(ctx.Request.Header.Peek("Authorization")) != "Bearer "+key {
			ctx.SetStatusCode(401)
			ctx.SetBodyString(`{"error":{"message":"Incorrect API key provided.","type":"invalid_request_error","param":null,"code":"invalid_api_key"}}`)
			return
		}
		path := string(ctx.Path())
		notFound := func(id string) {
			ctx.SetStatusCode(404)
			fmt.Fprintf(ctx, `{"error":{"message":"Response with id '%s' not found.","type":"invalid_request_error","param":"response_id","code":404}}`, id)
		}
		switch rest, byID := strings.CutPrefix(path, "/v1/responses/"); {
		case path == "/v1/responses" && ctx.IsPost():
			n++
			id := fmt.Sprintf("resp_%s_%d", name, n)
			stored[id] = true
			fmt.Fprintf(ctx, `{"id":%q,"object":"response","created_at":1,"status":"completed","model":"m","output":[],"usage":{"input_tokens":3,"output_tokens":1,"total_tokens":4}}`, id)
		case byID && ctx.IsGet() && !strings.Contains(rest, "/"):
			if !stored[rest] {
				notFound(rest)
				return
			}
			resp := fmt.Sprintf(`{"id":%q,"object":"response","created_at":1,"status":"completed","model":"m","output":[]}`, rest)
			if string(ctx.QueryArgs().Peek("stream")) == "true" {
				ctx.SetContentType("text/event-stream")
				fmt.Fprintf(ctx, "event: response.completed\ndata: {\"type\":\"response.completed\",\"sequence_number\":2,\"response\":%s}\n\n", resp)
				return
			}
			ctx.SetBodyString(resp)
		case byID && ctx.IsPost() && strings.HasSuffix(rest, "/cancel"):
			id := strings.TrimSuffix(rest, "/cancel")
			if !stored[id] {
				notFound(id)
				return
			}
			fmt.Fprintf(ctx, `{"id":%q,"object":"response","created_at":1,"status":"cancelled","model":"m","output":[]}`, id)
		default:
			ctx.SetStatusCode(404)
			ctx.SetBodyString(`{"error":{"message":"unknown path"}}`)
		}
	})
	return up, func() []seenRequest {
		mu.Lock()
		defer mu.Unlock()
		return append([]seenRequest(nil), seen...)
	}
}

// A retrieve (GET /v1/responses/{id}) or cancel (POST .../cancel) of a
// response an external split proxy entry made goes to that entry, as the
// request that made it went there: its own key (never the client's),
// the hop count, the retrieve's query; the local engine is not asked.
// The router learned such ids, but answered their retrieve and cancel
// with its own 404. Once the entry is removed, the router answers 404
// again, asking no one.
func TestARetrieveOrCancelOfAnExternalEntrysResponseGoesToThatEntry(t *testing.T) {
	local := storingResponsesEngine(t, "l")
	ext, seen := storingResponsesEntry(t, "x", "sk-entry-0123")
	proxies := []config.Proxy{
		{Local: true, Weight: 1},
		{Name: "x", Address: ext.url + "/v1", APIKey: config.NewSecret("sk-entry-0123"), Weight: 1},
	}
	cfg := splitConfig(config.SplitWeight, proxies...)
	cfg.Protocol.ResponsesPassthrough = true
	f := defaultFlags()
	f.APIKey = "sk-client-0123"
	r := startRouterWith(t, f, cfg, nil, local.url)
	client := map[string]string{"Authorization": "Bearer sk-client-0123"}
	do := func(method, path string) (*http.Response, string) {
		t.Helper()
		req, _ := http.NewRequest(method, r.url+path, nil)
		req.Header.Set("Authorization", "Bearer sk-client-0123")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp, string(b)
	}
	id, localID := "", ""
	for i := 0; i < 6 && (id == "" || localID == ""); i++ {
		resp, b := postWith(t, r.url+"/v1/responses", `{"model":"m","input":"hello"}`, client)
		var v struct{ ID string }
		json.Unmarshal([]byte(b), &v)
		if resp.StatusCode != 200 {
			t.Fatalf("create: %d %s", resp.StatusCode, b)
		}
		if strings.HasPrefix(v.ID, "resp_x_") {
			id = v.ID
		} else {
			localID = v.ID
		}
	}
	if id == "" || localID == "" {
		t.Fatalf("no response from the external entry (%q) or the local engine (%q)", id, localID)
	}
	// The local engine's response is still retrieved there.
	made := len(seen())
	if resp, b := do("GET", "/v1/responses/"+localID); resp.StatusCode != 200 || !strings.Contains(b, `"id":"`+localID+`"`) || len(seen()) != made {
		t.Fatalf("retrieve of the local engine's response: %d %s (the entry got %d requests)", resp.StatusCode, b, len(seen())-made)
	}
	localHits := local.hits.Load()

	check := func(what, method, uri string, resp *http.Response, b, want string) {
		t.Helper()
		if resp.StatusCode != 200 || !strings.Contains(b, want) || resp.Header.Get("X-Infera-Upstream") != "split:x" {
			t.Fatalf("%s: %d upstream %q %s", what, resp.StatusCode, resp.Header.Get("X-Infera-Upstream"), b)
		}
		all := seen()
		if len(all) != made+1 {
			t.Fatalf("%s: the entry got %d requests, want 1", what, len(all)-made)
		}
		got := all[made]
		made++
		if got.method != method || got.uri != uri || got.auth != "Bearer sk-entry-0123" || got.forwards != "1" {
			t.Fatalf("%s: the entry got %+v, want %s %s with its own key and one forward", what, got, method, uri)
		}
	}
	resp, b := do("GET", "/v1/responses/"+id)
	check("retrieve", "GET", "/v1/responses/"+id, resp, b, `"id":"`+id+`"`)
	resp, b = do("GET", "/v1/responses/"+id+"?stream=true&starting_after=1")
	check("streamed retrieve", "GET", "/v1/responses/"+id+"?stream=true&starting_after=1", resp, b, "event: response.completed")
	resp, b = do("POST", "/v1/responses/"+id+"/cancel")
	check("cancel", "POST", "/v1/responses/"+id+"/cancel", resp, b, `"status":"cancelled"`)
	if n := local.hits.Load() - localHits; n != 0 {
		t.Fatalf("the local engine got %d of the entry's retrieves and cancels", n)
	}

	// The entry removed: the router's own 404, no one asked.
	gone := splitConfig(config.SplitWeight, proxies[0])
	gone.Protocol.ResponsesPassthrough = true
	r.store.Set(gone)
	for _, c := range [][2]string{{"GET", "/v1/responses/" + id}, {"POST", "/v1/responses/" + id + "/cancel"}} {
		if resp, b := do(c[0], c[1]); resp.StatusCode != 404 || !strings.Contains(b, "not found") {
			t.Fatalf("%s %s after the entry left: %d %s", c[0], c[1], resp.StatusCode, b)
		}
	}
	if local.hits.Load() != localHits || len(seen()) != made {
		t.Fatal("a retrieve or cancel after the entry left was sent on")
	}
}
