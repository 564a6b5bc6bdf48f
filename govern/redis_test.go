package govern

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

var prefixSeq atomic.Int64

// redisOptions returns Options on rs under a key prefix of its own.
func redisOptions(t *testing.T, rs *redisServer) Options {
	t.Helper()
	return Options{State: rs.url(), RedisPrefix: fmt.Sprintf("t%d:", prefixSeq.Add(1)), PollInterval: 20 * time.Millisecond}
}

func TestRedisTwoRoutersEnforceOneUserQuota(t *testing.T) {
	rs := startRedis(t)
	key, hash := mintKey(t)
	for _, tc := range []struct {
		window         string
		maxReq, maxTok int
	}{{"day", 50, 0}, {"week", 0, 5050}} {
		o := redisOptions(t, rs)
		c := userConfig(t, hash, fmt.Sprintf(`{"name":"t","quota":{"enabled":true,"windows":[{"period":%q,"max_requests":%d,"max_tokens":%d}]}}`, tc.window, tc.maxReq, tc.maxTok), "")
		g1, g2 := newGov(t, o, c), newGov(t, o, c)
		u1, u2 := identify(t, g1, key), identify(t, g2, key)
		var n atomic.Int64
		checkNoOvershoot(t, func() (Ticket, *Rejection) {
			if n.Add(1)%2 == 0 {
				return g1.Admit(context.Background(), u1, Request{PromptTokens: 30, MaxTokens: 70})
			}
			return g2.Admit(context.Background(), u2, Request{PromptTokens: 30, MaxTokens: 70})
		}, tc.maxReq, tc.maxTok, 100)
	}
}

func TestRedisTwoRoutersShareSeatsAndQueue(t *testing.T) {
	rs := startRedis(t)
	o := redisOptions(t, rs)
	o.PollInterval = time.Hour // only release notifications wake the queue
	c := parseConfig(t, `{"rate_limit":{"overall_concurrency":2,"overlimit":"queue","queue_size":10,"queue_timeout_ms":5000}}`)
	g1, g2 := newGov(t, o, c), newGov(t, o, c)
	a := acquireOK(t, g1, []Target{w1, w2}, PhaseMixed, 0)
	b := acquireOK(t, g2, []Target{w1, w2}, PhaseMixed, 0)
	x := acquireOK(t, g2, []Target{w1, w2}, PhaseMixed, 1)
	acquireRejected(t, g1, []Target{w1}, PhaseMixed, CodeConcurrencyOverall)
	got := make(chan Seat)
	go func() {
		s, i, rej := g2.Acquire(context.Background(), []Target{w1}, PhaseMixed)
		if rej != nil || i != 0 {
			t.Errorf("queued acquire: %d %v", i, rej)
		}
		got <- s
	}()
	waitFor(t, func() bool { g2.seats.mu.Lock(); defer g2.seats.mu.Unlock(); return g2.seats.q.n == 1 })
	start := time.Now()
	a.Done() // released on the other router: the notification wakes g2's queue
	s := <-got
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("woken after %v", d)
	}
	acquireRejected(t, g1, []Target{w1}, PhaseMixed, CodeConcurrencyOverall)
	s.Done()
	b.Done()
	x.Done()
	syncState(t, g2) // g2's ends reach Redis (alone, they would after EndDelay)
	acquireOK(t, g1, []Target{w1}, PhaseMixed, 0).Done()
}

// With the seats in Redis, a reload that changes rate_limit.scope on two
// routers counts the seats one of them has in flight on the new scope's
// sets: the other is refused until they end.
func TestRedisAScopeReloadCountsTheSeatsInFlightOnEveryRouter(t *testing.T) {
	rs := startRedis(t)
	scopeReloadCountsTheSeatsInFlight(t, func(js string) (*Governor, *Governor) {
		o := redisOptions(t, rs)
		c := parseConfig(t, `{"rate_limit":`+js+`}`)
		return newGov(t, o, c), newGov(t, o, c)
	})
}

// The copy of a router's seats into the new scope's sets reaches Redis on
// its own, within the end delay, without a request of that router to
// carry it; a seat returned right after the reload leaves both scopes.
func TestRedisAScopeReloadCopiesTheSeatsWithoutARequestToCarryIt(t *testing.T) {
	rs := startRedis(t)
	o := redisOptions(t, rs)
	c := parseConfig(t, `{"rate_limit":{"scope":"instance","overall_concurrency":1}}`)
	g, h := newGov(t, o, c), newGov(t, o, c)
	a := acquireOK(t, g, []Target{w1}, PhaseMixed, 0)
	b := acquireOK(t, g, []Target{w3}, PhaseMixed, 0)
	gw := parseConfig(t, `{"rate_limit":{"scope":"gateway","overall_concurrency":2}}`)
	for _, x := range []*Governor{g, h} {
		if err := x.Apply(gw); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, func() bool {
		s, _, rej := h.TryAcquire([]Target{w2}, PhaseMixed)
		s.Done()
		syncState(t, h)
		return rej != nil && rej.Code == CodeConcurrencyOverall
	})
	a.Done()
	b.Done()
	syncState(t, g)
	x := acquireOK(t, h, []Target{w2}, PhaseMixed, 0)
	y := acquireOK(t, h, []Target{w2}, PhaseMixed, 0)
	acquireRejected(t, h, []Target{w2}, PhaseMixed, CodeConcurrencyOverall)
	x.Done()
	y.Done()
}

