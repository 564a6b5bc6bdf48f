package engine

import (
	"encoding/json"
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
	// An empty or null previous_response_id names none.
	create(`{"model":"sim-model","input":"hi","max_output_tokens":2,"previous_response_id":null}`)
	create(`{"model":"sim-model","input":"hi","max_output_tokens":2,"previous_response_id":""}`)
}
