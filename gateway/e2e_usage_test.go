package gateway

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/infera/infera/govern"
	"github.com/infera/infera/internal/testsrv"
)

// The admin API's GET /api/users/{name}/usage answers where a user stands
// from the router's own counters: after two requests (one refused by the
// RPM bucket) it counts the served one in the day's quota with the
// engine's usage, and the buckets as they were left; with the counters in
// Redis, a second router's requests are counted too.
func TestE2EAdminUserUsageIsTheRoutersCounters(t *testing.T) {
	for _, state := range []string{"memory", "redis"} {
		t.Run(state, func(t *testing.T) {
			clearOfMidnight(t, "Asia/Tokyo", 30*time.Second) // the day's quota is read whole
			_, eng := startEngine(t, "--speedup", "50")
			key, hash := newKey(t)
			cfg := filepath.Join(t.TempDir(), "infera.json")
			writeConfig(t, cfg, fmt.Sprintf(`{
				"user_limit": {"timezone": "Asia/Tokyo", "templates": [{"name": "std", "default": true,
					"rate": {"enabled": true, "rpm": 2, "tpm": 1000},
					"quota": {"enabled": true, "windows": [{"period": "day", "max_requests": 100, "max_tokens": 1000000}]},
					"concurrency": {"enabled": true, "limit": 4}}]},
				"users": [{"name": "usage-ann", "keys": [%q]}, {"name": "usage-ben", "keys": []}]}`, hash))
			args := []string{"--workers", eng, "--config", cfg}
			if state == "redis" {
				args = append(args, "--state", testsrv.StartRedis(t).URL)
			}
			ag := startAdminServe(t, args...)
			other := ag.router
			if state == "redis" {
				_, other = startServe(t, args...)
			}
			body := chatJSON("sim-model", "hello usage", 2, false)
			a := govPost(t, ag.router, key, body)
			a.want(t, 200, "")
			govPost(t, other, key, body).want(t, 200, "")
			govPost(t, ag.router, key, body).want(t, 429, "rate_limit_rpm")

			// A request's end reaches Redis with its router's next round
			// trip, or --state-end-delay after it: the other router's may
			// still be on its way.
			var r apiResp
			var st govern.UserStatus
			for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
				r = ag.api("GET", "/api/users/usage-ann/usage", "")
				st = govern.UserStatus{}
				if r.status != 200 || json.Unmarshal(r.body, &st) != nil {
					t.Fatalf("usage: %s", r)
				}
				if st.Active == 0 || time.Now().After(deadline) {
					break
				}
			}
			served := float64(2 * (a.usage.prompt + a.usage.completion)) // weights 1: both asked the same
			// The TPM bucket refills 1000 a minute (the 36 tokens taken in
			// about 2 s).
			if st.User != "usage-ann" || st.Template != "std" || st.Active != 0 || st.ConcurrencyLimit != 4 || st.Queued != 0 ||
				st.RPM == nil || st.RPM.Limit != 2 || st.RPM.Remaining != 0 || st.RPM.ResetMS < 55_000 || st.RPM.ResetMS > 60_000 ||
				st.TPM == nil || st.TPM.Remaining < 1000-int64(served) || st.TPM.Remaining >= 1000 ||
				len(st.Quota) != 1 || st.Quota[0].Period != "day" || st.Quota[0].Requests != 2 || st.Quota[0].Tokens != served ||
				st.Quota[0].MaxRequests != 100 || st.Quota[0].MaxTokens != 1e6 || st.Quota[0].Start[len(st.Quota[0].Start)-6:] != "+09:00" {
				t.Fatalf("usage of ann after two served requests of %v tokens and one refused:\n%s", served/2, r.body)
			}
			if r := ag.api("GET", "/api/users/usage-ben/usage", ""); r.status != 200 || string(r.body) != `{"user":"usage-ben","template":"std","dry_run":false,"enabled":true,"active":0,"concurrency_limit":4,"queued":0,"rpm":{"limit":2,"remaining":2,"reset_ms":0},"tpm":{"limit":1000,"remaining":1000,"reset_ms":0},"quota":[{"period":"day","start":"`+st.Quota[0].Start+`","end":"`+st.Quota[0].End+`","requests":0,"max_requests":100,"tokens":0,"max_tokens":1000000}]}`+"\n" {
				t.Fatalf("ben, who sent nothing: %s", r)
			}
			if r := ag.api("GET", "/api/users/nobody/usage", ""); r.status != 404 {
				t.Fatalf("an unknown user: %s", r)
			}
		})
	}
}

// clearOfMidnight waits, when the next midnight in zone is closer than d,
// until it has passed: a test that reads a day's quota whole must not
// straddle two days.
func clearOfMidnight(t *testing.T, zone string, d time.Duration) {
	t.Helper()
	loc, err := time.LoadLocation(zone)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().In(loc)
	y, m, day := now.Date()
	if left := time.Date(y, m, day+1, 0, 0, 0, 0, loc).Sub(now); left < d {
		time.Sleep(left + 100*time.Millisecond)
	}
}