func TestRedisSeatsOfACrashedRouterExpire(t *testing.T) {
	rs := startRedis(t)
	o := redisOptions(t, rs)
	o.LeaseTTL = 300 * time.Millisecond
	key, hash := mintKey(t)
	c := userConfig(t, hash, `{"name":"t","concurrency":{"enabled":true,"limit":1}}`, `"rate_limit":{"prefill_concurrency":1}`)
	crashed, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	if err := crashed.Apply(c); err != nil {
		t.Fatal(err)
	}
	g := newGov(t, o, c)
	acquireOK(t, crashed, []Target{w1}, PhaseMixed, 0)
	admitOK(t, crashed, identify(t, crashed, key), Request{})
	// Heartbeats keep the leases alive past their TTL.
	time.Sleep(2 * o.LeaseTTL)
	acquireRejected(t, g, []Target{w1}, PhaseMixed, CodeConcurrencyPrefill)
	admitRejected(t, g, identify(t, g, key), Request{}, CodeConcurrencyUser)
	crashed.Close() // no Done: the router died
	time.Sleep(o.LeaseTTL + 100*time.Millisecond)
	acquireOK(t, g, []Target{w1}, PhaseMixed, 0).Done()
	admitOK(t, g, identify(t, g, key), Request{}).Done(Usage{})
}

// countingHook counts the round trips (a command, or a pipeline) and the
// commands a client sends.
type countingHook struct{ trips, cmds atomic.Int64 }

func (h *countingHook) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) { return next(ctx, network, addr) }
}
func (h *countingHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.trips.Add(1)
		h.cmds.Add(1)
		return next(ctx, cmd)
	}
}
func (h *countingHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.trips.Add(1)
		h.cmds.Add(int64(len(cmds)))
		return next(ctx, cmds)
	}
}

