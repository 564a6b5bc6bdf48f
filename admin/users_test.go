package admin

import (
	"crypto/sha256"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"strings"
	"testing"

	"github.com/infera/infera/config"
	"github.com/infera/infera/govern"
)

// verifyKey checks a key against a stored hash as config documents it.
func verifyKey(t *testing.T, key, stored string) bool {
	t.Helper()
	h, err := config.ParseKeyHash(stored)
	if err != nil {
		t.Fatalf("stored hash does not parse: %v", err)
	}
	id, ok := config.KeyID(key)
	return ok && id == h.ID && sha256.Sum256(append(append([]byte{}, h.Salt...), key...)) == h.Sum
}

func TestCreateUserShowsTheKeyOnceAndStoresItsHash(t *testing.T) {
	logs := captureLogs(t)
	e := newEnv(t, envOpts{file: `{}`})
	r := e.do("POST", "/api/users", `{"name":"alice"}`)
	if r.status != http.StatusCreated {
		t.Fatalf("create: %d %s", r.status, r.body)
	}
	var out struct {
		User UserView `json:"user"`
		Key  string   `json:"key"`
	}
	json.Unmarshal(r.body, &out)
	if !config.LooksLikeKey(out.Key) || out.User.Name != "alice" || !out.User.Enabled || len(out.User.KeyIDs) != 1 {
		t.Fatalf("create answer: %s", r.body)
	}
	users := e.store.Load().Users
	if len(users) != 1 || len(users[0].Keys) != 1 || !verifyKey(t, out.Key, users[0].Keys[0]) {
		t.Fatalf("stored user: %+v", users)
	}
	// The key never appears again: not in reads, the file, the audit log,
	// an export or a log line.
	data, _ := os.ReadFile(e.path)
	for name, body := range map[string]string{
		"users":  string(e.do("GET", "/api/users", "").body),
		"user":   string(e.do("GET", "/api/users/alice", "").body),
		"config": string(e.do("GET", "/api/config", "").body),
		"audit":  string(e.do("GET", "/api/audit", "").body),
		"export": string(e.do("GET", "/api/backup/export", "").body),
		"file":   string(data),
		"logs":   logs.String(),
	} {
		if strings.Contains(body, out.Key) {
			t.Fatalf("the key appears in %s", name)
		}
	}
	if !strings.Contains(string(e.do("GET", "/api/audit", "").body), "key "+out.User.KeyIDs[0]) {
		t.Fatal("the audit log does not name the key by id")
	}
	// A second key, then revoke the first.
	r = e.do("POST", "/api/users/alice/keys", "")
	var k2 struct {
		Key string `json:"key"`
	}
	json.Unmarshal(r.body, &k2)
	if r.status != 201 || !config.LooksLikeKey(k2.Key) || len(e.store.Load().Users[0].Keys) != 2 {
		t.Fatalf("add key: %d %s", r.status, r.body)
	}
	r = e.do("DELETE", "/api/users/alice/keys/"+out.User.KeyIDs[0], "", "If-Match", e.etag())
	if r.status != 200 || len(e.store.Load().Users[0].Keys) != 1 || !verifyKey(t, k2.Key, e.store.Load().Users[0].Keys[0]) {
		t.Fatalf("revoke: %d %s", r.status, r.body)
	}
	if r := e.do("DELETE", "/api/users/alice/keys/0123456789abcdef", "", "If-Match", e.etag()); r.status != 404 {
		t.Fatalf("revoke unknown key: %d", r.status)
	}
}

func TestUserValidationAndConflicts(t *testing.T) {
	e := newEnv(t, envOpts{})
	if r := e.do("POST", "/api/users", `{"name":"bad name!"}`); r.status != 400 {
		t.Fatalf("bad name: %d %s", r.status, r.body)
	} else if p, _ := r.errPath(t); p != "name" {
		t.Fatalf("bad name error at %q", p)
	}
	if r := e.do("POST", "/api/users", `{"name":"bob","template":"gold"}`); r.status != 400 {
		t.Fatalf("unknown template: %d", r.status)
	} else if p, _ := r.errPath(t); p != "template" {
		t.Fatalf("unknown template error at %q", p)
	}
	if r := e.do("POST", "/api/users", `{"name":"bob","keys":["x"]}`); r.status != 400 {
		t.Fatalf("keys in the body: %d", r.status)
	}
	if r := e.do("POST", "/api/users", `{"name":"bob"}`); r.status != 201 {
		t.Fatal(r.status)
	}
	if r := e.do("POST", "/api/users", `{"name":"bob"}`); r.status != 409 {
		t.Fatalf("duplicate user: %d", r.status)
	}
	if r := e.do("PUT", "/api/users/bob", `{"enabled":false}`); r.status != 428 {
		t.Fatalf("update without If-Match: %d", r.status)
	}
	if r := e.do("PUT", "/api/users/bob", `{"enabled":false}`, "If-Match", e.etag()); r.status != 200 || e.store.Load().Users[0].Enabled {
		t.Fatalf("disable: %d %s", r.status, r.body)
	}
	if r := e.do("PUT", "/api/users/nobody", `{}`, "If-Match", e.etag()); r.status != 404 {
		t.Fatalf("update unknown: %d", r.status)
	}
	if r := e.do("DELETE", "/api/users/bob", "", "If-Match", e.etag()); r.status != 204 || len(e.store.Load().Users) != 0 {
		t.Fatalf("delete: %d", r.status)
	}
}

