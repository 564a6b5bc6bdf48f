package admin

import (
	"strings"
	"testing"
)

// An error that names what the client sent repeats at most 64 bytes of the
// name, escaped, and never a value: an unknown field of a 1 MiB user body
// was answered whole, and so were unknown sections, query parameters, the
// keys of a config body and a repeated key. A key sent next to an unknown
// field (or in a field of the wrong name) is never in the answer.
func TestErrorsRepeatTheClientsNamesBoundedAndNeverItsValues(t *testing.T) {
	e := newEnv(t, envOpts{file: `{"users":[{"name":"bob"}],"user_limit":{"templates":[{"name":"gold"}]}}`})
	const secret = "sk-live-0123456789abcdef-SECRET"
	long := strings.Repeat("A", 1<<20-200) // a name filling the user body's 1 MiB
	check := func(what string, r resp, wantStatus int) {
		t.Helper()
		if r.status != wantStatus {
			t.Fatalf("%s: %d, want %d: %.300s", what, r.status, wantStatus, r.body)
		}
		if strings.Contains(string(r.body), secret) {
			t.Fatalf("%s: the answer repeats the key: %s", what, r.body)
		}
		if strings.Contains(string(r.body), strings.Repeat("A", maxEchoed+1)) || len(r.body) > 2*maxErrMessage {
			t.Fatalf("%s: the answer repeats %d bytes: %.300s", what, len(r.body), r.body)
		}
		if path, msg := r.errPath(t); msg == "" || len(path) > maxErrPath+3 {
			t.Fatalf("%s: path %.100q, message %q", what, path, msg)
		}
	}
	for _, body := range []string{
		`{"name":"carol","` + long + `":1,"api_key":"` + secret + `"}`,
		`{"api_key":"` + secret + `","name":"carol","` + long + `":"` + secret + `"}`,
		`{"name":"carol","password":"` + secret + `"}`,
		`{"name":"carol","` + secret + `":1}`[:0] + `{"name":"carol","key":"` + secret + `"}`,
	} {
		check("create user", e.do("POST", "/api/users", body), 400)
		check("update user", e.do("PUT", "/api/users/bob", body, "If-Match", e.etag()), 400)
	}
	check("new key's body", e.do("POST", "/api/users/bob/keys", `{"`+long[:60000]+`":"`+secret+`"}`), 400)
	check("template", e.do("POST", "/api/templates", `{"name":"silver","`+long[:60000]+`":"`+secret+`"}`), 400)
	check("template update", e.do("PUT", "/api/templates/gold", `{"rate":{"`+long[:60000]+`":"`+secret+`"}}`, "If-Match", e.etag()), 400)
	check("section", e.do("PATCH", "/api/config/prefix_cache", `{"`+long+`":"`+secret+`"}`, "If-Match", e.etag()), 400)
	check("users section", e.do("PUT", "/api/config/users", `[{"name":"dan","`+long+`":"`+secret+`"}]`, "If-Match", e.etag()), 400)
	check("repeated key", e.do("PATCH", "/api/config/prefix_cache", `{"`+long[:100000]+`":1,"`+long[:100000]+`":2}`, "If-Match", e.etag()), 400)
	check("whole config", e.do("PUT", "/api/config", `{"debug":{"`+long+`":"`+secret+`"}}`, "If-Match", e.etag()), 400)
	check("unknown section", e.do("GET", "/api/config/"+long[:8000], ""), 404)
	check("unknown section write", e.do("PATCH", "/api/config/"+long[:8000], `{}`, "If-Match", e.etag()), 404)
	check("query parameter", e.do("POST", "/api/backup/import?"+long[:8000]+"=1", `{}`), 400)
	check("dry_run value", e.do("POST", "/api/backup/import?dry_run="+long[:8000], `{}`), 400)
}

// The 404 and 405 answers repeat the request's method and path bounded,
// and so do the log lines of refused requests (a path may be 64 KiB, the
// listener's header limit, and a refused one comes from anyone).
func TestUnknownEndpointsAndRefusedRequestsRepeatTheirPathBounded(t *testing.T) {
	logs := captureLogs(t)
	e := newEnv(t, envOpts{})
	long := strings.Repeat("A", 30000)
	tooMuch := func(what, s string, n int) {
		t.Helper()
		if strings.Contains(s, strings.Repeat("A", n+1)) || strings.Contains(s, strings.Repeat("M", maxEchoed+1)) {
			t.Fatalf("%s repeats the client's text unbounded: %.300s", what, s)
		}
	}
	r := e.do("GET", "/api/"+long, "")
	if r.status != 404 {
		t.Fatalf("unknown endpoint: %d %.300s", r.status, r.body)
	}
	tooMuch("404", string(r.body), maxEchoedPath)
	r = e.do(strings.Repeat("M", 10000), "/api/users", "")
	if r.status != 405 {
		t.Fatalf("unknown method: %d %.300s", r.status, r.body)
	}
	tooMuch("405", string(r.body), maxEchoedPath)
	if r := e.do("GET", "/api/"+long, "", "Authorization", "Bearer not-the-key"); r.status != 401 {
		t.Fatalf("wrong key: %d", r.status)
	}
	if !strings.Contains(logs.String(), "bad or missing key") {
		t.Fatal("the refused request was not logged")
	}
	tooMuch("the log", logs.String(), maxEchoedPath)
}

// A name the config refuses (a user's, a template's, a template a user is
// bound to, a session header) is repeated by its first 64 bytes: the
// message quoted it whole, from a body of up to 1 MiB (4 MiB for a
// section).
func TestRefusedNamesAreRepeatedBounded(t *testing.T) {
	e := newEnv(t, envOpts{file: `{"users":[{"name":"bob"}]}`})
	long := strings.Repeat("A", 100000)
	for _, c := range []struct{ what, method, path, body, wantPath string }{
		{"user name", "POST", "/api/users", `{"name":"-` + long + `"}`, "name"},
		{"template name", "POST", "/api/templates", `{"name":"/` + long + `"}`, "name"},
		{"user's template", "PUT", "/api/users/bob", `{"template":"` + long + `"}`, "template"},
		{"session header", "PATCH", "/api/config/session_affinity", `{"header":"` + long + ` "}`, "session_affinity.header"},
		{"fallback tier", "PATCH", "/api/config/smart_model_selection", `{"fallback_tier":"` + long + `"}`, "smart_model_selection.fallback_tier"},
	} {
		r := e.do(c.method, c.path, c.body, "If-Match", "*")
		path, msg := r.errPath(t)
		if r.status != 400 || path != c.wantPath {
			t.Fatalf("%s: %d %.300s, want 400 at %s", c.what, r.status, r.body, c.wantPath)
		}
		if strings.Contains(msg, strings.Repeat("A", maxEchoed+1)) || !strings.Contains(msg, `AAAA..."`) {
			t.Fatalf("%s: the message repeats %d bytes: %.300s", c.what, len(msg), msg)
		}
	}
}