// syncState returns once every end g queued has reached Redis: a call (an
// endsScript with no ends) runs after them.
//
// A stall's hold (a call timed out a moment ago: calls fail at once for
// stallHold) is waited out, up to 5 s: on a loaded machine a test's busy
// script may end later than it planned, so the hold can still be on.
func syncState(t testing.TB, g *Governor) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		err := g.rds.call(endsScript, nil).Err()
		if err == nil {
			return
		}
		if !errors.Is(err, errStateStalled) || time.Now().After(deadline) {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A client sending one request after another through one router, with
// every user rule and the seat counters on, costs one round trip per
// request: its admission and seat in one script, carrying the previous
// request's ends (seat returns, reconciliation) in the same pipeline,
// which Redis runs first: with a concurrency of 1 for the user and the
// instance, no request finds its predecessor's slot or seat taken.
func TestRedisOneRoundTripPerRequest(t *testing.T) {
	rs := startRedis(t)
	o := redisOptions(t, rs)
	o.PollInterval, o.LeaseTTL = time.Hour, time.Hour
	o.EndDelay = time.Hour // ends wait for the next call
	key, hash := mintKey(t)
	c := userConfig(t, hash, `{"name":"t","rate":{"enabled":true,"rpm":1000,"tpm":1000000},"concurrency":{"enabled":true,"limit":1},
		"quota":{"enabled":true,"windows":[{"period":"5h","max_requests":1000},{"period":"day","max_tokens":1000000},{"period":"week","max_requests":1000},{"period":"month","max_tokens":10000000}]}}`,
		`"rate_limit":{"overall_concurrency":1,"prefill_concurrency":1}`)
	g := newGov(t, o, c)
	u := identify(t, g, key)
	request := func(i int) {
		t.Helper()
		a := g.AdmitAcquire(u, Request{PromptTokens: 10, MaxTokens: 10}, []Target{w1}, PhaseMixed)
		if a.Refused != nil || a.Queue || a.SeatRefused != nil || a.Index != 0 || !a.Ticket.active() || a.Seat.ss == nil {
			t.Fatalf("request %d: %+v", i, a)
		}
		a.Ticket.FirstToken()
		a.Seat.FirstToken()
		a.Seat.Done()
		a.Ticket.Done(Usage{PromptTokens: 10, CompletionTokens: 5, Known: true})
	}
	request(-1) // the dispatcher's connection is set up (HELLO)
	h := &countingHook{}
	g.rds.c.AddHook(h)
	const n = 20
	for i := range n {
		request(i)
	}
	if got := h.trips.Load(); got != n {
		t.Fatalf("%d requests took %d round trips, want %d", n, got, n)
	}
	// Each pipeline: one script running the previous request's 3 ends
	// (prefill seat, seat, ticket), then the next admission.
	if got, want := h.cmds.Load(), int64(2*n); got != want {
		t.Fatalf("%d commands, want %d", got, want)
	}
	syncState(t, g)
	cl := rs.client(t)
	bg := context.Background()
	for _, k := range []string{o.RedisPrefix + "{u:alice}:seats", o.RedisPrefix + "{rl}:i:w1:overall", o.RedisPrefix + "{rl}:i:w1:prefill"} {
		if m, err := cl.ZCard(bg, k).Result(); err != nil || m != 0 {
			t.Fatalf("%s holds %d members after every end (%v)", k, m, err)
		}
	}
	if r, err := cl.HGet(bg, o.RedisPrefix+"{u:alice}", "w1k").Int64(); err != nil || r != (n+1)*15*1000 {
		t.Fatalf("day window tokens %d (%v), want the reconciled %d", r, err, (n+1)*15*1000)
	}
}

// Ends that no call carries reach Redis alone after EndDelay: another
// router sees the seat free.
func TestRedisEndsReachRedisAloneAfterEndDelay(t *testing.T) {
	rs := startRedis(t)
	o := redisOptions(t, rs)
	o.EndDelay = 20 * time.Millisecond
	c := parseConfig(t, `{"rate_limit":{"overall_concurrency":1}}`)
	g1, g2 := newGov(t, o, c), newGov(t, o, c)
	acquireOK(t, g1, []Target{w1}, PhaseMixed, 0).Done()
	cl := rs.client(t)
	waitFor(t, func() bool { return cl.ZCard(context.Background(), o.RedisPrefix+"{rl}:i:w1:overall").Val() == 0 })
	acquireOK(t, g2, []Target{w1}, PhaseMixed, 0).Done()
}

func TestRedisTPMReconcilesFromRealUsage(t *testing.T) {
	rs := startRedis(t)
	o := redisOptions(t, rs)
	clk := newFakeClock(t0)
	o.Now = clk.Now
	key, hash := mintKey(t)
	g := newGov(t, o, userConfig(t, hash, `{"name":"t","rate":{"enabled":true,"tpm":6000,"default_output_tokens":1000}}`, ""))
	u := identify(t, g, key)
	cl := rs.client(t)
	level := func() float64 {
		v, err := cl.HGet(context.Background(), o.RedisPrefix+"{u:alice}", "tl").Float64()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	a := admitOK(t, g, u, Request{PromptTokens: 500})
	if l := level(); l != 4500 {
		t.Fatalf("level %v, want 4500", l)
	}
	b := admitOK(t, g, u, Request{PromptTokens: 500, MaxTokens: 3000})
	admitRejected(t, g, u, Request{PromptTokens: 500, MaxTokens: 1000}, CodeTPM)
	a.FirstToken()
	a.Done(Usage{PromptTokens: 500, CompletionTokens: 20, Known: true})
	syncState(t, g)
	if l := level(); l != 1980 {
		t.Fatalf("level %v after refund, want 1980", l)
	}
	b.FirstToken()
	b.Done(Usage{PromptTokens: 500, CompletionTokens: 3500, Known: true})
	syncState(t, g)
	if l := level(); l != 1480 {
		t.Fatalf("level %v after charge, want 1480", l)
	}
	clk.Advance(10 * time.Second) // +1000
	admitOK(t, g, u, Request{PromptTokens: 480, MaxTokens: 2000}).Done(Usage{})
	syncState(t, g)
	if l := level(); l != 2480 {
		t.Fatalf("level %v after a refunded failure, want 2480", l)
	}
}

func TestRedisUserQueueAcrossRoutersDropsLeavers(t *testing.T) {
	rs := startRedis(t)
	o := redisOptions(t, rs)
	key, hash := mintKey(t)
	c := userConfig(t, hash, `{"name":"t","concurrency":{"enabled":true,"limit":1,"overlimit":"queue","queue_size":5,"queue_timeout_ms":5000}}`, "")
	g1, g2 := newGov(t, o, c), newGov(t, o, c)
	u1, u2 := identify(t, g1, key), identify(t, g2, key)
	holder := admitOK(t, g1, u1, Request{})
	ctx, cancel := context.WithCancel(context.Background())
	left := make(chan *Rejection)
	go func() { _, rej := g2.Admit(ctx, u2, Request{}); left <- rej }()
	waitFor(t, func() bool { return queuedOf(u2) == 1 })
	served := make(chan Ticket)
	go func() {
		tk, rej := g2.Admit(context.Background(), u2, Request{})
		if rej != nil {
			t.Error(rej)
		}
		served <- tk
	}()
	waitFor(t, func() bool { return queuedOf(u2) == 2 })
	cancel()
	if rej := <-left; rej == nil {
		t.Fatal("the leaving client was admitted")
	}
	waitFor(t, func() bool { return queuedOf(u2) == 1 })
	holder.Done(Usage{})
	tk := <-served
	short, cancel2 := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel2()
	if _, rej := g1.Admit(short, u1, Request{}); rej == nil || rej.Code != CodeConcurrencyUser {
		t.Fatalf("the slot is held on the other router: %v", rej)
	}
	tk.Done(Usage{})
	admitOK(t, g1, u1, Request{}).Done(Usage{})
}

func TestRedisRestartFailsOpenOrClosedAndRecovers(t *testing.T) {
	rs := startRedis(t)
	key, hash := mintKey(t)
	for _, mode := range []string{"open", "closed"} {
		o := redisOptions(t, rs)
		c := userConfig(t, hash, `{"name":"t","quota":{"enabled":true,"windows":[{"period":"day","max_requests":2}]}}`,
			fmt.Sprintf(`"rate_limit":{"overall_concurrency":1,"on_state_error":%q}`, mode))
		c.UserLimit.OnStateError = mode
		g := newGov(t, o, c)
		u := identify(t, g, key)
		tk := admitOK(t, g, u, Request{})
		tk.FirstToken()
		tk.Done(Usage{})
		rs.stop()
		tk, rej := g.Admit(context.Background(), u, Request{})
		s, _, srej := g.TryAcquire([]Target{w1}, PhaseMixed)
		switch mode {
		case "open":
			if rej != nil || srej != nil {
				t.Fatalf("fail open refused: %v %v", rej, srej)
			}
		case "closed":
			if rej == nil || rej.Code != CodeStateUnavailable || rej.Status != 503 || srej == nil || srej.Code != CodeStateUnavailable {
				t.Fatalf("fail closed: %v %v", rej, srej)
			}
		}
		tk.Done(Usage{})
		s.Done()
		rs.start()
		waitFor(t, func() bool { return g.rds.c.Ping(context.Background()).Err() == nil })
		// Redis ran without persistence: the day's count restarted at 0.
		for range 2 {
			tk := admitOK(t, g, u, Request{})
			tk.FirstToken()
			tk.Done(Usage{})
		}
		admitRejected(t, g, u, Request{}, CodeQuotaRequestsDay)
		acquireOK(t, g, []Target{w1}, PhaseMixed, 0).Done()
	}
}

func TestRedisDryRunCountsButAdmits(t *testing.T) {
	rs := startRedis(t)
	o := redisOptions(t, rs)
	key, hash := mintKey(t)
	c := userConfig(t, hash, `{"name":"t","dry_run":true,"quota":{"enabled":true,"windows":[{"period":"day","max_requests":1}]}}`, `"rate_limit":{"overall_concurrency":1,"dry_run":true}`)
	g := newGov(t, o, c)
	u := identify(t, g, key)
	qBefore := hitCounters[CodeQuotaRequestsDay][resDryRun].Get()
	sBefore := hitCounters[CodeConcurrencyOverall][resDryRun].Get()
	for range 3 {
		admitOK(t, g, u, Request{})
		acquireOK(t, g, []Target{w1}, PhaseMixed, 0)
	}
	if d := hitCounters[CodeQuotaRequestsDay][resDryRun].Get() - qBefore; d != 2 {
		t.Fatalf("quota dry-run hits %d, want 2", d)
	}
	if d := hitCounters[CodeConcurrencyOverall][resDryRun].Get() - sBefore; d != 2 {
		t.Fatalf("seat dry-run hits %d, want 2", d)
	}
}

func TestRedisURLErrorsNeverEchoThePassword(t *testing.T) {
	_, err := New(Options{State: "redis://:s3cret@127.0.0.1:1/0"})
	if err == nil || strings.Contains(err.Error(), "s3cret") {
		t.Fatalf("%v", err)
	}
}

// After Redis lost its scripts (a restart), a batch never runs a call
// while its ends are refused: the router reloads every script at the
// first NOSCRIPT, the ends' first. With a concurrency of 1 for the user
// and the instance, back-to-back requests are never refused.
func TestRedisEndsRunBeforeTheNextCallAfterAScriptFlush(t *testing.T) {
	rs := startRedis(t)
	o := redisOptions(t, rs)
	o.PollInterval, o.LeaseTTL, o.EndDelay = time.Hour, time.Hour, time.Hour
	key, hash := mintKey(t)
	g := newGov(t, o, userConfig(t, hash, `{"name":"t","concurrency":{"enabled":true,"limit":1}}`, `"rate_limit":{"overall_concurrency":1}`))
	u := identify(t, g, key)
	request := func(i int) {
		t.Helper()
		a := g.AdmitAcquire(u, Request{PromptTokens: 10, MaxTokens: 10}, []Target{w1}, PhaseMixed)
		if a.Refused != nil || a.Queue || a.SeatRefused != nil || a.Index != 0 {
			t.Fatalf("request %d: refused %v, queue %v, seat refused %v", i, a.Refused, a.Queue, a.SeatRefused)
		}
		a.Ticket.FirstToken()
		a.Seat.Done()
		a.Ticket.Done(Usage{})
	}
	request(0)
	syncState(t, g)
	if err := rs.client(t).ScriptFlush(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 3; i++ {
		request(i) // the first finds no script; the next carry the previous ends
	}
}

// The ends sent together run one by one: one that Redis refuses (a write
// under maxmemory with noeviction) does not keep a seat's release after it
// from running.
func TestRedisOneFailingEndDoesNotDropTheOthers(t *testing.T) {
	rs := startRedis(t)
	o := redisOptions(t, rs)
	o.EndDelay, o.LeaseTTL = time.Hour, time.Hour
	key, hash := mintKey(t)
	g := newGov(t, o, userConfig(t, hash, `{"name":"t","rate":{"enabled":true,"rpm":1000}}`, `"rate_limit":{"overall_concurrency":5}`))
	u := identify(t, g, key)
	tk := admitOK(t, g, u, Request{})
	s := acquireOK(t, g, []Target{w1}, PhaseMixed, 0)
	cl := rs.client(t)
	bg := context.Background()
	cl.ConfigSet(bg, "maxmemory-policy", "noeviction")
	cl.ConfigSet(bg, "maxmemory", "1")
	before := mStateErrors.Get()
	tk.Done(Usage{}) // its reconciliation writes (HSET): refused
	s.Done()         // a release (ZREM) is allowed
	syncState(t, g)
	cl.ConfigSet(bg, "maxmemory", "0")
	if n := cl.ZCard(bg, o.RedisPrefix+"{rl}:i:w1:overall").Val(); n != 0 {
		t.Fatalf("the seat is still held (%d members) after its release", n)
	}
	if mStateErrors.Get() == before {
		t.Fatal("the refused end was not counted as a state store error")
	}
}

// An admission whose reply comes after the call's timeout (Redis busy
// past it) is not sent again, and what it took once Redis ran it is given
// back: its request was admitted uncounted (fail open), so the day window
// counts nothing for it once Redis answers (it counted the request,
// refunded neither by the request's end, which touches nothing, nor by
// the router).
func TestRedisAnAdmissionWhoseReplyCameTooLateChargesNothing(t *testing.T) {
	rs := startRedis(t)
	o := redisOptions(t, rs)
	key, hash := mintKey(t)
	g := newGov(t, o, userConfig(t, hash, `{"name":"t","quota":{"enabled":true,"windows":[{"period":"day","max_requests":100}]}}`, ""))
	u := identify(t, g, key)
	admitOK(t, g, u, Request{}).Done(Usage{}) // refunded
	syncState(t, g)
	cl := rs.client(t)
	bg := context.Background()
	hk := o.RedisPrefix + "{u:alice}"
	cl.PExpire(bg, hk, time.Hour) // an admission that charges sets it to 35 days
	busy := make(chan struct{})
	go func() {
		defer close(busy)
		// Redis busy for 2.6 s, past the call's 2 s deadline (1.5 s, as
		// this test had, did not reach it: the call waited and succeeded).
		cl.Eval(context.Background(), `local s = redis.call('TIME'); local e = tonumber(s[1]) * 1e6 + tonumber(s[2]) + 2600000
while true do local n = redis.call('TIME'); if tonumber(n[1]) * 1e6 + tonumber(n[2]) > e then break end end return 0`, nil)
	}()
	time.Sleep(100 * time.Millisecond)
	errs := mStateErrors.Get()
	tk, _ := g.Admit(bg, u, Request{}) // times out: fail open
	if mStateErrors.Get() == errs {
		t.Fatal("the admission did not time out")
	}
	if tk.ts == nil || tk.ts.remote {
		t.Fatal("the admission that timed out was counted")
	}
	<-busy
	tk.FirstToken()
	tk.Done(Usage{})
	// Redis has read the admission: it charged (the hash's TTL), or it
	// came after its return (two marks: the first request's and its own).
	deadline := time.Now().Add(3 * time.Second)
	for cl.PTTL(bg, hk).Val() < 2*time.Hour && len(cl.Keys(bg, hk+":f:*").Val()) < 2 {
		if time.Now().After(deadline) {
			t.Fatal("Redis never ran the admission that timed out")
		}
		time.Sleep(10 * time.Millisecond)
	}
	deadline = time.Now().Add(3 * time.Second) // past the stall's hold: the return rides in its probe
	for {
		r, _ := cl.HGet(bg, hk, "w1r").Int64()
		if r == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("an admission admitted uncounted counted %d times in the day window", r)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// busyRedis keeps rs busy for ms milliseconds (a Lua busy loop) and
// returns a channel closed when it is over: the calls sent meanwhile wait
// for their answers.
func busyRedis(t *testing.T, rs *redisServer, ms int) chan struct{} {
	t.Helper()
	cl := rs.client(t)
	busy := make(chan struct{})
	go func() {
		defer close(busy)
		cl.Eval(context.Background(), `local s = redis.call('TIME'); local e = tonumber(s[1]) * 1e6 + tonumber(s[2]) + tonumber(ARGV[1]) * 1000
while true do local n = redis.call('TIME'); if tonumber(n[1]) * 1e6 + tonumber(n[2]) > e then break end end return 0`, nil, ms)
	}()
	time.Sleep(50 * time.Millisecond) // the script runs
	return busy
}

// recvWithin receives from ch, failing the test after d.
func recvWithin[T any](t *testing.T, ch <-chan T, d time.Duration, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(d):
		t.Fatalf("%s: nothing after %v", what, d)
		panic("unreachable")
	}
}

// seatQueueState is the seat queue's length and w1's count of waiters.
func seatQueueState(g *Governor) (n, waiting int) {
	g.seats.mu.Lock()
	defer g.seats.mu.Unlock()
	return g.seats.q.n, g.seats.inst["w1"].waiting
}

// A seat waiter whose client leaves while the queue loop's acquisition for
// it is out in Redis is dequeued once (not again by the loop), and the
// seat Redis granted for it goes back: nobody is left holding or renewing
// it, and the next request takes it.
func TestARedisSeatWaiterThatLeavesDuringThePumpGivesItsSeatBack(t *testing.T) {
	rs := startRedis(t)
	o := redisOptions(t, rs)
	o.PollInterval = time.Hour // only kicks run the queue loop
	c := parseConfig(t, `{"rate_limit":{"overall_concurrency":1,"overlimit":"queue","queue_size":10,"queue_timeout_ms":20000}}`)
	g := newGov(t, o, c)
	a := acquireOK(t, g, []Target{w1}, PhaseMixed, 0)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	res := make(chan *Rejection, 1)
	go func() {
		s, _, rej := g.Acquire(ctx, []Target{w1}, PhaseMixed)
		s.Done()
		res <- rej
	}()
	waitFor(t, func() bool { n, _ := seatQueueState(g); return n == 1 })
	time.Sleep(100 * time.Millisecond) // the enqueue's pump pass is over
	busy := busyRedis(t, rs, 600)
	a.Done() // the queue loop copies the queue and asks Redis for a seat (blocked)
	time.Sleep(150 * time.Millisecond)
	cancel() // the client leaves while that round trip is out
	if rej := recvWithin(t, res, 5*time.Second, "the leaver's Acquire"); rej == nil {
		t.Fatal("the client that left got a seat")
	}
	recvWithin(t, busy, 5*time.Second, "the busy script")
	time.Sleep(300 * time.Millisecond) // the loop's answer came back and it gave the seat back
	syncState(t, g)
	n, waiting := seatQueueState(g)
	held := rs.client(t).ZCard(context.Background(), o.RedisPrefix+"{rl}:i:w1:overall").Val()
	g.rds.mu.Lock()
	leases := len(g.rds.leases)
	g.rds.mu.Unlock()
	if n != 0 || waiting != 0 || held != 0 || leases != 0 {
		t.Errorf("after everyone left: queue n=%d, w1 waiting=%d, seats held in Redis=%d, leases renewed=%d; want all 0", n, waiting, held, leases)
	}
	short, cancel2 := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel2()
	s, _, rej := g.Acquire(short, []Target{w1}, PhaseMixed)
	if rej != nil {
		t.Errorf("nobody holds a seat, yet a new request is refused: %s %q", rej.Code, rej.Message)
	}
	s.Done()
}

// With a second waiter behind the one that leaves during the queue
// loop's round trip, the seat freed goes to the second one (it is neither
// dropped from the queue nor left to time out).
func TestARedisSeatWaiterThatLeavesDuringThePumpPassesTheSeatToTheNext(t *testing.T) {
	rs := startRedis(t)
	o := redisOptions(t, rs)
	o.PollInterval = time.Hour
	c := parseConfig(t, `{"rate_limit":{"overall_concurrency":1,"overlimit":"queue","queue_size":10,"queue_timeout_ms":3000}}`)
	g := newGov(t, o, c)
	a := acquireOK(t, g, []Target{w1}, PhaseMixed, 0)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	res := make(chan *Rejection, 1)
	go func() {
		s, _, rej := g.Acquire(ctx, []Target{w1}, PhaseMixed)
		s.Done()
		res <- rej
	}()
	waitFor(t, func() bool { n, _ := seatQueueState(g); return n == 1 })
	second := make(chan Seat, 1)
	go func() {
		s, _, rej := g.Acquire(context.Background(), []Target{w1}, PhaseMixed)
		if rej != nil {
			t.Errorf("the waiter behind the one that left: %s %q", rej.Code, rej.Message)
		}
		second <- s
	}()
	waitFor(t, func() bool { n, _ := seatQueueState(g); return n == 2 })
	time.Sleep(100 * time.Millisecond)
	busy := busyRedis(t, rs, 600)
	a.Done()
	time.Sleep(150 * time.Millisecond)
	cancel()
	recvWithin(t, res, 5*time.Second, "the leaver's Acquire")
	recvWithin(t, busy, 5*time.Second, "the busy script")
	s := recvWithin(t, second, 5*time.Second, "the second waiter")
	n, waiting := seatQueueState(g)
	if n != 0 || waiting != 0 {
		t.Errorf("queue n=%d, w1 waiting=%d; want 0", n, waiting)
	}
	s.Done()
	syncState(t, g)
	if held := rs.client(t).ZCard(context.Background(), o.RedisPrefix+"{rl}:i:w1:overall").Val(); held != 0 {
		t.Errorf("%d seats held in Redis after every request ended", held)
	}
}

// A user's queued request whose client leaves while the queue loop's
// admission for it is out in Redis is dequeued once, and the slot Redis
// granted for it goes back: the user's next request is admitted.
func TestARedisUserWaiterThatLeavesDuringThePumpGivesItsSlotBack(t *testing.T) {
	rs := startRedis(t)
	o := redisOptions(t, rs)
	o.PollInterval = time.Hour
	o.LeaseTTL = 300 * time.Millisecond
	key, hash := mintKey(t)
	c := userConfig(t, hash, `{"name":"t","concurrency":{"enabled":true,"limit":1,"overlimit":"queue","queue_size":5,"queue_timeout_ms":20000}}`, "")
	g := newGov(t, o, c)
	u := identify(t, g, key)
	holder := admitOK(t, g, u, Request{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	res := make(chan *Rejection, 1)
	go func() {
		tk, rej := g.Admit(ctx, u, Request{})
		tk.Done(Usage{})
		res <- rej
	}()
	waitFor(t, func() bool { return queuedOf(u) == 1 })
	time.Sleep(100 * time.Millisecond)
	busy := busyRedis(t, rs, 600)
	holder.Done(Usage{}) // kicks the queue loop: its admission for the waiter blocks in Redis
	time.Sleep(150 * time.Millisecond)
	cancel()
	if rej := recvWithin(t, res, 5*time.Second, "the leaver's Admit"); rej == nil {
		t.Fatal("the client that left was admitted")
	}
	recvWithin(t, busy, 5*time.Second, "the busy script")
	time.Sleep(300 * time.Millisecond)
	syncState(t, g)
	n := queuedOf(u)
	held := rs.client(t).ZCard(context.Background(), o.RedisPrefix+"{u:alice}:seats").Val()
	if n != 0 || held != 0 {
		t.Errorf("after everyone left: user queue n=%d, slots held in Redis=%d; want 0", n, held)
	}
	short, cancel2 := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel2()
	tk, rej := g.Admit(short, u, Request{})
	if rej != nil {
		t.Errorf("nobody holds a slot, yet the user is refused: %s %q", rej.Code, rej.Message)
	}
	tk.Done(Usage{})
}

// A call that timed out (Redis stalled past the client's timeout) still
// runs when Redis reads it. Its request was admitted uncounted (fail open)
// or refused (fail closed) and never returned the slot or seat the call
// took: with a limit of one, every request met the phantom until its
// lease expired (about 12 s). The failed call's slot and seat are now
// returned as soon as Redis answers again.
func TestRedisACallThatTimedOutButRanLaterLeavesNoPhantomSlotOrSeat(t *testing.T) {
	rs := startRedis(t)
	key, hash := mintKey(t)
	for _, mode := range []string{"open", "closed"} {
		o := redisOptions(t, rs)
		o.RedisPrefix += mode + ":"
		c := userConfig(t, hash, `{"name":"t","concurrency":{"enabled":true,"limit":1}}`,
			fmt.Sprintf(`"rate_limit":{"overall_concurrency":1,"on_state_error":%q}`, mode))
		c.UserLimit.OnStateError = mode
		g := newGov(t, o, c)
		u := identify(t, g, key)
		busy := busyRedis(t, rs, 2600) // past the call's 2 s deadline
		var s Seat
		seated := make(chan struct{})
		go func() { // in the same stall
			defer close(seated)
			s, _, _ = g.TryAcquire([]Target{w1}, PhaseMixed)
		}()
		tk, _ := g.Admit(context.Background(), u, Request{})
		<-seated
		<-busy
		tk.FirstToken()
		tk.Done(Usage{})
		s.Done()
		time.Sleep(300 * time.Millisecond) // the returns ride alone after EndDelay
		syncState(t, g)
		tk = admitOK(t, g, u, Request{})
		acquireOK(t, g, []Target{w1}, PhaseMixed, 0).Done()
		tk.FirstToken()
		tk.Done(Usage{})
	}
}

// An admission stamped just before a window boundary that reaches Redis
// after the new window's first admissions (a router's clock a millisecond
// behind, or its call queued behind another's) counts in the new window and
// leaves it standing: it wrote its older start, and the next admission of
// the new window found the count reset to zero.
func TestAQuotaWindowSurvivesALateAdmissionOfThePreviousOne(t *testing.T) {
	rs := startRedis(t)
	key, hash := mintKey(t)
	o := redisOptions(t, rs)
	midnight := time.Date(2026, 12, 6, 0, 0, 0, 0, time.UTC)
	c1 := newFakeClock(midnight.Add(time.Millisecond))
	c2 := newFakeClock(midnight.Add(-time.Millisecond))
	o1, o2 := o, o
	o1.Now, o2.Now = c1.Now, c2.Now
	c := userConfig(t, hash, `{"name":"t","quota":{"enabled":true,"windows":[{"period":"day","max_requests":3}]}}`, "")
	g1, g2 := newGov(t, o1, c), newGov(t, o2, c)
	u1, u2 := identify(t, g1, key), identify(t, g2, key)
	admit := func(g *Governor, u *User) bool {
		tk, rej := g.Admit(context.Background(), u, Request{PromptTokens: 1, MaxTokens: 1})
		if rej != nil {
			return false
		}
		tk.FirstToken()
		tk.Done(Usage{Known: true, PromptTokens: 1, CompletionTokens: 1})
		syncState(t, g)
		return true
	}
	// The new day on router 1: two requests.
	for i := 0; i < 2; i++ {
		if !admit(g1, u1) {
			t.Fatal("refused early")
		}
	}
	// Router 2's last request of the old day reaches Redis now.
	if !admit(g2, u2) {
		t.Fatal("router 2 refused")
	}
	// The new day has had at least 2 requests (3 counting the late one):
	// router 1 may admit at most 1 more.
	n := 0
	for i := 0; i < 5; i++ {
		if admit(g1, u1) {
			n++
		}
	}
	if n > 1 {
		t.Fatalf("day quota max_requests 3: after 2 requests of the new day (and 1 late one of the previous day), router 1 admitted %d more in the same day", n)
	}
}

// With Redis, a worker moved to another service takes the seats a router
// holds on it along: the new service's sets count them on every router,
// the old one's no longer do, and their return empties the sets.
func TestRedisAMovedInstancesSeatsCountOnItsNewService(t *testing.T) {
	rs := startRedis(t)
	o := redisOptions(t, rs)
	c := parseConfig(t, `{"rate_limit":{"scope":"service","overall_concurrency":2}}`)
	g, h := newGov(t, o, c), newGov(t, o, c)
	a := acquireOK(t, g, []Target{w1}, PhaseMixed, 0)
	b := acquireOK(t, g, []Target{w1}, PhaseMixed, 0)
	g.MoveInstance(Target{Instance: w1.Instance, Service: w3.Service})
	syncState(t, g)
	cl := rs.client(t)
	card := func(svc string) int64 {
		t.Helper()
		n, err := cl.ZCard(context.Background(), o.RedisPrefix+"{rl}:s:"+svc+":overall").Result()
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	if na, nb := card("svc-a"), card("svc-b"); na != 0 || nb != 2 {
		t.Fatalf("after the move: svc-a holds %d seats, svc-b %d; want 0 and 2", na, nb)
	}
	acquireRejected(t, h, []Target{w3}, PhaseMixed, CodeConcurrencyOverall)
	x := acquireOK(t, h, []Target{w2}, PhaseMixed, 0)
	y := acquireOK(t, h, []Target{w2}, PhaseMixed, 0)
	for _, s := range []Seat{a, b, x, y} {
		s.Done()
	}
	syncState(t, g)
	syncState(t, h)
	if na, nb := card("svc-a"), card("svc-b"); na != 0 || nb != 0 {
		t.Fatalf("once idle: svc-a holds %d seats, svc-b %d", na, nb)
	}
	acquireOK(t, h, []Target{w3}, PhaseMixed, 0).Done()
}

// A seat whose return is under way (Done has taken its counters, its end
// is not queued yet) as its instance moves to another service is removed
// from the sets it is in. Before, MoveInstance skipped it (nothing held)
// but already named the new service's sets for it, so the return removed
// it from svc-b's sets, where it never was, and left it in svc-a's: 1
// overall and 1 prefill member there, holding a seat of svc-a until its
// lease expired.
func TestRedisASeatReturnedAsItsInstanceMovesLeavesNothingBehind(t *testing.T) {
	rs := startRedis(t)
	o := redisOptions(t, rs)
	c := parseConfig(t, `{"rate_limit":{"scope":"service","overall_concurrency":2}}`)
	g := newGov(t, o, c)
	cl := rs.client(t)
	card := func(svc, part string) int64 {
		t.Helper()
		n, err := cl.ZCard(context.Background(), o.RedisPrefix+"{rl}:s:"+svc+":"+part).Result()
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	for _, firstToken := range []bool{false, true} {
		a := acquireOK(t, g, []Target{w1}, PhaseMixed, 0)
		ss := a.ss
		// Done's first half: the counters are taken from the seat...
		var st uint64
		for {
			st = ss.state.Load()
			bit := uint64(ssDoneBusy)
			clear := uint64(ssHeld | ssActive)
			if firstToken { // or FirstToken's: the prefill seat only
				bit, clear = ssFTBusy, 1<<cPrefill
			}
			if ss.state.CompareAndSwap(st, st&^clear|bit) {
				break
			}
		}
		// ...the instance moves...
		g.MoveInstance(Target{Instance: w1.Instance, Service: w3.Service})
		// ...and the return is queued.
		if firstToken {
			g.rds.releaseSeat(ss, 1<<cPrefill)
			ss.unbusy(ssFTBusy)
			syncState(t, g)
			if na, nb := card("svc-a", "prefill"), card("svc-b", "prefill"); na != 0 || nb != 0 {
				t.Fatalf("prefill returned during the move: svc-a holds %d prefill seats, svc-b %d; want 0 and 0", na, nb)
			}
			if na, nb := card("svc-a", "overall"), card("svc-b", "overall"); na != 0 || nb != 1 {
				t.Fatalf("prefill returned during the move: svc-a holds %d overall seats, svc-b %d; want 0 and 1", na, nb)
			}
			a.Done()
		} else {
			g.rds.releaseSeat(ss, st&ssHeld)
			ss.unbusy(ssDoneBusy)
		}
		syncState(t, g)
		for _, part := range []string{"overall", "prefill"} {
			if na, nb := card("svc-a", part), card("svc-b", part); na != 0 || nb != 0 {
				t.Fatalf("firstToken=%v, once idle: svc-a holds %d %s seats, svc-b %d", firstToken, na, part, nb)
			}
		}
		g.MoveInstance(Target{Instance: w1.Instance, Service: w1.Service}) // back for the next round
	}
}
