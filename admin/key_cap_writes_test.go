package admin

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/infera/infera/config"
	"github.com/infera/infera/govern"
)

// keyHashes returns n fresh stored key hashes as JSON strings.
func keyHashes(t testing.TB, n int) []string {
	t.Helper()
	out := make([]string, n)
	for i := range out {
		_, h, err := govern.NewKey()
		if err != nil {
			t.Fatal(err)
		}
		out[i] = fmt.Sprintf("%q", h)
	}
	return out
}

// usersList is a users section: name -> key hashes (JSON strings).
func usersList(users map[string][]string) string {
	var parts []string
	for name, keys := range users {
		parts = append(parts, fmt.Sprintf(`{"name":%q,"keys":[%s]}`, name, strings.Join(keys, ",")))
	}
	return "[" + strings.Join(parts, ",") + "]"
}

// importOf is an export of e with its config replaced by cfg (no
// checksum: an edited export, imported on purpose).
func importOf(t *testing.T, e *env, cfg string) string {
	t.Helper()
	var f snapshotFile
	if err := json.Unmarshal(e.do("GET", "/api/backup/export", "").body, &f); err != nil {
		t.Fatal(err)
	}
	f.Config, f.SHA256 = json.RawMessage(cfg), ""
	data, err := json.Marshal(f)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// wantKeysCapRefusal checks a refusal of a write that would grow user
// past the keys cap: 400 at the user's keys, naming the user and no key.
func wantKeysCapRefusal(t *testing.T, what string, r resp, path, user string) {
	t.Helper()
	if r.status != 400 {
		t.Fatalf("%s: %d %.300s, want 400", what, r.status, r.body)
	}
	p, msg := r.errPath(t)
	if p != path || !strings.Contains(msg, fmt.Sprintf("%q", user)) || !strings.Contains(msg, fmt.Sprint(config.MaxAPIUserKeys)) {
		t.Fatalf("%s: error at %q %q, want %q naming user %q and the cap", what, p, msg, path, user)
	}
	if strings.Contains(string(r.body), config.KeyHashPrefix) || strings.Contains(string(r.body), config.KeyPrefix) {
		t.Fatalf("%s: the refusal quotes a key: %s", what, r.body)
	}
}

// POST /api/users/{name}/keys stops at config.MaxAPIUserKeys, but a
// section write, a whole-config write and an import took a user's keys
// past it without a word. Every API write now refuses to leave a user with
// more keys than the cap, unless the user already held at least as many
// (data from before the cap keeps loading, and may be written back as it
// is or with fewer keys).
func TestNoAPIWriteGrowsAUserPastTheKeysCap(t *testing.T) {
	over := keyHashes(t, config.MaxAPIUserKeys+1)
	atCap := over[:config.MaxAPIUserKeys]
	e := newEnv(t, envOpts{file: `{"users":` + usersList(map[string][]string{"alice": atCap}) + `}`, snapshotDir: t.TempDir()})
	v := e.store.Version()
	grown := usersList(map[string][]string{"alice": over})
	wantKeysCapRefusal(t, "PUT users", e.do("PUT", "/api/config/users", grown, "If-Match", e.etag()), "users[0].keys", "alice")
	wantKeysCapRefusal(t, "PATCH users", e.do("PATCH", "/api/config/users", grown, "If-Match", e.etag()), "users[0].keys", "alice")
	wantKeysCapRefusal(t, "PUT config", e.do("PUT", "/api/config", `{"users":`+grown+`}`, "If-Match", e.etag()), "users[0].keys", "alice")
	wantKeysCapRefusal(t, "a new user", e.do("PUT", "/api/config/users", usersList(map[string][]string{"bob": over}), "If-Match", e.etag()), "users[0].keys", "bob")
	imp := importOf(t, e, `{"users":`+grown+`}`)
	wantKeysCapRefusal(t, "import dry run", e.do("POST", "/api/backup/import?dry_run=1", imp), "config.users[0].keys", "alice")
	wantKeysCapRefusal(t, "import", e.do("POST", "/api/backup/import", imp), "config.users[0].keys", "alice")
	if e.store.Version() != v || len(e.store.Load().Users[0].Keys) != config.MaxAPIUserKeys {
		t.Fatalf("a refused write changed the config: version %d -> %d", v, e.store.Version())
	}
	var b Backup
	json.Unmarshal(e.do("GET", "/api/backup", "").body, &b)
	if len(b.Snapshots) != 0 {
		t.Fatalf("a refused import took a snapshot first: %+v", b.Snapshots)
	}
	// At the cap is fine, through every write.
	if r := e.do("PUT", "/api/config/users", usersList(map[string][]string{"alice": atCap, "bob": keyHashes(t, config.MaxAPIUserKeys)}), "If-Match", e.etag()); r.status != 200 {
		t.Fatalf("a user at the cap: %d %.300s", r.status, r.body)
	}

	// Data that already holds more keeps loading, and writes may keep a
	// user at what it holds, or lower it, but not grow it.
	many := keyHashes(t, config.MaxAPIUserKeys+7)
	old := newEnv(t, envOpts{file: `{"users":` + usersList(map[string][]string{"carol": many[:len(many)-1]}) + `}`})
	if n := len(old.store.Load().Users[0].Keys); n != len(many)-1 {
		t.Fatalf("loaded %d keys", n)
	}
	wantKeysCapRefusal(t, "growing a user over the cap", old.do("PUT", "/api/config/users", usersList(map[string][]string{"carol": many}), "If-Match", old.etag()), "users[0].keys", "carol")
	kept := `[{"name":"carol","enabled":false,"keys":[` + strings.Join(many[:len(many)-1], ",") + `]}]`
	if r := old.do("PUT", "/api/config/users", kept, "If-Match", old.etag()); r.status != 200 {
		t.Fatalf("a user kept at what it held: %d %.300s", r.status, r.body)
	}
	if r := old.do("POST", "/api/backup/import", importOf(t, old, `{"users":`+usersList(map[string][]string{"carol": many[2:]})+`}`)); r.status != 200 {
		t.Fatalf("an import lowering a user over the cap: %d %.300s", r.status, r.body)
	}
	wantKeysCapRefusal(t, "growing it back", old.do("PUT", "/api/config/users", usersList(map[string][]string{"carol": many[1:]}), "If-Match", old.etag()), "users[0].keys", "carol")
}

// The same with Redis: a replica loads data holding more keys than the
// cap (seeded by another), and its writes may keep but not grow them.
func TestRedisNoAPIWriteGrowsAUserPastTheKeysCap(t *testing.T) {
	rs := startRedis(t)
	many := keyHashes(t, config.MaxAPIUserKeys+3)
	a := newEnv(t, envOpts{state: rs.url(), file: `{"users":` + usersList(map[string][]string{"dave": many[:len(many)-1]}) + `}`})
	b := newEnv(t, envOpts{state: rs.url()})
	if n := len(b.store.Load().Users); n != 1 || len(b.store.Load().Users[0].Keys) != len(many)-1 {
		t.Fatalf("replica B loaded %+v", b.store.Load().Users)
	}
	v := a.store.Version()
	wantKeysCapRefusal(t, "PUT users on B", b.do("PUT", "/api/config/users", usersList(map[string][]string{"dave": many}), "If-Match", b.etag()), "users[0].keys", "dave")
	wantKeysCapRefusal(t, "import on B", b.do("POST", "/api/backup/import", importOf(t, b, `{"users":`+usersList(map[string][]string{"dave": many})+`}`)), "config.users[0].keys", "dave")
	if b.store.Version() != v {
		t.Fatalf("a refused write reached Redis: version %d -> %d", v, b.store.Version())
	}
	if r := b.do("PUT", "/api/config/users", usersList(map[string][]string{"dave": many[1:]}), "If-Match", b.etag()); r.status != 200 {
		t.Fatalf("a write keeping the count: %d %.300s", r.status, r.body)
	}
	eventually(t, 2*time.Second, "replica A adopts B's write", func() bool { return a.store.Version() == b.store.Version() })
}
