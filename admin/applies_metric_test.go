package admin

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/VictoriaMetrics/metrics"
)

// applies reads infera_config_applies_total{result="ok"} and {result="error"}.
func applies(t *testing.T) (ok, refused float64) {
	t.Helper()
	var b bytes.Buffer
	metrics.WritePrometheus(&b, false)
	for _, ln := range bytes.Split(b.Bytes(), []byte("\n")) {
		var v float64
		if _, err := fmt.Sscanf(string(ln), `infera_config_applies_total{result="ok"} %g`, &v); err == nil {
			ok = v
		}
		if _, err := fmt.Sscanf(string(ln), `infera_config_applies_total{result="error"} %g`, &v); err == nil {
			refused = v
		}
	}
	return ok, refused
}

// infera_config_applies_total{result} counts the admin API's writes as
// docs/router.md says: a write that makes a new version is ok, a refused
// one (an invalid value, a body that does not parse, a stale If-Match) an
// error, with every storage. A write refused before the store's Apply (all
// of the admin's validation) was never counted, and with Redis, where
// Apply is not used, no write was: 0 and 0 after writes of every kind.
func TestAdminWritesAreCountedInConfigApplies(t *testing.T) {
	rs := startRedis(t)
	for name, o := range map[string]envOpts{"file": {file: "{}"}, "redis": {state: rs.url()}} {
		e := newEnv(t, o)
		ok0, bad0 := applies(t)
		e.put("debug", `{"decision_header":true}`, 200)
		e.put("debug", `{"decision_header":true}`, 200) // changes nothing: no apply
		e.put("session_affinity", `{"ttl_s":-1}`, 400)
		e.put("debug", `{"decision_header":`, 400)
		if r := e.do("PATCH", "/api/config/debug", `{"decision_header":false}`, "If-Match", `"1-000000000000"`); r.status != 409 {
			t.Fatalf("stale If-Match: %d %s", r.status, r.body)
		}
		if r := e.do("POST", "/api/users", `{"name":"ann"}`); r.status != 201 {
			t.Fatalf("create user: %d %s", r.status, r.body)
		}
		ok, bad := applies(t)
		if ok-ok0 != 2 || bad-bad0 != 3 {
			t.Fatalf("%s: applies ok +%g, error +%g; want +2 and +3", name, ok-ok0, bad-bad0)
		}
	}
}
