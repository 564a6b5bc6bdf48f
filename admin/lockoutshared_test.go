package admin

import (
	"context"
	"io"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/infera/infera/config"
	"github.com/infera/infera/govern"
	"github.com/redis/go-redis/v9"
)

// With the admin lockout shared through Redis and Redis down, wrong admin
// keys count in this process alone, as without Redis: the address is
// locked out after maxAuthFailures of them, and each wrong key Redis
// could not count is counted.
func TestWithRedisDownWrongAdminKeysLockTheAddressInThisProcess(t *testing.T) {
	rs := startRedis(t)
	g, err := govern.New(govern.Options{State: "redis://" + rs.addr() + "/0"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Close() })
	a, err := New(Options{Store: config.NewStore("", nil), Key: testKey, Addr: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	a.ShareLockouts(g.Lockouts("admin"))
	if a.shared == nil {
		t.Fatal("an admin listener with a key does not share its lockout")
	}
	if err := a.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	url := "http://" + a.ln.Addr().String() + "/api/version"
	get := func(key string) int {
		t.Helper()
		req, _ := http.NewRequest("GET", url, nil)
		req.Header.Set("Authorization", "Bearer "+key)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, res.Body)
		res.Body.Close()
		return res.StatusCode
	}
	if st := get(testKey); st != 200 {
		t.Fatalf("the right key: %d", st)
	}
	rs.stop()
	errs := mLockoutStateCountErrors.Get()
	for i := 0; i < maxAuthFailures; i++ {
		if st := get("wrong-admin-key"); st != 401 {
			t.Fatalf("wrong key %d: %d", i+1, st)
		}
	}
	// Sent to Redis without waiting: the failures are counted a moment
	// after the 401s.
	for deadline := time.Now().Add(5 * time.Second); mLockoutStateCountErrors.Get()-errs < maxAuthFailures && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	if got := mLockoutStateCountErrors.Get() - errs; got != maxAuthFailures {
		t.Fatalf("%d wrong keys counted as not shared, want %d", got, maxAuthFailures)
	}
	if st := get(testKey); st != 429 {
		t.Fatalf("the right key after %d wrong ones, Redis down: %d", maxAuthFailures, st)
	}
}

// The admin listener whose wrong key brings an address's shared count to
// maxAuthFailures answers it 401 at once and holds the address's next
// request until Redis's answer arrives, even while Redis is slow to
// answer: that request is refused as locked out, its right key included.
func TestTheNextAdminRequestAfterTheKeyThatLocksTheAddressIsRefused(t *testing.T) {
	rs := startRedis(t)
	g, err := govern.New(govern.Options{State: rs.url()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Close() })
	a, err := New(Options{Store: config.NewStore("", nil), Key: testKey, Addr: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	a.ShareLockouts(g.Lockouts("admin"))
	if err := a.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	url := "http://" + a.ln.Addr().String() + "/api/version"
	get := func(key string) int {
		t.Helper()
		req, _ := http.NewRequest("GET", url, nil)
		req.Header.Set("Authorization", "Bearer "+key)
		res, err := (&http.Client{Transport: &http.Transport{DisableKeepAlives: true}}).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, res.Body)
		res.Body.Close()
		return res.StatusCode
	}
	c := redis.NewClient(&redis.Options{Addr: rs.addr(), MaxRetries: -1})
	defer c.Close()
	ctx := context.Background()
	// maxAuthFailures-1 wrong keys counted through other routers.
	if err := c.Set(ctx, "infera:lockout:admin:127.0.0.1", maxAuthFailures-1, 30*time.Second).Err(); err != nil {
		t.Fatal(err)
	}
	// Keep Redis busy for 500 ms (a Lua loop: every client waits).
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.Eval(ctx, `local s = redis.call('TIME')
repeat local n = redis.call('TIME') until (n[1] - s[1]) * 1000000 + (n[2] - s[2]) > 500000
return 1`, nil)
	}()
	for deadline := time.Now().Add(2 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		p := redis.NewClient(&redis.Options{Addr: rs.addr(), MaxRetries: -1, ReadTimeout: 20 * time.Millisecond})
		err := p.Ping(ctx).Err()
		p.Close()
		if err != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("redis-server never became busy")
		}
	}
	start := time.Now()
	if st := get("wrong-admin-key"); st != 401 || time.Since(start) > 300*time.Millisecond {
		t.Fatalf("the wrong key that reaches the shared limit: %d after %v, want 401 at once", st, time.Since(start))
	}
	if st := get(testKey); st != 429 {
		t.Fatalf("the locked address's next request, its right key: %d, want 429", st)
	}
	<-done
	if n, _ := strconv.Atoi(c.Get(ctx, "infera:lockout:admin:127.0.0.1").Val()); n != maxAuthFailures {
		t.Fatalf("Redis counts %d, want %d", n, maxAuthFailures)
	}
}