func TestQuotaTemplatesCRUD(t *testing.T) {
	e := newEnv(t, envOpts{})
	r := e.do("POST", "/api/templates", `{"name":"gold","default":true,"rate":{"enabled":true,"rpm":60}}`)
	if r.status != 201 {
		t.Fatalf("create: %d %s", r.status, r.body)
	}
	ts := e.store.Load().UserLimit.Templates
	if len(ts) != 1 || ts[0].Rate.RPM != 60 || !ts[0].Default || ts[0].Rate.DefaultOutputTokens != 1024 {
		t.Fatalf("stored: %+v", ts)
	}
	if r := e.do("POST", "/api/templates", `{"name":"silver","rate":{"rpm":-1}}`); r.status != 400 {
		t.Fatalf("bad template: %d", r.status)
	} else if p, _ := r.errPath(t); p != "rate.rpm" {
		t.Fatalf("error at %q", p)
	}
	if r := e.do("POST", "/api/users", `{"name":"carol","template":"gold"}`); r.status != 201 {
		t.Fatal(r.status)
	}
	if r := e.do("PUT", "/api/templates/gold", `{"rate":{"enabled":true,"rpm":120}}`, "If-Match", e.etag()); r.status != 200 {
		t.Fatalf("update: %d %s", r.status, r.body)
	}
	if e.store.Load().UserLimit.Templates[0].Rate.RPM != 120 {
		t.Fatal("update not applied")
	}
	// A template in use cannot go: the error names the user binding it.
	r = e.do("DELETE", "/api/templates/gold", "", "If-Match", e.etag())
	if p, _ := r.errPath(t); r.status != 400 || p != "users[0].template" {
		t.Fatalf("delete in use: %d %s", r.status, r.body)
	}
	e.do("DELETE", "/api/users/carol", "", "If-Match", e.etag())
	if r := e.do("DELETE", "/api/templates/gold", "", "If-Match", e.etag()); r.status != 204 {
		t.Fatalf("delete: %d %s", r.status, r.body)
	}
	var list struct{ Templates []any }
	json.Unmarshal(e.do("GET", "/api/templates", "").body, &list)
	if list.Templates == nil || len(list.Templates) != 0 {
		t.Fatalf("list: %+v", list)
	}
}

// usageFleet answers usage from a canned status, or an error.
type usageFleet struct {
	fakeFleet
	err error
}

func (f *usageFleet) UserUsage(name string) (govern.UserStatus, error) {
	return govern.UserStatus{User: name, Template: "t", RPM: &govern.BucketStatus{Limit: 5, Remaining: 4, ResetMS: 12000}}, f.err
}

// GET /api/users/{name}/usage answers the router's status of a configured
// user; 404 for a user the config does not have (or the governance not
// yet), 503 without a router or when its state store fails (the store's
// error is logged, never answered), 401 without the admin key.
func TestUserUsageAnswersTheRoutersStatus(t *testing.T) {
	users := `{"users":[{"name":"alice","keys":[]}]}`
	e := newEnv(t, envOpts{file: users, fleet: &usageFleet{}})
	if r := e.do("GET", "/api/users/alice/usage", ""); r.status != 200 ||
		string(r.body) != `{"user":"alice","template":"t","dry_run":false,"enabled":false,"active":0,"queued":0,"rpm":{"limit":5,"remaining":4,"reset_ms":12000}}`+"\n" {
		t.Fatalf("alice: %d %s", r.status, r.body)
	}
	if r := e.do("GET", "/api/users/bob/usage", ""); r.status != 404 {
		t.Fatalf("bob: %d %s", r.status, r.body)
	}
	req, _ := http.NewRequest("GET", e.srv.URL+"/api/users/alice/usage", nil)
	if res, err := http.DefaultClient.Do(req); err != nil || res.StatusCode != 401 {
		t.Fatalf("without the admin key: %v %v", res, err)
	} else {
		res.Body.Close()
	}
	logs := captureLogs(t)
	e = newEnv(t, envOpts{file: users, fleet: &usageFleet{err: errors.New("dial tcp 10.0.0.9:6379: refused")}})
	if r := e.do("GET", "/api/users/alice/usage", ""); r.status != 503 || strings.Contains(string(r.body), "10.0.0.9") {
		t.Fatalf("state store down: %d %s", r.status, r.body)
	}
	if !strings.Contains(logs.String(), "10.0.0.9") {
		t.Fatalf("the store's error is not logged: %s", logs)
	}
	e = newEnv(t, envOpts{file: users, fleet: &fakeFleet{}})
	if r := e.do("GET", "/api/users/alice/usage", ""); r.status != 503 {
		t.Fatalf("no governance: %d %s", r.status, r.body)
	}
	e = newEnv(t, envOpts{file: users, fleet: &usageFleet{err: govern.ErrNoUser}})
	if r := e.do("GET", "/api/users/alice/usage", ""); r.status != 404 {
		t.Fatalf("not applied yet: %d %s", r.status, r.body)
	}
}

