package engine

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"testing"
)

// The simulated engine with native protocols keeps the ids of the
// Responses it answered (bounded, "store": false ones excepted) and
// answers a follow-up naming one; an id it does not hold is answered as
// vLLM answers it: 404 "Response with id '...' not found.". It refused
// every previous_response_id with the router's conversion wording (400
// "this gateway does not store responses"), so follow-ups through a
// passthrough router could not be tested against it.
func TestTheEngineAnswersFollowUpsOfTheResponsesItStored(t *testing.T) {
	e := startEngine(t, func(c *Config) { c.NativeProtocols = true })
	e.srv.resp.max = 3
	create := func(body string) string {
		t.Helper()
		code, b, _ := e.post(t, "/v1/responses", body)
		var v struct {
			ID   string `json:"id"`
			Prev any    `json:"previous_response_id"`
		}
		if code != 200 || json.Unmarshal(b, &v) != nil || !strings.HasPrefix(v.ID, "resp_") {
			t.Fatalf("%s: %d %s", body, code, b)
		}
		return v.ID
	}
	notFound := func(id string) {
		t.Helper()
		code, b, _ := e.post(t, "/v1/responses", `{"model":"sim-model","input":"again","max_output_tokens":2,"previous_response_id":"`+id+`"}`)
		want := `{"error":{"message":"Response with id '` + id + `' not found.","type":"invalid_request_error","param":"response_id","code":404}}`
		if code != 404 || string(b) != want {
			t.Fatalf("follow-up of %s: %d %s, want 404 %s", id, code, b, want)
		}
	}
	first := create(`{"model":"sim-model","input":"hi","max_output_tokens":2}`)
	second := create(`{"model":"sim-model","input":"more","max_output_tokens":2,"previous_response_id":"` + first + `"}`)
	if second == first {
		t.Fatal("the follow-up got its previous response's id")
	}
	create(`{"model":"sim-model","input":"more","max_output_tokens":2,"previous_response_id":"` + second + `"}`)
	notFound("resp_unknown")
	notFound(`resp_\"x`) // echoed as JSON
	// "store": false: not kept.
	unstored := create(`{"model":"sim-model","input":"hi","max_output_tokens":2,"store":false}`)
	notFound(unstored)
	// A stream's id is kept too.
	resp, err := testClient.Post(e.base+"/v1/responses", "application/json", strings.NewReader(`{"model":"sim-model","input":"hi","max_output_tokens":2,"stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	sb, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	i := strings.Index(string(sb), `"id":"resp_`)
	if i < 0 {
		t.Fatalf("stream: %s", sb)
	}
	streamed := string(sb[i+6 : i+6+strings.IndexByte(string(sb[i+6:]), '"')])
	create(`{"model":"sim-model","input":"more","max_output_tokens":2,"previous_response_id":"` + streamed + `"}`)
	// Bounded: the oldest ids are forgotten (3 kept).
	notFound(first)
	// A null previous_response_id names none; an empty one names the id
	// "", which vLLM looks up ("if prev_response_id is not None",
	// serving_responses.py) and does not hold: 404. It was taken for none.
	create(`{"model":"sim-model","input":"hi","max_output_tokens":2,"previous_response_id":null}`)
	notFound("")
}

// The engine's Response echoes the request's previous_response_id
// (decoded) and store (true unless the request says false), whole and in
// a stream's events, as vLLM's does (ResponsesResponse.from_request). It
// echoed "previous_response_id":null,"store":false for a stored follow-up.
func TestTheEnginesResponseEchoesPreviousResponseIDAndStore(t *testing.T) {
	e := startEngine(t, func(c *Config) { c.NativeProtocols = true })
	type echo struct {
		ID    string  `json:"id"`
		Prev  *string `json:"previous_response_id"`
		Store *bool   `json:"store"`
	}
	check := func(body string, wantPrev string, wantStore bool) string {
		t.Helper()
		id := ""
		for _, stream := range []bool{false, true} {
			b := body
			if stream {
				b = strings.Replace(body, `{`, `{"stream":true,`, 1)
			}
			code, got, _ := e.post(t, "/v1/responses", b)
			if code != 200 {
				t.Fatalf("%s: %d %s", b, code, got)
			}
			objs := []string{string(got)}
			if stream {
				objs = objs[:0]
				for _, line := range strings.Split(string(got), "\n") {
					if d, ok := strings.CutPrefix(line, "data: "); ok && strings.Contains(d, `"response":{`) {
						var ev struct{ Response json.RawMessage }
						json.Unmarshal([]byte(d), &ev)
						objs = append(objs, string(ev.Response))
					}
				}
				if len(objs) < 2 {
					t.Fatalf("stream %s: %s", b, got)
				}
			}
			for _, o := range objs {
				var v echo
				if err := json.Unmarshal([]byte(o), &v); err != nil || v.Store == nil {
					t.Fatalf("%s: %v %s", b, err, o)
				}
				prev := ""
				if v.Prev != nil {
					prev = *v.Prev
				}
				if prev != wantPrev || *v.Store != wantStore {
					t.Fatalf("%s (stream %v): previous_response_id %q store %v, want %q %v: %s", b, stream, prev, *v.Store, wantPrev, wantStore, o)
				}
				if !stream {
					id = v.ID
				}
			}
		}
		return id
	}
	first := check(`{"model":"sim-model","input":"hi","max_output_tokens":2}`, "", true)
	check(`{"model":"sim-model","input":"hi","max_output_tokens":2,"previous_response_id":"`+first+`"}`, first, true)
	check(`{"model":"sim-model","input":"hi","max_output_tokens":2,"previous_response_id":"`+first[:5]+`\u00`+fmt.Sprintf("%02x", first[5])+first[6:]+`","store":true}`, first, true)
	check(`{"model":"sim-model","input":"hi","max_output_tokens":2,"previous_response_id":"`+first+`","store":false}`, first, false)
	check(`{"model":"sim-model","input":"hi","max_output_tokens":2,"store":false}`, "", false)
}

// The request's store is read as vLLM's pydantic model reads a bool (lax
// mode, jsonscan.LaxBool): 0, "false", "off", "No", "\u006e" are false and
// the Response is not kept (a follow-up naming it gets 404); 1, "yes",
// "ON" are true. Only the literal false was: "store":0 and "store":"false"
// were stored, where vLLM keeps nothing.
func TestTheEngineReadsStoreAsALaxBool(t *testing.T) {
	e := startEngine(t, func(c *Config) { c.NativeProtocols = true })
	followUp := func(store, id string) int {
		t.Helper()
		code, b, _ := e.post(t, "/v1/responses", `{"model":"sim-model","input":"again","max_output_tokens":2,"previous_response_id":"`+id+`"}`)
		if code != 200 && code != 404 {
			t.Fatalf("store %s: follow-up: %d %s", store, code, b)
		}
		return code
	}
	for _, c := range []struct {
		store string
		kept  bool
	}{
		{`0`, false}, {`0.0`, false}, {`"false"`, false}, {`"off"`, false}, {`"No"`, false}, {`"\u006e"`, false}, {`"F"`, false},
		{`null`, false}, // None: vLLM stores only "if request.store"
		{`1`, true}, {`"yes"`, true}, {`"ON"`, true}, {`"t"`, true}, {`true`, true},
	} {
		for _, stream := range []bool{false, true} {
			code, b, _ := e.post(t, "/v1/responses", `{"model":"sim-model","input":"hi","max_output_tokens":2,"stream":`+fmt.Sprint(stream)+`,"store":`+c.store+`}`)
			i := strings.Index(string(b), `"id":"resp_`)
			if code != 200 || i < 0 {
				t.Fatalf("store %s: %d %s", c.store, code, b)
			}
			id := string(b[i+6 : i+6+strings.IndexByte(string(b[i+6:]), '"')])
			if !strings.Contains(string(b), `"store":`+fmt.Sprint(c.kept)) {
				t.Fatalf("store %s: the Response does not say store %v: %s", c.store, c.kept, b)
			}
			if got := followUp(c.store, id) == 200; got != c.kept {
				t.Fatalf("store %s (stream %v): kept %v, want %v", c.store, stream, got, c.kept)
			}
		}
	}
}

// The engine's /v1/responses (and /v1/messages) read stream as vLLM's
// pydantic request models read a bool (lax mode): 1, "true", "Yes", "on",
// "\u0074" stream; 0, "false", "off", null do not; what pydantic refuses
// (2, "maybe", [], {}) is a 400 naming stream, as is a store it cannot
// read. The engine took only the JSON booleans: "stream":1 and
// "stream":"true" were refused with "stream must be a boolean", which
// vLLM accepts.
func TestTheEnginesResponsesReadStreamAsVLLMDoes(t *testing.T) {
	e := startEngine(t, func(c *Config) { c.NativeProtocols = true })
	bodies := map[string]string{
		"/v1/responses": `{"model":"sim-model","input":"hi","max_output_tokens":2,"stream":%s}`,
		"/v1/messages":  `{"model":"sim-model","max_tokens":2,"messages":[{"role":"user","content":"hi"}],"stream":%s}`,
	}
	for path, tmpl := range bodies {
		for _, c := range []struct {
			v    string
			want int // 1 a stream, 0 a whole answer, 400 refused
		}{
			{`1`, 1}, {`"true"`, 1}, {`"Yes"`, 1}, {`"on"`, 1}, {`"\u0074"`, 1}, {`1.0`, 1}, {`true`, 1},
			{`0`, 0}, {`"false"`, 0}, {`"off"`, 0}, {`null`, 0}, {`false`, 0},
			{`2`, 400}, {`"maybe"`, 400}, {`[]`, 400}, {`{}`, 400}, {`""`, 400},
		} {
			body := fmt.Sprintf(tmpl, c.v)
			code, b, h := e.post(t, path, body)
			switch c.want {
			case 400:
				var v struct {
					Error struct{ Message, Type, Param string }
				}
				if path == "/v1/messages" {
					if code != 400 || !strings.Contains(string(b), "stream") {
						t.Errorf("%s %s: %d %s, want 400 naming stream", path, body, code, b)
					}
					continue
				}
				if code != 400 || json.Unmarshal(b, &v) != nil || v.Error.Param != "stream" || v.Error.Type != "invalid_request_error" || !strings.Contains(v.Error.Message, "valid boolean") {
					t.Errorf("%s %s: %d %s, want 400 on stream", path, body, code, b)
				}
			default:
				stream := strings.HasPrefix(h.Get("Content-Type"), "text/event-stream")
				if code != 200 || stream != (c.want == 1) {
					t.Errorf("%s %s: %d %s %.80s, want 200 streamed %v", path, body, code, h.Get("Content-Type"), b, c.want == 1)
				}
			}
		}
	}
	code, b, _ := e.post(t, "/v1/responses", `{"model":"sim-model","input":"hi","max_output_tokens":2,"store":"maybe","previous_response_id":"resp_unknown"}`)
	if code != 400 || !strings.Contains(string(b), `"param":"store"`) {
		t.Errorf("store \"maybe\": %d %s, want 400 on store", code, b)
	}
}

// A key written with JSON escapes is the key it decodes to, as vLLM's JSON
// decoder reads it: "st\u006fre":false is not stored, and
// "previous_\u0072esponse_id" names a previous response (404 when the
// engine does not hold it, answered when it does). A quick byte search
// for the plain keys passed such bodies over: the first was stored, the
// second refused with the router's 400 "this gateway does not store
// responses".
func TestTheEngineReadsEscapedResponsesKeys(t *testing.T) {
	e := startEngine(t, func(c *Config) { c.NativeProtocols = true })
	post := func(body string) (int, string) {
		t.Helper()
		code, b, _ := e.post(t, "/v1/responses", body)
		return code, string(b)
	}
	code, b := post(`{"model":"sim-model","input":"hi","max_output_tokens":2,"st\u006fre":false}`)
	var v struct{ ID string }
	if code != 200 || json.Unmarshal([]byte(b), &v) != nil || !strings.Contains(b, `"store":false`) {
		t.Fatalf("escaped store: %d %s", code, b)
	}
	if code, b := post(`{"model":"sim-model","input":"again","max_output_tokens":2,"previous_response_id":"` + v.ID + `"}`); code != 404 {
		t.Fatalf("follow-up of an unstored response: %d %s, want 404", code, b)
	}
	if code, b := post(`{"model":"sim-model","input":"again","max_output_tokens":2,"previous_\u0072esponse_id":"resp_unknown"}`); code != 404 || !strings.Contains(b, "resp_unknown") {
		t.Fatalf("escaped previous_response_id, unknown: %d %s, want 404", code, b)
	}
	code, b = post(`{"model":"sim-model","input":"hi","max_output_tokens":2}`)
	if code != 200 || json.Unmarshal([]byte(b), &v) != nil {
		t.Fatalf("%d %s", code, b)
	}
	if code, b := post(`{"model":"sim-model","input":"again","max_output_tokens":2,"previous_\u0072esponse_id":"` + v.ID + `"}`); code != 200 || !strings.Contains(b, `"previous_response_id":"`+v.ID+`"`) {
		t.Fatalf("escaped previous_response_id, held: %d %s, want 200 echoing it", code, b)
	}
}

// The engine serves GET /v1/responses/{id} with a Response it stored (a
// whole one as it was sent, a streamed one as its last event's)
// and refuses POST /v1/responses/{id}/cancel as vLLM refuses a response
// that is not background (400 "Cannot cancel a synchronous response.");
// an id it does not hold is vLLM's 404 on both. It answered both paths 404
// unknown path.
func TestTheEngineServesRetrieveAndCancelOfItsStoredResponses(t *testing.T) {
	e := startEngine(t, func(c *Config) { c.NativeProtocols = true })
	get := func(path string) (int, string) {
		t.Helper()
		resp, err := testClient.Get(e.base + path)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp.StatusCode, string(b)
	}
	code, whole, _ := e.post(t, "/v1/responses", `{"model":"sim-model","input":"hi","max_output_tokens":2}`)
	var v struct{ ID string }
	if code != 200 || json.Unmarshal(whole, &v) != nil {
		t.Fatalf("%d %s", code, whole)
	}
	if code, got := get("/v1/responses/" + v.ID); code != 200 || got != string(whole) {
		t.Fatalf("retrieve: %d %s, want %s", code, got, whole)
	}
	code, got, _ := e.post(t, "/v1/responses/"+v.ID+"/cancel", "")
	if code != 400 || !strings.Contains(string(got), `"message":"Cannot cancel a synchronous response."`) {
		t.Fatalf("cancel: %d %s", code, got)
	}
	resp, err := testClient.Post(e.base+"/v1/responses", "application/json", strings.NewReader(`{"model":"sim-model","input":"hi","max_output_tokens":2,"stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	sb, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	i := strings.Index(string(sb), `"id":"resp_`)
	if i < 0 {
		t.Fatalf("stream: %s", sb)
	}
	streamed := string(sb[i+6 : i+6+strings.IndexByte(string(sb[i+6:]), '"')])
	// A stream's Response is its last event's (response.incomplete).
	var last struct {
		Response json.RawMessage `json:"response"`
	}
	ev := string(sb[strings.LastIndex(string(sb), "data: ")+len("data: "):])
	if err := json.Unmarshal([]byte(strings.TrimSpace(ev)), &last); err != nil {
		t.Fatalf("last event %q: %v", ev, err)
	}
	if code, got := get("/v1/responses/" + streamed); code != 200 || got != string(last.Response) || !strings.Contains(got, `"status":"incomplete"`) {
		t.Fatalf("retrieve streamed: %d %q, want %q", code, got, last.Response)
	}
	want := `{"error":{"message":"Response with id 'resp_nope' not found.","type":"invalid_request_error","param":"response_id","code":404}}`
	if code, got := get("/v1/responses/resp_nope"); code != 404 || got != want {
		t.Fatalf("retrieve unknown: %d %s", code, got)
	}
	if code, got, _ := e.post(t, "/v1/responses/resp_nope/cancel", ""); code != 404 || string(got) != want {
		t.Fatalf("cancel unknown: %d %s", code, got)
	}
	if code, got := get("/v1/responses/" + v.ID + "/cancel"); code != 405 {
		t.Fatalf("GET cancel: %d %s", code, got)
	}
}
