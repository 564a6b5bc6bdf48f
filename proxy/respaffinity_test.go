package proxy

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"math/rand"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/infera/infera/config"
	"github.com/infera/infera/fleet"
	"github.com/infera/infera/internal/jsonscan"
	"github.com/valyala/fasthttp"
)

// storingResponsesEngine serves /v1/responses as vLLM does with its
// response store on: every answer's id is stored, and a request whose
// previous_response_id this engine did not answer gets 404.
func storingResponsesEngine(t *testing.T, name string) *upstream {
	return storingResponsesEngineSplit(t, name, false)
}

// storingResponsesEngineSplit is storingResponsesEngine; with split its
// answers come in two pieces, the second after a pause: a whole answer is
// cut in the middle of its id, a stream starts with an SSE retry field
// alone (the router's first read then holds no id).
func storingResponsesEngineSplit(t *testing.T, name string, split bool) *upstream {
	return storingResponsesEngineHold(t, name, split, nil)
}

// storingResponsesEngineHold is storingResponsesEngineSplit; a request
// whose input is "hold" waits for a value on h.release first (up to 10 s),
// counted in h.inflight; a follow-up whose input is "busy" gets 503 (the
// engine overloaded).
func storingResponsesEngineHold(t *testing.T, name string, split bool, h *holdUpstream) *upstream {
	return storingResponsesEngineOpt(t, name, respEngineOpt{split: split, hold: h})
}

// respEngineOpt shapes a storingResponsesEngine's answers.
type respEngineOpt struct {
	split bool          // storingResponsesEngineSplit
	hold  *holdUpstream // storingResponsesEngineHold
	// escapeID writes each answer's id with its "resp_" prefix JSON-escaped
	// ("\u0072\u0065\u0073\u0070\u005f..."): the same id, as a client or
	// the engine's own decoder reads it.
	escapeID bool
}

func storingResponsesEngineOpt(t *testing.T, name string, o respEngineOpt) *upstream {
	split, h := o.split, o.hold
	var mu sync.Mutex
	stored := map[string]bool{}
	n := 0
	return startUpstream(t, func(ctx *fasthttp.RequestCtx) {
		if id, ok := strings.CutPrefix(string(ctx.Path()), "/v1/responses/"); ok && ctx.IsGet() {
			// Retrieve, as vLLM answers it.
			mu.Lock()
			defer mu.Unlock()
			ctx.SetContentType("application/json")
			if !stored[id] {
				ctx.SetStatusCode(404)
				fmt.Fprintf(ctx, `{"error":{"message":"Response with id '%s' not found.","type":"invalid_request_error","param":"response_id","code":404}}`, id)
				return
			}
			fmt.Fprintf(ctx, `{"id":%q,"object":"response","status":"completed","model":"m","output":[]}`, id)
			return
		}
		var req struct {
			Stream bool            `json:"stream"`
			Prev   string          `json:"previous_response_id"`
			Store  json.RawMessage `json:"store"`
			Input  any             `json:"input"`
		}
		json.Unmarshal(ctx.PostBody(), &req)
		if h != nil && req.Input == "hold" {
			h.inflight.Add(1)
			select {
			case <-h.release:
			case <-time.After(10 * time.Second):
			}
			h.inflight.Add(-1)
		}
		mu.Lock()
		defer mu.Unlock()
		ctx.SetContentType("application/json")
		if req.Prev != "" && !stored[req.Prev] {
			ctx.SetStatusCode(404)
			fmt.Fprintf(ctx, `{"error":{"message":"Response with id '%s' not found.","type":"invalid_request_error","param":null,"code":404}}`, req.Prev)
			return
		}
		if h != nil && req.Input == "busy" {
			ctx.SetStatusCode(503)
			ctx.SetBodyString(`{"error":{"message":"the engine is overloaded","type":"server_error","param":null,"code":503}}`)
			return
		}
		n++
		id := fmt.Sprintf("resp_%s_%d", name, n)
		// store: true by default, read as vLLM reads it (a lax bool;
		// null is None, and vLLM stores only "if request.store").
		if req.Store == nil || jsonscan.LaxBool(req.Store) == 't' {
			stored[id] = true
		}
		wire := id
		if o.escapeID {
			wire = `\u0072\u0065\u0073\u0070\u005f` + id[len("resp_"):]
		}
		resp := `{"id":"` + wire + `","object":"response","created_at":1,"status":"completed","model":"m","output":[{"id":"msg_1","type":"message","role":"assistant","status":"completed","content":[{"type":"output_text","text":"hi","annotations":[]}]}],"usage":{"input_tokens":3,"output_tokens":1,"total_tokens":4}}`
		body := resp
		if req.Stream {
			ctx.SetContentType("text/event-stream")
			created := strings.Replace(resp, `"status":"completed"`, `"status":"in_progress"`, 1)
			body = fmt.Sprintf("event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":%s}\n\n", created) +
				fmt.Sprintf("event: response.completed\ndata: {\"type\":\"response.completed\",\"sequence_number\":1,\"response\":%s}\n\n", resp)
		}
		if !split {
			ctx.SetBodyString(body)
			return
		}
		cut := strings.Index(body, "resp_") + 3
		head := body[:cut]
		if req.Stream {
			// An SSE field line that is no event of the protocol
			// (the reconnection time) is the stream's first packet.
			head, cut = "retry: 3000\n\n", 0
		}
		ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
			w.WriteString(head)
			w.Flush()
			time.Sleep(30 * time.Millisecond)
			w.WriteString(body[cut:])
			w.Flush()
		})
	})
}

// In passthrough, a Responses follow-up (previous_response_id) goes to the
// worker that answered the response it names, whole or streamed, across a
// config reload; the engines store responses each for itself. It was routed
// by load: round-robin sent every follow-up to the other engine (404).
func TestAResponsesFollowUpGoesToTheWorkerHoldingItsPreviousResponse(t *testing.T) {
	testFollowUps(t, false)
}

// An answer whose id arrives after the router's first read (a slow engine,
// a stream that starts with a comment) is learned too. Only the first read
// was scanned: each such conversation's follow-ups were routed by load, and
// half of them reached the other engine (404).
func TestAResponseIDThatArrivesAfterTheFirstReadIsLearned(t *testing.T) {
	testFollowUps(t, true)
}

