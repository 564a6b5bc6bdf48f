package admin

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Redis restarted from its persistence (an RDB written a little before a
// crash, or a failover to a replica behind the primary) comes back with an
// older version of the management data than the replicas serve. A replica
// that notices writes its own document back, and writes then work and
// reach every replica again.
//
// This used to go wrong: the replicas ignored Redis's older version (not
// newer than theirs), and every API write on every replica then failed
// with 409 after retrying for 10 s (the compare-and-set sent the replica's
// version, Redis held its older one, and there was nothing newer to
// adopt), until someone edited Redis by hand; and a write that did get
// through would have restarted the versions below what the replicas
// held, so they would never have adopted it.
func TestRedisRestoredWithOlderDataGetsTheReplicasDataBack(t *testing.T) {
	rs := startRedis(t)
	a := newEnv(t, envOpts{state: rs.url()})
	b := newEnv(t, envOpts{state: rs.url()})
	if r := a.do("POST", "/api/users", `{"name":"dave"}`); r.status != 201 {
		t.Fatalf("create dave: %d %s", r.status, r.body)
	}
	eventually(t, 2*time.Second, "B sees dave", func() bool { return len(b.store.Load().Users) == 1 })
	c := redis.NewClient(&redis.Options{Addr: rs.addr()})
	defer c.Close()
	if err := c.Save(context.Background()).Err(); err != nil { // the RDB point
		t.Fatal(err)
	}
	rdbVer := a.store.Version()
	// Two more writes after the RDB point.
	a.put("load_balancing", `{"algorithm":"round-robin"}`, 200)
	a.put("debug", `{"decision_header":true}`, 200)
	eventually(t, 2*time.Second, "B adopts", func() bool { return b.store.Load().Debug.DecisionHeader })
	vb := b.store.Version()
	// Crash (no save at shutdown) and restart from the RDB.
	rs.restart()
	// Redis came back at rdbVer; a replica that reconnects at once may
	// already have written its data back (at vb) before this read.
	if v, err := c.HGet(context.Background(), "infera:admin:data", "version").Uint64(); err != nil || v != rdbVer && v != vb {
		t.Fatalf("Redis restarted from the RDB holds version %d (%v), want %d (or %d, restored)", v, err, rdbVer, vb)
	}
	time.Sleep(time.Second) // the routers notice Redis again
	// Operator deletes dave on A (If-Match: *: whatever is current).
	t0 := time.Now()
	r := a.do("DELETE", "/api/users/dave", "", "If-Match", "*")
	if r.status/100 != 2 {
		t.Fatalf("after Redis came back from its RDB (Redis at version %d, replicas at %d), DELETE /api/users/dave with If-Match: * on A answered %d after %v: %s", rdbVer, a.store.Version(), r.status, time.Since(t0).Round(time.Millisecond), r.body)
	}
	// The versions go on from the replicas', not from Redis's older one.
	if v, err := c.HGet(context.Background(), "infera:admin:data", "version").Uint64(); err != nil || v != vb+1 || a.store.Version() != vb+1 {
		t.Fatalf("the delete after Redis came back at version %d (replicas at %d): Redis at version %d (%v), A at %d; want both at %d", rdbVer, vb, v, err, a.store.Version(), vb+1)
	}
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) && len(b.store.Load().Users) != 0 {
		time.Sleep(20 * time.Millisecond)
	}
	if n := len(b.store.Load().Users); n != 0 {
		t.Fatalf("3 s after dave was deleted on replica A (A version %d), replica B (version %d, was %d before the restart) still serves %d user(s)", a.store.Version(), b.store.Version(), vb, n)
	}
	if !b.store.Load().Debug.DecisionHeader || b.store.Load().LoadBalancing.Algorithm != "round-robin" {
		t.Fatal("B lost the writes made after the RDB point")
	}
}

// A write that reaches Redis before the periodic check has noticed its
// older data puts the replica's data back itself and lands, conditional
// (with the ETag the replica answered) or not, at the next version above
// the replica's.
func TestAWriteOnRedisWithOlderDataLandsAboveTheReplicasVersion(t *testing.T) {
	rs := startRedis(t)
	a := newEnv(t, envOpts{state: rs.url(), syncInterval: time.Hour})
	c := redis.NewClient(&redis.Options{Addr: rs.addr()})
	defer c.Close()
	ctx := context.Background()
	a.put("load_balancing", `{"algorithm":"round-robin"}`, 200)
	old, err := c.HGetAll(ctx, "infera:admin:data").Result()
	if err != nil {
		t.Fatal(err)
	}
	a.put("debug", `{"decision_header":true}`, 200)
	v := a.store.Version()
	// Redis goes back to the older data, without a message (a failover to
	// a replica that had not received the last write).
	if err := c.HSet(ctx, "infera:admin:data", old).Err(); err != nil {
		t.Fatal(err)
	}
	r := a.do("PUT", "/api/config/session_affinity", `{"ttl_s":77}`, "If-Match", a.etag())
	if r.status != 200 {
		t.Fatalf("conditional write with the current ETag on Redis holding version %s (replica at %d): %d %s", old["version"], v, r.status, r.body)
	}
	if r := a.do("PUT", "/api/config/session_affinity", `{"ttl_s":78}`, "If-Match", "*"); r.status != 200 {
		t.Fatalf("unconditional write: %d %s", r.status, r.body)
	}
	got, err := c.HGetAll(ctx, "infera:admin:data").Result()
	if err != nil {
		t.Fatal(err)
	}
	if got["version"] != strconv.FormatUint(v+2, 10) || a.store.Version() != v+2 {
		t.Fatalf("Redis at version %s, the replica at %d; want both at %d", got["version"], a.store.Version(), v+2)
	}
	cfg, err := a.a.st.(*redisStorage).parse(got["doc"])
	if err != nil {
		t.Fatal(err)
	}
	if !cfg.Debug.DecisionHeader || cfg.LoadBalancing.Algorithm != "round-robin" || cfg.SessionAffinity.TTLSeconds != 78 {
		t.Fatalf("Redis lost a write: decision header %v, algorithm %q, session TTL %v", cfg.Debug.DecisionHeader, cfg.LoadBalancing.Algorithm, cfg.SessionAffinity.TTLSeconds)
	}
}
