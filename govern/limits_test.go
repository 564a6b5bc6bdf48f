package govern

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"testing"
	"time"
)

// An admission tells the user's RPM and TPM buckets as it left them:
// what is left after its pre-deduction and when each is full again; a
// refusal tells them as they stood; a queued request granted later tells
// them at its grant. The same with the counters in Redis.
func TestAdmissionsTellTheBucketsTheyLeft(t *testing.T) {
	for _, state := range []string{"memory", "redis"} {
		t.Run(state, func(t *testing.T) {
			key, hash := mintKey(t)
			clk := newFakeClock(t0)
			o := Options{Now: clk.Now}
			if state == "redis" {
				o = redisOptions(t, startRedis(t))
				o.Now = clk.Now
			}
			g := newGov(t, o, userConfig(t, hash, `{"name":"t",
				"rate":{"enabled":true,"rpm":3,"tpm":1000},
				"concurrency":{"enabled":true,"limit":1,"overlimit":"queue","queue_size":2,"queue_timeout_ms":5000}}`, ""))
			u := identify(t, g, key)
			r := Request{PromptTokens: 100, MaxTokens: 50}
			tk := admitOK(t, g, u, r)
			// 150 tokens taken of 1000 a minute: back in 9 s; one request of
			// 3 a minute: back in 20 s.
			want := Limits{RPM: 3, TPM: 1000, Requests: 2, Tokens: 850, RequestsReset: 20e9, TokensReset: 9e9}
			if got := tk.Limits(); got != want {
				t.Fatalf("first admission: %+v, want %+v", got, want)
			}
			queued := make(chan Ticket, 1)
			go func() {
				tk, rej := g.Admit(context.Background(), u, r)
				if rej != nil {
					t.Error(rej)
				}
				queued <- tk
			}()
			waitFor(t, func() bool { return queuedOf(u) == 1 })
			clk.Advance(3 * time.Second) // 50 tokens and 0.15 requests flow back
			tk.FirstToken()
			tk.Done(Usage{})
			tk2 := <-queued
			want = Limits{RPM: 3, TPM: 1000, Requests: 1, Tokens: 750, RequestsReset: 37e9, TokensReset: 15e9}
			if got := tk2.Limits(); got != want {
				t.Fatalf("queued admission: %+v, want %+v", got, want)
			}
			tk2.FirstToken()
			tk2.Done(Usage{})
			tk3 := admitOK(t, g, u, r)
			tk3.FirstToken()
			tk3.Done(Usage{Known: true, PromptTokens: 100, CompletionTokens: 50})
			_, rej := g.Admit(context.Background(), u, r)
			if rej == nil || rej.Code != CodeRPM {
				t.Fatalf("fourth request: %v, want %s", rej, CodeRPM)
			}
			// 0.15 request left of 3: 17 s until one fits, 57 s until full.
			want = Limits{RPM: 3, TPM: 1000, Requests: 0, Tokens: 600, RequestsReset: 57e9, TokensReset: 24e9}
			// (Redis's script rounds its retry time up from a level a hair
			// under 0.15: 17.000001 s, which Retry-After says as 18.)
			if rej.Limits != want || rej.RetryAfter < 17 || rej.RetryAfter > 18 || (state == "memory" && rej.RetryAfter != 17) {
				t.Fatalf("refusal: %+v retry %d, want %+v retry 17", rej.Limits, rej.RetryAfter, want)
			}
		})
	}
}

func TestDryRunAdmissionsTellNoLimits(t *testing.T) {
	key, hash := mintKey(t)
	g := newGov(t, Options{}, userConfig(t, hash, `{"name":"t","dry_run":true,"rate":{"enabled":true,"rpm":1}}`, ""))
	u := identify(t, g, key)
	for range 3 {
		tk := admitOK(t, g, u, Request{})
		if l := tk.Limits(); l.Any() {
			t.Fatalf("dry run: %+v", l)
		}
		tk.Done(Usage{})
	}
}