func testFollowUps(t *testing.T, split bool) {
	a, b := storingResponsesEngineSplit(t, "a", split), storingResponsesEngineSplit(t, "b", split)
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
		var buf [respIDDecodeMax]byte
		if got, _ := responseID(&buf, []byte(in)); string(got) != want {
			t.Errorf("%.60q: %q, want %q", in, got, want)
		}
	}
	f(`{"id":"resp_1","object":"response","output":[{"id":"msg_2"}]}`, "resp_1")
	f(`{"object":"response","output":[{"id":"msg_2"}],"id":"resp_1"}`, "resp_1")
	f(`{"id":"resp_1","output":[{"id":"msg_2"`, "resp_1") // a first read cut after the id
	f("event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"id\":\"resp_9\",\"output\":[]}}\n\n", "resp_9")
	f("event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"object\":\"response\",\"id\":\"resp_9\"", "resp_9")
	f("event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"resp_", "")
	f(`{"id":"a\"b"}`, `a"b`) // decoded, as the client reads it
	f(`{"id":"resp_\u0061bc"}`, "resp_abc")
	f("event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"resp_\\u0041\\/1\"", "resp_A/1")
	f(`{"id":"`+strings.Repeat(`\u0078`, 128)+`"}`, strings.Repeat("x", 128))
	f(`{"id":"`+strings.Repeat(`\u0078`, 129)+`"}`, "")
	f(`{"id":"resp_\u00e9"}`, "") // not ASCII once decoded
	f(`{"id":"resp_\u0020"}`, "") // a space
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
		a.learn([]byte(fmt.Sprintf(`{"id":"resp_%d"}`, i)), w, respCred{}, 0)
	}
	if len(a.m) != respAffinityMax || a.heap[0].held() != respAffinityMax {
		t.Fatalf("%d ids, %d held", len(a.m), a.heap[0].held())
	}
	if ref, _ := a.lookupRef([]byte(`{"previous_response_id":"resp_3"}`)); ref != (fleet.Ref{}) {
		t.Fatal("the oldest kept")
	}
	if ref, _ := a.lookupRef([]byte(fmt.Sprintf(`{"previous_response_id":"resp_%d"}`, respAffinityMax+9))); ref != w.Ref() {
		t.Fatal("not the oldest evicted")
	}
}

// One credential's many answers cannot push out another's ids: a full
// table gives way at the credential holding the most. The table was one
// ring: a client sending 65,536 Responses requests pushed every other
// client's ids out, and their follow-ups reached engines that answered 404.
func TestOneCredentialCannotPushOutAnothersResponseIDs(t *testing.T) {
	var a respAffinity
	w := &fleetWorkerStub
	alice, bob := respCred{user: "alice"}, respCred{addr: netip.MustParseAddr("10.1.1.1")}
	for i := 0; i < 100; i++ {
		a.learn([]byte(fmt.Sprintf(`{"id":"resp_alice_%d"}`, i)), w, alice, 0)
	}
	for i := 0; i < 2*respAffinityMax; i++ {
		a.learn([]byte(fmt.Sprintf(`{"id":"resp_bob_%d"}`, i)), w, bob, 0)
	}
	if len(a.m) != respAffinityMax {
		t.Fatalf("%d ids kept", len(a.m))
	}
	for i := 0; i < 100; i++ {
		if ref, _ := a.lookupRef([]byte(fmt.Sprintf(`{"previous_response_id":"resp_alice_%d"}`, i))); ref != w.Ref() {
			t.Fatalf("alice's id %d pushed out by bob's answers", i)
		}
	}
	// Bob keeps his newest, the rest of the table.
	if ref, _ := a.lookupRef([]byte(fmt.Sprintf(`{"previous_response_id":"resp_bob_%d"}`, 2*respAffinityMax-1))); ref != w.Ref() {
		t.Fatal("bob's newest id not kept")
	}
	if got := a.owners[bob].held(); got != respAffinityMax-100 {
		t.Fatalf("bob holds %d", got)
	}
	// Many credentials share the table: each new one takes from the
	// largest, so the table ends even (64 ids among bob and 8 others).
	a = respAffinity{limit: 64}
	for i := 0; i < 64; i++ {
		a.learn([]byte(fmt.Sprintf(`{"id":"resp_big_%d"}`, i)), w, bob, 0)
	}
	for c := 0; c < 8; c++ {
		for i := 0; i < 8; i++ {
			a.learn([]byte(fmt.Sprintf(`{"id":"resp_%d_%d"}`, c, i)), w, respCred{user: fmt.Sprint(c)}, 0)
		}
	}
	if len(a.m) != 64 {
		t.Fatalf("%d ids", len(a.m))
	}
	for c, o := range a.owners {
		if o.held() < 7 || o.held() > 8 {
			t.Fatalf("%v holds %d, want 7 or 8", c, o.held())
		}
	}
	checkRespHeap(t, &a)
}

// checkRespHeap checks the table's invariants.
func checkRespHeap(t *testing.T, a *respAffinity) {
	t.Helper()
	n := 0
	for i, o := range a.heap {
		if o.hi != i || a.owners[o.cred] != o || o.held() <= 0 {
			t.Fatalf("heap entry %d: hi %d, held %d", i, o.hi, o.held())
		}
		if i > 0 && a.heap[(i-1)/2].held() < o.held() {
			t.Fatalf("heap order broken at %d", i)
		}
		for _, id := range o.ids[o.head:] {
			if _, ok := a.m[id]; !ok {
				t.Fatalf("%s held but not mapped", id)
			}
		}
		n += o.held()
	}
	if n != len(a.m) || len(a.owners) != len(a.heap) {
		t.Fatalf("%d held, %d mapped, %d owners, heap %d", n, len(a.m), len(a.owners), len(a.heap))
	}
}

// A random mix of credentials keeps the table's invariants.
func TestResponsesAffinityTableStaysConsistent(t *testing.T) {
	a := respAffinity{limit: 500}
	w := &fleetWorkerStub
	rnd := rand.New(rand.NewSource(1))
	for i := 0; i < 20000; i++ {
		c := respCred{user: fmt.Sprint(rnd.Intn(1 + rnd.Intn(40)))}
		a.learn([]byte(fmt.Sprintf(`{"id":"resp_%d"}`, rnd.Intn(30000))), w, c, 0)
		if i%997 == 0 {
			checkRespHeap(t, &a)
		}
	}
	checkRespHeap(t, &a)
}

