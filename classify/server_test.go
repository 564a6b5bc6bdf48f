package classify

import (
	"io"
	"net/http"
	"strings"
	"testing"
)

func TestReferenceServerRefusesBadRequests(t *testing.T) {
	base := serve(t, NewServer(Heuristic{L2Bytes: 10, L3Bytes: 100, Keywords: DefaultKeywords}, "key", 0))
	do := func(method, path, auth, body string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(method, base+path, strings.NewReader(body))
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	f := func(method, path, auth, body string, wantCode int, wantBody string) {
		t.Helper()
		code, got := do(method, path, auth, body)
		if code != wantCode || !strings.Contains(got, wantBody) {
			t.Fatalf("%s %s %q: %d %q, want %d containing %q", method, path, body, code, got, wantCode, wantBody)
		}
	}
	f("GET", "/health", "", "", 200, "ok")
	f("POST", ClassifyPath, "Bearer key", `{"model":"m","text":"hi","text_bytes":2}`, 200, `{"tier":"L1"}`)
	f("POST", ClassifyPath, "Bearer key", `{"model":"m","text":"hi","text_bytes":500}`, 200, `{"tier":"L3"}`)
	f("POST", ClassifyPath, "Bearer key", `{"text":"twelve bytes"}`, 200, `{"tier":"L2"}`)
	f("POST", ClassifyPath, "", `{"text":"hi"}`, 401, "bearer")
	f("POST", ClassifyPath, "Bearer nope", `{"text":"hi"}`, 401, "bearer")
	f("GET", ClassifyPath, "Bearer key", ``, 405, "POST")
	f("POST", ClassifyPath, "Bearer key", `{"text":`, 400, "JSON object")
	f("POST", ClassifyPath, "Bearer key", `{"text":1}`, 400, "JSON object")
	f("POST", ClassifyPath, "Bearer key", `{"text":"a"} {}`, 400, "after the JSON object")
	f("POST", "/nope", "Bearer key", `{}`, 404, "")
}
