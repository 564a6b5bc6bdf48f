package admin

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/infera/infera/config"
	"github.com/infera/infera/govern"
)

// POST /api/users/{name}/keys had no bound: a script in a loop grew one
// user's keys (the config, every snapshot, Redis, the router's key table)
// without end. The API mints at most config.MaxAPIUserKeys per user, then
// 409 until one is revoked; a config that holds more still loads.
func TestAddKeyStopsAtTheKeysCapUntilOneIsRevoked(t *testing.T) {
	e := newEnv(t, envOpts{file: `{}`})
	if r := e.do("POST", "/api/users", `{"name":"alice"}`); r.status != 201 {
		t.Fatalf("create: %d %s", r.status, r.body)
	}
	for i := 1; i < config.MaxAPIUserKeys; i++ {
		if r := e.do("POST", "/api/users/alice/keys", ""); r.status != 201 {
			t.Fatalf("key %d: %d %s", i+1, r.status, r.body)
		}
	}
	before := e.store.Load()
	r := e.do("POST", "/api/users/alice/keys", "")
	if r.status != 409 || strings.Contains(string(r.body), config.KeyPrefix) {
		t.Fatalf("key %d: %d %s, want 409 without a key", config.MaxAPIUserKeys+1, r.status, r.body)
	}
	if _, msg := r.errPath(t); !strings.Contains(msg, "revoke") {
		t.Fatalf("the refusal does not say what to do: %s", msg)
	}
	if e.store.Load() != before {
		t.Fatal("a refused key changed the config")
	}
	var u UserView
	json.Unmarshal(e.do("GET", "/api/users/alice", "").body, &u)
	if r := e.do("DELETE", "/api/users/alice/keys/"+u.KeyIDs[0], "", "If-Match", e.etag()); r.status != 200 {
		t.Fatalf("revoke: %d %s", r.status, r.body)
	}
	if r := e.do("POST", "/api/users/alice/keys", ""); r.status != 201 {
		t.Fatalf("a key after a revocation: %d %s", r.status, r.body)
	}

	// Data written before the cap, with more keys, still loads.
	var hashes []string
	for range config.MaxAPIUserKeys + 6 {
		_, h, err := govern.NewKey()
		if err != nil {
			t.Fatal(err)
		}
		hashes = append(hashes, fmt.Sprintf("%q", h))
	}
	old := newEnv(t, envOpts{file: `{"users":[{"name":"bob","keys":[` + strings.Join(hashes, ",") + `]}]}`})
	if n := len(old.store.Load().Users[0].Keys); n != config.MaxAPIUserKeys+6 {
		t.Fatalf("loaded %d keys", n)
	}
	if r := old.do("POST", "/api/users/bob/keys", ""); r.status != 409 {
		t.Fatalf("a key for a user over the cap: %d %s", r.status, r.body)
	}
	if r := old.do("PUT", "/api/users/bob", `{"enabled":false}`, "If-Match", old.etag()); r.status != 200 {
		t.Fatalf("other edits of a user over the cap: %d %s", r.status, r.body)
	}
}
