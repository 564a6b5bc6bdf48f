package admin

import "testing"

// A user written through POST /api/users or PUT /api/users/{name} that the
// config refuses was answered at the config's path of the user
// (users[3].name, users[0].template), a position the client never sent
// and cannot map to its body: the error names the body's field.
func TestAUserWriteErrorNamesTheBodysField(t *testing.T) {
	e := newEnv(t, envOpts{file: `{"users":[{"name":"bob"},{"name":"carol"}]}`})
	f := func(method, path, body, want string) {
		t.Helper()
		r := e.do(method, path, body, "If-Match", "*")
		got, msg := r.errPath(t)
		if r.status != 400 || got != want {
			t.Fatalf("%s %s %s: %d at %q (%s), want 400 at %q", method, path, body, r.status, got, msg, want)
		}
	}
	f("POST", "/api/users", `{"name":"a b"}`, "name")
	f("POST", "/api/users", `{"name":""}`, "name")
	f("POST", "/api/users", `{"name":"dan","template":"nope"}`, "template")
	f("POST", "/api/users", `{"name":"dan","models":["ok",""]}`, "models[1]")
	f("PUT", "/api/users/carol", `{"template":"nope"}`, "template")
	f("PUT", "/api/users/carol", `{"models":[""]}`, "models[0]")
}
