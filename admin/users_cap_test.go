package admin

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/infera/infera/config"
)

// manyUsers is a config file with users u0..u(n-1), without keys.
func manyUsers(n int) string {
	var b strings.Builder
	b.WriteString(`{"users":[`)
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"name":"u%d"}`, i)
	}
	b.WriteString("]}")
	return b.String()
}

// wantUsersCapRefusal checks a refused creation: 409 naming the cap, no
// key minted, nothing changed.
func wantUsersCapRefusal(t *testing.T, e *env, name string) {
	t.Helper()
	before, v := e.store.Current()
	r := e.do("POST", "/api/users", fmt.Sprintf(`{"name":%q}`, name))
	if r.status != 409 || strings.Contains(string(r.body), config.KeyPrefix) {
		t.Fatalf("creating %s at %d users: %d %.300s, want 409 without a key", name, len(before.Users), r.status, r.body)
	}
	if _, msg := r.errPath(t); !strings.Contains(msg, fmt.Sprint(config.MaxAPIUsers)) || !strings.Contains(msg, "delete") {
		t.Fatalf("the refusal does not name the cap and what to do: %s", msg)
	}
	if after, av := e.store.Current(); after != before || av != v {
		t.Fatal("a refused creation changed the config")
	}
}

// POST /api/users had no bound: a script in a loop grew the users list,
// and with it every write's cost, every snapshot and Redis, without end.
// It now creates no user once there are config.MaxAPIUsers (409); a
// deletion makes room, and data holding more still loads and takes other
// writes.
func TestCreateUserStopsAtTheUsersCap(t *testing.T) {
	e := newEnv(t, envOpts{file: manyUsers(config.MaxAPIUsers - 1)})
	if r := e.do("POST", "/api/users", `{"name":"last"}`); r.status != 201 {
		t.Fatalf("user %d: %d %.300s", config.MaxAPIUsers, r.status, r.body)
	}
	wantUsersCapRefusal(t, e, "one-more")
	if r := e.do("DELETE", "/api/users/u7", "", "If-Match", e.etag()); r.status != 204 {
		t.Fatalf("delete: %d %.300s", r.status, r.body)
	}
	if r := e.do("POST", "/api/users", `{"name":"one-more"}`); r.status != 201 {
		t.Fatalf("a creation after a deletion: %d %.300s", r.status, r.body)
	}

	old := newEnv(t, envOpts{file: manyUsers(config.MaxAPIUsers + 2)})
	if n := len(old.store.Load().Users); n != config.MaxAPIUsers+2 {
		t.Fatalf("loaded %d users", n)
	}
	wantUsersCapRefusal(t, old, "another")
	if r := old.do("PUT", "/api/users/u3", `{"enabled":false}`, "If-Match", old.etag()); r.status != 200 {
		t.Fatalf("another write over the cap: %d %.300s", r.status, r.body)
	}
	if r := old.do("POST", "/api/users/u3/keys", ""); r.status != 201 {
		t.Fatalf("a key for a user over the users cap: %d %.300s", r.status, r.body)
	}
}

// With two replicas creating users at once just below the cap, every
// creation is checked against what Redis holds: exactly as many land as
// the cap leaves room for.
func TestRedisCreationsOnTwoReplicasStopAtTheUsersCap(t *testing.T) {
	rs := startRedis(t)
	a := newEnv(t, envOpts{state: rs.url(), file: manyUsers(config.MaxAPIUsers - 2)})
	b := newEnv(t, envOpts{state: rs.url()})
	var wg sync.WaitGroup
	var mu sync.Mutex
	codes := map[int]int{}
	for i := range 6 {
		e := a
		if i%2 == 1 {
			e = b
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := e.do("POST", "/api/users", fmt.Sprintf(`{"name":"new%d"}`, i))
			mu.Lock()
			codes[r.status]++
			mu.Unlock()
		}()
	}
	wg.Wait()
	if codes[201] != 2 || codes[409] != 4 {
		t.Fatalf("answers %v, want 2 201 and 4 409", codes)
	}
	for _, e := range []*env{a, b} {
		eventually(t, 5*time.Second, "both replicas at the cap", func() bool { return len(e.store.Load().Users) == config.MaxAPIUsers })
	}
}