func BenchmarkRespAffinityLearn(b *testing.B) {
	a := respAffinity{limit: 4096}
	ids := make([][]byte, 8192)
	for i := range ids {
		ids[i] = []byte(fmt.Sprintf(`{"id":"resp_%d"}`, i))
	}
	creds := []respCred{{user: "a"}, {user: "b"}, {addr: netip.MustParseAddr("10.0.0.1")}}
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		a.learn(ids[i%len(ids)], &fleetWorkerStub, creds[i%len(creds)], 0)
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
	a.learn([]byte(`{"id":"resp_victim"}`), first, respCred{user: "victim"}, 0)
	a.learn([]byte(`{"id":"resp_victim"}`), other, respCred{user: "other"}, 0)
	if got, _ := a.lookupRef([]byte(`{"previous_response_id":"resp_victim"}`)); got != first.Ref() {
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
		// Lax bools, as vLLM's pydantic model reads them.
		`{"model":"m","input":"x","store":0}`,
		`{"model":"m","input":"x","store":0.0}`,
		`{"model":"m","input":"x","store":"false"}`,
		`{"model":"m","input":"x","store":"OFF","stream":true}`,
		`{"model":"m","input":"x","store":"\u006eo"}`,
		`{"model":"m","input":"x","store":"f"}`,
		// null: vLLM's store is Optional[bool] = True, stored only
		// "if request.store", and None is not.
		`{"model":"m","input":"x","store":null}`,
		`{"model":"m","input":"x","store":true,"store":null,"stream":true}`,
	} {
		if resp, got := postH(t, r.url+"/v1/responses", body, nil); resp.StatusCode != 200 {
			t.Fatalf("%d: %d %s", i, resp.StatusCode, got)
		}
	}
	if n := r.srv.respAff.n.Load(); n != 0 {
		t.Fatalf("%d ids of unstored answers kept", n)
	}
	stored := []string{`{"model":"m","input":"x"}`, `{"model":"m","input":"x","store":true}`, `{"model":"m","input":"x","store":null,"store":true}`,
		`{"model":"m","input":"x","store":1}`, `{"model":"m","input":"x","store":"Yes"}`, `{"model":"m","input":"x","store":"on"}`}
	for _, body := range stored {
		if resp, got := postH(t, r.url+"/v1/responses", body, nil); resp.StatusCode != 200 {
			t.Fatalf("%d %s", resp.StatusCode, got)
		}
	}
	if n := r.srv.respAff.n.Load(); n != int64(len(stored)) {
		t.Fatalf("%d ids of stored answers kept, want %d", n, len(stored))
	}
}

func TestLookupReadsStore(t *testing.T) {
	var a respAffinity
	f := func(body string, want bool) {
		t.Helper()
		if _, got := a.lookupRef([]byte(body)); got != want {
			t.Errorf("%s: noStore %v, want %v", body, got, want)
		}
	}
	f(`{"model":"m"}`, false)
	f(`{"model":"m","store":false}`, true)
	f(`{"model":"m","store":true}`, false)
	f(`{"model":"m","store":null}`, true)       // None: vLLM stores "if request.store"
	f(`{"model":"m","store":"maybe"}`, true)    // refused by vLLM (400): nothing kept
	f(`{"model":"m","st\u006fre":false}`, true) // the key decoded, as the engine reads it
	f(`{"model":"m","store":false,"store":true}`, false)
	f(`{"model":"m","store":0}`, true)
	f(`{"model":"m","store":"false"}`, true)
	f(`{"model":"m","store":"\u0046alse"}`, true)
	f(`{"model":"m","store":"n"}`, true)
	f(`{"model":"m","store":1}`, false)
	f(`{"model":"m","store":"TRUE"}`, false)
	f(`{"model":"m","metadata":{"store":false}}`, false)
}

