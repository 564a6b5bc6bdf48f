package govern

import (
	"bytes"
	"context"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/infera/infera/internal/testsrv"
)

// outageProxy is a loopback TCP proxy in front of a redis-server that can
// make it unreachable (every connection closed, new ones refused) and
// reachable again at the same address, with its data: a testsrv.Front
// whose backend stays the server. The front holds its port while the
// server is cut off; a proxy that closed its listener and listened again
// could find its port taken by another test meanwhile (go test -p).
type outageProxy struct {
	front  *testsrv.Front
	target string
}

func startOutageProxy(t *testing.T, target string) *outageProxy {
	p := &outageProxy{front: testsrv.NewFront(t), target: target}
	p.front.Up(target)
	return p
}

func (p *outageProxy) url() string { return "redis://" + p.front.Addr + "/0" }

// cut makes Redis unreachable: connecting is refused.
func (p *outageProxy) cut() { p.front.Down() }

// restore makes Redis reachable again.
func (p *outageProxy) restore() { p.front.Up(p.target) }

// Requests that end while Redis cannot be reached (down, or a partition)
// are refunded or reconciled once it answers again, when their end never
// reached it: a Redis back with its data does not keep their estimates
// (and a refunded request's count) charged for good.
func TestRedisEndsThatCouldNotReachRedisAreSettledWhenItAnswers(t *testing.T) {
	rs := startRedis(t)
	px := startOutageProxy(t, "127.0.0.1:"+strconv.Itoa(rs.port))
	o := redisOptions(t, rs)
	o.State = px.url()
	key, hash := mintKey(t)
	c := userConfig(t, hash, `{"name":"t","quota":{"enabled":true,"windows":[{"period":"day","max_requests":3,"max_tokens":1000}]}}`, "")
	g := newGov(t, o, c)
	u := identify(t, g, key)
	r := Request{PromptTokens: 10, MaxTokens: 10} // an estimate of 20
	refunded := admitOK(t, g, u, r)
	served := admitOK(t, g, u, r)
	served.FirstToken()

	px.cut()
	for range 3 { // fail open, uncounted; the pool's connections are gone
		admitOK(t, g, u, r).Done(Usage{})
	}
	refunded.Done(Usage{})                                                 // its engine failed: nothing served
	served.Done(Usage{Known: true, PromptTokens: 10, CompletionTokens: 2}) // 12 of its 20
	time.Sleep(50 * time.Millisecond)                                      // the ends fail to connect
	px.restore()

	h := rs.client(t)
	hk := o.RedisPrefix + "{u:alice}"
	deadline := time.Now().Add(3 * time.Second)
	for {
		v, _ := h.HMGet(context.Background(), hk, "w1r", "w1k").Result()
		if len(v) == 2 && v[0] == "1" && v[1] == "12000" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the day's requests and milli-tokens %v, want [1 12000] (one request served, 12 tokens)", v)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Lease renewals that cannot reach Redis (it is down) keep nothing to send
// again: over a long outage they would fill the returns kept for Redis's
// return and evict those of the requests that ended meanwhile.
func TestRedisRenewalsThatCouldNotReachRedisKeepNothing(t *testing.T) {
	rs := startRedis(t)
	px := startOutageProxy(t, "127.0.0.1:"+strconv.Itoa(rs.port))
	o := redisOptions(t, rs)
	o.State = px.url()
	o.LeaseTTL = 300 * time.Millisecond // renewed every 100 ms
	key, hash := mintKey(t)
	g := newGov(t, o, userConfig(t, hash, `{"name":"t","concurrency":{"enabled":true,"limit":5}}`, ""))
	u := identify(t, g, key)
	var held []Ticket
	for range 3 {
		held = append(held, admitOK(t, g, u, Request{}))
	}
	px.cut()
	for range 3 { // fail open; the pool's connections are gone
		admitOK(t, g, u, Request{}).Done(Usage{})
	}
	time.Sleep(600 * time.Millisecond) // renewals fail to connect
	g.rds.qmu.Lock()
	n := 0
	for _, x := range g.rds.rets {
		if x.renewal {
			n++
		}
	}
	g.rds.qmu.Unlock()
	px.restore()
	for _, tk := range held {
		tk.Done(Usage{})
	}
	if n > 0 {
		t.Fatalf("%d renewals that never reached Redis kept to send again", n)
	}
}

// The settlements kept for sending again while Redis cannot be reached are
// bounded (16,384, shortened here to 8): past it the oldest are evicted,
// their requests keeping their estimates charged, and each one evicted is
// counted in infera_governance_state_settlements_dropped_total{reason="evicted"}
// (it went silently). The ones kept land once Redis answers.
func TestRedisSettlementsEvictedFromAFullResendQueueAreCounted(t *testing.T) {
	rs := startRedis(t)
	px := startOutageProxy(t, "127.0.0.1:"+strconv.Itoa(rs.port))
	o := redisOptions(t, rs)
	o.State = px.url()
	o.LeaseTTL = time.Hour // no renewals in the way
	key, hash := mintKey(t)
	c := userConfig(t, hash, `{"name":"t","quota":{"enabled":true,"windows":[{"period":"day","max_requests":100,"max_tokens":100000}]}}`, "")
	g := newGov(t, o, c)
	g.rds.maxRedo = 8
	u := identify(t, g, key)
	r := Request{PromptTokens: 10, MaxTokens: 10} // an estimate of 20
	const n = 12
	var tks []Ticket
	for range n {
		tk := admitOK(t, g, u, r)
		tk.FirstToken()
		tks = append(tks, tk)
	}
	syncState(t, g)
	evicted := mStateSettleEvicted.Get()
	px.cut()
	for _, tk := range tks { // settled while Redis is down: kept, the oldest evicted
		tk.Done(Usage{Known: true, PromptTokens: 10, CompletionTokens: 2}) // 12 of its 20
		time.Sleep(5 * time.Millisecond)
	}
	deadline := time.Now().Add(3 * time.Second)
	for mStateSettleEvicted.Get()-evicted < n-8 {
		if time.Now().After(deadline) {
			t.Fatalf("%d settlements counted as evicted, want %d (%d kept for 8 places)", mStateSettleEvicted.Get()-evicted, n-8, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
	px.restore()
	h := rs.client(t)
	hk := o.RedisPrefix + "{u:alice}"
	want := []any{"12", strconv.Itoa((8*12 + (n-8)*20) * 1000)} // the evicted keep their estimates
	deadline = time.Now().Add(3 * time.Second)
	for {
		v, _ := h.HMGet(context.Background(), hk, "w1r", "w1k").Result()
		if len(v) == 2 && v[0] == want[0] && v[1] == want[1] {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the day's requests and milli-tokens %v, want %v (8 settlements landed, 4 evicted)", v, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if got := mStateSettleEvicted.Get() - evicted; got != n-8 {
		t.Fatalf("%d settlements counted as evicted, want %d", got, n-8)
	}
}

// The returns of seats kept for sending again while Redis cannot be
// reached are bounded (shortened here to 2): past it the oldest are
// evicted and counted in
// infera_governance_state_releases_dropped_total{reason="evicted"} (they
// went uncounted), and the seats whose return was evicted stay taken in
// Redis until their leases expire, LeaseTTL after their return at most
// (their last renewal came before it): then every seat is free again.
func TestRedisASeatWhoseReturnWasEvictedIsFreeOnceItsLeaseExpires(t *testing.T) {
	rs := startRedis(t)
	px := startOutageProxy(t, "127.0.0.1:"+strconv.Itoa(rs.port))
	o := redisOptions(t, rs)
	o.State = px.url()
	const ttl = 2 * time.Second // renewed every 667 ms while held
	o.LeaseTTL = ttl
	g := newGov(t, o, parseConfig(t, `{"rate_limit":{"overall_concurrency":4}}`))
	g.rds.maxRedo = 2
	evicted := metrics.GetOrCreateCounter(`infera_governance_state_releases_dropped_total{reason="evicted"}`)
	var seats []Seat
	for range 4 {
		seats = append(seats, acquireOK(t, g, []Target{w1}, PhaseMixed, 0))
	}
	syncState(t, g)
	before := evicted.Get()
	px.cut()
	returned := time.Now()
	for _, s := range seats { // returned while Redis is down: kept, the oldest evicted
		s.Done()
		time.Sleep(5 * time.Millisecond)
	}
	deadline := time.Now().Add(3 * time.Second)
	for evicted.Get()-before < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("%d seat returns counted as evicted, want 2 (4 kept for 2 places)", evicted.Get()-before)
		}
		time.Sleep(5 * time.Millisecond)
	}
	px.restore()
	h := rs.client(t)
	bg := context.Background()
	k := o.RedisPrefix + "{rl}:i:w1:overall"
	live := func() int64 { // the seats a seat acquisition counts now
		return h.ZCount(bg, k, "("+strconv.FormatInt(time.Now().UnixMilli(), 10), "+inf").Val()
	}
	// The 2 returns kept land; the 2 evicted seats stay taken.
	deadline = time.Now().Add(time.Second)
	for h.ZCard(bg, k).Val() != 2 {
		if time.Now().After(deadline) {
			t.Fatalf("%d seats in Redis after the kept returns landed, want the 2 evicted", h.ZCard(bg, k).Val())
		}
		time.Sleep(5 * time.Millisecond)
	}
	if n := live(); n != 2 || time.Since(returned) >= ttl {
		t.Fatalf("%d seats counted %v after their return, want the 2 evicted within their lease (%v)", n, time.Since(returned), ttl)
	}
	for live() > 0 {
		if time.Since(returned) > ttl+500*time.Millisecond {
			t.Fatalf("%d seats whose return was evicted still counted %v after it, past their lease (%v)", live(), time.Since(returned), ttl)
		}
		time.Sleep(10 * time.Millisecond)
	}
	for range 4 { // every seat is free again
		acquireOK(t, g, []Target{w1}, PhaseMixed, 0)
	}
	if got := evicted.Get() - before; got != 2 {
		t.Fatalf("%d seat returns counted as evicted, want 2", got)
	}
}

// A settlement kept to be sent again (its connection was reset) when the
// router closes is sent before it closes: Redis answers, and the request
// is charged its usage, not its estimate. Before, the router closed with
// it in its list of ends to send again, silently: with no other call
// queued at shutdown nothing carried it.
func TestRedisASettlementKeptToSendAgainLandsWhenTheRouterCloses(t *testing.T) {
	rs := startRedis(t)
	o := redisOptions(t, rs)
	o.LeaseTTL = time.Hour
	o.PollInterval = time.Hour // only the shutdown sends what is kept
	o.EndDelay = time.Millisecond
	px := startResetProxy(t, "127.0.0.1:"+strconv.Itoa(rs.port), []byte(endsScript.Hash()), []byte(o.RedisPrefix+"{u:alice}"))
	o.State = px.url()
	key, hash := mintKey(t)
	g := newGov(t, o, userConfig(t, hash, `{"name":"t","quota":{"enabled":true,"windows":[{"period":"day","max_requests":10,"max_tokens":1000}]}}`, ""))
	u := identify(t, g, key)
	tk := admitOK(t, g, u, Request{PromptTokens: 10, MaxTokens: 10}) // an estimate of 20
	late := admitOK(t, g, u, Request{PromptTokens: 10, MaxTokens: 10})
	idle(t, g)
	tk.FirstToken()
	px.arm(cutBefore)
	tk.Done(Usage{Known: true, PromptTokens: 10, CompletionTokens: 2})
	recvWithin(t, px.fired, 3*time.Second, "the settlement's connection reset")
	waitFor(t, func() bool {
		g.rds.qmu.Lock()
		defer g.rds.qmu.Unlock()
		return g.rds.keptLocked() == 1 && !g.rds.busy && len(g.rds.q) == 0
	})
	g.Close()
	v, _ := rs.client(t).HMGet(context.Background(), o.RedisPrefix+"{u:alice}", "w1r", "w1k").Result()
	if len(v) != 2 || v[0] != "2" || v[1] != "32000" {
		t.Fatalf("the day's requests and milli-tokens %v after the router closed, want the usage and the estimate in flight [2 32000]", v)
	}
	// A request ending after the router closed cannot be settled: counted.
	closed := metrics.GetOrCreateCounter(`infera_governance_state_settlements_dropped_total{reason="closed"}`)
	before := closed.Get()
	late.Done(Usage{})
	if got := closed.Get() - before; got != 1 {
		t.Fatalf("%d settlements counted as dropped at close, want the one of the request ending after it", got)
	}
}

// loadingProxy is a loopback TCP proxy in front of a redis-server that,
// while loading is set, answers every command of a chunk holding each
// trigger with Redis's LOADING error instead of forwarding it, as a Redis
// restarted with persistence answers while it loads its dataset.
type loadingProxy struct {
	addr    string
	target  string
	trigger [][]byte
	loading atomic.Bool
	refused atomic.Int64 // chunks answered LOADING
}

func startLoadingProxy(t *testing.T, target string, trigger ...[]byte) *loadingProxy {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &loadingProxy{addr: ln.Addr().String(), target: target, trigger: trigger}
	var mu sync.Mutex
	var conns []net.Conn
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
	})
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			u, err := net.Dial("tcp4", p.target)
			if err != nil {
				c.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, c, u)
			mu.Unlock()
			// Both directions write to c.
			var wmu sync.Mutex
			go func() { // client -> Redis
				defer u.Close()
				buf := make([]byte, 64<<10)
				for {
					n, err := c.Read(buf)
					if err != nil {
						return
					}
					if p.loading.Load() && p.matches(buf[:n]) {
						p.refused.Add(1)
						wmu.Lock()
						for range countCommands(buf[:n]) {
							c.Write([]byte("-LOADING Redis is loading the dataset in memory\r\n"))
						}
						wmu.Unlock()
						continue
					}
					if _, err := u.Write(buf[:n]); err != nil {
						return
					}
				}
			}()
			go func() { // Redis -> client
				defer c.Close()
				buf := make([]byte, 64<<10)
				for {
					n, err := u.Read(buf)
					if err != nil {
						return
					}
					wmu.Lock()
					_, err = c.Write(buf[:n])
					wmu.Unlock()
					if err != nil {
						return
					}
				}
			}()
		}
	}()
	return p
}

