package govern

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/infera/infera/config"
)

var t0 = time.Date(2025, 6, 4, 12, 0, 0, 0, time.UTC) // a Wednesday

func admitOK(t testing.TB, g *Governor, u *User, r Request) Ticket {
	t.Helper()
	tk, rej := g.Admit(context.Background(), u, r)
	if rej != nil {
		t.Fatalf("admit: %v", rej)
	}
	return tk
}

// queuedOf is how many requests of u wait in its queue (0 before its
// first request made its counters).
func queuedOf(u *User) int {
	st := u.st.Load()
	if st == nil {
		return 0
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.q.n
}

func admitRejected(t testing.TB, g *Governor, u *User, r Request, code Code) *Rejection {
	t.Helper()
	tk, rej := g.Admit(context.Background(), u, r)
	if rej == nil {
		tk.Done(Usage{})
		t.Fatalf("admitted, want %s", code)
	}
	if rej.Code != code {
		t.Fatalf("rejected with %s (%s), want %s", rej.Code, rej.Message, code)
	}
	return rej
}

func TestRPMBucketRefillsAndSaysWhenToRetry(t *testing.T) {
	key, hash := mintKey(t)
	clk := newFakeClock(t0)
	g := newGov(t, Options{Now: clk.Now}, userConfig(t, hash, `{"name":"t","rate":{"enabled":true,"rpm":3}}`, ""))
	u := identify(t, g, key)
	for range 3 {
		tk := admitOK(t, g, u, Request{})
		tk.FirstToken()
		tk.Done(Usage{})
	}
	rej := admitRejected(t, g, u, Request{}, CodeRPM)
	if rej.Status != 429 || rej.RetryAfter != 20 { // one request per 20 s
		t.Fatalf("status %d retry %d", rej.Status, rej.RetryAfter)
	}
	clk.Advance(20 * time.Second)
	admitOK(t, g, u, Request{}).Done(Usage{})
	// A request that failed before its first byte was refunded: the bucket
	// is as before.
	admitOK(t, g, u, Request{}).Done(Usage{})
}

func TestTPMPreDeductsMaxTokensOrTheDefaultAndReconcilesWithUsage(t *testing.T) {
	key, hash := mintKey(t)
	clk := newFakeClock(t0)
	g := newGov(t, Options{Now: clk.Now}, userConfig(t, hash, `{"name":"t","rate":{"enabled":true,"tpm":6000,"default_output_tokens":1000}}`, ""))
	u := identify(t, g, key)
	level := func() float64 {
		st := u.st.Load()
		st.mu.Lock()
		defer st.mu.Unlock()
		st.tpm.refill(6000, clk.Now().UnixNano())
		return st.tpm.level
	}
	// No max_tokens: 500 prompt + 1000 default output pre-deducted.
	a := admitOK(t, g, u, Request{PromptTokens: 500})
	if l := level(); l != 4500 {
		t.Fatalf("level %v after pre-deduction, want 4500", l)
	}
	b := admitOK(t, g, u, Request{PromptTokens: 500, MaxTokens: 3000})
	if l := level(); l != 1000 {
		t.Fatalf("level %v, want 1000", l)
	}
	admitRejected(t, g, u, Request{PromptTokens: 500, MaxTokens: 1000}, CodeTPM)
	// Real usage: a used 520 (refund 980), b used 4000 (charge 500).
	a.FirstToken()
	a.Done(Usage{PromptTokens: 500, CompletionTokens: 20, Known: true})
	if l := level(); l != 1980 {
		t.Fatalf("level %v after refund, want 1980", l)
	}
	if !b.active() {
		t.Fatal("b is in flight")
	}
	b.FirstToken()
	b.Done(Usage{PromptTokens: 500, CompletionTokens: 3500, Known: true})
	if l := level(); l != 1480 {
		t.Fatalf("level %v after charge, want 1480", l)
	}
	if b.active() {
		t.Fatal("b is done")
	}
	// Done twice does nothing.
	b.Done(Usage{PromptTokens: 500, CompletionTokens: 3500, Known: true})
	if l := level(); l != 1480 {
		t.Fatalf("level %v after a second Done", l)
	}
	// Served without reported usage: the estimate stays charged.
	c := admitOK(t, g, u, Request{PromptTokens: 100, MaxTokens: 100})
	c.FirstToken()
	c.Done(Usage{})
	if l := level(); l != 1280 {
		t.Fatalf("level %v, want 1280", l)
	}
	// A request larger than the bucket passes only when the bucket is full.
	clk.Advance(time.Minute)
	admitOK(t, g, u, Request{MaxTokens: 10000}).Done(Usage{})
}

func TestQuotaWindowsCountRequestsAndWeightedTokensAndResetAtBoundaries(t *testing.T) {
	key, hash := mintKey(t)
	clk := newFakeClock(time.Date(2025, 6, 4, 23, 0, 0, 0, time.UTC))
	g := newGov(t, Options{Now: clk.Now}, userConfig(t, hash, `{"name":"t","quota":{"enabled":true,
		"weights":{"input":1,"output":2,"cached":0.5},
		"windows":[{"period":"day","max_requests":3,"max_tokens":0},{"period":"week","max_requests":0,"max_tokens":5000}]}}`, ""))
	u := identify(t, g, key)
	for range 3 {
		tk := admitOK(t, g, u, Request{PromptTokens: 100, MaxTokens: 100})
		tk.FirstToken()
		// 100 prompt (60 cached): 40*1 + 60*0.5 + 50*2 = 170
		tk.Done(Usage{PromptTokens: 100, CachedTokens: 60, CompletionTokens: 50, Known: true})
	}
	rej := admitRejected(t, g, u, Request{}, CodeQuotaRequestsDay)
	if rej.RetryAfter != 3600 {
		t.Fatalf("retry after %d, want 3600 (midnight)", rej.RetryAfter)
	}
	if w := u.st.Load().win[periodWeek].tok; w != 3*170_000 {
		t.Fatalf("week tokens %d milli, want %d", w, 3*170_000)
	}
	clk.Advance(time.Hour) // Thursday: a new day, the same week
	// 4490 tokens left this week; the estimate of 1000 prompt + 2000 output
	// x2 = 5000 does not fit.
	admitRejected(t, g, u, Request{PromptTokens: 1000, MaxTokens: 2000}, CodeQuotaTokensWeek)
	tk := admitOK(t, g, u, Request{PromptTokens: 1000, MaxTokens: 1000}) // 3000
	tk.FirstToken()
	tk.Done(Usage{PromptTokens: 1000, CompletionTokens: 1745, Known: true}) // 4490
	admitRejected(t, g, u, Request{MaxTokens: 1}, CodeQuotaTokensWeek)
	clk.Set(time.Date(2025, 6, 9, 0, 0, 0, 0, time.UTC)) // Monday: a new week
	admitOK(t, g, u, Request{MaxTokens: 1}).Done(Usage{})
}

func TestQuotaWindowsFollowTheTimezoneAcrossDST(t *testing.T) {
	ny, err := time.LoadLocation("America/New_York")
	if err != nil {
		t.Fatal(err)
	}
	cal := newCalendar(ny)
	// 2025-03-09: clocks spring forward at 02:00, the day is 23 hours.
	at := time.Date(2025, 3, 9, 12, 0, 0, 0, ny).Unix()
	s := cal.state(at)
	day := s.win[periodDay]
	if day.end-day.start != 23*3600 || time.Unix(day.start, 0).In(ny).Hour() != 0 {
		t.Fatalf("DST day %v..%v", time.Unix(day.start, 0).In(ny), time.Unix(day.end, 0).In(ny))
	}
	five := s.win[period5h]
	if a, b := time.Unix(five.start, 0).In(ny), time.Unix(five.end, 0).In(ny); a.Hour() != 10 || b.Hour() != 15 {
		t.Fatalf("5h window %v..%v", a, b)
	}
	last := cal.state(time.Date(2025, 3, 9, 22, 0, 0, 0, ny).Unix()).win[period5h]
	if a, b := time.Unix(last.start, 0).In(ny), time.Unix(last.end, 0).In(ny); a.Hour() != 20 || b.Day() != 10 || b.Hour() != 0 {
		t.Fatalf("last 5h window %v..%v, want 20:00..00:00", a, b)
	}
	week := s.win[periodWeek]
	if a := time.Unix(week.start, 0).In(ny); a.Weekday() != time.Monday || a.Day() != 3 {
		t.Fatalf("week starts %v", a)
	}
	month := s.win[periodMonth]
	if a, b := time.Unix(month.start, 0).In(ny), time.Unix(month.end, 0).In(ny); a.Day() != 1 || b.Month() != time.April {
		t.Fatalf("month %v..%v", a, b)
	}
	minute, wd := s.local(at)
	if minute != 12*60 || wd != time.Sunday {
		t.Fatalf("local %d %v", minute, wd)
	}
	// After the jump the offset is -4h: 03:30 EDT is minute 210.
	if m, _ := cal.state(time.Date(2025, 3, 9, 3, 30, 0, 0, ny).Unix()).local(time.Date(2025, 3, 9, 3, 30, 0, 0, ny).Unix()); m != 210 {
		t.Fatalf("03:30 EDT is minute %d", m)
	}
}

func TestAllowedPeriodsAcrossMidnightAndDSTName403AndTheNextTime(t *testing.T) {
	key, hash := mintKey(t)
	ber, _ := time.LoadLocation("Europe/Berlin")
	// 2025-03-28 is a Friday; DST starts Sunday 2025-03-30 at 02:00.
	clk := newFakeClock(time.Date(2025, 3, 28, 21, 59, 0, 0, ber))
	c := parseConfig(t, fmt.Sprintf(`{
		"user_limit": {"timezone": "Europe/Berlin", "templates": [{"name":"t","default":true,"periods":{"enabled":true,"segments":[
			{"days":["fri"],"start":"22:00","end":"23:59"},
			{"days":["sat"],"start":"00:00","end":"02:00"},
			{"days":["sun"],"start":"02:00","end":"04:00"}]}}]},
		"users": [{"name": "alice", "keys": [%q]}]}`, hash))
	g := newGov(t, Options{Now: clk.Now}, c)
	u := identify(t, g, key)
	rej := admitRejected(t, g, u, Request{}, CodeOutsidePeriod)
	if rej.Status != 403 || !strings.Contains(rej.Message, "2025-03-28 22:00") || rej.RetryAfter != 60 {
		t.Fatalf("%d %q retry %d", rej.Status, rej.Message, rej.RetryAfter)
	}
	for _, at := range []time.Time{
		time.Date(2025, 3, 28, 22, 0, 0, 0, ber),
		time.Date(2025, 3, 28, 23, 59, 59, 0, ber), // inclusive to the end of the minute
		time.Date(2025, 3, 29, 0, 0, 0, 0, ber),
		time.Date(2025, 3, 29, 2, 0, 59, 0, ber),
		time.Date(2025, 3, 30, 3, 0, 0, 0, ber), // 02:00-02:59 does not exist that day
	} {
		clk.Set(at)
		admitOK(t, g, u, Request{}).Done(Usage{})
	}
	clk.Set(time.Date(2025, 3, 29, 2, 1, 0, 0, ber))
	rej = admitRejected(t, g, u, Request{}, CodeOutsidePeriod)
	// Next: Sunday 02:00 does not exist; the first allowed minute is 03:00 CEST.
	if !strings.Contains(rej.Message, "2025-03-30 03:00 CEST") {
		t.Fatalf("%q", rej.Message)
	}
	clk.Set(time.Date(2025, 3, 30, 4, 1, 0, 0, ber))
	rej = admitRejected(t, g, u, Request{}, CodeOutsidePeriod)
	if !strings.Contains(rej.Message, "2025-04-04 22:00") {
		t.Fatalf("%q", rej.Message)
	}
	// Switching the capability off keeps its settings and allows all.
	c2 := *c
	c2.UserLimit.Templates = append([]config.QuotaTemplate(nil), c.UserLimit.Templates...)
	c2.UserLimit.Templates[0].Periods.Enabled = false
	if err := g.Apply(&c2); err != nil {
		t.Fatal(err)
	}
	admitOK(t, g, identify(t, g, key), Request{}).Done(Usage{})
}

// A queued request is admitted against every rule when a slot frees: one
// whose wait outlasted its user's allowed period is refused as a new
// request is then (403 outside_allowed_period), not served outside it.
func TestAQueuedRequestIsNotAdmittedOutsideTheAllowedPeriods(t *testing.T) {
	stores(t, func(t *testing.T, o Options) {
		key, hash := mintKey(t)
		now := time.Now().UTC().Truncate(time.Minute).Add(30 * time.Second)
		clk := newFakeClock(now)
		o.Now = clk.Now
		day := strings.ToLower(now.Weekday().String()[:3])
		tmpl := fmt.Sprintf(`{"name":"t","periods":{"enabled":true,"segments":[{"days":[%q],"start":"00:00","end":%q}]},
			"concurrency":{"enabled":true,"limit":1,"overlimit":"queue","queue_size":5,"queue_timeout_ms":30000}}`, day, now.Format("15:04"))
		g := newGov(t, o, userConfig(t, hash, tmpl, ""))
		u := identify(t, g, key)
		holder := admitOK(t, g, u, Request{})
		got := make(chan *Rejection, 1)
		go func() {
			tk, rej := g.Admit(context.Background(), u, Request{})
			if rej == nil {
				tk.Done(Usage{})
			}
			got <- rej
		}()
		waitFor(t, func() bool { return queuedOf(u) == 1 })
		clk.Advance(time.Minute) // the allowed period ends while it waits
		holder.Done(Usage{})
		rej := recvWithin(t, got, 5*time.Second, "the queued request")
		if rej == nil || rej.Code != CodeOutsidePeriod || rej.Status != 403 || rej.RetryAfter <= 0 {
			t.Fatalf("the queued request admitted after its allowed period: %+v", rej)
		}
	})
}

func TestUserConcurrencyRejectsOverTheLimit(t *testing.T) {
	key, hash := mintKey(t)
	g := newGov(t, Options{}, userConfig(t, hash, `{"name":"t","concurrency":{"enabled":true,"limit":2}}`, ""))
	u := identify(t, g, key)
	a, b := admitOK(t, g, u, Request{}), admitOK(t, g, u, Request{})
	rej := admitRejected(t, g, u, Request{}, CodeConcurrencyUser)
	if rej.Status != 429 || rej.RetryAfter != 0 {
		t.Fatalf("%+v", rej)
	}
	a.Done(Usage{})
	a.Done(Usage{}) // idempotent: frees one slot only
	c := admitOK(t, g, u, Request{})
	admitRejected(t, g, u, Request{}, CodeConcurrencyUser)
	b.Done(Usage{})
	c.Done(Usage{})
}

func TestUserQueueIsFIFOAndClientsThatLeaveAreRemovedAtOnce(t *testing.T) {
	key, hash := mintKey(t)
	g := newGov(t, Options{}, userConfig(t, hash, `{"name":"t","concurrency":{"enabled":true,"limit":1,"overlimit":"queue","queue_size":3,"queue_timeout_ms":5000}}`, ""))
	u := identify(t, g, key)
	holder := admitOK(t, g, u, Request{})
	type result struct {
		i   int
		tk  Ticket
		rej *Rejection
	}
	results := make(chan result, 4)
	ctxs := make([]context.CancelFunc, 3)
	for i := range 3 {
		ctx, cancel := context.WithCancel(context.Background())
		ctxs[i] = cancel
		go func() {
			tk, rej := g.Admit(ctx, u, Request{})
			results <- result{i, tk, rej}
		}()
		waitFor(t, func() bool { return queuedOf(u) == i+1 })
	}
	// The queue is full: the next is refused at once.
	rej := admitRejected(t, g, u, Request{}, CodeConcurrencyUser)
	if !strings.Contains(rej.Message, "queue") {
		t.Fatalf("%q", rej.Message)
	}
	// The second waiter's client leaves: removed at once.
	ctxs[1]()
	if r := <-results; r.i != 1 || r.rej == nil {
		t.Fatalf("%+v", r)
	}
	waitFor(t, func() bool { return queuedOf(u) == 2 })
	holder.Done(Usage{})
	r := <-results
	if r.i != 0 || r.rej != nil {
		t.Fatalf("first served %+v", r)
	}
	r.tk.Done(Usage{})
	r = <-results
	if r.i != 2 || r.rej != nil {
		t.Fatalf("then %+v", r)
	}
	r.tk.Done(Usage{})
	for _, c := range ctxs {
		c()
	}
	if userQueued.Load() != 0 {
		t.Fatalf("queue gauge %d", userQueued.Load())
	}
}

func TestUserQueueTimesOut(t *testing.T) {
	key, hash := mintKey(t)
	g := newGov(t, Options{}, userConfig(t, hash, `{"name":"t","concurrency":{"enabled":true,"limit":1,"overlimit":"queue","queue_size":3,"queue_timeout_ms":50}}`, ""))
	u := identify(t, g, key)
	holder := admitOK(t, g, u, Request{})
	start := time.Now()
	admitRejected(t, g, u, Request{}, CodeConcurrencyUser)
	if d := time.Since(start); d < 50*time.Millisecond {
		t.Fatalf("returned after %v", d)
	}
	holder.Done(Usage{})
	admitOK(t, g, u, Request{}).Done(Usage{})
}

func TestDryRunCountsHitsButBlocksNothing(t *testing.T) {
	key, hash := mintKey(t)
	for _, global := range []bool{false, true} {
		tmpl := `{"name":"t","dry_run":true,"rate":{"enabled":true,"rpm":1},"concurrency":{"enabled":true,"limit":1}}`
		extra := ""
		c := userConfig(t, hash, tmpl, extra)
		if global {
			c.UserLimit.Templates[0].DryRun = false
			c.UserLimit.DryRun = true
		}
		g := newGov(t, Options{Now: newFakeClock(t0).Now}, c)
		u := identify(t, g, key)
		rpmHits := hitCounters[CodeRPM][resDryRun].Get()
		concHits := hitCounters[CodeConcurrencyUser][resDryRun].Get()
		rejected := hitCounters[CodeRPM][resRejected].Get()
		var tks []Ticket
		for range 5 {
			tks = append(tks, admitOK(t, g, u, Request{}))
		}
		if d := hitCounters[CodeRPM][resDryRun].Get() - rpmHits; d != 4 {
			t.Fatalf("global=%v: rpm dry-run hits %d, want 4", global, d)
		}
		if d := hitCounters[CodeConcurrencyUser][resDryRun].Get() - concHits; d != 4 {
			t.Fatalf("concurrency dry-run hits %d, want 4", d)
		}
		if hitCounters[CodeRPM][resRejected].Get() != rejected {
			t.Fatal("dry run counted a rejection")
		}
		for _, tk := range tks {
			tk.FirstToken()
			tk.Done(Usage{})
		}
		// Enforcing again: the counters were kept.
		c.UserLimit.DryRun = false
		c.UserLimit.Templates[0].DryRun = false
		if err := g.Apply(c); err != nil {
			t.Fatal(err)
		}
		admitRejected(t, g, identify(t, g, key), Request{}, CodeRPM)
	}
}

func TestReloadKeepsCountersOfRulesThatStillExist(t *testing.T) {
	key, hash := mintKey(t)
	clk := newFakeClock(t0)
	c := userConfig(t, hash, `{"name":"t","concurrency":{"enabled":true,"limit":2},"quota":{"enabled":true,"windows":[{"period":"day","max_requests":3}]}}`, "")
	g := newGov(t, Options{Now: clk.Now}, c)
	u := identify(t, g, key)
	a := admitOK(t, g, u, Request{})
	a.FirstToken()
	b := admitOK(t, g, u, Request{})
	b.FirstToken()
	// New template object, a renamed template, lower concurrency limit, a new user.
	key2, hash2 := mintKey(t)
	c2 := parseConfig(t, fmt.Sprintf(`{"user_limit":{"templates":[{"name":"t2","concurrency":{"enabled":true,"limit":1},"quota":{"enabled":true,"windows":[{"period":"day","max_requests":3}]}}]},
		"users":[{"name":"alice","keys":[%q],"template":"t2"},{"name":"bob","keys":[%q],"template":"t2"}]}`, hash, hash2))
	if err := g.Apply(c2); err != nil {
		t.Fatal(err)
	}
	u2 := identify(t, g, key)
	admitRejected(t, g, u2, Request{}, CodeConcurrencyUser) // 2 in flight > 1
	a.Done(Usage{})                                         // returns to the same counters
	b.Done(Usage{})
	tk := admitOK(t, g, u2, Request{}) // third of the day
	tk.FirstToken()
	tk.Done(Usage{})
	admitRejected(t, g, u2, Request{}, CodeQuotaRequestsDay)
	admitOK(t, g, identify(t, g, key2), Request{}).Done(Usage{})
	// Removing the user: its key is unknown.
	if err := g.Apply(parseConfig(t, fmt.Sprintf(`{"users":[{"name":"bob","keys":[%q]}]}`, hash2))); err != nil {
		t.Fatal(err)
	}
	if _, rej := g.Identify([]byte(key)); rej == nil || rej.Status != 401 {
		t.Fatal("a removed user's key still works")
	}
}

// TestNoOvershootUnderConcurrency: 200 goroutines of one user against a
// quota of N requests and T tokens: at most N admitted, and tokens within
// T when every estimate covers the real usage.
func TestNoOvershootUnderConcurrency(t *testing.T) {
	key, hash := mintKey(t)
	for _, tc := range []struct {
		window         string
		maxReq, maxTok int
	}{{"day", 50, 0}, {"month", 0, 5050}} {
		g := newGov(t, Options{}, userConfig(t, hash, fmt.Sprintf(`{"name":"t","quota":{"enabled":true,"windows":[{"period":%q,"max_requests":%d,"max_tokens":%d}]}}`, tc.window, tc.maxReq, tc.maxTok), ""))
		u := identify(t, g, key)
		checkNoOvershoot(t, func() (Ticket, *Rejection) {
			return g.Admit(context.Background(), u, Request{PromptTokens: 30, MaxTokens: 70})
		}, tc.maxReq, tc.maxTok, 100)
	}
}

// checkNoOvershoot runs 200 concurrent requests of 100 estimated tokens
// each (really using est-1..est) and checks the admitted count and the
// charged tokens.
func checkNoOvershoot(t *testing.T, admit func() (Ticket, *Rejection), maxReq, maxTok, est int) {
	t.Helper()
	var admitted, tokens atomic.Int64
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range 200 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			tk, rej := admit()
			if rej != nil {
				return
			}
			admitted.Add(1)
			tk.FirstToken()
			used := est - i%2
			tokens.Add(int64(used))
			tk.Done(Usage{PromptTokens: 30, CompletionTokens: used - 30, Known: true})
		}()
	}
	close(start)
	wg.Wait()
	n, tok := admitted.Load(), tokens.Load()
	if maxReq > 0 && n != int64(maxReq) {
		t.Fatalf("admitted %d of 200 against a quota of %d requests", n, maxReq)
	}
	if maxTok > 0 && (tok > int64(maxTok) || n < int64(maxTok/est)) {
		t.Fatalf("admitted %d consuming %d tokens against a quota of %d", n, tok, maxTok)
	}
}