// An engine that writes its Response's id with JSON escapes names the id
// it decodes to ("resp_\u0061..." is resp_a...), as the client reads it:
// the follow-up naming that decoded id goes to this engine, whole or
// streamed, whether the id came in the first read or after it. The raw
// escaped bytes were refused (not a plain id): nothing was learned, and
// the follow-ups went by load, half of them to the other engine (404).
func TestAnEscapedResponseIDIsLearnedDecoded(t *testing.T) {
	for _, split := range []bool{false, true} {
		a := storingResponsesEngineOpt(t, "a", respEngineOpt{split: split, escapeID: true})
		b := storingResponsesEngineOpt(t, "b", respEngineOpt{split: split, escapeID: true})
		cfg := config.Default()
		cfg.Protocol.ResponsesPassthrough = true
		r := startRouter(t, nil, cfg, a.url, b.url)
		for conv := 0; conv < 4; conv++ {
			stream := conv%2 == 1
			body := func(prev string) string {
				b := `{"model":"m","input":"hello","stream":` + fmt.Sprint(stream)
				if prev != "" {
					b += `,"previous_response_id":"` + prev + `"`
				}
				return b + "}"
			}
			idOf := func(body string) string {
				t.Helper()
				resp, got := postH(t, r.url+"/v1/responses", body, nil)
				if resp.StatusCode != 200 {
					t.Fatalf("split %v conversation %d: %d %s", split, conv, resp.StatusCode, got)
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
			id := idOf(body(""))
			for turn := 0; turn < 3; turn++ {
				next := idOf(body(id)) // decoded by encoding/json, as an SDK sends it
				if next == "" || next[:6] != id[:6] {
					t.Fatalf("split %v conversation %d turn %d: %q followed %q", split, conv, turn, next, id)
				}
				id = next
			}
		}
	}
}

// The head of an answer is gathered across reads, within bounds: an id
// 40 KiB into a whole answer (after a long instructions field, a first
// read of 32 KiB) is learned; one past respScanMax is not, nor one after
// respScanReads reads.
func TestAResponseIDIsLookedForInTheAnswersHead(t *testing.T) {
	w := &fleetWorkerStub
	f := func(name string, body string, read int, want bool) {
		t.Helper()
		var a respAffinity
		var sc respScan
		b := []byte(body)
		first := b[:min(read, len(b))]
		sc.start(&a, first, w, respCred{}, 0)
		for b = b[len(first):]; len(b) > 0; {
			k := min(read, len(b))
			sc.more(b[:k])
			b = b[k:]
		}
		ref, _ := a.lookupRef([]byte(`{"previous_response_id":"resp_x"}`))
		if got := ref == w.Ref(); got != want {
			t.Errorf("%s: learned %v, want %v", name, got, want)
		}
		if sc.a != nil {
			t.Errorf("%s: still scanning after the answer", name)
		}
		sc.reset()
	}
	long := strings.Repeat("x", 40<<10)
	f("id after 40 KiB", `{"instructions":"`+long+`","id":"resp_x"}`, 32<<10, true)
	f("id in the first read", `{"id":"resp_x","instructions":"`+long+`"}`, 32<<10, true)
	f("stream after a retry field", "retry: 10\n\nevent: response.created\ndata: {\"response\":{\"id\":\"resp_x\"}}\n\n", 14, true)
	f("id past the bound", `{"instructions":"`+strings.Repeat("x", respScanMax)+`","id":"resp_x"}`, 32<<10, false)
	f("id after too many reads", `{"instructions":"`+strings.Repeat("x", 200*respScanReads)+`","id":"resp_x"}`, 100, false)
}

func BenchmarkRespScanMore(b *testing.B) {
	var a respAffinity
	var sc respScan
	first := []byte("retry: 10\n\n")
	rest := []byte("event: response.created\ndata: {\"response\":{\"id\":\"resp_x\"}}\n\n")
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		sc.start(&a, first, &fleetWorkerStub, respCred{}, 0)
		sc.more(rest)
		sc.reset()
	}
}

// Through the router: each user's ids are their own share of the table.
// Bob's many answers (the table holds 8 ids here) left alice's
// conversations without their engine, and her follow-ups got 404.
func TestAUsersFollowUpsSurviveAnotherUsersManyResponses(t *testing.T) {
	a, b := storingResponsesEngine(t, "a"), storingResponsesEngine(t, "b")
	ka, ha := mintKey(t)
	kb, hb := mintKey(t)
	r, _ := govRouter(t, nil, fmt.Sprintf(`{"protocol": {"responses_passthrough": true},
		"users": [{"name": "alice", "keys": [%q]}, {"name": "bob", "keys": [%q]}]}`, ha, hb), a.url, b.url)
	r.srv.respAff.limit = 8
	post := func(key, body string) string {
		t.Helper()
		res := postPath(t, r.url, "/v1/responses", key, body)
		if res.status != 200 {
			t.Fatalf("%d %s", res.status, res.body)
		}
		var v struct{ ID string }
		json.Unmarshal([]byte(res.body), &v)
		return v.ID
	}
	ids := []string{post(ka, `{"model":"m","input":"x"}`), post(ka, `{"model":"m","input":"x"}`)}
	for i := 0; i < 30; i++ {
		post(kb, `{"model":"m","input":"x"}`)
	}
	for _, id := range ids {
		if ref, _ := r.srv.respAff.lookupRef([]byte(`{"previous_response_id":"` + id + `"}`)); ref.ID == "" {
			t.Fatalf("alice's %s pushed out by bob's answers", id)
		}
		next := post(ka, `{"model":"m","input":"x","previous_response_id":"`+id+`"}`)
		if next[:6] != id[:6] {
			t.Fatalf("%s followed %s", next, id)
		}
	}
}

// A follow-up whose engine (the only one holding its previous response)
// is at its concurrency limit waits for that engine's seat, as any queued
// request waits, and under overlimit reject is refused (429): it is not
// sent to another engine, which can only answer 404. It was: the gate
// passed over the full engine and the follow-up got the other's 404.
func TestAFollowUpWaitsForTheFullEngineHoldingItsPreviousResponse(t *testing.T) {
	for _, overlimit := range []string{"queue", "reject", "gone"} {
		t.Run(overlimit, func(t *testing.T) {
			mode := overlimit
			if mode == "gone" {
				mode = "queue"
			}
			ha, hb := &holdUpstream{release: make(chan struct{}, 10)}, &holdUpstream{release: make(chan struct{}, 10)}
			a, b := storingResponsesEngineHold(t, "a", false, ha), storingResponsesEngineHold(t, "b", false, hb)
			r, g := govRouter(t, nil, `{"protocol": {"responses_passthrough": true},
				"rate_limit": {"overall_concurrency": 1, "overlimit": "`+mode+`", "queue_timeout_ms": 5000}}`, a.url, b.url)
			post := func(body string) apiResp {
				// (not postPath: it stops the goroutine on an engine's error)
				resp, err := http.Post(r.url+"/v1/responses", "application/json", strings.NewReader(body))
				if err != nil {
					return apiResp{body: err.Error()}
				}
				defer resp.Body.Close()
				b, _ := io.ReadAll(resp.Body)
				return apiResp{status: resp.StatusCode, body: string(b)}
			}
			res := post(`{"model":"m","input":"x"}`)
			var v struct{ ID string }
			json.Unmarshal([]byte(res.body), &v)
			if res.status != 200 || v.ID == "" {
				t.Fatalf("%d %s", res.status, res.body)
			}
			holder := ha
			if v.ID[:6] == "resp_b" {
				holder = hb
			}
			defer func() { holder.release <- struct{}{} }() // (an extra one stays unread)
			// The engine holding the response takes a long request.
			long := make(chan apiResp, 1)
			go func() { long <- post(`{"model":"m","input":"hold","previous_response_id":"` + v.ID + `"}`) }()
			waitUntil(t, "the engine busy", func() bool { return holder.inflight.Load() == 1 })
			follow := make(chan apiResp, 1)
			go func() { follow <- post(`{"model":"m","input":"x","previous_response_id":"` + v.ID + `"}`) }()
			if overlimit == "reject" {
				got := <-follow
				if got.status != 429 {
					t.Fatalf("follow-up: %d %s, want 429", got.status, got.body)
				}
				holder.release <- struct{}{}
				<-long
				return
			}
			select {
			case got := <-follow:
				t.Fatalf("follow-up answered while its engine is full: %d %s", got.status, got.body)
			case <-time.After(300 * time.Millisecond):
			}
			if overlimit == "gone" {
				// The engine leaves the fleet while the follow-up waits:
				// it is routed as any request, and the engine that gets it
				// answers (vLLM: 404).
				other := fleet.Record{ID: "w1", URL: b.url, Models: []string{"m"}}
				if holder == hb {
					other = fleet.Record{ID: "w0", URL: a.url, Models: []string{"m"}}
				}
				if errs := r.fl.Sync([]fleet.Record{other}); len(errs) > 0 {
					t.Fatal(errs)
				}
				g.Retarget() // as the gateway's fleet hook does
				if got := <-follow; got.status != 404 || !strings.Contains(got.body, "not found") {
					t.Fatalf("follow-up after its engine left: %d %s", got.status, got.body)
				}
				return
			}
			holder.release <- struct{}{}
			if got := <-long; got.status != 200 {
				t.Fatalf("long: %d %s", got.status, got.body)
			}
			got := <-follow
			var w struct{ ID string }
			json.Unmarshal([]byte(got.body), &w)
			if got.status != 200 || w.ID[:6] != v.ID[:6] {
				t.Fatalf("follow-up: %d %s", got.status, got.body)
			}
		})
	}
}

// A follow-up that fails on the engine holding its previous response (503:
// overloaded; its connection refused) is not retried on another engine,
// which can only answer 404 "not found": the client gets the failure it
// may retry. It was retried, and the client got the other engine's 404.
func TestAFollowUpIsNotRetriedAwayFromTheEngineHoldingItsPreviousResponse(t *testing.T) {
	ha, hb := &holdUpstream{}, &holdUpstream{}
	a, b := storingResponsesEngineHold(t, "a", false, ha), storingResponsesEngineHold(t, "b", false, hb)
	cfg := config.Default()
	cfg.Protocol.ResponsesPassthrough = true
	f := defaultFlags()
	f.RequestMaxRetries = 2
	r := startRouter(t, f, cfg, a.url, b.url)
	resp, got := postH(t, r.url+"/v1/responses", `{"model":"m","input":"x"}`, nil)
	var v struct{ ID string }
	json.Unmarshal([]byte(got), &v)
	if resp.StatusCode != 200 || v.ID == "" {
		t.Fatalf("%d %s", resp.StatusCode, got)
	}
	resp, got = postH(t, r.url+"/v1/responses", `{"model":"m","input":"busy","previous_response_id":"`+v.ID+`"}`, nil)
	if resp.StatusCode != 503 || !strings.Contains(got, "overloaded") {
		t.Fatalf("follow-up on an overloaded engine: %d %s, want its 503", resp.StatusCode, got)
	}
	// Its engine down (connection refused): a 502, not another's 404.
	holder := a
	if v.ID[:6] == "resp_b" {
		holder = b
	}
	holder.srv.Shutdown()
	resp, got = postH(t, r.url+"/v1/responses", `{"model":"m","input":"x","previous_response_id":"`+v.ID+`"}`, nil)
	if resp.StatusCode != 502 && resp.StatusCode != 503 || !strings.Contains(got, `"error"`) {
		t.Fatalf("follow-up on a down engine: %d %s, want 502 or 503", resp.StatusCode, got)
	}
}

// A follow-up pinned to a local engine that holds its previous response
// is not forwarded to another region when that engine is full: the other
// region's engines cannot know the id (404). It gets the local answer:
// 429 under overlimit reject, a wait for the seat under queue. It was
// forwarded (before any local try, and again on the seat refusal), and
// the client got the member's 404.
func TestAFollowUpPinnedToALocalEngineIsNotForwardedToAnotherRegion(t *testing.T) {
	for _, overlimit := range []string{"reject", "queue"} {
		t.Run(overlimit, func(t *testing.T) {
			engM := storingResponsesEngine(t, "m")
			cfgM := config.Default()
			cfgM.Protocol.ResponsesPassthrough = true
			m := startRouterWith(t, nil, cfgM, nil, engM.url)
			ha := &holdUpstream{release: make(chan struct{}, 10)}
			a := storingResponsesEngineHold(t, "a", false, ha)
			cfgA := globalConfig(config.Member{Name: "m", URL: m.url})
			cfgA.Protocol.ResponsesPassthrough = true
			cfgA.RateLimit.OverallConcurrency, cfgA.RateLimit.Overlimit = 1, overlimit
			cfgA.RateLimit.QueueSize, cfgA.RateLimit.QueueTimeoutMS = 10, 5000
			g := newGovernor(t, cfgA)
			pa := startPoller(t, &cfgA.GlobalScheduling)
			r := startRouterWith(t, nil, cfgA, func(o *Options) { o.Poller = pa; o.Governor = g }, a.url)
			waitFor(t, func() bool { _, _, ok := pa.Members()[0].Report(); return ok }, "the member's report")
			post := func(body string) apiResp {
				resp, err := http.Post(r.url+"/v1/responses", "application/json", strings.NewReader(body))
				if err != nil {
					return apiResp{body: err.Error()}
				}
				defer resp.Body.Close()
				b, _ := io.ReadAll(resp.Body)
				return apiResp{status: resp.StatusCode, body: string(b)}
			}
			res := post(`{"model":"m","input":"x"}`)
			var v struct{ ID string }
			json.Unmarshal([]byte(res.body), &v)
			if res.status != 200 || !strings.HasPrefix(v.ID, "resp_a") {
				t.Fatalf("%d %s", res.status, res.body)
			}
			defer func() { ha.release <- struct{}{} }()
			long := make(chan apiResp, 1)
			go func() { long <- post(`{"model":"m","input":"hold","previous_response_id":"` + v.ID + `"}`) }()
			waitUntil(t, "the engine busy", func() bool { return ha.inflight.Load() == 1 })
			follow := make(chan apiResp, 1)
			go func() { follow <- post(`{"model":"m","input":"x","previous_response_id":"` + v.ID + `"}`) }()
			if overlimit == "reject" {
				if got := <-follow; got.status != 429 {
					t.Fatalf("follow-up: %d %s, want the local 429", got.status, got.body)
				}
			} else {
				select {
				case got := <-follow:
					t.Fatalf("follow-up answered while its engine is full: %d %s", got.status, got.body)
				case <-time.After(300 * time.Millisecond):
				}
			}
			ha.release <- struct{}{}
			if got := <-long; got.status != 200 {
				t.Fatalf("long: %d %s", got.status, got.body)
			}
			if overlimit == "queue" {
				got := <-follow
				var w struct{ ID string }
				json.Unmarshal([]byte(got.body), &w)
				if got.status != 200 || !strings.HasPrefix(w.ID, "resp_a") {
					t.Fatalf("follow-up: %d %s", got.status, got.body)
				}
			}
			if n := engM.hits.Load(); n != 0 {
				t.Fatalf("the member's engine got %d requests", n)
			}
		})
	}
}

// A follow-up whose engine (the only one holding its previous response)
// is half-open, its one trial request taken by another request, is
// answered 503 with Retry-After, naming that engine unavailable: it is not
// re-picked by load onto another engine, which can only answer 404. Once
// the trial succeeds the follow-ups go to the engine again. It was
// re-picked, and the client got the other engine's 404.
func TestAFollowUpWhoseEngineIsOnTrialIsAnsweredUnavailable(t *testing.T) {
	ha, hb := &holdUpstream{release: make(chan struct{}, 10)}, &holdUpstream{release: make(chan struct{}, 10)}
	a, b := storingResponsesEngineHold(t, "a", false, ha), storingResponsesEngineHold(t, "b", false, hb)
	cfg := config.Default()
	cfg.Protocol.ResponsesPassthrough = true
	f := defaultFlags()
	f.BreakerFailureThreshold, f.BreakerCooldownS = 1, 0.2
	r := startRouter(t, f, cfg, a.url, b.url)
	resp, got := postH(t, r.url+"/v1/responses", `{"model":"m","input":"x"}`, nil)
	var v struct{ ID string }
	json.Unmarshal([]byte(got), &v)
	if resp.StatusCode != 200 || v.ID == "" {
		t.Fatalf("%d %s", resp.StatusCode, got)
	}
	holder := ha
	if v.ID[:6] == "resp_b" {
		holder = hb
	}
	defer func() { holder.release <- struct{}{} }()
	// The engine fails (its breaker opens), then after the cooldown a
	// follow-up becomes its trial and is held.
	if resp, got := postH(t, r.url+"/v1/responses", `{"model":"m","input":"busy","previous_response_id":"`+v.ID+`"}`, nil); resp.StatusCode != 503 {
		t.Fatalf("busy: %d %s", resp.StatusCode, got)
	}
	time.Sleep(300 * time.Millisecond)
	long := make(chan int, 1)
	go func() {
		resp, err := http.Post(r.url+"/v1/responses", "application/json", strings.NewReader(`{"model":"m","input":"hold","previous_response_id":"`+v.ID+`"}`))
		if err != nil {
			long <- 0
			return
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		long <- resp.StatusCode
	}()
	waitUntil(t, "the trial held", func() bool { return holder.inflight.Load() == 1 })
	resp, got = postH(t, r.url+"/v1/responses", `{"model":"m","input":"x","previous_response_id":"`+v.ID+`"}`, nil)
	if resp.StatusCode != 503 || resp.Header.Get("Retry-After") == "" || !strings.Contains(got, `"error"`) || strings.Contains(got, "not found") {
		t.Fatalf("follow-up during its engine's trial: %d %q %s, want 503 with Retry-After", resp.StatusCode, resp.Header.Get("Retry-After"), got)
	}
	holder.release <- struct{}{}
	if st := <-long; st != 200 {
		t.Fatalf("the trial: %d", st)
	}
	resp, got = postH(t, r.url+"/v1/responses", `{"model":"m","input":"x","previous_response_id":"`+v.ID+`"}`, nil)
	var w struct{ ID string }
	json.Unmarshal([]byte(got), &w)
	if resp.StatusCode != 200 || w.ID[:6] != v.ID[:6] {
		t.Fatalf("follow-up after the trial: %d %s", resp.StatusCode, got)
	}
}

// A previous_response_id with JSON escapes names the id it decodes to, as
// the engine reads it: "resp_\u0041bc" is the follow-up of "resp_Abc" and
// goes to the engine holding it (without allocating:
// TestLookingUpAnEscapedPreviousResponseIDDoesNotAllocate). It was looked up as
// raw bytes, counted unknown and routed by load (the engine then answered
// 404 or, holding the response, the wrong engine was never asked).
func TestAnEscapedPreviousResponseIDNamesItsDecodedID(t *testing.T) {
	var a respAffinity
	w := &fleet.Worker{ID: "a", URL: "http://10.0.0.1:8000", Addr: "10.0.0.1:8000"}
	long := "resp_" + strings.Repeat("x", 123) // 128 bytes, the longest kept
	for _, id := range []string{"resp_Abc", "resp_a/b", long} {
		a.learn([]byte(`{"id":"`+id+`"}`), w, respCred{user: "u"}, 0)
	}
	f := func(prev string, want fleet.Ref) {
		t.Helper()
		body := []byte(`{"model":"m","previous_response_id":"` + prev + `"}`)
		if got, _ := a.lookupRef(body); got != want {
			t.Fatalf("%s: %v, want %v", prev, got, want)
		}
	}
	f(`resp_Abc`, w.Ref())
	f(`resp_\u0041bc`, w.Ref())
	f(`\u0072\u0065\u0073\u0070\u005f\u0041\u0062\u0063`, w.Ref())
	f(`resp_a\/b`, w.Ref())
	f(`resp_\u0078`+strings.Repeat("x", 122), w.Ref())
	f(strings.Repeat(`\u0078`, 130), fleet.Ref{}) // decodes past 128 bytes
	f(`resp_\u0041bd`, fleet.Ref{})
	f(`resp_\u0061bc`, fleet.Ref{})
}

// FuzzPreviousResponseIDLookup: whatever escapes a previous_response_id
// holds, lookup finds the engine of the id it decodes to, as
// encoding/json (and the engine) reads it, and never panics.
func FuzzPreviousResponseIDLookup(f *testing.F) {
	for _, s := range []string{`resp_Abc`, `resp_\u0041bc`, `\ud83d\ude00`, `a\"b`, `\u00e9`, `x\\y`} {
		f.Add(s)
	}
	w := &fleet.Worker{ID: "a", URL: "http://10.0.0.1:8000", Addr: "10.0.0.1:8000"}
	f.Fuzz(func(t *testing.T, raw string) {
		body := []byte(`{"previous_response_id":"` + raw + `"}`)
		var v struct {
			ID string `json:"previous_response_id"`
		}
		if json.Unmarshal(body, &v) != nil {
			return
		}
		var a respAffinity
		a.learn([]byte(`{"id":"x"}`), w, respCred{}, 0) // the table is not empty
		a.learn([]byte(`{"id":`+string(mustJSON(v.ID))+`}`), w, respCred{}, 0)
		got, _ := a.lookupRef(body)
		want := fleet.Ref{}
		var buf [respIDDecodeMax]byte
		if id, _ := responseID(&buf, []byte(`{"id":`+string(mustJSON(v.ID))+`}`)); id != nil {
			want = w.Ref() // a plain id, kept
		}
		if got != want {
			t.Fatalf("%q (decoded %q): %v, want %v", raw, v.ID, got, want)
		}
	})
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}

// A follow-up whose engine (the only one holding its previous response)
// has its breaker open, the cooldown not over, is answered 503 with
// Retry-After the cooldown left (whole seconds, rounded up), naming the
// engine: it is not routed by load onto another engine, which can only
// answer 404. After the cooldown the follow-up is the engine's trial and
// is answered there. It was routed by load and got the other engine's 404.
func TestAFollowUpWhoseEngineIsBehindAnOpenBreakerIsAnsweredUnavailable(t *testing.T) {
	h := &holdUpstream{release: make(chan struct{}, 10)}
	a, b := storingResponsesEngineHold(t, "a", false, h), storingResponsesEngineHold(t, "b", false, h)
	cfg := config.Default()
	cfg.Protocol.ResponsesPassthrough = true
	f := defaultFlags()
	f.BreakerFailureThreshold, f.BreakerCooldownS = 1, 1.5
	r := startRouter(t, f, cfg, a.url, b.url)
	resp, got := postH(t, r.url+"/v1/responses", `{"model":"m","input":"x"}`, nil)
	var v struct{ ID string }
	json.Unmarshal([]byte(got), &v)
	if resp.StatusCode != 200 || v.ID == "" {
		t.Fatalf("%d %s", resp.StatusCode, got)
	}
	// The engine fails: its breaker opens for 1.5 s.
	if resp, got := postH(t, r.url+"/v1/responses", `{"model":"m","input":"busy","previous_response_id":"`+v.ID+`"}`, nil); resp.StatusCode != 503 {
		t.Fatalf("busy: %d %s", resp.StatusCode, got)
	}
	for i := 0; i < 3; i++ {
		resp, got = postH(t, r.url+"/v1/responses", `{"model":"m","input":"x","previous_response_id":"`+v.ID+`"}`, nil)
		if resp.StatusCode != 503 || resp.Header.Get("Retry-After") != "2" || !strings.Contains(got, `"worker_breaker_open"`) || strings.Contains(got, "not found") {
			t.Fatalf("follow-up %d while its engine's breaker is open: %d %q %s, want 503 with Retry-After: 2", i, resp.StatusCode, resp.Header.Get("Retry-After"), got)
		}
	}
	// A request naming no response goes to the other engine meanwhile.
	if resp, got := postH(t, r.url+"/v1/responses", `{"model":"m","input":"x"}`, nil); resp.StatusCode != 200 || strings.Contains(got, v.ID[:6]+"_") {
		t.Fatalf("a new conversation: %d %s", resp.StatusCode, got)
	}
	time.Sleep(1600 * time.Millisecond)
	resp, got = postH(t, r.url+"/v1/responses", `{"model":"m","input":"x","previous_response_id":"`+v.ID+`"}`, nil)
	var w struct{ ID string }
	json.Unmarshal([]byte(got), &w)
	if resp.StatusCode != 200 || w.ID[:6] != v.ID[:6] {
		t.Fatalf("follow-up after the cooldown: %d %s", resp.StatusCode, got)
	}
}

// With global scheduling on, a follow-up whose local engine's breaker is
// open (every local worker open: the local fleet counts as saturated) is
// not forwarded to another region either, whose engines cannot know the
// id: it is answered 503 worker_breaker_open. It was forwarded and got the
// member's 404.
func TestAFollowUpBehindAnOpenBreakerIsNotForwardedToAnotherRegion(t *testing.T) {
	engM := storingResponsesEngine(t, "m")
	cfgM := config.Default()
	cfgM.Protocol.ResponsesPassthrough = true
	m := startRouterWith(t, nil, cfgM, nil, engM.url)
	a := storingResponsesEngineHold(t, "a", false, &holdUpstream{release: make(chan struct{}, 10)})
	cfgA := globalConfig(config.Member{Name: "m", URL: m.url})
	cfgA.Protocol.ResponsesPassthrough = true
	pa := startPoller(t, &cfgA.GlobalScheduling)
	f := defaultFlags()
	f.BreakerFailureThreshold, f.BreakerCooldownS, f.RequestMaxRetries = 1, 30, 0
	r := startRouterWith(t, f, cfgA, func(o *Options) { o.Poller = pa }, a.url)
	waitFor(t, func() bool { _, _, ok := pa.Members()[0].Report(); return ok }, "the member's report")
	resp, got := postH(t, r.url+"/v1/responses", `{"model":"m","input":"x"}`, nil)
	var v struct{ ID string }
	json.Unmarshal([]byte(got), &v)
	if resp.StatusCode != 200 || !strings.HasPrefix(v.ID, "resp_a") {
		t.Fatalf("%d %s", resp.StatusCode, got)
	}
	if resp, got := postH(t, r.url+"/v1/responses", `{"model":"m","input":"busy","previous_response_id":"`+v.ID+`"}`, nil); resp.StatusCode != 503 {
		t.Fatalf("busy: %d %s", resp.StatusCode, got)
	}
	resp, got = postH(t, r.url+"/v1/responses", `{"model":"m","input":"x","previous_response_id":"`+v.ID+`"}`, nil)
	if ra := resp.Header.Get("Retry-After"); resp.StatusCode != 503 || !strings.Contains(got, `"worker_breaker_open"`) || (ra != "30" && ra != "29") {
		t.Fatalf("follow-up behind an open breaker: %d %q %s, want 503 worker_breaker_open, Retry-After: 30", resp.StatusCode, ra, got)
	}
	if n := engM.hits.Load(); n != 0 {
		t.Fatalf("the member's engine got %d requests", n)
	}
}

// A follow-up whose engine is draining (its record says DRAINING: it
// finishes its in-flight work, takes no new request, and leaves) is
// answered 410 previous_response_draining, naming the worker: drain admits
// no new request, and no other engine holds the response. Once the worker
// is ACTIVE again its follow-ups reach it; once it is gone they are routed
// as any request. The draining worker was passed over by load and the
// follow-up reached the other engine, which answered 404 "not found" for a
// response that existed.
func TestAFollowUpWhoseEngineIsDrainingIsAnsweredGone(t *testing.T) {
	a, b := storingResponsesEngine(t, "a"), storingResponsesEngine(t, "b")
	cfg := config.Default()
	cfg.Protocol.ResponsesPassthrough = true
	r := startRouter(t, nil, cfg, a.url, b.url)
	urls := map[string]string{"w0": a.url, "w1": b.url}
	idOf := func(body string) string {
		t.Helper()
		resp, got := postH(t, r.url+"/v1/responses", body, nil)
		if resp.StatusCode != 200 {
			t.Fatalf("%s: %d %s", body, resp.StatusCode, got)
		}
		var v struct{ ID string }
		json.Unmarshal([]byte(got), &v)
		return v.ID
	}
	first := idOf(`{"model":"m","input":"hi"}`)
	w, other := "w0", "w1"
	if strings.HasPrefix(first, "resp_b_") {
		w, other = "w1", "w0"
	}
	set := func(id, status string) {
		t.Helper()
		if err := r.fl.Upsert(fleet.Record{ID: id, URL: urls[id], Models: []string{"m"}, Status: status}); err != nil {
			t.Fatal(err)
		}
	}
	set(w, fleet.StatusDraining)
	follow := `{"model":"m","input":"more","previous_response_id":"` + first + `"}`
	for _, stream := range []bool{false, true} {
		body := follow
		if stream {
			body = strings.Replace(follow, `{`, `{"stream":true,`, 1)
		}
		resp, got := postH(t, r.url+"/v1/responses", body, nil)
		var e struct {
			Error struct{ Message, Type, Param, Code string }
		}
		json.Unmarshal([]byte(got), &e)
		if resp.StatusCode != 410 || e.Error.Code != "previous_response_draining" || e.Error.Param != "previous_response_id" ||
			!strings.Contains(e.Error.Message, "worker "+w+")") || strings.Contains(got, first) {
			t.Fatalf("stream %v: %d %s, want 410 previous_response_draining naming worker %s", stream, resp.StatusCode, got, w)
		}
	}
	// Other requests go to the worker still ACTIVE.
	if id := idOf(`{"model":"m","input":"new"}`); !strings.HasPrefix(id, "resp_"+map[string]string{"w0": "a", "w1": "b"}[other]+"_") {
		t.Fatalf("a new conversation went to %q", id)
	}
	set(w, fleet.StatusActive)
	if next := idOf(follow); next[:7] != first[:7] {
		t.Fatalf("ACTIVE again: %q followed %q", next, first)
	}
	// Gone: routed as any request (the other engine answers 404).
	r.fl.Remove(w)
	if resp, got := postH(t, r.url+"/v1/responses", follow, nil); resp.StatusCode != 404 {
		t.Fatalf("worker gone: %d %s, want the other engine's 404", resp.StatusCode, got)
	}
}

// An answer whose id has come but is not one the table keeps (decoded
// longer than respIDMax, not visible ASCII, not a string: a client-chosen
// request_id) ends the scan at once. The scan went on gathering the head
// for respScanReads reads or respScanMax bytes, parsing the growing head on
// every read of the stream, and the head, grown past 16 KiB, was dropped
// from the pool (an allocation per such request).
func TestAnIDNotKeptEndsTheScan(t *testing.T) {
	var a respAffinity
	w := &fleet.Worker{ID: "a", URL: "http://10.0.0.1:8000", Addr: "10.0.0.1:8000"}
	var sc respScan
	for _, first := range []string{
		`{"id":"resp_` + strings.Repeat("x", 200) + `","object":"response"`,
		`{"id":7,"object":"response"`,
		"event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"resp_\\u00e9\",",
		"event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":null,",
	} {
		sc.reset()
		sc.start(&a, []byte(first), w, respCred{}, 0)
		if sc.a != nil {
			t.Errorf("%.50q: still scanning", first)
		}
	}
	if a.n.Load() != 0 {
		t.Fatalf("%d ids kept", a.n.Load())
	}
	// An id that has not come yet is waited for.
	for _, first := range []string{"retry: 3000\n\n", `{"object":"response","instructions":"long`, `{"id":"resp_ab`} {
		sc.reset()
		sc.start(&a, []byte(first), w, respCred{}, 0)
		if sc.a == nil {
			t.Errorf("%q: not scanning", first)
		}
	}
}

// lookupRef is lookup's engine and store flag, for the table's tests.
func (a *respAffinity) lookupRef(body []byte) (fleet.Ref, bool) {
	var buf [respIDDecodeMax]byte
	e, _, noStore := a.lookup(&buf, body)
	return e.ref, noStore
}

// A Responses follow-up (passthrough) kept on the engine holding its
// previous response is not moved to another tier's model by smart model
// selection: another engine cannot know the id. It goes as the tier whose
// model that engine serves (the highest, when it serves several), without
// asking the classifier. It was classified like any request, and a
// follow-up the classifier rated harder than its first turn was sent to
// the larger model's engine, which answered 404 for the id.
func TestASmartSelectedFollowUpStaysOnTheEngineHoldingItsResponse(t *testing.T) {
	var asked atomic.Int64
	cls := startUpstream(t, func(ctx *fasthttp.RequestCtx) {
		asked.Add(1)
		if strings.Contains(string(ctx.PostBody()), "easy") {
			ctx.SetBodyString(`{"tier":"L1"}`)
			return
		}
		ctx.SetBodyString(`{"tier":"L3"}`)
	})
	small, big := storingResponsesEngine(t, "small"), storingResponsesEngine(t, "big")
	cfg := config.Default()
	cfg.Debug.DecisionHeader = true
	cfg.Protocol.ResponsesPassthrough = true
	cfg.SmartModelSelection = config.SmartModelSelection{Enabled: true, ClassifierURL: cls.url + "/v1/classify",
		TimeoutMS: 10000, FallbackTier: "L2", MatchModels: []string{"auto"},
		Tiers: config.TierModels{L1: "small-model", L2: "small-model", L3: "big-model"}, MaxTextBytes: 8192}
	r := startRouterWith(t, nil, cfg, nil, deadURL(t))
	r.fl.Remove("w0")
	for id, u := range map[string]string{"small-model": small.url, "big-model": big.url} {
		if err := r.fl.Upsert(fleet.Record{ID: id, URL: u, Models: []string{id}}); err != nil {
			t.Fatal(err)
		}
	}
	post := func(body string) (*http.Response, string) {
		resp, err := http.Post(r.url+"/v1/responses", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}
	resp, body := post(`{"model":"auto","input":"easy"}`)
	var v struct{ ID string }
	json.Unmarshal([]byte(body), &v)
	if resp.StatusCode != 200 || !strings.HasPrefix(v.ID, "resp_small") || resp.Header.Get("X-Infera-Tier") != "L1" {
		t.Fatalf("first turn: %d %s %v", resp.StatusCode, body, resp.Header)
	}
	before := asked.Load()
	resp, body = post(`{"model":"auto","input":"now prove it","previous_response_id":"` + v.ID + `"}`)
	var w struct{ ID string }
	json.Unmarshal([]byte(body), &w)
	if resp.StatusCode != 200 || !strings.HasPrefix(w.ID, "resp_small") || resp.Header.Get("X-Infera-Tier") != "L2" {
		t.Fatalf("follow-up: %d %s %v (big's engine got %d requests)", resp.StatusCode, body, resp.Header, big.hits.Load())
	}
	if n := asked.Load() - before; n != 0 {
		t.Fatalf("the classifier was asked %d times for a follow-up whose engine decides its tier", n)
	}
	// A request without previous_response_id is classified as before.
	resp, body = post(`{"model":"auto","input":"now prove it"}`)
	if resp.StatusCode != 200 || resp.Header.Get("X-Infera-Tier") != "L3" || big.hits.Load() != 1 {
		t.Fatalf("new conversation: %d %s %v", resp.StatusCode, body, resp.Header)
	}
}
