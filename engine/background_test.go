package engine

import (
	"encoding/json"
	"io"
	"strings"
	"testing"
	"time"
)

// A background Response (native protocols) runs as vLLM runs one with its
// Responses store on: the create is answered at once, "queued" with no
// output and usage null; a retrieve answers it queued while it is
// generated (vLLM stores no "in_progress" for it); a cancel stops the
// generation (the sequence is aborted) and answers and stores it
// "cancelled"; a second cancel, or a cancel of one that ended, is vLLM's
// 400 "Cannot cancel a synchronous response."; one left alone ends stored
// with its output and usage. The engine refused "background": true with
// the router's conversion error (400 "this gateway does not store
// responses").
func TestTheEngineRunsBackgroundResponsesAsVLLMDoes(t *testing.T) {
	e := startEngine(t, func(c *Config) {
		c.NativeProtocols = true
		c.Core.Time.Speedup = 1 // 12 ms a token: the long one runs for a minute
	})
	get := func(id string) (int, map[string]any) {
		t.Helper()
		resp, err := testClient.Get(e.base + "/v1/responses/" + id)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var v map[string]any
		if err := json.Unmarshal(b, &v); err != nil {
			t.Fatalf("retrieve %s: %d %s", id, resp.StatusCode, b)
		}
		return resp.StatusCode, v
	}
	decode := func(what string, code int, b []byte, wantCode int) map[string]any {
		t.Helper()
		var v map[string]any
		if code != wantCode || json.Unmarshal(b, &v) != nil {
			t.Fatalf("%s: %d %s, want %d", what, code, b, wantCode)
		}
		return v
	}
	start := time.Now()
	code, b, _ := e.post(t, "/v1/responses", `{"model":"sim-model","input":"hello","max_output_tokens":5000,"background":true}`)
	created := decode("create", code, b, 200)
	if time.Since(start) > 5*time.Second {
		t.Fatalf("the create took %v: it waited for the generation", time.Since(start))
	}
	id, _ := created["id"].(string)
	if !strings.HasPrefix(id, "resp_") || created["status"] != "queued" || created["background"] != true ||
		created["usage"] != nil || len(created["output"].([]any)) != 0 || created["store"] != true {
		t.Fatalf("create: %s", b)
	}
	eventually(t, "the generation running", func() bool { return e.srv.Stats().Running == 1 })
	if code, v := get(id); code != 200 || v["status"] != "queued" || v["id"] != id {
		t.Fatalf("retrieve while generating: %d %v", code, v)
	}
	code, b, _ = e.post(t, "/v1/responses/"+id+"/cancel", "")
	cancelled := decode("cancel", code, b, 200)
	if cancelled["status"] != "cancelled" || cancelled["id"] != id || cancelled["background"] != true || cancelled["usage"] != nil {
		t.Fatalf("cancel: %s", b)
	}
	eventually(t, "the generation aborted", func() bool { st := e.srv.Stats(); return st.Aborted == 1 && st.Active == 0 })
	if code, v := get(id); code != 200 || v["status"] != "cancelled" {
		t.Fatalf("retrieve after the cancel: %d %v", code, v)
	}
	code, b, _ = e.post(t, "/v1/responses/"+id+"/cancel", "")
	if v := decode("second cancel", code, b, 400); !strings.Contains(string(b), "Cannot cancel a synchronous response.") {
		t.Fatalf("second cancel: %v", v)
	}

	// Left alone, a background Response ends stored with its output.
	code, b, _ = e.post(t, "/v1/responses", `{"model":"sim-model","input":"hello","max_output_tokens":3,"background":"true","store":true}`)
	short := decode("short create", code, b, 200)
	sid, _ := short["id"].(string)
	var done map[string]any
	eventually(t, "the short one ended", func() bool {
		_, done = get(sid)
		return done["status"] != "queued"
	})
	usage, _ := done["usage"].(map[string]any)
	if done["status"] != "incomplete" || done["background"] != true || len(done["output"].([]any)) != 1 || usage == nil || usage["output_tokens"] != 3.0 {
		t.Fatalf("the ended background Response: %v", done)
	}
	code, b, _ = e.post(t, "/v1/responses/"+sid+"/cancel", "")
	decode("cancel of an ended one", code, b, 400)
	if _, v := get(sid); v["status"] != "incomplete" {
		t.Fatalf("a refused cancel changed the Response: %v", v)
	}

	// vLLM's validate_background: not without the store.
	code, b, _ = e.post(t, "/v1/responses", `{"model":"sim-model","input":"hello","background":true,"store":false}`)
	if v := decode("background without store", code, b, 400); !strings.Contains(string(b), "background can only be used when `store` is true") || !strings.Contains(string(b), `"param":"background"`) {
		t.Fatalf("background without store: %v", v)
	}
	code, b, _ = e.post(t, "/v1/responses", `{"model":"sim-model","input":"hello","background":true,"stream":true}`)
	decode("background stream", code, b, 400)
	// "background": false is an ordinary request.
	code, b, _ = e.post(t, "/v1/responses", `{"model":"sim-model","input":"hello","max_output_tokens":2,"background":false}`)
	if v := decode("background false", code, b, 200); v["status"] != "incomplete" || v["background"] != false {
		t.Fatalf("background false: %v", v)
	}
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatalf("timed out waiting for %s", what)
}