func (p *loadingProxy) url() string { return "redis://" + p.addr + "/0" }

func (p *loadingProxy) matches(b []byte) bool {
	for _, x := range p.trigger {
		if !bytes.Contains(b, x) {
			return false
		}
	}
	return true
}

// countCommands counts the commands (RESP arrays of bulk strings) in b,
// a whole pipeline.
func countCommands(b []byte) int {
	n := 0
	for len(b) > 0 && b[0] == '*' {
		i := bytes.Index(b, []byte("\r\n"))
		args, _ := strconv.Atoi(string(b[1:i]))
		b = b[i+2:]
		for range args {
			i = bytes.Index(b, []byte("\r\n"))
			l, _ := strconv.Atoi(string(b[1:i]))
			b = b[i+2+l+2:]
		}
		n++
	}
	return n
}

// A settlement that Redis refused with an error reply (LOADING: restarted
// with its AOF or its dump, it is still loading; any error reply for the
// whole script) never ran: it is sent again until it lands, however long
// Redis takes, not dropped after the minute that bounds the copies that
// may have run. Before, a load longer than that minute dropped it (counted
// as expired), its request keeping its estimate.
func TestRedisASettlementRefusedWhileRedisLoadsLandsOnceItHasLoaded(t *testing.T) {
	rs := startRedis(t)
	o := redisOptions(t, rs)
	o.LeaseTTL = time.Hour
	o.EndDelay = time.Millisecond
	px := startLoadingProxy(t, "127.0.0.1:"+strconv.Itoa(rs.port), []byte(endsScript.Hash()), []byte(o.RedisPrefix+"{u:alice}"))
	o.State = px.url()
	key, hash := mintKey(t)
	g := newGov(t, o, userConfig(t, hash, `{"name":"t","quota":{"enabled":true,"windows":[{"period":"day","max_requests":10,"max_tokens":1000}]}}`, ""))
	g.rds.settleFor = 300 * time.Millisecond
	u := identify(t, g, key)
	tk := admitOK(t, g, u, Request{PromptTokens: 10, MaxTokens: 10}) // an estimate of 20
	idle(t, g)
	tk.FirstToken()
	px.loading.Store(true)
	start := time.Now()
	tk.Done(Usage{Known: true, PromptTokens: 10, CompletionTokens: 2})
	deadline := start.Add(3 * time.Second)
	for px.refused.Load() < 3 || time.Since(start) < 3*g.rds.settleFor { // loading for 3 times the resend limit
		if time.Now().After(deadline) {
			t.Fatalf("%d copies of the settlement refused while loading, want it sent again", px.refused.Load())
		}
		time.Sleep(10 * time.Millisecond)
	}
	px.loading.Store(false) // loaded
	h := rs.client(t)
	deadline = time.Now().Add(8 * time.Second) // the backoff's step (5 s at most) and margin
	for {
		v, _ := h.HMGet(context.Background(), o.RedisPrefix+"{u:alice}", "w1r", "w1k").Result()
		if len(v) == 2 && v[0] == "1" && v[1] == "12000" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the day's requests and milli-tokens %v once Redis loaded, want the usage [1 12000]", v)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Seat acquisitions that cannot reach Redis (it is down, connections
// refused: admitted uncounted, fail open) never ran, so they keep nothing
// to give back: under load over an outage their returns filled the list
// of ends kept for Redis's return (2 entries each) and evicted the
// settlements of the requests that ended meanwhile, which kept their
// estimates for good.
func TestRedisSeatCallsThatCouldNotReachRedisKeepNoReturns(t *testing.T) {
	rs := startRedis(t)
	px := startOutageProxy(t, "127.0.0.1:"+strconv.Itoa(rs.port))
	o := redisOptions(t, rs)
	o.State = px.url()
	o.LeaseTTL = time.Hour // no renewals in the way
	key, hash := mintKey(t)
	c := userConfig(t, hash, `{"name":"t","quota":{"enabled":true,"windows":[{"period":"day","max_requests":100,"max_tokens":100000}]}}`,
		`"rate_limit":{"overall_concurrency":100}`)
	g := newGov(t, o, c)
	g.rds.maxRedo = 8
	u := identify(t, g, key)
	r := Request{PromptTokens: 10, MaxTokens: 10} // an estimate of 20
	const n = 4
	var tks []Ticket
	for range n {
		tk := admitOK(t, g, u, r)
		tk.FirstToken()
		tks = append(tks, tk)
	}
	syncState(t, g)
	px.cut()
	for _, tk := range tks { // settled while Redis is down: kept
		tk.Done(Usage{Known: true, PromptTokens: 10, CompletionTokens: 2}) // 12 of its 20
	}
	waitFor(t, func() bool { g.rds.qmu.Lock(); defer g.rds.qmu.Unlock(); return g.rds.keptLocked() == n })
	for range 20 { // fail open: uncounted
		s, _, rej := g.TryAcquire([]Target{w1}, PhaseMixed)
		if rej != nil {
			t.Fatalf("seat refused while Redis is down: %v, want fail open", rej)
		}
		s.Done()
	}
	idle(t, g)
	px.restore()
	h := rs.client(t)
	deadline := time.Now().Add(3 * time.Second)
	for {
		v, _ := h.HMGet(context.Background(), o.RedisPrefix+"{u:alice}", "w1r", "w1k").Result()
		if len(v) == 2 && v[0] == "4" && v[1] == "48000" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the day's requests and milli-tokens %v once Redis is back, want the usage [4 48000]", v)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A settlement that Redis refuses as it runs (a primary demoted to a
// read-only replica by a failover, answering READONLY to writes; a write
// refused under maxmemory) changed nothing: it is sent again until Redis
// takes it. Before, it was counted as an error and dropped, its request
// keeping its estimate for good.
func TestRedisASettlementRefusedByARedisThatCannotWriteLandsOnceItCan(t *testing.T) {
	rs := startRedis(t)
	o := redisOptions(t, rs)
	o.LeaseTTL = time.Hour
	o.EndDelay = time.Millisecond
	key, hash := mintKey(t)
	g := newGov(t, o, userConfig(t, hash, `{"name":"t","quota":{"enabled":true,"windows":[{"period":"day","max_requests":10,"max_tokens":1000}]}}`, ""))
	u := identify(t, g, key)
	tk := admitOK(t, g, u, Request{PromptTokens: 10, MaxTokens: 10}) // an estimate of 20
	tk.FirstToken()
	syncState(t, g)
	h := rs.client(t)
	bg := context.Background()
	if err := h.ReplicaOf(bg, "127.0.0.1", "1").Err(); err != nil { // read-only, its data kept
		t.Fatal(err)
	}
	t.Cleanup(func() { h.ReplicaOf(bg, "NO", "ONE") })
	errs := mStateErrors.Get()
	tk.Done(Usage{Known: true, PromptTokens: 10, CompletionTokens: 2})
	waitFor(t, func() bool { return mStateErrors.Get() > errs }) // refused
	time.Sleep(100 * time.Millisecond)
	if err := h.ReplicaOf(bg, "NO", "ONE").Err(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(3 * time.Second)
	for {
		v, _ := h.HMGet(bg, o.RedisPrefix+"{u:alice}", "w1r", "w1k").Result()
		if len(v) == 2 && v[0] == "1" && v[1] == "12000" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the day's requests and milli-tokens %v once Redis writes again, want the usage [1 12000]", v)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Ends that Redis keeps refusing (a primary demoted to a read-only
// replica answering READONLY, writes refused under maxmemory) are sent
// again with a backoff that doubles while Redis refuses them (from
// 200 ms, jittered, up to 5 s), not ahead of every
// pipeline and every poll; an admission Redis refused as read-only took
// nothing and keeps no return. Once Redis writes again they land, and
// the backoff starts over. Before, the refused settlement rode in every
// admission's pipeline and every poll, and every admission refused left
// a return of its own kept and sent again with it, filling the list.
func TestRedisEndsRedisKeepsRefusingAreSentAgainWithBackoff(t *testing.T) {
	rs := startRedis(t)
	for _, how := range []string{"READONLY", "OOM"} {
		t.Run(how, func(t *testing.T) { testEndsRefusedWithBackoff(t, rs, how) })
	}
}

func testEndsRefusedWithBackoff(t *testing.T, rs *redisServer, how string) {
	o := redisOptions(t, rs)
	o.LeaseTTL = time.Hour
	o.EndDelay = time.Millisecond
	key, hash := mintKey(t)
	g := newGov(t, o, userConfig(t, hash, `{"name":"t","quota":{"enabled":true,"windows":[{"period":"day","max_requests":1000,"max_tokens":100000}]}}`, ""))
	u := identify(t, g, key)
	r := Request{PromptTokens: 10, MaxTokens: 10} // an estimate of 20
	tk := admitOK(t, g, u, r)
	tk.FirstToken()
	syncState(t, g)
	h := rs.client(t)
	bg := context.Background()
	refuse := func(on bool) {
		t.Helper()
		var err error
		switch {
		case how == "READONLY" && on:
			err = h.ReplicaOf(bg, "127.0.0.1", "1").Err() // read-only, its data kept
		case how == "READONLY":
			err = h.ReplicaOf(bg, "NO", "ONE").Err()
		case on: // every write that may grow memory refused
			if err = h.ConfigSet(bg, "maxmemory-policy", "noeviction").Err(); err == nil {
				err = h.ConfigSet(bg, "maxmemory", "1").Err()
			}
		default:
			err = h.ConfigSet(bg, "maxmemory", "0").Err()
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	refuse(true)
	t.Cleanup(func() { refuse(false) })
	undone := mStateUndone.Get()
	tk.Done(Usage{Known: true, PromptTokens: 10, CompletionTokens: 2})
	waitFor(t, func() bool { return g.rds.redoLen() == 1 }) // refused, kept
	// 2 s of traffic: an admission every 5 ms at most, each refused
	// and admitted uncounted (on_state_error open).
	start := time.Now()
	n := 0
	for ; n < 400 && time.Since(start) < 2*time.Second; n++ {
		if tk, rej := g.Admit(bg, u, r); rej == nil {
			tk.Done(Usage{})
		}
		time.Sleep(5 * time.Millisecond)
	}
	took := time.Since(start)
	// 200, 400, 800, 1600 ms at most: 5 sends in 2 s at most, 10 with margin.
	sent := mStateUndone.Get() - undone
	t.Logf("sent again %d times in %v under %d admissions", sent, took, n)
	if sent > 10 {
		t.Errorf("the refused ends were sent again (or returns queued) %d times in %v under %d admissions, want a backoff", sent, took, n)
	}
	if k := g.rds.redoLen(); k > 1 {
		t.Errorf("%d ends kept after %d admissions refused, want the settlement's only", k, n)
	}
	refuse(false)
	deadline := time.Now().Add(8 * time.Second) // the last step (5 s at most) and margin
	for {
		v, _ := h.HMGet(bg, o.RedisPrefix+"{u:alice}", "w1r", "w1k").Result()
		if len(v) == 2 && v[0] == "1" && v[1] == "12000" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the day's requests and milli-tokens %v once Redis writes again, want the usage [1 12000]", v)
		}
		time.Sleep(10 * time.Millisecond)
	}
	waitFor(t, func() bool { return g.rds.redoLen() == 0 })
	// Landed: the backoff starts over, and the next end Redis refuses is
	// sent again within the first step, not the last.
	tk = admitOK(t, g, u, r)
	tk.FirstToken()
	syncState(t, g)
	refuse(true)
	tk.Done(Usage{})
	waitFor(t, func() bool { return g.rds.redoLen() == 1 })
	undone = mStateUndone.Get()
	refused := time.Now()
	for mStateUndone.Get() == undone {
		if time.Since(refused) > time.Second {
			t.Fatal("a refused end not sent again within 1 s after the last ones landed: the backoff did not start over")
		}
		time.Sleep(time.Millisecond)
	}
}

// A settlement Redis refuses with an error reply for the whole call
// (LOADING while a restarted Redis loads its AOF or dump, BUSY behind a
// long script) is sent again with the same backoff as one refused as it
// runs: not ahead of every pipeline and at every poll while Redis loads.
// Before, it went out at every poll (20 ms here, 100 ms by default), 80
// to 100 times in 2 s.
func TestRedisEndsRefusedWholeWhileRedisLoadsAreSentAgainWithBackoff(t *testing.T) {
	rs := startRedis(t)
	o := redisOptions(t, rs)
	o.LeaseTTL = time.Hour
	o.EndDelay = time.Millisecond
	px := startLoadingProxy(t, "127.0.0.1:"+strconv.Itoa(rs.port), []byte(endsScript.Hash()), []byte(o.RedisPrefix+"{u:alice}"))
	o.State = px.url()
	key, hash := mintKey(t)
	g := newGov(t, o, userConfig(t, hash, `{"name":"t","quota":{"enabled":true,"windows":[{"period":"day","max_requests":10,"max_tokens":1000}]}}`, ""))
	u := identify(t, g, key)
	tk := admitOK(t, g, u, Request{PromptTokens: 10, MaxTokens: 10}) // an estimate of 20
	idle(t, g)
	tk.FirstToken()
	px.loading.Store(true)
	tk.Done(Usage{Known: true, PromptTokens: 10, CompletionTokens: 2})
	time.Sleep(2 * time.Second)
	// 200, 400, 800, 1600 ms at most: 5 copies in 2 s at most, 8 with margin.
	n := px.refused.Load()
	t.Logf("%d copies refused in 2 s", n)
	if n > 8 {
		t.Errorf("%d copies of the settlement refused in 2 s of loading, want a backoff", n)
	}
	px.loading.Store(false) // loaded
	h := rs.client(t)
	deadline := time.Now().Add(8 * time.Second) // the last step (5 s at most) and margin
	for {
		v, _ := h.HMGet(context.Background(), o.RedisPrefix+"{u:alice}", "w1r", "w1k").Result()
		if len(v) == 2 && v[0] == "1" && v[1] == "12000" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the day's requests and milli-tokens %v once Redis loaded, want the usage [1 12000]", v)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// While Redis refuses ends (here read-only: a primary demoted by a
// failover), the ends kept for sending again are bounded (16,384,
// shortened here to 16); past it what goes is what costs least: the
// returns of seats, which free themselves when their lease runs out,
// before settlements, whose requests would keep their estimates charged
// for good. 12 requests end (a settlement holding a user slot, and a seat
// return each: 24 ends for 16 places): the 8 oldest seat returns go,
// counted; once Redis writes again every settlement lands (the quota
// counts each request's usage, every user slot is free) and only the 8
// evicted seats stay taken, until their lease. Before, the 8 oldest ends
// went whatever they were: the settlements of 4 requests were lost.
func TestRedisAFullResendListLosesSeatReturnsBeforeSettlements(t *testing.T) {
	rs := startRedis(t)
	o := redisOptions(t, rs)
	o.LeaseTTL = time.Hour // no renewals in the way; an evicted seat stays
	o.EndDelay = time.Millisecond
	key, hash := mintKey(t)
	c := userConfig(t, hash, `{"name":"t","concurrency":{"enabled":true,"limit":100},"quota":{"enabled":true,"windows":[{"period":"day","max_requests":100,"max_tokens":100000}]}}`,
		`"rate_limit":{"overall_concurrency":100}`)
	g := newGov(t, o, c)
	g.rds.maxRedo = 16
	u := identify(t, g, key)
	const n = 12
	var tks []Ticket
	var seats []Seat
	for range n {
		tk := admitOK(t, g, u, Request{PromptTokens: 10, MaxTokens: 10}) // an estimate of 20
		tk.FirstToken()
		tks = append(tks, tk)
		seats = append(seats, acquireOK(t, g, []Target{w1}, PhaseMixed, 0))
	}
	syncState(t, g)
	h := rs.client(t)
	bg := context.Background()
	if err := h.ReplicaOf(bg, "127.0.0.1", "1").Err(); err != nil { // read-only, its data kept
		t.Fatal(err)
	}
	t.Cleanup(func() { h.ReplicaOf(bg, "NO", "ONE") })
	settleEvicted, releaseEvicted := mStateSettleEvicted.Get(), mStateReleaseEvicted.Get()
	evicted := func() uint64 {
		return mStateSettleEvicted.Get() - settleEvicted + mStateReleaseEvicted.Get() - releaseEvicted
	}
	for i := range n { // ended while Redis refuses writes: kept, 8 evicted
		tks[i].Done(Usage{Known: true, PromptTokens: 10, CompletionTokens: 2}) // 12 of its 20
		seats[i].Done()
	}
	deadline := time.Now().Add(5 * time.Second)
	for evicted() < 2*n-16 {
		if time.Now().After(deadline) {
			t.Fatalf("%d ends evicted, want %d (%d kept for 16 places)", evicted(), 2*n-16, 2*n)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := h.ReplicaOf(bg, "NO", "ONE").Err(); err != nil {
		t.Fatal(err)
	}
	hk := o.RedisPrefix + "{u:alice}"
	want := []any{strconv.Itoa(n), strconv.Itoa(n * 12 * 1000)} // every request charged its usage
	deadline = time.Now().Add(10 * time.Second)
	for {
		v, _ := h.HMGet(bg, hk, "w1r", "w1k").Result()
		if len(v) == 2 && v[0] == want[0] && v[1] == want[1] && h.ZCard(bg, hk+":seats").Val() == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the day's requests and milli-tokens %v and %d user slots taken once Redis writes again, want %v and none (settlements lost: %d)",
				v, h.ZCard(bg, hk+":seats").Val(), want, mStateSettleEvicted.Get()-settleEvicted)
		}
		time.Sleep(10 * time.Millisecond)
	}
	waitFor(t, func() bool { return g.rds.redoLen() == 0 })
	if got := mStateSettleEvicted.Get() - settleEvicted; got != 0 {
		t.Errorf("%d settlements evicted, want none (seat returns go first)", got)
	}
	if got := mStateReleaseEvicted.Get() - releaseEvicted; got != 2*n-16 {
		t.Errorf("%d releases evicted, want %d", got, 2*n-16)
	}
	if got := h.ZCard(bg, o.RedisPrefix+"{rl}:i:w1:overall").Val(); got != 2*n-16 {
		t.Errorf("%d seats still taken, want the %d whose return was evicted", got, 2*n-16)
	}
}

// A settlement that changes no counter (its request served, its usage
// its estimate: what a user with only a concurrency limit settles) only
// returns its slot: a full list of ends kept for sending again loses it
// before a settlement that corrects a count. 4 requests end with less than
// their estimate, then 8 with exactly it, while Redis is read-only, for 8
// places: the 4 slot-only settlements kept last go, counted as slot
// returns, not as settlements, and once Redis writes again the 4
// corrections land (the quota counts each request's usage). Before, the
// 4 oldest settlements went, the corrections among them, their requests
// keeping their estimates.
func TestRedisAFullResendListLosesSettlementsThatChangeNoCounterFirst(t *testing.T) {
	rs := startRedis(t)
	o := redisOptions(t, rs)
	o.LeaseTTL = time.Hour // no renewals in the way; an evicted slot stays
	o.EndDelay = time.Millisecond
	key, hash := mintKey(t)
	c := userConfig(t, hash, `{"name":"t","concurrency":{"enabled":true,"limit":100},"quota":{"enabled":true,"windows":[{"period":"day","max_requests":100,"max_tokens":100000}]}}`, "")
	g := newGov(t, o, c)
	g.rds.maxRedo = 8
	u := identify(t, g, key)
	const n = 12
	var tks []Ticket
	for range n {
		tk := admitOK(t, g, u, Request{PromptTokens: 10, MaxTokens: 10}) // an estimate of 20
		tk.FirstToken()
		tks = append(tks, tk)
	}
	syncState(t, g)
	h := rs.client(t)
	bg := context.Background()
	if err := h.ReplicaOf(bg, "127.0.0.1", "1").Err(); err != nil { // read-only, its data kept
		t.Fatal(err)
	}
	t.Cleanup(func() { h.ReplicaOf(bg, "NO", "ONE") })
	settleEvicted, releaseEvicted := mStateSettleEvicted.Get(), mStateReleaseEvicted.Get()
	for i, tk := range tks { // ended while Redis refuses writes: kept, 4 evicted
		if i < 4 {
			tk.Done(Usage{Known: true, PromptTokens: 10, CompletionTokens: 2}) // 12 of its 20
		} else {
			tk.Done(Usage{Known: true, PromptTokens: 10, CompletionTokens: 10}) // its 20
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for mStateReleaseEvicted.Get()-releaseEvicted < n-8 {
		if time.Now().After(deadline) {
			t.Fatalf("%d slot returns evicted, want %d (%d kept for 8 places)", mStateReleaseEvicted.Get()-releaseEvicted, n-8, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := h.ReplicaOf(bg, "NO", "ONE").Err(); err != nil {
		t.Fatal(err)
	}
	hk := o.RedisPrefix + "{u:alice}"
	want := []any{strconv.Itoa(n), strconv.Itoa((4*12 + 8*20) * 1000)} // every request charged its usage
	deadline = time.Now().Add(5 * time.Second)
	for {
		v, _ := h.HMGet(bg, hk, "w1r", "w1k").Result()
		if len(v) == 2 && v[0] == want[0] && v[1] == want[1] && g.rds.redoLen() == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the day's requests and milli-tokens %v once Redis writes again, want %v (settlements evicted: %d)",
				v, want, mStateSettleEvicted.Get()-settleEvicted)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if got := mStateSettleEvicted.Get() - settleEvicted; got != 0 {
		t.Errorf("%d settlements counted as evicted, want none (those evicted changed no counter)", got)
	}
	if got := mStateReleaseEvicted.Get() - releaseEvicted; got != n-8 {
		t.Errorf("%d slot returns counted as evicted, want %d", got, n-8)
	}
	if got := h.ZCard(bg, hk+":seats").Val(); got != n-8 {
		t.Errorf("%d user slots still taken, want the %d whose settlement was evicted", got, n-8)
	}
}

// slotOnly tells a settlement that changes a counter (a refund, a token
// correction where its rule is on) from one that only returns its slot.
func TestRedisSettlementsThatChangeNoCounterAreSlotOnly(t *testing.T) {
	f := func(served int, rpmCap, tpmCap, tpmDelta, quotaDelta int64, day int64, want bool) {
		t.Helper()
		x := redoRelease{kind: endFinish, args: []any{"m", 1, int64(1), served, rpmCap, tpmCap, tpmDelta, quotaDelta, "wake", "u:a", 0, day, 0, 0, int64(120000)}}
		if got := x.slotOnly(); got != want {
			t.Fatalf("served %d rpm %d tpm %d/%d quota %d day %d: slot only %v, want %v", served, rpmCap, tpmCap, tpmDelta, quotaDelta, day, got, want)
		}
	}
	f(1, 60, 1000, 0, 0, 1700000000, true)  // served, its estimate exactly
	f(1, 0, 0, -8, -8000, 0, true)          // corrections with their rules off
	f(1, 0, 1000, -8, 0, 0, false)          // a TPM correction
	f(1, 0, 0, 0, -8000, 1700000000, false) // a quota correction
	f(0, 60, 0, 0, 0, 0, false)             // an RPM refund
	f(0, 0, 0, 0, 0, 1700000000, false)     // a request count refund
	f(0, 0, 0, 0, 0, 0, true)               // refused, no rule to refund
	if x := (redoRelease{kind: endUnadmit}); x.slotOnly() {
		t.Fatal("an admission's return is slot only, want not: it gives back what the admission took")
	}
	if x := (redoRelease{}); !x.slotOnly() {
		t.Fatal("a return is not slot only")
	}
}

// The ends kept for sending again are bounded by the memory they hold
// (16 MiB, about 670 bytes a settlement), not by their number: 20,000
// requests that end while Redis refuses writes (read-only, a primary
// demoted by a failover; OOM under maxmemory) are all kept, and once
// Redis writes again every one is charged its usage, none evicted.
// Before, the list kept 16,384 ends of any size (about 16 s of requests
// at 1,000 a second): 3,616 settlements were evicted, their requests
// keeping their estimates.
func TestRedisAnOutageKeepsEndsByTheirBytesNotTheirNumber(t *testing.T) {
	rs := startRedis(t)
	for _, how := range []string{"READONLY", "OOM"} {
		t.Run(how, func(t *testing.T) { testOutageKeepsEndsByBytes(t, rs, how) })
	}
}

func testOutageKeepsEndsByBytes(t *testing.T, rs *redisServer, how string) {
	o := redisOptions(t, rs)
	o.LeaseTTL = time.Hour // no renewals in the way
	o.EndDelay = time.Millisecond
	key, hash := mintKey(t)
	c := userConfig(t, hash, `{"name":"t","quota":{"enabled":true,"windows":[{"period":"day","max_requests":100000,"max_tokens":10000000}]}}`, "")
	g := newGov(t, o, c)
	u := identify(t, g, key)
	const n = 20000
	tks := make([]Ticket, 0, n)
	for range n {
		tk := admitOK(t, g, u, Request{PromptTokens: 10, MaxTokens: 10}) // an estimate of 20
		tk.FirstToken()
		tks = append(tks, tk)
	}
	syncState(t, g)
	h := rs.client(t)
	bg := context.Background()
	refuse := func(on bool) {
		t.Helper()
		var err error
		switch {
		case how == "READONLY" && on:
			err = h.ReplicaOf(bg, "127.0.0.1", "1").Err() // read-only, its data kept
		case how == "READONLY":
			err = h.ReplicaOf(bg, "NO", "ONE").Err()
		case on: // every write that may grow memory refused
			if err = h.ConfigSet(bg, "maxmemory-policy", "noeviction").Err(); err == nil {
				err = h.ConfigSet(bg, "maxmemory", "1").Err()
			}
		default:
			err = h.ConfigSet(bg, "maxmemory", "0").Err()
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	refuse(true)
	t.Cleanup(func() { refuse(false) })
	evicted := mStateSettleEvicted.Get()
	for _, tk := range tks { // ended while Redis refuses writes: kept
		tk.Done(Usage{Known: true, PromptTokens: 10, CompletionTokens: 2}) // 12 of its 20
	}
	// 20,000 ends take seconds to go round under the race detector on a
	// loaded machine (a CI run took 40 s): each wait fails once nothing
	// moved for 20 s (four of the backoff's 5 s steps), not at a fixed
	// time.
	stuck := progressClock(20 * time.Second)
	for g.rds.redoLen() < n || mStateSettleEvicted.Get() != evicted {
		if stuck(g.rds.redoLen()) || mStateSettleEvicted.Get() != evicted {
			t.Fatalf("%d settlements kept, %d evicted, want all %d kept", g.rds.redoLen(), mStateSettleEvicted.Get()-evicted, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
	refuse(false)
	hk := o.RedisPrefix + "{u:alice}"
	want := []any{strconv.Itoa(n), strconv.Itoa(n * 12 * 1000)} // every request charged its usage
	stuck = progressClock(20 * time.Second)
	for {
		v, _ := h.HMGet(bg, hk, "w1r", "w1k").Result()
		if len(v) == 2 && v[0] == want[0] && v[1] == want[1] && g.rds.redoLen() == 0 {
			break
		}
		if stuck(g.rds.redoLen()) {
			t.Fatalf("the day's requests and milli-tokens %v once Redis writes again (%d ends still kept), want %v", v, g.rds.redoLen(), want)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if got := mStateSettleEvicted.Get() - evicted; got != 0 {
		t.Errorf("%d settlements evicted, want none", got)
	}
	g.rds.qmu.Lock()
	b := g.rds.keptBytes
	g.rds.qmu.Unlock()
	if b != 0 {
		t.Errorf("%d bytes counted as kept with nothing kept", b)
	}
}

// progressClock returns a check that reports true once the value it is
// given has not changed for d: a wait on a long piece of work fails when
// the work stops, not when a slow machine has not finished it yet.
func progressClock(d time.Duration) func(v int) bool {
	last, since := -1, time.Now()
	return func(v int) bool {
		if v != last {
			last, since = v, time.Now()
		}
		return time.Since(since) > d
	}
}

// Past the bound in bytes the oldest ends go until the rest fit: 12
// settlements for the bytes of 10 keep the 10 newest, and a seat's return,
// smaller, takes the room of half a settlement.
func TestRedisTheResendListIsBoundedInBytes(t *testing.T) {
	settlement := func(i int) redoRelease {
		m := "ticket-" + strconv.Itoa(1000+i)
		return redoRelease{kind: endFinish, ended: true, keys: []string{"p:{u:a}", "p:{u:a}:seats", "p:{u:a}:f:" + m},
			args: []any{m, 0, int64(1765000000000), 1, 0, 0, int64(-8), int64(-8000), "p:wake", "u:a", int64(1764979200000), 0, 0, 0, int64(120000)}}
	}
	one := settlement(0)
	size := one.sizeOf()
	r := &redisState{maxRedo: 1 << 20, maxRedoBytes: 10 * size, leases: map[string][]string{}}
	evicted := mStateSettleEvicted.Get()
	for i := range 12 {
		r.keep(settlement(i))
	}
	if got := mStateSettleEvicted.Get() - evicted; got != 2 || len(r.redo) != 10 || r.keptBytes != 10*size {
		t.Fatalf("%d evicted, %d kept in %d bytes, want 2, 10 in %d", got, len(r.redo), r.keptBytes, 10*size)
	}
	if m := r.redo[0].args[0]; m != "ticket-1002" {
		t.Fatalf("the oldest kept is %v, want ticket-1002", m)
	}
	seat := redoRelease{ended: true, keys: []string{"p:{rl}:i:w1:overall"}, args: []any{"seat-1", "p:wake", "rl"}}
	if s := seat.sizeOf(); 2*s > size {
		t.Fatalf("a seat's return counts %d bytes, a settlement %d: want under half", s, size)
	}
	r.maxRedoBytes += seat.sizeOf()
	r.keep(seat)
	if got := mStateSettleEvicted.Get() - evicted; got != 2 || r.keptLocked() != 11 {
		t.Fatalf("%d evicted, %d kept, want 2 and 11 (the seat's return fits its own bytes)", got, r.keptLocked())
	}
	r.qmu.Lock()
	r.takeKept()
	r.qmu.Unlock()
	if r.keptBytes != 0 {
		t.Fatalf("%d bytes counted with nothing kept", r.keptBytes)
	}
}
