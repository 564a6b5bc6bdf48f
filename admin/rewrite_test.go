package admin

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// reformat rewrites the config file at path with the same settings in
// another layout (one line, keys in another order), as a deployment tool
// rendering it again or jq would.
func reformat(t *testing.T, path string, edit func(doc map[string]any)) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := json.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	if edit != nil {
		edit(doc)
	}
	out, err := json.Marshal(doc) // one line, keys sorted
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Equal(out, data) {
		t.Fatal("BUG: the rewrite did not change the bytes")
	}
	if err := os.WriteFile(path, out, 0o600); err != nil {
		t.Fatal(err)
	}
}

// A config file written again with the same settings (re-indented, keys
// reordered, its sealed keys replaced by the same keys in clear) is no
// edit: it made a new version with no change, so an operator's next write
// with the ETag it held got 409, and the audit log an empty entry.
func TestAFileRewrittenWithTheSameSettingsIsNoEdit(t *testing.T) {
	e := newEnv(t, envOpts{file: `{"session_affinity": {"ttl_s": 900},
  "mirror": {"target_address": "http://127.0.0.1:9", "auth_token": "mirror-token-one"}}`})
	if r := e.do("POST", "/api/users", `{"name":"alice"}`); r.status != 201 { // the file now holds the token sealed
		t.Fatalf("create user: %d %s", r.status, r.body)
	}
	if data, _ := os.ReadFile(e.path); !strings.Contains(string(data), "enc:v2:") {
		t.Fatalf("the token is not sealed in the file:\n%s", data)
	}
	etag, v := e.etag(), e.store.Version()
	reformat(t, e.path, nil)
	if ok, err := e.store.Reload(); ok || err != nil || e.store.Version() != v {
		t.Fatalf("a rewrite with the same settings: reloaded %v (%v), version %d, was %d", ok, err, e.store.Version(), v)
	}
	reformat(t, e.path, func(doc map[string]any) {
		doc["mirror"].(map[string]any)["auth_token"] = "mirror-token-one" // the sealed key, in clear
	})
	if r := e.do("PATCH", "/api/config/session_affinity", `{"ttl_s":901}`, "If-Match", etag); r.status != 200 {
		t.Fatalf("a write with the ETag from before the rewrite (before the poll saw it): %d %s", r.status, r.body)
	}
	if e.store.Version() != v+1 || e.store.Load().Mirror.AuthToken.Reveal() != "mirror-token-one" {
		t.Fatalf("version %d, want %d; token %q", e.store.Version(), v+1, e.store.Load().Mirror.AuthToken.Reveal())
	}
	// A real edit is still one.
	reformat(t, e.path, func(doc map[string]any) { doc["session_affinity"].(map[string]any)["ttl_s"] = 5 })
	if ok, err := e.store.Reload(); !ok || err != nil || e.store.Load().SessionAffinity.TTLSeconds != 5 {
		t.Fatalf("a hand edit: reloaded %v (%v), ttl_s %v", ok, err, e.store.Load().SessionAffinity.TTLSeconds)
	}
}

// With --state redis a hand edit of the config file is written to Redis;
// a rewrite with the same settings is none: it overwrote every user, key
// and setting made through the API since, on every replica.
func TestRedisAFileRewrittenWithTheSameSettingsKeepsTheRedisData(t *testing.T) {
	rs := startRedis(t)
	file := `{"session_affinity": {"ttl_s": 900}}`
	e := newEnv(t, envOpts{state: rs.url(), file: file})
	b := newEnv(t, envOpts{state: rs.url(), file: file})
	if r := e.do("POST", "/api/users", `{"name":"alice"}`); r.status != 201 {
		t.Fatalf("create user: %d %s", r.status, r.body)
	}
	e.put("session_affinity", `{"ttl_s":42}`, 200)
	v := e.store.Version()
	eventually(t, 3*time.Second, "replica B adopts the writes", func() bool { return b.store.Version() == v })
	reformat(t, e.path, nil)
	if _, err := e.store.Reload(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond) // the other replica's sync interval is 200 ms
	for name, r := range map[string]*env{"the replica whose file was rewritten": e, "the other replica": b} {
		c := r.store.Load()
		if _, ok := findUser(c, "alice"); !ok || c.SessionAffinity.TTLSeconds != 42 || r.store.Version() != v {
			t.Fatalf("%s lost the API's changes: users %d, ttl_s %v (version %d, was %d)", name, len(c.Users), c.SessionAffinity.TTLSeconds, r.store.Version(), v)
		}
	}
	cl := redis.NewClient(&redis.Options{Addr: rs.addr()})
	defer cl.Close()
	doc, err := cl.HGet(context.Background(), "infera:admin:data", "doc").Result()
	if err != nil || !strings.Contains(doc, `"alice"`) {
		t.Fatalf("Redis lost the user: %v", err)
	}
	// A real edit is still written.
	reformat(t, e.path, func(doc map[string]any) { doc["session_affinity"].(map[string]any)["ttl_s"] = 5 })
	if ok, err := e.store.Reload(); !ok || err != nil {
		t.Fatalf("a hand edit: reloaded %v (%v)", ok, err)
	}
	eventually(t, 3*time.Second, "the other replica adopts the hand edit", func() bool { return b.store.Load().SessionAffinity.TTLSeconds == 5 })
}
