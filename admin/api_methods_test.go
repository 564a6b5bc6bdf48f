package admin

import (
	"strings"
	"testing"
)

// A wrong method on an endpoint that exists answered 404 "no such
// endpoint"; it is 405 with the Allow header RFC 9110 requires. A path
// that exists for no method stays 404.
func TestAWrongMethodOnAnEndpointGets405WithAllow(t *testing.T) {
	e := newEnv(t, envOpts{})
	for _, c := range []struct{ method, path, allow string }{
		{"DELETE", "/api/version", "GET"},
		{"POST", "/api/config", "GET, PUT"},
		{"DELETE", "/api/config/session_affinity", "GET, PUT, PATCH"},
	} {
		r := e.do(c.method, c.path, "")
		if r.status != 405 || r.hdr.Get("Allow") != c.allow || !strings.Contains(string(r.body), "not allowed") {
			t.Errorf("%s %s: %d Allow %q %s, want 405 Allow %q", c.method, c.path, r.status, r.hdr.Get("Allow"), r.body, c.allow)
		}
	}
	if r := e.do("GET", "/api/no-such-thing", ""); r.status != 404 {
		t.Fatalf("an unknown endpoint: %d %s", r.status, r.body)
	}
}
