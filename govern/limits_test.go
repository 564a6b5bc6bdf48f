package govern

import (
	"context"
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
			waitFor(t, func() bool { u.st.mu.Lock(); defer u.st.mu.Unlock(); return u.st.q.n == 1 })
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
