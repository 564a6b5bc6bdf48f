package admin

import (
	"net/http"
	"os"
	"strings"
	"testing"
)

// A hand edit of the config file that does not parse refuses every API
// write until it is fixed (admin.md), not only the first one.
func TestABrokenHandEditRefusesEveryWrite(t *testing.T) {
	e := newEnv(t, envOpts{file: `{}`})
	broken := `{"debug":{"decision_header":tru`
	if err := os.WriteFile(e.path, []byte(broken), 0o600); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		r := e.do("PUT", "/api/config/debug", `{"decision_header":true}`, "If-Match", "*")
		data, _ := os.ReadFile(e.path)
		if r.status != http.StatusConflict || string(data) != broken {
			t.Fatalf("write %d over the broken hand edit: %d %s; file now %.60q", i+1, r.status, r.body, data)
		}
		// Not "changed since version N (now N)": the version did not move.
		if strings.Contains(string(r.body), "changed since version") {
			t.Fatalf("write %d: a version conflict that is none: %s", i+1, r.body)
		}
	}
}

// The same when the config poll (or SIGHUP) saw the broken edit first.
func TestABrokenHandEditSeenByThePollRefusesWrites(t *testing.T) {
	e := newEnv(t, envOpts{file: `{}`})
	broken := `{"debug":{"decision_header":tru`
	if err := os.WriteFile(e.path, []byte(broken), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := e.store.Reload(); err == nil { // as the poll would
		t.Fatal("the broken file was reloaded")
	}
	if _, err := e.store.Reload(); err != nil { // the same bytes: reported once
		t.Fatalf("the same broken bytes reported again: %v", err)
	}
	r := e.do("PATCH", "/api/config/debug", `{"decision_header":true}`, "If-Match", e.etag())
	data, _ := os.ReadFile(e.path)
	if r.status != http.StatusConflict || string(data) != broken || !strings.Contains(string(r.body), "edited by hand") {
		t.Fatalf("write after the poll saw the broken edit: %d %s; file now %.60q", r.status, r.body, data)
	}
}