func waitFor(t testing.TB, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met in 5 s")
		}
		time.Sleep(time.Millisecond)
	}
}

// stores runs f with in-process counters and with counters in Redis.
func stores(t *testing.T, f func(t *testing.T, o Options)) {
	t.Run("local", func(t *testing.T) { f(t, Options{}) })
	t.Run("redis", func(t *testing.T) { f(t, redisOptions(t, startRedis(t))) })
}

func concTemplate(limit, timeoutMS int) string {
	return fmt.Sprintf(`{"name":"t","concurrency":{"enabled":true,"limit":%d,"overlimit":"queue","queue_size":5,"queue_timeout_ms":%d}}`, limit, timeoutMS)
}

// A reload that raises a user's concurrency limit admits the requests
// already queued at once (the queue is served under the user's current
// template, not the one they were queued with), and a new request is not
// held behind them.
func TestAReloadRaisingAUsersLimitAdmitsItsQueuedRequests(t *testing.T) {
	stores(t, func(t *testing.T, o Options) {
		key, hash := mintKey(t)
		g := newGov(t, o, userConfig(t, hash, concTemplate(1, 10000), ""))
		u := identify(t, g, key)
		holder := admitOK(t, g, u, Request{})
		defer holder.Done(Usage{})
		got := make(chan *Rejection, 1)
		go func() { tk, rej := g.Admit(context.Background(), u, Request{}); tk.Done(Usage{}); got <- rej }()
		waitFor(t, func() bool { return queuedOf(u) == 1 })
		if err := g.Apply(userConfig(t, hash, concTemplate(4, 10000), "")); err != nil {
			t.Fatal(err)
		}
		if rej := recvWithin(t, got, 2*time.Second, "the queued request"); rej != nil {
			t.Fatalf("the queued request after the limit was raised to 4 with 1 in flight: %s", rej.Code)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		tk, rej := g.Admit(ctx, identify(t, g, key), Request{})
		if rej != nil {
			t.Fatalf("a new request with 1 of 4 slots in use: %s", rej.Code)
		}
		tk.Done(Usage{})
	})
}

// A reload that lowers a user's concurrency limit applies to the requests
// already queued: a slot freed while the user is still at the new limit
// admits none of them.
func TestAReloadLoweringAUsersLimitHoldsItsQueuedRequests(t *testing.T) {
	stores(t, func(t *testing.T, o Options) {
		key, hash := mintKey(t)
		g := newGov(t, o, userConfig(t, hash, concTemplate(2, 10000), ""))
		u := identify(t, g, key)
		a := admitOK(t, g, u, Request{})
		b := admitOK(t, g, u, Request{})
		got := make(chan Ticket, 2)
		for range 2 {
			go func() { tk, _ := g.Admit(context.Background(), u, Request{}); got <- tk }()
		}
		waitFor(t, func() bool { return queuedOf(u) == 2 })
		if err := g.Apply(userConfig(t, hash, concTemplate(1, 10000), "")); err != nil {
			t.Fatal(err)
		}
		a.Done(Usage{}) // 1 in flight: the new limit
		select {
		case tk := <-got:
			tk.Done(Usage{})
			t.Fatal("a queued request was admitted over the reloaded limit of 1")
		case <-time.After(300 * time.Millisecond):
		}
		b.Done(Usage{}) // the queued ones now go one at a time
		tk := recvWithin(t, got, 2*time.Second, "the first queued request")
		select {
		case tk2 := <-got:
			tk2.Done(Usage{})
			t.Fatal("both queued requests admitted at once under a limit of 1")
		case <-time.After(200 * time.Millisecond):
		}
		tk.Done(Usage{})
		recvWithin(t, got, 2*time.Second, "the second queued request").Done(Usage{})
	})
}

// A reload that takes a user's limits away admits its queued requests,
// holding nothing; their tickets end cleanly.
func TestAReloadLiftingAUsersLimitsAdmitsItsQueuedRequests(t *testing.T) {
	stores(t, func(t *testing.T, o Options) {
		key, hash := mintKey(t)
		g := newGov(t, o, userConfig(t, hash, concTemplate(1, 10000), ""))
		u := identify(t, g, key)
		holder := admitOK(t, g, u, Request{})
		got := make(chan Ticket, 1)
		go func() {
			tk, rej := g.Admit(context.Background(), u, Request{})
			if rej != nil {
				t.Errorf("queued request: %s", rej.Code)
			}
			got <- tk
		}()
		waitFor(t, func() bool { return queuedOf(u) == 1 })
		if err := g.Apply(userConfig(t, hash, `{"name":"t"}`, "")); err != nil {
			t.Fatal(err)
		}
		tk := recvWithin(t, got, 2*time.Second, "the queued request")
		tk.FirstToken()
		tk.Done(Usage{Known: true, PromptTokens: 10, CompletionTokens: 10})
		holder.Done(Usage{})
	})
}

// A reload that disables or removes a user, or no longer allows it the
// model a queued request names, refuses that user's queued requests at
// once, as it refuses a new one (they were served once a slot freed).
func TestAReloadRevokingAUserRefusesItsQueuedRequests(t *testing.T) {
	for _, c := range []struct {
		name  string
		users string
		code  Code
	}{
		{"disabled", `[{"name":"alice","keys":[%q],"template":"t","enabled":false}]`, CodeUserDisabled},
		{"removed", `[{"name":"bob","keys":[],"template":"t"}]`, CodeInvalidKey},
		{"model no longer allowed", `[{"name":"alice","keys":[%q],"template":"t","models":["other-*"]}]`, CodeModelNotAllowed},
	} {
		t.Run(c.name, func(t *testing.T) {
			stores(t, func(t *testing.T, o Options) {
				key, hash := mintKey(t)
				g := newGov(t, o, userConfig(t, hash, concTemplate(1, 10000), ""))
				u := identify(t, g, key)
				holder := admitOK(t, g, u, Request{Model: []byte("m")})
				defer holder.Done(Usage{})
				got := make(chan *Rejection, 1)
				go func() {
					tk, rej := g.Admit(context.Background(), u, Request{Model: []byte("m")})
					if rej == nil {
						tk.Done(Usage{})
					}
					got <- rej
				}()
				waitFor(t, func() bool { return queuedOf(u) == 1 })
				users := c.users
				if strings.Contains(users, "%q") {
					users = fmt.Sprintf(users, hash)
				}
				if err := g.Apply(parseConfig(t, fmt.Sprintf(`{"user_limit": {"timezone": "UTC", "templates": [%s]}, "users": %s}`, concTemplate(1, 10000), users))); err != nil {
					t.Fatal(err)
				}
				rej := recvWithin(t, got, 2*time.Second, "the queued request")
				if rej == nil || rej.Code != c.code {
					t.Fatalf("the queued request after the reload: %v, want %s", rej, c.code)
				}
			})
		})
	}
}

// A reload that switches a user's concurrency overlimit from queue to
// reject refuses its queued requests at once, as it refuses a new one
// (they waited for a slot, or their queue timeout).
func TestAReloadSwitchingAUsersQueueToRejectRefusesItsQueuedRequests(t *testing.T) {
	stores(t, func(t *testing.T, o Options) {
		key, hash := mintKey(t)
		g := newGov(t, o, userConfig(t, hash, concTemplate(1, 30000), ""))
		u := identify(t, g, key)
		holder := admitOK(t, g, u, Request{})
		defer holder.Done(Usage{})
		got := make(chan *Rejection, 1)
		go func() {
			tk, rej := g.Admit(context.Background(), u, Request{})
			if rej == nil {
				tk.Done(Usage{})
			}
			got <- rej
		}()
		waitFor(t, func() bool { return queuedOf(u) == 1 })
		reject := strings.Replace(concTemplate(1, 30000), `"overlimit":"queue"`, `"overlimit":"reject"`, 1)
		if err := g.Apply(userConfig(t, hash, reject, "")); err != nil {
			t.Fatal(err)
		}
		rej := recvWithin(t, got, 2*time.Second, "the queued request")
		if rej == nil || rej.Code != CodeConcurrencyUser || rej.Status != 429 {
			t.Fatalf("the queued request after overlimit became reject: %v", rej)
		}
	})
}

// The same for rate_limit's seats: a reload to overlimit reject refuses
// the requests waiting in the seat queue at once.
func TestAReloadSwitchingTheSeatQueueToRejectRefusesItsQueuedRequests(t *testing.T) {
	stores(t, func(t *testing.T, o Options) {
		c := parseConfig(t, `{"rate_limit":{"overall_concurrency":1,"overlimit":"queue","queue_size":10,"queue_timeout_ms":30000}}`)
		g := newGov(t, o, c)
		holder := acquireOK(t, g, []Target{w1}, PhaseMixed, 0)
		defer holder.Done()
		got := make(chan *Rejection, 1)
		go func() {
			s, _, rej := g.Acquire(context.Background(), []Target{w1}, PhaseMixed)
			if rej == nil {
				s.Done()
			}
			got <- rej
		}()
		waitFor(t, func() bool { g.seats.mu.Lock(); defer g.seats.mu.Unlock(); return g.seats.q.n == 1 })
		c = parseConfig(t, `{"rate_limit":{"overall_concurrency":1,"overlimit":"reject"}}`)
		if err := g.Apply(c); err != nil {
			t.Fatal(err)
		}
		rej := recvWithin(t, got, 2*time.Second, "the queued request")
		if rej == nil || rej.Code != CodeConcurrencyOverall || rej.Status != 429 {
			t.Fatalf("the queued request after overlimit became reject: %v", rej)
		}
	})
}

// A reload that changes a queue's timeout applies to the requests already
// waiting, measured from when each was queued, as it does to a new one:
// shortened below the time they have waited they are refused at once,
// lengthened they wait on past the old timeout (they kept the timeout
// they were queued with, 30 s or 500 ms here).
func TestAReloadOfTheQueueTimeoutAppliesToQueuedRequests(t *testing.T) {
	wait := func(t *testing.T, g *Governor, queued func() bool, admit func() *Rejection, apply func(ms int)) {
		t.Helper()
		got := make(chan *Rejection, 1)
		go func() { got <- admit() }()
		waitFor(t, queued)
		time.Sleep(100 * time.Millisecond)
		apply(50)
		if rej := recvWithin(t, got, 2*time.Second, "the queued request after its timeout was shortened"); rej == nil || rej.Status != 429 {
			t.Fatalf("the queued request after its timeout was shortened: %v, want a 429", rej)
		}
		apply(500)
		go func() { got <- admit() }()
		waitFor(t, queued)
		apply(30000)
		select {
		case rej := <-got:
			t.Fatalf("the queued request ended (%v) within 1 s, although its timeout was lengthened to 30 s", rej)
		case <-time.After(time.Second):
		}
		apply(50)
		if rej := recvWithin(t, got, 2*time.Second, "the queued request"); rej == nil || rej.Status != 429 {
			t.Fatalf("the queued request: %v, want a 429", rej)
		}
	}
	t.Run("seats", func(t *testing.T) {
		stores(t, func(t *testing.T, o Options) {
			rl := func(ms int) *config.Config {
				return parseConfig(t, fmt.Sprintf(`{"rate_limit":{"overall_concurrency":1,"overlimit":"queue","queue_size":10,"queue_timeout_ms":%d}}`, ms))
			}
			g := newGov(t, o, rl(30000))
			holder := acquireOK(t, g, []Target{w1}, PhaseMixed, 0)
			defer holder.Done()
			wait(t, g, func() bool { g.seats.mu.Lock(); defer g.seats.mu.Unlock(); return g.seats.q.n == 1 },
				func() *Rejection {
					s, _, rej := g.Acquire(context.Background(), []Target{w1}, PhaseMixed)
					if rej == nil {
						s.Done()
					}
					return rej
				},
				func(ms int) {
					if err := g.Apply(rl(ms)); err != nil {
						t.Fatal(err)
					}
				})
		})
	})
	t.Run("user", func(t *testing.T) {
		stores(t, func(t *testing.T, o Options) {
			key, hash := mintKey(t)
			g := newGov(t, o, userConfig(t, hash, concTemplate(1, 30000), ""))
			u := identify(t, g, key)
			holder := admitOK(t, g, u, Request{})
			defer holder.Done(Usage{})
			wait(t, g, func() bool { return queuedOf(u) == 1 },
				func() *Rejection {
					tk, rej := g.Admit(context.Background(), u, Request{})
					if rej == nil {
						tk.Done(Usage{})
					}
					return rej
				},
				func(ms int) {
					if err := g.Apply(userConfig(t, hash, concTemplate(1, ms), "")); err != nil {
						t.Fatal(err)
					}
				})
		})
	})
}

// A reload turning rate_limit.dry_run on serves the requests already
// queued at once, as a new request would be (they waited for a seat to
// free: up to queue_timeout_ms).
func TestAReloadTurningDryRunOnServesTheQueuedRequests(t *testing.T) {
	stores(t, func(t *testing.T, o Options) {
		c := parseConfig(t, `{"rate_limit":{"overall_concurrency":1,"overlimit":"queue","queue_size":10,"queue_timeout_ms":30000}}`)
		g := newGov(t, o, c)
		holder := acquireOK(t, g, []Target{w1}, PhaseMixed, 0)
		defer holder.Done()
		got := make(chan *Rejection, 1)
		go func() {
			s, _, rej := g.Acquire(context.Background(), []Target{w1}, PhaseMixed)
			if rej == nil {
				s.Done()
			}
			got <- rej
		}()
		waitFor(t, func() bool { g.seats.mu.Lock(); defer g.seats.mu.Unlock(); return g.seats.q.n == 1 })
		c = parseConfig(t, `{"rate_limit":{"overall_concurrency":1,"overlimit":"queue","queue_size":10,"queue_timeout_ms":30000,"dry_run":true}}`)
		if err := g.Apply(c); err != nil {
			t.Fatal(err)
		}
		if rej := recvWithin(t, got, 2*time.Second, "the queued request"); rej != nil {
			t.Fatalf("the queued request after dry_run went on: %v", rej)
		}
	})
}

// A reload of user_limit.timezone moves every quota window's start by the
// zones' offset; the counts of the windows running go with them (they
// started afresh: a month capped at 5 requests let 15 through over two
// timezone changes).
func TestATimezoneReloadKeepsTheQuotaWindowsCounts(t *testing.T) {
	for _, w := range []struct {
		period string
		code   Code
	}{{"month", CodeQuotaRequestsMonth}, {"day", CodeQuotaRequestsDay}} {
		t.Run(w.period, func(t *testing.T) { timezoneReloadKeepsCounts(t, w.period, w.code) })
	}
}

func timezoneReloadKeepsCounts(t *testing.T, period string, code Code) {
	stores(t, func(t *testing.T, o Options) {
		// A fixed time: at the wall clock's, between 23:00 and 24:00 UTC
		// Berlin's day is a new one, whose window rightly starts afresh.
		clk := newFakeClock(time.Date(2025, 6, 4, 12, 0, 0, 0, time.UTC))
		o.Now = clk.Now
		key, hash := mintKey(t)
		tmpl := fmt.Sprintf(`{"name":"t","quota":{"enabled":true,"windows":[{"period":%q,"max_requests":5}]}}`, period)
		cfg := func(tz string) *config.Config {
			return parseConfig(t, fmt.Sprintf(`{"user_limit": {"timezone": %q, "templates": [%s]}, "users": [{"name": "alice", "keys": [%q], "template": "t"}]}`, tz, tmpl, hash))
		}
		g := newGov(t, o, cfg("UTC"))
		for range 5 {
			tk := admitOK(t, g, identify(t, g, key), Request{})
			tk.FirstToken()
			tk.Done(Usage{})
		}
		for _, tz := range []string{"Europe/Berlin", "America/Los_Angeles", "UTC"} {
			if err := g.Apply(cfg(tz)); err != nil {
				t.Fatal(err)
			}
			admitRejected(t, g, identify(t, g, key), Request{}, code)
		}
	})
}

// The window before another is never taken for it, whatever a DST hour or
// a shorter month does to its length; a window moved by a timezone change
// (hours, either way) and still running is.
func TestAWindowHoldsTheCountsOfAShiftedStartButNotOfTheLastWindow(t *testing.T) {
	const h = 3600
	day := window{start: 1_000_000, end: 1_000_000 + 24*h}
	month := window{start: 1_000_000, end: 1_000_000 + 31*24*h}
	for _, c := range []struct {
		w           window
		stored, now int64
		holds       bool
	}{
		{day, day.start, day.start + 5*h, true},
		{day, day.start - h, day.start + 5*h, true},       // an hour east
		{day, day.start + 7*h, day.start + 9*h, true},     // the new zone's day began 7 h earlier
		{day, day.start - 16*h, day.start + 5*h, true},    // 16 h east: still running
		{day, day.start - 16*h, day.start + 9*h, false},   // ... and over
		{day, day.start - 23*h, day.start + 10*60, false}, // yesterday, 23 h long (DST)
		{day, day.start - 24*h, day.start + 10*60, false},
		{day, day.start - 25*h, day.start + 10*60, false},
		{day, day.end, day.start + 5*h, false},
		{day, 0, day.start + 5*h, false},
		{month, month.start - 30*24*h, month.start + h, false}, // last month, 30 days long
		{month, month.start - 28*24*h, month.start + h, false}, // February
		{month, month.start - 9*h, month.start + h, true},
	} {
		if got := c.w.holds(c.stored, c.now); got != c.holds {
			t.Errorf("a window of %d h from %d holds counts from %+d h at %+d h: %v", (c.w.end-c.w.start)/h, c.w.start, (c.stored-c.w.start)/h, (c.now-c.w.start)/h, got)
		}
	}
}

// In a zone whose DST begins at midnight (Havana: 00:00 becomes 01:00) the
// day that begins with the jump begins at the jump: the day before ends
// there, not an hour early (which made a daily quota's Retry-After an hour
// short, then 1 s for the last hour of the day).
func TestADayThatBeginsWithADSTJumpBeginsAtTheJump(t *testing.T) {
	loc, err := time.LoadLocation("America/Havana")
	if err != nil {
		t.Skip(err)
	}
	jump := time.Date(2026, 3, 8, 5, 0, 0, 0, time.UTC) // 00:00 CST, the clocks read 01:00 CDT
	if _, off := jump.In(loc).Zone(); off != -4*3600 {
		t.Skipf("the timezone data has no jump there (offset %d)", off)
	}
	c := newCalendar(loc)
	now := time.Date(2026, 3, 8, 3, 0, 0, 0, time.UTC) // 22:00 CST on the 7th
	day := c.compute(now.Unix()).win[1]
	if day.end != jump.Unix() {
		t.Fatalf("the 7th ends at %s, want %s", time.Unix(day.end, 0).In(loc), jump.In(loc))
	}
	next := c.compute(jump.Unix() + 60).win[1]
	if next.start != jump.Unix() || next.end != time.Date(2026, 3, 9, 0, 0, 0, 0, loc).Unix() {
		t.Fatalf("the 8th: %s .. %s", time.Unix(next.start, 0).In(loc), time.Unix(next.end, 0).In(loc))
	}
}

// A reload that removes a user and a later one that adds it back do not
// hand it a fresh quota or concurrency: its counters are kept while it is
// away (with Redis they are keyed by its name anyway).
func TestAUserRemovedAndAddedBackKeepsItsCounters(t *testing.T) {
	stores(t, func(t *testing.T, o Options) {
		key, hash := mintKey(t)
		clk := newFakeClock(t0)
		o.Now = clk.Now
		tmpl := `{"name":"t","concurrency":{"enabled":true,"limit":1},"quota":{"enabled":true,"windows":[{"period":"day","max_requests":2}]}}`
		c := userConfig(t, hash, tmpl, "")
		g := newGov(t, o, c)
		holder := admitOK(t, g, identify(t, g, key), Request{})
		holder.FirstToken()
		if err := g.Apply(parseConfig(t, `{"users":[{"name":"bob","keys":[]}]}`)); err != nil {
			t.Fatal(err)
		}
		if err := g.Apply(c); err != nil {
			t.Fatal(err)
		}
		u := identify(t, g, key)
		admitRejected(t, g, u, Request{}, CodeConcurrencyUser) // the one in flight still counts
		holder.Done(Usage{})
		tk := admitOK(t, g, u, Request{}) // second of the day
		tk.FirstToken()
		tk.Done(Usage{})
		admitRejected(t, g, u, Request{}, CodeQuotaRequestsDay)
	})
}

// The counters of removed users are kept for the latest maxGone removals
// (of users that had counters: that had sent a request).
func TestTheCountersOfRemovedUsersAreBounded(t *testing.T) {
	var sb strings.Builder
	sb.WriteString(`{"users":[`)
	for i := 0; i < maxGone+10; i++ {
		if i > 0 {
			sb.WriteByte(',')
		}
		fmt.Fprintf(&sb, `{"name":"u%d","keys":[]}`, i)
	}
	sb.WriteString(`]}`)
	all := parseConfig(t, sb.String())
	g := newGov(t, Options{}, all)
	// Counters are made at a user's first request: every user has sent one.
	counted := func() {
		for _, u := range g.snap.Load().users {
			g.state(u)
		}
	}
	counted()
	for i := 0; i < 3; i++ { // remove all, add all back, remove all again
		if err := g.Apply(parseConfig(t, `{"users":[]}`)); err != nil {
			t.Fatal(err)
		}
		if len(g.gone) != maxGone || len(g.goneOrder) > 2*maxGone+64 {
			t.Fatalf("round %d: %d removed users kept (order %d), want %d", i, len(g.gone), len(g.goneOrder), maxGone)
		}
		if i < 2 {
			if err := g.Apply(all); err != nil {
				t.Fatal(err)
			}
			counted()
			if len(g.gone) != 0 {
				t.Fatalf("round %d: %d kept after adding every user back", i, len(g.gone))
			}
		}
	}
}

// A request the parser accepts (max_tokens <= 2^31, n/best_of times the
// prompts of a batch <= 2^20) whose weighted estimate passes 2^63 milli
// tokens (an output weight of 5, as for a model whose output costs 5x its
// input) overflows the estimate's int64 conversion: the estimate becomes
// MinInt64, the token quota check passes and the window's count drops by
// 2^63. While such a request is in flight (in process), and with Redis
// for the rest of the window (the count is stored as a float that
// HINCRBY cannot add to any more), the user's token quota no longer holds.
func TestAHugeEstimateIsRefusedNotWrapped(t *testing.T) {
	stores(t, func(t *testing.T, o Options) {
		key, hash := mintKey(t)
		c := userConfig(t, hash, `{"name":"t","quota":{"enabled":true,"weights":{"input":1,"output":5,"cached":1},
			"windows":[{"period":"month","max_tokens":1000}]}}`, "")
		g := newGov(t, o, c)
		u := identify(t, g, key)
		// A batched /v1/completions body: 16 prompts, n 65536, max_tokens 2^31.
		huge := Request{PromptTokens: 16, MaxTokens: 1 << 31, Generations: 1 << 20}
		tk, rej := g.Admit(context.Background(), u, huge)
		if rej == nil {
			t.Errorf("a request estimated at 2^31 x 2^20 x 5 tokens was admitted under a quota of 1000 tokens")
			// The engine refuses it (400): the request counts, no tokens.
			tk.FirstToken()
			tk.Done(Usage{Known: true})
			if g.rds != nil {
				syncState(t, g)
			}
		}
		// Now 100 requests of 100 weighted tokens each (20 prompt + 16 x 5):
		// at most 10 fit in the month's 1000 tokens.
		admitted := 0
		for range 100 {
			tk, rej := g.Admit(context.Background(), u, Request{PromptTokens: 20, MaxTokens: 16})
			if rej != nil {
				continue
			}
			admitted++
			tk.FirstToken()
			tk.Done(Usage{Known: true, PromptTokens: 20, CompletionTokens: 16})
			if g.rds != nil {
				syncState(t, g)
			}
		}
		if admitted > 10 {
			t.Errorf("%d requests of 100 weighted tokens admitted under a monthly quota of 1000 tokens", admitted)
		}
	})
}

// In a zone whose clocks go back over midnight (Gaza on 2020-10-24: 01:00
// EEST became 00:00 EET, so 00:00-00:59 came twice) the day begins at the
// first midnight: its first hour (EEST) counted in the day before, whose
// window ended at the second midnight, a 25-hour day.
func TestADayWhoseMidnightComesTwiceBeginsAtTheFirst(t *testing.T) {
	loc, err := time.LoadLocation("Asia/Gaza")
	if err != nil {
		t.Skip(err)
	}
	first := time.Date(2020, 10, 23, 21, 0, 0, 0, time.UTC) // 00:00 EEST on the 24th
	second := first.Add(time.Hour)                          // 00:00 EET, the clocks went back
	for _, at := range []time.Time{first, second} {
		if l := at.In(loc); l.Day() != 24 || l.Hour() != 0 || l.Minute() != 0 {
			t.Skipf("the timezone data has no repeated midnight there (%s)", l)
		}
	}
	c := newCalendar(loc)
	end := time.Date(2020, 10, 25, 0, 0, 0, 0, loc).Unix()
	for _, now := range []time.Time{first, first.Add(30 * time.Minute), second, second.Add(3 * time.Hour)} {
		s := c.state(now.Unix())
		if day := s.win[periodDay]; day.start != first.Unix() || day.end != end {
			t.Errorf("at %s the day is %s .. %s, want %s .. the 25th", now.In(loc), time.Unix(day.start, 0).In(loc), time.Unix(day.end, 0).In(loc), first.In(loc))
		}
		if five := s.win[period5h]; five.start != first.Unix() {
			t.Errorf("at %s the 5h window begins %s, want %s", now.In(loc), time.Unix(five.start, 0).In(loc), first.In(loc))
		}
	}
	before := c.state(first.Unix() - 1800).win[periodDay] // 23:30 on the 23rd
	if before.end != first.Unix() || before.end-before.start != 24*3600 {
		t.Errorf("the 23rd is %s .. %s, want 24 hours to %s", time.Unix(before.start, 0).In(loc), time.Unix(before.end, 0).In(loc), first.In(loc))
	}
}

// A daily quota in that zone: a request in the first hour of the 24th
// counts in the 24th, not in the 23rd (whose one request it was refused
// behind), and the 24th's second midnight begins nothing.
func TestADailyQuotaCountsTheFirstOfTwoMidnightHoursInItsOwnDay(t *testing.T) {
	if _, err := time.LoadLocation("Asia/Gaza"); err != nil {
		t.Skip(err)
	}
	stores(t, func(t *testing.T, o Options) {
		key, hash := mintKey(t)
		first := time.Date(2020, 10, 23, 21, 0, 0, 0, time.UTC) // 00:00 EEST on the 24th
		clk := newFakeClock(first.Add(-30 * time.Minute))
		o.Now = clk.Now
		c := parseConfig(t, fmt.Sprintf(`{
			"user_limit": {"timezone": "Asia/Gaza", "templates": [{"name":"t","quota":{"enabled":true,"windows":[{"period":"day","max_requests":1}]}}]},
			"users": [{"name": "alice", "keys": [%q], "template": "t"}]}`, hash))
		g := newGov(t, o, c)
		u := identify(t, g, key)
		served := func() {
			t.Helper()
			tk := admitOK(t, g, u, Request{})
			tk.FirstToken()
			tk.Done(Usage{})
		}
		served()                             // 23:30 on the 23rd
		clk.Set(first.Add(30 * time.Minute)) // 00:30 EEST on the 24th
		served()
		clk.Set(first.Add(90 * time.Minute)) // 00:30 EET, the same day
		admitRejected(t, g, u, Request{}, CodeQuotaRequestsDay)
	})
}
