package govern

import (
	"context"
	"testing"
	"time"
)

// An admission stamped just before a window's end that reaches Redis after
// another router began the next window counts in that next window
// (TestAQuotaWindowSurvivesALateAdmissionOfThePreviousOne), and its end is
// settled there: a refund gives its request back, a reconciliation
// replaces its estimate with its usage; and a refusal there tells the time
// to that window's end.
func TestALateAdmissionIsSettledInTheWindowItWasCountedIn(t *testing.T) {
	rs := startRedis(t)
	key, hash := mintKey(t)
	o := redisOptions(t, rs)
	midnight := time.Date(2026, 12, 6, 0, 0, 0, 0, time.UTC)
	c1 := newFakeClock(midnight.Add(time.Millisecond))
	c2 := newFakeClock(midnight.Add(-time.Millisecond))
	o1, o2 := o, o
	o1.Now, o2.Now = c1.Now, c2.Now
	c := userConfig(t, hash, `{"name":"t","quota":{"enabled":true,"windows":[{"period":"day","max_requests":3,"max_tokens":100}]}}`, "")
	g1, g2 := newGov(t, o1, c), newGov(t, o2, c)
	u1, u2 := identify(t, g1, key), identify(t, g2, key)
	r := Request{PromptTokens: 10, MaxTokens: 20} // an estimate of 30
	// The new day on router 1: one request of 30 tokens.
	tk := admitOK(t, g1, u1, r)
	tk.FirstToken()
	tk.Done(Usage{Known: true, PromptTokens: 10, CompletionTokens: 20})
	syncState(t, g1)
	// Router 2's last requests of the old day reach Redis now: one whose
	// engine failed (refunded), one served with 5 of its 30 tokens.
	admitOK(t, g2, u2, r).Done(Usage{})
	tk = admitOK(t, g2, u2, r)
	tk.FirstToken()
	tk.Done(Usage{Known: true, PromptTokens: 3, CompletionTokens: 2})
	syncState(t, g2)
	// The new day holds 2 requests and 35 tokens: 1 request and 65
	// tokens are left.
	h := rs.client(t)
	v, _ := h.HMGet(context.Background(), o.RedisPrefix+"{u:alice}", "w1r", "w1k").Result()
	if len(v) != 2 || v[0] != "2" || v[1] != "35000" {
		t.Fatalf("the new day's requests and milli-tokens: %v, want [2 35000]", v)
	}
	last := admitOK(t, g1, u1, Request{PromptTokens: 10, MaxTokens: 55}) // exactly what is left
	defer last.Done(Usage{})
	// Router 2 (still before midnight) refused in the new day: its
	// Retry-After runs to the new day's end, not to its own midnight.
	rej := admitRejected(t, g2, u2, Request{}, CodeQuotaRequestsDay)
	if rej.RetryAfter < 86400 {
		t.Fatalf("Retry-After %d s of a refusal in the day that ends in 86400 s", rej.RetryAfter)
	}
}

