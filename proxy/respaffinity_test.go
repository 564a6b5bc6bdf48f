package proxy

import (
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/infera/infera/config"
	"github.com/infera/infera/fleet"
	"github.com/valyala/fasthttp"
)

// storingResponsesEngine serves /v1/responses as vLLM does with its
// response store on: every answer's id is stored, and a request whose
// previous_response_id this engine did not answer gets 404.
func storingResponsesEngine(t *testing.T, name string) *upstream {
	var mu sync.Mutex
	stored := map[string]bool{}
	n := 0
	return startUpstream(t, func(ctx *fasthttp.RequestCtx) {
		var req struct {
			Stream bool   `json:"stream"`
			Prev   string `json:"previous_response_id"`
			Store  *bool  `json:"store"`
		}
		json.Unmarshal(ctx.PostBody(), &req)
		mu.Lock()
		defer mu.Unlock()
		ctx.SetContentType("application/json")
		if req.Prev != "" && !stored[req.Prev] {
			ctx.SetStatusCode(404)
			fmt.Fprintf(ctx, `{"error":{"message":"Response with id '%s' not found.","type":"invalid_request_error","param":null,"code":404}}`, req.Prev)
			return
		}
		n++
		id := fmt.Sprintf("resp_%s_%d", name, n)
		if req.Store == nil || *req.Store {
			stored[id] = true
		}
		resp := `{"id":"` + id + `","object":"response","created_at":1,"status":"completed","model":"m","output":[{"id":"msg_1","type":"message","role":"assistant","status":"completed","content":[{"type":"output_text","text":"hi","annotations":[]}]}],"usage":{"input_tokens":3,"output_tokens":1,"total_tokens":4}}`
		if !req.Stream {
			ctx.SetBodyString(resp)
			return
		}
		ctx.SetContentType("text/event-stream")
		created := strings.Replace(resp, `"status":"completed"`, `"status":"in_progress"`, 1)
		fmt.Fprintf(ctx, "event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":%s}\n\n", created)
		fmt.Fprintf(ctx, "event: response.completed\ndata: {\"type\":\"response.completed\",\"sequence_number\":1,\"response\":%s}\n\n", resp)
	})
}

// In passthrough, a Responses follow-up (previous_response_id) goes to the
// worker that answered the response it names, whole or streamed, across a
// config reload; the engines store responses each for itself. It was routed
// by load: round-robin sent every follow-up to the other engine (404).
func TestAResponsesFollowUpGoesToTheWorkerHoldingItsPreviousResponse(t *testing.T) {
	a, b := storingResponsesEngine(t, "a"), storingResponsesEngine(t, "b")
	cfg := config.Default()
	cfg.Protocol.ResponsesPassthrough = true
	r := startRouter(t, nil, cfg, a.url, b.url)
	idOf := func(stream bool, body string) string {
		t.Helper()
		resp, got := postH(t, r.url+"/v1/responses", body, nil)
		if resp.StatusCode != 200 {
			t.Fatalf("%d %s", resp.StatusCode, got)
		}
		if stream {
			_, got, _ = strings.Cut(got, "data: ")
			got, _, _ = strings.Cut(got, "\n")
			var ev struct {
				Response struct{ ID string } `json:"response"`
			}
			json.Unmarshal([]byte(got), &ev)
			return ev.Response.ID
		}
		var v struct{ ID string }
		json.Unmarshal([]byte(got), &v)
		return v.ID
	}
	for conv := 0; conv < 6; conv++ {
		stream := conv%2 == 1
		body := func(prev string) string {
			b := `{"model":"m","input":"hello","stream":` + fmt.Sprint(stream)
			if prev != "" {
				b += `,"previous_response_id":"` + prev + `"`
			}
			return b + "}"
		}
		id := idOf(stream, body(""))
		for turn := 0; turn < 4; turn++ {
			if turn == 2 {
				c := *r.store.Load() // a reload keeps what was learned
				r.store.Set(&c)
			}
			next := idOf(stream, body(id))
			if next == "" || next[:6] != id[:6] {
				t.Fatalf("conversation %d turn %d: %q followed %q", conv, turn, next, id)
			}
			id = next
		}
	}
	// An id the router does not know is routed as any request (the engine
	// answers it).
	resp, got := postH(t, r.url+"/v1/responses", `{"model":"m","input":"x","previous_response_id":"resp_zz_1"}`, nil)
	if resp.StatusCode != 404 || !strings.Contains(got, "not found") {
		t.Fatalf("%d %s", resp.StatusCode, got)
	}
}

