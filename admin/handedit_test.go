package admin

import (
	"net/http"
	"os"
	"strings"
	"testing"
)

// A hand edit of the config file that does not parse refuses every API
// write until it is fixed (admin.md), not only the first one, and a write
// that would change nothing as well (it answered 200 with values the file
// no longer holds).
func TestABrokenHandEditRefusesEveryWrite(t *testing.T) {
	e := newEnv(t, envOpts{file: `{}`})
	broken := `{"debug":{"decision_header":tru`
	if err := os.WriteFile(e.path, []byte(broken), 0o600); err != nil {
		t.Fatal(err)
	}
	for i, body := range []string{`{"decision_header":true}`, `{"decision_header":false}`, `{"decision_header":true}`} {
		r := e.do("PUT", "/api/config/debug", body, "If-Match", "*")
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
	for _, body := range []string{`{"decision_header":false}`, `{"decision_header":true}`} {
		r := e.do("PATCH", "/api/config/debug", body, "If-Match", e.etag())
		data, _ := os.ReadFile(e.path)
		if r.status != http.StatusConflict || string(data) != broken || !strings.Contains(string(r.body), "edited by hand") {
			t.Fatalf("write %s after the poll saw the broken edit: %d %s; file now %.60q", body, r.status, r.body, data)
		}
	}
}