// A user's models list: set on creation, kept by a PUT that leaves it
// out (the console's template and enable switches), replaced by one that
// names it, cleared by an empty list; a bad pattern names its path.
func TestUserModelsAreSetKeptAndCleared(t *testing.T) {
	e := newEnv(t, envOpts{file: `{}`})
	if r := e.do("POST", "/api/users", `{"name":"ann","models":["qwen3-*","m"]}`); r.status != 201 {
		t.Fatalf("create: %d %s", r.status, r.body)
	}
	models := func() []string {
		t.Helper()
		return e.store.Load().Users[0].Models
	}
	if got := models(); len(got) != 2 || got[0] != "qwen3-*" {
		t.Fatalf("created with %v", got)
	}
	if r := e.do("PUT", "/api/users/ann", `{"template":"","enabled":false}`, "If-Match", e.etag()); r.status != 200 || len(models()) != 2 ||
		!strings.Contains(string(r.body), `"models":["qwen3-*","m"]`) {
		t.Fatalf("PUT without models: %d %s, %v", r.status, r.body, models())
	}
	if r := e.do("PUT", "/api/users/ann", `{"models":["llama-*"]}`, "If-Match", e.etag()); r.status != 200 || len(models()) != 1 || models()[0] != "llama-*" {
		t.Fatalf("PUT with models: %d %s", r.status, r.body)
	}
	r := e.do("PUT", "/api/users/ann", `{"models":[""]}`, "If-Match", e.etag())
	if p, _ := r.errPath(t); r.status != 400 || p != "models[0]" {
		t.Fatalf("an empty pattern: %d %s", r.status, r.body)
	}
	if r := e.do("PUT", "/api/users/ann", `{"models":[]}`, "If-Match", e.etag()); r.status != 200 || models() != nil ||
		!strings.Contains(string(r.body), `"models":[]`) {
		t.Fatalf("PUT with no models: %d %s, %v", r.status, r.body, models())
	}
}

// A template body may spell "name" in another case, as the config reads
// every setting. POST {"Name":"silver"} created the template but answered
// 201 with an empty one (name "", weights 0: the name was looked up by its
// exact spelling), and a PUT with "Name" got 400 "repeated key".
func TestATemplateNamedInAnotherCase(t *testing.T) {
	e := newEnv(t, envOpts{})
	r := e.do("POST", "/api/templates", `{"Name":"silver","rate":{"enabled":true,"rpm":5}}`)
	if m := r.json(t); r.status != 201 || m["name"] != "silver" {
		t.Fatalf("create with Name: %d %s", r.status, r.body)
	}
	r = e.do("PUT", "/api/templates/silver", `{"NAME":"silver","rate":{"enabled":true,"rpm":7}}`, "If-Match", e.etag())
	if m := r.json(t); r.status != 200 || m["name"] != "silver" {
		t.Fatalf("put with NAME: %d %s", r.status, r.body)
	}
	if ts := e.store.Load().UserLimit.Templates; len(ts) != 1 || ts[0].Rate.RPM != 7 {
		t.Fatalf("templates %+v", ts)
	}
}

// A quota template bound to a user cannot be deleted, and the refusal says
// which user holds it: it said only `no quota template named "gold"` at
// users[1].template, and neither the API's users nor the console's users
// page shows users by position.
func TestDeletingABoundTemplateNamesTheUserBoundToIt(t *testing.T) {
	e := newEnv(t, envOpts{file: `{"user_limit":{"templates":[{"name":"gold"},{"name":"silver"}]},
		"users":[{"name":"alice","template":"silver"},{"name":"bob","template":"gold"}]}`})
	check := func(what string, r resp) {
		t.Helper()
		p, msg := r.errPath(t)
		if r.status != 400 || p != "users[1].template" || !strings.Contains(msg, `"bob"`) || !strings.Contains(msg, `"gold"`) {
			t.Fatalf("%s: %d %s %q: want 400 at users[1].template naming bob and gold", what, r.status, p, msg)
		}
	}
	check("DELETE /api/templates/gold", e.do("DELETE", "/api/templates/gold", "", "If-Match", "*"))
	// The console's Quota templates page saves the whole section.
	check("PUT /api/config/user_limit", e.do("PUT", "/api/config/user_limit", `{"templates":[{"name":"silver"}]}`, "If-Match", "*"))
	if len(e.store.Load().UserLimit.Templates) != 2 {
		t.Fatal("a refused deletion deleted the template")
	}
}
