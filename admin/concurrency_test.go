package admin

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
)

// Two operators with the same ETag: exactly one write wins, the others get
// 409. Writes without If-Match (user creation) never lose each other.
func TestConcurrentWritesNeverLoseUpdates(t *testing.T) {
	e := newEnv(t, envOpts{file: `{}`})
	tag := e.etag()
	var ok, conflict atomic.Int32
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			r := e.do("PUT", "/api/config/session_affinity", fmt.Sprintf(`{"ttl_s":%d}`, 100+i), "If-Match", tag)
			switch r.status {
			case 200:
				ok.Add(1)
			case 409:
				conflict.Add(1)
			default:
				t.Errorf("status %d: %s", r.status, r.body)
			}
		}(i)
	}
	wg.Wait()
	if ok.Load() != 1 || conflict.Load() != 7 {
		t.Fatalf("same ETag: %d applied, %d conflicts", ok.Load(), conflict.Load())
	}
	v := e.store.Version()
	for i := 0; i < 12; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			if r := e.do("POST", "/api/users", fmt.Sprintf(`{"name":"user-%d"}`, i)); r.status != 201 {
				t.Errorf("create user-%d: %d %s", i, r.status, r.body)
			}
		}(i)
	}
	wg.Wait()
	if n := len(e.store.Load().Users); n != 12 || e.store.Version() != v+12 {
		t.Fatalf("%d users at version %d (from %d)", n, e.store.Version(), v)
	}
}