func TestResponseIDOfAnAnswersFirstRead(t *testing.T) {
	f := func(in, want string) {
		t.Helper()
		if got := string(responseID([]byte(in))); got != want {
			t.Errorf("%.60q: %q, want %q", in, got, want)
		}
	}
	f(`{"id":"resp_1","object":"response","output":[{"id":"msg_2"}]}`, "resp_1")
	f(`{"object":"response","output":[{"id":"msg_2"}],"id":"resp_1"}`, "resp_1")
	f(`{"id":"resp_1","output":[{"id":"msg_2"`, "resp_1") // a first read cut after the id
	f("event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"id\":\"resp_9\",\"output\":[]}}\n\n", "resp_9")
	f("event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"object\":\"response\",\"id\":\"resp_9\"", "resp_9")
	f("event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"resp_", "")
	f(`{"id":"a\"b"}`, "")
	f(`{"id":"`+strings.Repeat("x", 129)+`"}`, "")
	f(`{"id":7}`, "")
	f(`{"error":{"message":"x"}}`, "")
	f(`data: [DONE]`, "")
	f(``, "")
}

// The ids kept are bounded: the oldest go first.
func TestResponsesAffinityIsBounded(t *testing.T) {
	var a respAffinity
	w := &fleetWorkerStub
	for i := 0; i < respAffinityMax+10; i++ {
		a.learn([]byte(fmt.Sprintf(`{"id":"resp_%d"}`, i)), w)
	}
	if len(a.m) != respAffinityMax || len(a.ring) != respAffinityMax {
		t.Fatalf("%d ids, ring %d", len(a.m), len(a.ring))
	}
	if ref, _ := a.lookup([]byte(`{"previous_response_id":"resp_3"}`)); ref != (fleet.Ref{}) {
		t.Fatal("the oldest kept")
	}
	if ref, _ := a.lookup([]byte(fmt.Sprintf(`{"previous_response_id":"resp_%d"}`, respAffinityMax+9))); ref != w.Ref() {
		t.Fatal("not the oldest evicted")
	}
}

var fleetWorkerStub = fleet.Worker{Serial: 7, ID: "w7", URL: "http://10.0.0.7:8000", Addr: "10.0.0.7:8000"}

// A response id learned again from another engine (vLLM lets a client
// choose the id: request_id) keeps its first engine: another client who
// knows the id cannot move the conversation's follow-ups to the engine
// holding a response it planted under the same id.
func TestAResponseIDKeepsTheEngineThatAnsweredItFirst(t *testing.T) {
	var a respAffinity
	first := &fleet.Worker{ID: "a", URL: "http://10.0.0.1:8000", Addr: "10.0.0.1:8000"}
	other := &fleet.Worker{ID: "b", URL: "http://10.0.0.2:8000", Addr: "10.0.0.2:8000"}
	a.learn([]byte(`{"id":"resp_victim"}`), first)
	a.learn([]byte(`{"id":"resp_victim"}`), other)
	if got, _ := a.lookup([]byte(`{"previous_response_id":"resp_victim"}`)); got != first.Ref() {
		t.Fatalf("the follow-up goes to %v, want the first engine %v", got, first.Ref())
	}
}

// An answer to a request with "store": false is not stored by the engine
// (a follow-up naming it fails anyway): its id takes no slot. Such answers
// were learned, and 65,536 of them pushed every stored response's id out.
func TestAnAnswerNotStoredTakesNoAffinitySlot(t *testing.T) {
	a, b := storingResponsesEngine(t, "a"), storingResponsesEngine(t, "b")
	cfg := config.Default()
	cfg.Protocol.ResponsesPassthrough = true
	r := startRouter(t, nil, cfg, a.url, b.url)
	for i, body := range []string{
		`{"model":"m","input":"x","store":false}`,
		`{"model":"m","input":"x","store":false,"stream":true}`,
		`{"model":"m","input":"x","store":true,"store":false}`,
	} {
		if resp, got := postH(t, r.url+"/v1/responses", body, nil); resp.StatusCode != 200 {
			t.Fatalf("%d: %d %s", i, resp.StatusCode, got)
		}
	}
	if n := r.srv.respAff.n.Load(); n != 0 {
		t.Fatalf("%d ids of unstored answers kept", n)
	}
	for _, body := range []string{`{"model":"m","input":"x"}`, `{"model":"m","input":"x","store":true}`, `{"model":"m","input":"x","store":null}`} {
		if resp, got := postH(t, r.url+"/v1/responses", body, nil); resp.StatusCode != 200 {
			t.Fatalf("%d %s", resp.StatusCode, got)
		}
	}
	if n := r.srv.respAff.n.Load(); n != 3 {
		t.Fatalf("%d ids of stored answers kept, want 3", n)
	}
}

func TestLookupReadsStore(t *testing.T) {
	var a respAffinity
	f := func(body string, want bool) {
		t.Helper()
		if _, got := a.lookup([]byte(body)); got != want {
			t.Errorf("%s: noStore %v, want %v", body, got, want)
		}
	}
	f(`{"model":"m"}`, false)
	f(`{"model":"m","store":false}`, true)
	f(`{"model":"m","store":true}`, false)
	f(`{"model":"m","store":null}`, false)
	f(`{"model":"m","store":false,"store":true}`, false)
	f(`{"model":"m","metadata":{"store":false}}`, false)
}
