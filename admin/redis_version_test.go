package admin

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/infera/infera/config"
)

// Two replicas on one Redis, six writers: a replica's config version only
// ever grows (its Redis sync never adopts an older version than its own,
// which a write of its own may have passed since the sync read Redis).
func TestARedisReplicaNeverGoesBackToAnOlderConfig(t *testing.T) {
	rs := startRedis(t)
	a := newEnv(t, envOpts{state: rs.url()})
	b := newEnv(t, envOpts{state: rs.url()})
	var back atomic.Int64
	var mu sync.Mutex
	var last uint64
	var example string
	a.store.OnChange(func(old, cur *config.Config) {
		v := a.store.Version()
		mu.Lock()
		if v < last {
			back.Add(1)
			if example == "" {
				example = fmt.Sprintf("version %d after %d", v, last)
			}
		}
		last = v
		mu.Unlock()
	})
	deadline := time.Now().Add(5 * time.Second)
	var wg sync.WaitGroup
	for g := 0; g < 6; g++ {
		e := a
		if g%3 == 0 {
			e = b
		}
		wg.Add(1)
		go func(g int, e *env) {
			defer wg.Done()
			for i := 0; time.Now().Before(deadline) && back.Load() == 0; i++ {
				e.do("PATCH", "/api/config/session_affinity", fmt.Sprintf(`{"ttl_s":%d}`, g*100000+i+1), "If-Match", "*")
			}
		}(g, e)
	}
	wg.Wait()
	if n := back.Load(); n > 0 {
		t.Fatalf("replica A went back to an older version %d time(s), e.g. %s", n, example)
	}
}

// One replica, one client, nobody else writing: each write carries the
// ETag the previous write answered, and none may get 409 (the replica's
// Redis sync must never roll it back to its own older version).
func TestALoneWriterOverRedisNeverGetsASpurious409(t *testing.T) {
	rs := startRedis(t)
	a := newEnv(t, envOpts{state: rs.url()})
	tag := a.etag()
	for i := 0; i < 1000; i++ {
		r := a.do("PATCH", "/api/config/session_affinity", fmt.Sprintf(`{"ttl_s":%d}`, i+1), "If-Match", tag)
		if r.status != 200 {
			t.Fatalf("write %d with the ETag of the previous answer: %d %s", i, r.status, r.body)
		}
		tag = r.etag
	}
}