// In process too: an admission that read the clock just before a window's
// end and takes the user's lock after a request of the next window was
// admitted counts in the next window and keeps its count (it reset it, and
// the next request reset it again: the new window started from zero).
func TestALateAdmissionKeepsTheNextWindowsCountInProcess(t *testing.T) {
	key, hash := mintKey(t)
	midnight := time.Date(2026, 12, 6, 0, 0, 0, 0, time.UTC)
	clk := newFakeClock(midnight.Add(time.Millisecond))
	c := userConfig(t, hash, `{"name":"t","quota":{"enabled":true,"windows":[{"period":"day","max_requests":3,"max_tokens":100}]}}`, "")
	g := newGov(t, Options{Now: clk.Now}, c)
	u := identify(t, g, key)
	r := Request{PromptTokens: 10, MaxTokens: 20} // an estimate of 30
	tk := admitOK(t, g, u, r)
	tk.FirstToken()
	tk.Done(Usage{Known: true, PromptTokens: 10, CompletionTokens: 20})
	clk.Set(midnight.Add(-time.Millisecond)) // the late ones
	admitOK(t, g, u, r).Done(Usage{})
	tk = admitOK(t, g, u, r)
	tk.FirstToken()
	tk.Done(Usage{Known: true, PromptTokens: 3, CompletionTokens: 2})
	clk.Set(midnight.Add(2 * time.Millisecond))
	// 2 requests and 35 tokens counted: 1 request and 65 tokens left.
	last := admitOK(t, g, u, Request{PromptTokens: 10, MaxTokens: 55})
	defer last.Done(Usage{})
	rej := admitRejected(t, g, u, Request{}, CodeQuotaRequestsDay)
	if rej.RetryAfter < 86399 {
		t.Fatalf("Retry-After %d s", rej.RetryAfter)
	}
	clk.Set(midnight.Add(-time.Millisecond))
	if rej := admitRejected(t, g, u, Request{}, CodeQuotaRequestsDay); rej.RetryAfter < 86400 {
		t.Fatalf("Retry-After %d s of a late refusal in the day that ends in 86400 s", rej.RetryAfter)
	}
}

// A refusal counted in a month another router (or, in process, a request
// that read the clock later) began already tells the time to that month's
// real end, not to the end of a month as long as the router's own: past
// November (30 days) December ends 31 days after it began, past January
// (31 days) February 28 days after.
func TestALateRefusalRetriesAtTheEndOfTheMonthThatRefusedIt(t *testing.T) {
	rs := startRedis(t)
	key, hash := mintKey(t)
	c := userConfig(t, hash, `{"name":"t","quota":{"enabled":true,"windows":[{"period":"month","max_requests":1}]}}`, "")
	for _, tc := range []struct {
		name           string
		boundary, next time.Time // the later month's start and end
	}{
		{"december after november", time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC), time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC)},
		{"february after january", time.Date(2027, 2, 1, 0, 0, 0, 0, time.UTC), time.Date(2027, 3, 1, 0, 0, 0, 0, time.UTC)},
	} {
		late := tc.boundary.Add(-time.Millisecond) // the refused router's clock, in the month before
		check := func(t *testing.T, rej *Rejection) {
			t.Helper()
			want := tc.next.Sub(late)
			if rej.RetryAfterMS != want.Milliseconds() || rej.RetryAfter != int((want+time.Second-1)/time.Second) {
				t.Fatalf("Retry-After %d s (%d ms), want %d ms: the month that refused ends %v", rej.RetryAfter, rej.RetryAfterMS, want.Milliseconds(), tc.next)
			}
		}
		t.Run(tc.name+"/redis", func(t *testing.T) {
			o := redisOptions(t, rs)
			o1, o2 := o, o
			o1.Now = newFakeClock(tc.boundary.Add(time.Millisecond)).Now
			o2.Now = newFakeClock(late).Now
			g1, g2 := newGov(t, o1, c), newGov(t, o2, c)
			tk := admitOK(t, g1, identify(t, g1, key), Request{}) // the new month's one request
			tk.FirstToken()
			tk.Done(Usage{Known: true})
			syncState(t, g1)
			check(t, admitRejected(t, g2, identify(t, g2, key), Request{}, CodeQuotaRequestsMonth))
		})
		t.Run(tc.name+"/in process", func(t *testing.T) {
			clk := newFakeClock(tc.boundary.Add(time.Millisecond))
			g := newGov(t, Options{Now: clk.Now}, c)
			u := identify(t, g, key)
			tk := admitOK(t, g, u, Request{})
			tk.FirstToken()
			tk.Done(Usage{Known: true})
			clk.Set(late)
			check(t, admitRejected(t, g, u, Request{}, CodeQuotaRequestsMonth))
		})
	}
}

