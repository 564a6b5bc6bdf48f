package govern

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// A Redis that lost the slots and seats in flight (restarted without
// persistence, or unreachable for longer than the lease TTL, so that the
// next admission pruned them as expired) counts them again once the
// routers holding them renew their leases: a router's requests in flight
// keep the other routers within the limits after Redis comes back.
func TestRedisSlotsAndSeatsInFlightCountAgainAfterRedisLostThem(t *testing.T) {
	rs := startRedis(t)
	o := redisOptions(t, rs)
	o.LeaseTTL = 600 * time.Millisecond // renewed every 200 ms
	key, hash := mintKey(t)
	c := userConfig(t, hash, `{"name":"t","concurrency":{"enabled":true,"limit":1}}`,
		`"rate_limit":{"overall_concurrency":1,"on_state_error":"closed"}`)
	c.UserLimit.OnStateError = "closed"
	g1, g2 := newGov(t, o, c), newGov(t, o, c)
	u1, u2 := identify(t, g1, key), identify(t, g2, key)
	tk := admitOK(t, g1, u1, Request{})
	seat := acquireOK(t, g1, []Target{w1}, PhaseMixed, 0)
	tk.FirstToken()
	seat.FirstToken()

	rs.stop()
	rs.start() // empty: the slot and the seat are gone
	waitFor(t, func() bool { return g2.rds.c.Ping(context.Background()).Err() == nil })
	// g1's next renewals add them back (every 200 ms; under load, a
	// renewal on a connection the restart closed fails and the next one
	// lands later: waiting one lease TTL flaked with -race on a loaded machine).
	h := rs.client(t)
	waitFor(t, func() bool {
		bg := context.Background()
		return h.ZCard(bg, o.RedisPrefix+"{u:alice}:seats").Val() == 1 && h.ZCard(bg, o.RedisPrefix+"{rl}:i:w1:overall").Val() == 1
	})
	admitRejected(t, g2, u2, Request{}, CodeConcurrencyUser)
	acquireRejected(t, g2, []Target{w1}, PhaseMixed, CodeConcurrencyOverall)

	// They end: counted no more, on either router.
	seat.Done()
	tk.Done(Usage{})
	syncState(t, g1)
	time.Sleep(o.LeaseTTL) // renewals after the end re-add nothing
	admitOK(t, g2, u2, Request{}).Done(Usage{})
	acquireOK(t, g2, []Target{w1}, PhaseMixed, 0).Done()
}

