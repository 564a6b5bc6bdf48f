package admin

import (
	"strings"
	"testing"
)

// POST /api/users/{name}/keys took any body and ignored it: a client that
// sent {"name":"ci","expires_at":"..."} got 201 and a key that never
// expires, believing it set both. A key takes no settings: a body naming
// any is refused with 400 naming every field, and no key is minted.
func TestAddKeyRefusesABodyItWouldIgnore(t *testing.T) {
	e := newEnv(t, envOpts{file: `{}`})
	if r := e.do("POST", "/api/users", `{"name":"alice"}`); r.status != 201 {
		t.Fatalf("create: %d %s", r.status, r.body)
	}
	r := e.do("POST", "/api/users/alice/keys", `{"name":"ci","expires_at":"2027-01-01T00:00:00Z"}`)
	if r.status != 400 {
		t.Fatalf("a body with name and expires_at: %d %s, want 400", r.status, r.body)
	}
	path, msg := r.errPath(t)
	if path != "expires_at" || !strings.Contains(msg, `"expires_at"`) || !strings.Contains(msg, `"name"`) {
		t.Fatalf("error: path %q message %q", path, msg)
	}
	for _, body := range []string{`[]`, `null`, `{"a":1} x`, `"ci"`} {
		if r := e.do("POST", "/api/users/alice/keys", body); r.status != 400 {
			t.Fatalf("body %s: %d %s, want 400", body, r.status, r.body)
		}
	}
	if n := len(e.store.Load().Users[0].Keys); n != 1 {
		t.Fatalf("refused requests minted keys: the user has %d", n)
	}
	// No body (the console's) and {} still mint one.
	for _, body := range []string{"", "{}", " \n"} {
		if r := e.do("POST", "/api/users/alice/keys", body); r.status != 201 {
			t.Fatalf("body %q: %d %s", body, r.status, r.body)
		}
	}
	if n := len(e.store.Load().Users[0].Keys); n != 4 {
		t.Fatalf("the user has %d keys, want 4", n)
	}
}