// UserStatus tells where a user stands: the buckets refilled to now, the
// current window of each quota (counted with the engine's weighted usage)
// with its bounds in the timezone, the slots held and the queue; with
// Redis the shared counters. A user without a template, or unknown, says so.
func TestUserStatusTellsBucketsWindowsAndSlots(t *testing.T) {
	for _, state := range []string{"memory", "redis"} {
		t.Run(state, func(t *testing.T) {
			key, hash := mintKey(t)
			clk := newFakeClock(t0) // Wednesday 12:00 UTC
			o := Options{Now: clk.Now}
			if state == "redis" {
				o = redisOptions(t, startRedis(t))
				o.Now = clk.Now
			}
			c := parseConfig(t, fmt.Sprintf(`{
				"user_limit": {"timezone": "Europe/Berlin", "templates": [{"name": "t",
					"rate": {"enabled": true, "rpm": 3, "tpm": 1000},
					"quota": {"enabled": true, "weights": {"input": 1, "output": 2, "cached": 0.5},
						"windows": [{"period": "day", "max_requests": 10}, {"period": "month", "max_tokens": 5000}]},
					"concurrency": {"enabled": true, "limit": 2}}]},
				"users": [{"name": "alice", "keys": [%q], "template": "t"}, {"name": "bob", "keys": []}]}`, hash))
			g := newGov(t, o, c)
			u := identify(t, g, key)
			done := admitOK(t, g, u, Request{PromptTokens: 100, MaxTokens: 50})
			done.FirstToken()
			done.Done(Usage{Known: true, PromptTokens: 100, CachedTokens: 40, CompletionTokens: 30}) // 60 + 20 + 60 = 140 weighted
			held := admitOK(t, g, u, Request{PromptTokens: 10, MaxTokens: 10})
			clk.Advance(6 * time.Second) // 0.3 request and 100 tokens flow back
			st, err := g.UserStatus("alice")
			if err != nil {
				t.Fatal(err)
			}
			// RPM: 3 - 2 + 0.3 = 1.3; TPM: 1000 - 130 (reconciled) - 20 + 100 = 950.
			want := UserStatus{User: "alice", Template: "t", Enabled: true, Active: 1, ConcurrencyLimit: 2,
				RPM: &BucketStatus{Limit: 3, Remaining: 1, ResetMS: 34000},
				TPM: &BucketStatus{Limit: 1000, Remaining: 950, ResetMS: 3000},
				Quota: []WindowStatus{
					{Period: "day", Start: "2025-06-04T00:00:00+02:00", End: "2025-06-05T00:00:00+02:00", Requests: 2, MaxRequests: 10, Tokens: 140 + 30},
					{Period: "month", Start: "2025-06-01T00:00:00+02:00", End: "2025-07-01T00:00:00+02:00", Requests: 2, Tokens: 140 + 30, MaxTokens: 5000},
				}}
			if !reflect.DeepEqual(st, want) {
				t.Fatalf("alice:\n%s\nwant\n%s", js(st), js(want))
			}
			held.Done(Usage{})
			st, _ = g.UserStatus("alice")
			if st.Active != 0 || st.Quota[0].Requests != 1 || st.Quota[0].Tokens != 140 {
				t.Fatalf("after the held request was refunded: %s", js(st))
			}
			if st, err := g.UserStatus("bob"); err != nil || st.Template != "" || st.RPM != nil || st.Quota != nil {
				t.Fatalf("bob (no template): %s %v", js(st), err)
			}
			if _, err := g.UserStatus("carol"); err != ErrNoUser {
				t.Fatalf("carol: %v, want ErrNoUser", err)
			}
		})
	}
}

// A user bound to a template whose capabilities are all off still names
// it: the template limits nothing, but it is the user's.
func TestUserStatusNamesATemplateWithEveryCapabilityOff(t *testing.T) {
	c := parseConfig(t, `{"user_limit": {"templates": [{"name": "off",
			"rate": {"enabled": false, "rpm": 3}, "concurrency": {"enabled": false, "limit": 1}}]},
		"users": [{"name": "bob", "keys": [], "template": "off"}]}`)
	g := newGov(t, Options{}, c)
	st, err := g.UserStatus("bob")
	if err != nil || st.Template != "off" || st.RPM != nil || st.ConcurrencyLimit != 0 {
		t.Fatalf("bob: %s %v", js(st), err)
	}
}

func js(v any) string {
	b, _ := json.MarshalIndent(v, "", "  ")
	return string(b)
}

// A bucket below zero (an admission larger than what was left, which the
// TPM estimate allows) is full again later than a minute: the reset said
// 60 s (X-Ratelimit-Reset-Tokens: 1m0s, reset_ms 60000) while Retry-After
// said 101 s.
func TestABucketBelowZeroResetsAfterMoreThanAMinute(t *testing.T) {
	for _, c := range []struct {
		capacity   int64
		level      float64
		left       int64
		resetNanos int64
	}{
		{600, 600, 600, 0},
		{600, 300, 300, 30e9},
		{600, 0, 0, 60e9},
		{600, -414, 0, 101.4e9},
		{2, -4, 0, 180e9},
		{600, 700, 600, 0},
	} {
		left, reset := bucketLeft(c.capacity, c.level)
		if left != c.left || reset != c.resetNanos {
			t.Errorf("bucketLeft(%d, %g) = %d, %d; want %d, %d", c.capacity, c.level, left, reset, c.left, c.resetNanos)
		}
	}
}