// A Redis restarted without persistence under load loses the counters,
// the records of the admissions and the marks. The requests admitted
// before it and settled after it were not counted in the windows the
// restarted Redis began: their settlements give back nothing there (a
// refund of one not served, the difference of a served one's usage to its
// estimate), or the new windows would count less than the requests
// admitted in them, below zero at worst, and let through more than the
// quota. Their slots and seats are counted again by the renewals until
// they end, then free: every count comes back to exactly what the requests
// admitted after the restart used, and the limits hold again. Before, the
// requests in flight across the restart took their refunds and
// reconciliations out of the new day window.
func TestRedisRestartedWithoutPersistenceUnderLoadComesBackConsistent(t *testing.T) {
	rs := startRedis(t)
	o := redisOptions(t, rs)
	o.LeaseTTL = 600 * time.Millisecond // renewed every 200 ms
	key, hash := mintKey(t)
	const conc = 8
	c := userConfig(t, hash, fmt.Sprintf(`{"name":"t","concurrency":{"enabled":true,"limit":%d},"rate":{"enabled":true,"rpm":100000,"tpm":100000000},
		"quota":{"enabled":true,"windows":[{"period":"day","max_requests":100000,"max_tokens":100000000}]}}`, conc),
		fmt.Sprintf(`"rate_limit":{"overall_concurrency":%d,"on_state_error":"closed"}`, conc))
	c.UserLimit.OnStateError = "closed"
	g := newGov(t, o, c)
	u := identify(t, g, key)
	r := Request{PromptTokens: 10, MaxTokens: 10} // an estimate of 20
	bg := context.Background()

	// The restart waits for the admissions under way (gate), so that each
	// admission is known to have run before it (epoch 0) or after (1);
	// requests stay in flight across it.
	var gate sync.RWMutex
	var epoch atomic.Int32
	var mu sync.Mutex
	var servedNew, tokensNew int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	const loaders = 3
	for w := range loaders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 400; i++ {
				select {
				case <-stop:
					return
				default:
				}
				gate.RLock()
				e := epoch.Load()
				a := g.AdmitAcquire(u, r, []Target{w1}, PhaseMixed)
				gate.RUnlock()
				if a.Refused != nil || a.SeatRefused != nil || a.Queue {
					a.Seat.Done()
					a.Ticket.Done(Usage{})
					time.Sleep(5 * time.Millisecond)
					continue
				}
				a.Ticket.FirstToken()
				a.Seat.FirstToken()
				time.Sleep(time.Duration(1+(i+w)%5) * time.Millisecond)
				use := Usage{Known: true, PromptTokens: 10, CompletionTokens: 1 + (i+w)%7}
				if e == 1 && a.Ticket.ts != nil && a.Ticket.ts.remote {
					mu.Lock()
					servedNew++
					tokensNew += int64(use.PromptTokens + use.CompletionTokens)
					mu.Unlock()
				}
				a.Seat.Done()
				a.Ticket.Done(use)
			}
		}()
	}
	// Requests in flight across the restart: two end unserved (refunds),
	// two served with less than their estimates.
	var held []Admission
	for range 4 {
		gate.RLock()
		a := g.AdmitAcquire(u, r, []Target{w1}, PhaseMixed)
		gate.RUnlock()
		if a.Refused != nil || a.SeatRefused != nil || a.Queue {
			t.Fatalf("a request before the restart: %+v", a)
		}
		held = append(held, a)
	}
	held[2].Ticket.FirstToken()
	held[3].Ticket.FirstToken()
	time.Sleep(300 * time.Millisecond) // load on the first Redis

	gate.Lock()
	rs.stop()
	rs.start() // empty
	epoch.Store(1)
	gate.Unlock()
	time.Sleep(300 * time.Millisecond) // load on the restarted Redis
	for i, a := range held {
		a.Seat.Done()
		a.Ticket.Done(Usage{Known: i >= 2, PromptTokens: 10, CompletionTokens: 1})
	}
	time.Sleep(300 * time.Millisecond)
	close(stop)
	wg.Wait()
	syncState(t, g)
	waitFor(t, func() bool { return g.rds.redoLen() == 0 })
	syncState(t, g)

	h := rs.client(t)
	hk := o.RedisPrefix + "{u:alice}"
	v, err := h.HMGet(bg, hk, "w1r", "w1k").Result()
	if err != nil {
		t.Fatal(err)
	}
	want := []any{strconv.FormatInt(servedNew, 10), strconv.FormatInt(tokensNew*1000, 10)}
	if servedNew == 0 {
		want = []any{nil, nil}
	}
	for i, name := range []string{"day's requests", "day's milli-tokens"} {
		if v[i] != want[i] {
			t.Errorf("%s %v after the restart, want %v (%d requests served admitted after it, %d tokens)", name, v[i], want[i], servedNew, tokensNew)
		}
	}
	if servedNew < 10 {
		t.Errorf("only %d requests served after the restart: too little load to tell", servedNew)
	}
	// Nothing stays taken: the renewals stopped with the requests.
	time.Sleep(o.LeaseTTL / 2)
	for _, k := range []string{hk + ":seats", o.RedisPrefix + "{rl}:i:w1:overall"} {
		if m := h.ZRange(bg, k, 0, -1).Val(); len(m) != 0 {
			t.Errorf("%s holds %v after every request ended", k, m)
		}
	}
	// The limits hold again: conc requests at once, not one more.
	var tks []Admission
	for range conc {
		a := g.AdmitAcquire(u, r, []Target{w1}, PhaseMixed)
		if a.Refused != nil || a.SeatRefused != nil || a.Queue {
			t.Fatalf("request %d of %d at once after the restart: %+v", len(tks)+1, conc, a)
		}
		tks = append(tks, a)
	}
	admitRejected(t, g, u, r, CodeConcurrencyUser)
	for _, a := range tks {
		a.Seat.Done()
		a.Ticket.Done(Usage{})
	}
}
