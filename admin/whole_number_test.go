package admin

import (
	"strings"
	"testing"
)

// A whole-number setting takes any JSON number whose value is whole: 100.0
// and 1e2 were refused with "want a whole number" although they are 100.
// A number that is not whole, or past what the setting holds, is refused
// with which of the two it is, and a long one is not repeated whole.
func TestAWholeNumberSettingTakesAnyWholeJSONNumber(t *testing.T) {
	e := newEnv(t, envOpts{file: `{}`})
	ok := func(v string, want int) {
		t.Helper()
		e.do("PATCH", "/api/config/prefix_cache", `{"pending_request_threshold":0}`, "If-Match", "*")
		r := e.do("PATCH", "/api/config/prefix_cache", `{"pending_request_threshold":`+v+`}`, "If-Match", e.etag())
		if r.status != 200 {
			t.Fatalf("%s: %d %s", v, r.status, r.body)
		}
		if got := e.store.Load().PrefixCache.PendingRequestThreshold; got != want {
			t.Fatalf("%s: stored %d, want %d", v, got, want)
		}
	}
	ok("100", 100)
	ok("100.0", 100)
	ok("1e2", 100)
	ok("1.0E+2", 100)
	ok("10000e-2", 100)
	ok("0.0", 0)
	ok("-0e5", 0)
	refused := func(v, want string) {
		t.Helper()
		r := e.do("PATCH", "/api/config/prefix_cache", `{"pending_request_threshold":`+v+`}`, "If-Match", e.etag())
		path, msg := r.errPath(t)
		if r.status != 400 || path != "prefix_cache.pending_request_threshold" || !strings.Contains(msg, want) {
			t.Fatalf("%.40s: %d %s: want 400 at the setting saying %q", v, r.status, r.body, want)
		}
		if len(msg) > 200 {
			t.Fatalf("%.40s: the message repeats %d bytes: %.300s", v, len(msg), msg)
		}
	}
	refused("100.5", "100.5 is not a whole number")
	refused("1e-1", "not a whole number")
	refused("1e30", "1e30 is out of range: this setting takes whole numbers from -9223372036854775808 to 9223372036854775807")
	refused("9223372036854775808", "out of range")
	refused("1e1000000000", "out of range")
	refused("1e-1000000000", "not a whole number")
	refused("1"+strings.Repeat("0", 100000)+".5", "not a whole number")
	// The same in a list (templates) and an int64 setting, through the
	// templates endpoint.
	if r := e.do("POST", "/api/templates", `{"name":"gold","rate":{"enabled":true,"rpm":60.0,"tpm":1.5e4}}`); r.status != 201 {
		t.Fatalf("template: %d %s", r.status, r.body)
	}
	if rt := e.store.Load().UserLimit.Templates[0].Rate; rt.RPM != 60 || rt.TPM != 15000 {
		t.Fatalf("template rate: %+v", rt)
	}
	r := e.do("POST", "/api/templates", `{"name":"silver","rate":{"enabled":true,"rpm":60.5}}`)
	if path, msg := r.errPath(t); r.status != 400 || path != "rate.rpm" || !strings.Contains(msg, "not a whole number") {
		t.Fatalf("rpm 60.5: %d %s", r.status, r.body)
	}
	// A repeated key is still refused when the document is rewritten.
	r = e.do("PATCH", "/api/config/prefix_cache", `{"pending_request_threshold":1.0,"pending_request_threshold":2}`, "If-Match", e.etag())
	if r.status != 400 {
		t.Fatalf("repeated key with 1.0: %d %s", r.status, r.body)
	}
}