// A quota window's refusal tells the time to the window's end to the
// millisecond in RetryAfterMS (Retry-After-Ms), as RPM and TPM refusals
// do; it was whole seconds, up to a second late. Both backends.
func TestAQuotaRefusalTellsTheWindowsEndToTheMillisecond(t *testing.T) {
	for _, state := range []string{"memory", "redis"} {
		t.Run(state, func(t *testing.T) {
			key, hash := mintKey(t)
			// 250 ms past 23:00 UTC: the day ends in 3599.75 s.
			clk := newFakeClock(time.Date(2025, 6, 4, 23, 0, 0, 250e6, time.UTC))
			o := Options{Now: clk.Now}
			if state == "redis" {
				o = redisOptions(t, startRedis(t))
				o.Now = clk.Now
			}
			g := newGov(t, o, userConfig(t, hash, `{"name":"t","quota":{"enabled":true,"windows":[{"period":"day","max_requests":1}]}}`, ""))
			u := identify(t, g, key)
			tk := admitOK(t, g, u, Request{})
			tk.FirstToken()
			tk.Done(Usage{})
			rej := admitRejected(t, g, u, Request{}, CodeQuotaRequestsDay)
			if rej.RetryAfter != 3600 || rej.RetryAfterMS != 3_599_750 {
				t.Fatalf("retry after %d s, %d ms; want 3600 s, 3599750 ms", rej.RetryAfter, rej.RetryAfterMS)
			}
		})
	}
}

// A refusal outside the allowed periods tells the user's RPM and TPM
// buckets as they stand, as every other refusal of such a user does (it
// told none: the x-ratelimit-* headers were missing from it alone).
func TestAPeriodRefusalTellsTheBuckets(t *testing.T) {
	key, hash := mintKey(t)
	clk := newFakeClock(time.Date(2025, 6, 4, 12, 0, 0, 0, time.UTC)) // a Wednesday
	g := newGov(t, Options{Now: clk.Now}, userConfig(t, hash, `{"name":"t",
		"periods":{"enabled":true,"segments":[{"days":["mon"],"start":"00:00","end":"23:59"}]},
		"rate":{"enabled":true,"rpm":60,"tpm":1000}}`, ""))
	u := identify(t, g, key)
	rej := admitRejected(t, g, u, Request{}, CodeOutsidePeriod)
	want := Limits{RPM: 60, TPM: 1000, Requests: 60, Tokens: 1000}
	if rej.Limits != want {
		t.Fatalf("limits %+v, want %+v", rej.Limits, want)
	}
}

// A TPM bucket far below zero (behind a reservation of a huge max_tokens,
// which a full bucket admits, or a settlement with an engine's absurd
// usage) is a wait of centuries: a refusal says so (Retry-After at its
// bound, X-Should-Retry territory) and the bucket's reset is that long, not
// a wrapped number (the nanoseconds overflowed int64: no Retry-After at
// all, a reset of 0, or with Redis a random one).
func TestATPMBucketFarBelowZeroTellsALongWaitNotAWrappedOne(t *testing.T) {
	for _, state := range []string{"memory", "redis"} {
		t.Run(state, func(t *testing.T) {
			for _, how := range []string{"reservation", "usage"} {
				key, hash := mintKey(t)
				clk := newFakeClock(t0)
				o := Options{Now: clk.Now}
				if state == "redis" {
					o = redisOptions(t, startRedis(t))
					o.Now = clk.Now
				}
				g := newGov(t, o, userConfig(t, hash, `{"name":"t","rate":{"enabled":true,"tpm":1000}}`, ""))
				u := identify(t, g, key)
				big := admitOK(t, g, u, Request{PromptTokens: 10, MaxTokens: 1 << 40})
				if how == "usage" {
					big.FirstToken()
					big.Done(Usage{Known: true, PromptTokens: 1 << 43, CompletionTokens: 1 << 43})
					if state == "redis" {
						syncState(t, g)
					}
				}
				_, rej := g.Admit(context.Background(), u, Request{PromptTokens: 10, MaxTokens: 10})
				if rej == nil || rej.Code != CodeTPM {
					t.Fatalf("%s: %v, want %s", how, rej, CodeTPM)
				}
				if rej.RetryAfter < 1<<31-1 || rej.RetryAfterMS <= 0 {
					t.Errorf("%s: Retry-After %d s (%d ms), want the bound, %d s: the bucket is refilled in centuries", how, rej.RetryAfter, rej.RetryAfterMS, 1<<31-1)
				}
				if l := rej.Limits; l.Tokens != 0 || l.TokensReset < 1<<62 {
					t.Errorf("%s: limits %+v, want no tokens left and a reset of centuries", how, l)
				}
				big.Done(Usage{})
			}
		})
	}
}
