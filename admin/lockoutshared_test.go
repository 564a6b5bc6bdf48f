package admin

import (
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/infera/infera/config"
	"github.com/infera/infera/govern"
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