// A quota window without a token limit counts every reservation, up to
// maxCount milli-tokens each (a huge max_tokens): with about 90 of them in
// flight its count in Redis passed 1e17, which Redis writes from Lua as
// 1.1258999068426e+17, and every settlement's HINCRBY in that window
// failed from then on ("hash value is not an integer"): the requests kept
// their reservations, the window's count stayed there. They are settled
// exactly, in process and in Redis.
func TestAWindowCountPast1e17IsStillSettled(t *testing.T) {
	stores(t, func(t *testing.T, o Options) {
		key, hash := mintKey(t)
		g := newGov(t, o, userConfig(t, hash, `{"name":"t","quota":{"enabled":true,"windows":[{"period":"month","max_requests":100000}]}}`, ""))
		u := identify(t, g, key)
		huge := Request{PromptTokens: 1 << 40, MaxTokens: 1 << 31, Generations: 1 << 20}
		var held []Ticket
		for range 100 {
			held = append(held, admitOK(t, g, u, huge))
		}
		for _, tk := range held {
			tk.FirstToken()
			tk.Done(Usage{Known: true, PromptTokens: 1, CompletionTokens: 1})
		}
		if g.rds != nil {
			syncState(t, g)
		}
		st, err := g.UserStatus("alice")
		if err != nil {
			t.Fatal(err)
		}
		if w := st.Quota[0]; w.Requests != 100 || w.Tokens != 200 {
			t.Fatalf("the month holds %d requests and %v tokens, want 100 and 200 (2 each)", w.Requests, w.Tokens)
		}
	})
}

// Past what an int64 holds (8,192 such reservations in flight) the count
// stays at maxWindowCount: it wrapped to a negative count in process,
// which a token limit added later by a reload would have taken for room.
func TestAWindowCountIsBoundedNotWrapped(t *testing.T) {
	key, hash := mintKey(t)
	g := newGov(t, Options{}, userConfig(t, hash, `{"name":"t","quota":{"enabled":true,"windows":[{"period":"month","max_requests":100000}]}}`, ""))
	u := identify(t, g, key)
	huge := Request{PromptTokens: 1 << 40, MaxTokens: 1 << 31, Generations: 1 << 20}
	for range 8200 {
		admitOK(t, g, u, huge) // held
	}
	st, err := g.UserStatus("alice")
	if err != nil {
		t.Fatal(err)
	}
	if w := st.Quota[0]; w.Tokens != float64(maxWindowCount)/1000 {
		t.Fatalf("the month holds %v tokens, want the bound %v", w.Tokens, float64(maxWindowCount)/1000)
	}
}

// A TPM bucket far below zero (behind a huge max_tokens, which a full
// bucket admits) tells the same reset in Redis as in process: with a TPM
// of 2^40, a reservation of 2^50 tokens refills in 1,024 minutes. Redis
// reported its level capped at -9e12 (for its reply's millionths), so the
// answer's x-ratelimit-reset-tokens said 9 minutes, and a refusal's too.
func TestABucketFarBelowZeroTellsItsRealReset(t *testing.T) {
	stores(t, func(t *testing.T, o Options) {
		key, hash := mintKey(t)
		clk := newFakeClock(t0)
		o.Now = clk.Now
		g := newGov(t, o, userConfig(t, hash, `{"name":"t","rate":{"enabled":true,"tpm":1099511627776}}`, ""))
		u := identify(t, g, key)
		tk := admitOK(t, g, u, Request{PromptTokens: 1 << 40, MaxTokens: 1 << 31, Generations: 1 << 20}) // held
		want := int64(1024 * time.Minute)
		if l := tk.Limits(); l.Tokens != 0 || l.TokensReset < want-int64(time.Millisecond) || l.TokensReset > want+int64(time.Millisecond) {
			t.Fatalf("after the reservation: %d tokens left, full in %v; want 0, in %v", l.Tokens, time.Duration(l.TokensReset), time.Duration(want))
		}
		rej := admitRejected(t, g, u, Request{PromptTokens: 1}, CodeTPM)
		if l := rej.Limits; l.TokensReset < want-int64(time.Millisecond) || l.TokensReset > want+int64(time.Millisecond) {
			t.Fatalf("the refusal tells the bucket full in %v, want %v", time.Duration(l.TokensReset), time.Duration(want))
		}
	})
}
