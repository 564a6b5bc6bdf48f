package gateway

import (
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/infera/infera/internal/testsrv"
)

// Two router processes sharing a redis-server that restarts empty (no
// persistence) while one of them relays a user's stream: within a lease
// renewal (LeaseTTL/3, 5 s) the stream's concurrency slot and seat count
// again, so the other router refuses the user's next request; they free
// when the stream ends.
func TestE2EGovernRedisRestartedEmptyCountsTheStreamsInFlightAgain(t *testing.T) {
	rd := testsrv.StartStoppableRedis(t)
	_, eng := startEngine(t) // real time: the held stream lasts about 25 s, far past the test
	k, h := newKey(t)
	cfg := filepath.Join(t.TempDir(), "infera.json")
	writeConfig(t, cfg, fmt.Sprintf(`{
		"rate_limit": {"scope": "gateway", "overall_concurrency": 1},
		"user_limit": {"templates": [{"name": "one", "concurrency": {"enabled": true, "limit": 1}}]},
		"users": [{"name": "kim", "keys": [%q], "template": "one"}]}`, h))
	args := []string{"--workers", "e1=" + eng, "--config", cfg, "--state", rd.URL, "--api-key", "admin-secret"}
	r1 := startChild(t, "serve", 0, args...).url
	r2 := startChild(t, "serve", 0, args...).url
	held := holdStream(t, r1, k)
	body := chatJSON("sim-model", "hi", 2, false)
	govPost(t, r2, k, body).want(t, 429, "concurrency_user")

	rd.Restart() // empty: the stream's slot and seat are gone
	start := time.Now()
	waitUntil(t, "the stream's slot counted again", func() bool {
		a := govPost(t, r2, k, body)
		if a.status != 200 && a.status != 429 {
			t.Fatalf("%d %s", a.status, a.body)
		}
		return a.status == 429
	})
	t.Logf("counted again %v after the restart", time.Since(start).Round(100*time.Millisecond))
	govPost(t, r2, "admin-secret", body).want(t, 429, "concurrency_overall") // the seat too (the global key: no user limits)

	held.Body.Close() // the client leaves: the slot and the seat are given back
	waitUntil(t, "the slot and seat freed", func() bool { return govPost(t, r2, k, body).status == 200 })
}
