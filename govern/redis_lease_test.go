package govern

import (
	"context"
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
