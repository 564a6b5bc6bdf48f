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
)

// resetProxy is a loopback TCP proxy in front of a redis-server that, once
// armed, resets the client's connection of the next request whose bytes
// hold every trigger: before the request reaches Redis (cutBefore: it
// never runs), or once Redis answered it (cutAfter: it ran, the answer is
// lost). Either way the client sees a pooled connection reset mid-call.
type resetProxy struct {
	t       *testing.T
	addr    string
	target  string
	trigger [][]byte
	mode    atomic.Int32 // cutNone, cutBefore, cutAfter: armed for one cut
	fired   chan int32
	mu      sync.Mutex
	conns   []net.Conn
	ln      net.Listener
}

const (
	cutNone int32 = iota
	cutBefore
	cutAfter
)

func startResetProxy(t *testing.T, target string, trigger ...[]byte) *resetProxy {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &resetProxy{t: t, addr: ln.Addr().String(), target: target, trigger: trigger, fired: make(chan int32, 1), ln: ln}
	go p.serve()
	t.Cleanup(func() {
		ln.Close()
		p.mu.Lock()
		for _, c := range p.conns {
			c.Close()
		}
		p.mu.Unlock()
	})
	return p
}

func (p *resetProxy) url() string { return "redis://" + p.addr + "/0" }

// arm makes the next request holding the triggers be cut as mode says.
func (p *resetProxy) arm(mode int32) { p.mode.Store(mode) }

func (p *resetProxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		u, err := net.Dial("tcp4", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, u)
		p.mu.Unlock()
		var drop atomic.Bool // the next answer is lost (cutAfter)
		reset := func(mode int32) {
			c.(*net.TCPConn).SetLinger(0) // RST, as a Redis or a proxy that kills the connection
			c.Close()
			u.Close()
			p.fired <- mode
		}
		go func() { // client -> Redis
			buf := make([]byte, 64<<10)
			for {
				n, err := c.Read(buf)
				if err != nil {
					u.Close()
					return
				}
				if p.matches(buf[:n]) {
					switch mode := p.mode.Swap(cutNone); mode {
					case cutBefore:
						reset(mode)
						return
					case cutAfter:
						drop.Store(true)
					}
				}
				if _, err := u.Write(buf[:n]); err != nil {
					c.Close()
					return
				}
			}
		}()
		go func() { // Redis -> client
			buf := make([]byte, 64<<10)
			for {
				n, err := u.Read(buf)
				if err != nil {
					c.Close()
					return
				}
				if drop.Load() {
					reset(cutAfter)
					return
				}
				if _, err := c.Write(buf[:n]); err != nil {
					u.Close()
					return
				}
			}
		}()
	}
}

func (p *resetProxy) matches(b []byte) bool {
	if p.mode.Load() == cutNone {
		return false
	}
	for _, x := range p.trigger {
		if !bytes.Contains(b, x) {
			return false
		}
	}
	return true
}

// idle waits until g has nothing queued for Redis and no pipeline out.
func idle(t *testing.T, g *Governor) {
	t.Helper()
	waitFor(t, func() bool {
		r := g.rds
		r.qmu.Lock()
		defer r.qmu.Unlock()
		return !r.busy && len(r.q) == 0
	})
}

// A request's settlement (its tokens, its request count, its slot) sent on
// a pooled connection that Redis or a proxy resets mid-call is ambiguous:
// it may have run or not. It is sent again until it lands and counts once:
// two routers sharing Redis, each settlement cut before Redis read it, cut
// after Redis ran it (its answer lost), or not cut, leave the user's day
// window, TPM bucket and slot set exactly as the requests' usage says.
func TestRedisASettlementOnAResetConnectionCountsExactlyOnce(t *testing.T) {
	rs := startRedis(t)
	o := redisOptions(t, rs)
	o.LeaseTTL = time.Hour // no renewals in the way
	o.EndDelay = time.Millisecond
	clk := newFakeClock(time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)) // buckets do not refill: exact levels
	o.Now = clk.Now
	target := "127.0.0.1:" + strconv.Itoa(rs.port)
	trigger := [][]byte{[]byte(endsScript.Hash()), []byte(o.RedisPrefix + "{u:alice}")}
	px := [2]*resetProxy{startResetProxy(t, target, trigger...), startResetProxy(t, target, trigger...)}
	var gs [2]*Governor
	var us [2]*User
	key, hash := mintKey(t)
	const tpm = 1000000
	c := userConfig(t, hash, `{"name":"t","concurrency":{"enabled":true,"limit":100},"rate":{"enabled":true,"tpm":1000000},
		"quota":{"enabled":true,"windows":[{"period":"day","max_requests":1000,"max_tokens":1000000}]}}`, "")
	for i := range gs {
		oi := o
		oi.State = px[i].url()
		gs[i] = newGov(t, oi, c)
		us[i] = identify(t, gs[i], key)
	}
	r := Request{PromptTokens: 10, MaxTokens: 10} // an estimate of 20
	var served, tokens int64
	cuts := 0
	const n = 36
	for i := range n {
		g, u, p := gs[i%2], us[i%2], px[i%2]
		mode := int32(i/2) % 3 // both routers see each kind of cut
		tk := admitOK(t, g, u, r)
		idle(t, g) // the admission's pipeline is back: the cut falls on the settlement
		var use Usage
		if i%4 != 3 { // one in four fails before its first token: refunded
			tk.FirstToken()
			use = Usage{Known: true, PromptTokens: 10, CompletionTokens: 1 + i%7}
			served++
			tokens += int64(use.PromptTokens + use.CompletionTokens)
		}
		p.arm(mode)
		tk.Done(use)
		if mode != cutNone {
			recvWithin(t, p.fired, 3*time.Second, "the settlement's connection reset")
			cuts++
		}
		idle(t, g)
	}
	if cuts != 2*n/3 {
		t.Fatalf("%d settlements cut, want %d", cuts, 2*n/3)
	}
	// Every settlement kept for sending again has landed.
	for _, g := range gs {
		waitFor(t, func() bool {
			syncState(t, g)
			g.rds.qmu.Lock()
			defer g.rds.qmu.Unlock()
			return len(g.rds.redo) == 0
		})
	}
	h := rs.client(t)
	bg := context.Background()
	v, err := h.HMGet(bg, o.RedisPrefix+"{u:alice}", "w1r", "w1k", "tl").Result()
	if err != nil {
		t.Fatal(err)
	}
	want := []any{strconv.FormatInt(served, 10), strconv.FormatInt(tokens*1000, 10), strconv.FormatInt(tpm-tokens, 10)}
	for i, name := range []string{"day's requests", "day's milli-tokens", "TPM level"} {
		if v[i] != want[i] {
			t.Errorf("%s %v, want %v (%d requests served of %d, %d tokens; %d settlements cut)", name, v[i], want[i], served, n, tokens, cuts)
		}
	}
	if m := h.ZCard(bg, o.RedisPrefix+"{u:alice}:seats").Val(); m != 0 {
		t.Errorf("%d concurrency slots left after every request ended", m)
	}
}

// A settlement that failed ambiguously is sent again only while the mark
// of a copy that ran surely lives: one that still cannot land by then is
// dropped (counted in infera_governance_state_settlements_dropped_total),
// never sent once more (a copy running after the mark expired would count
// twice).
func TestRedisASettlementIsNotSentAgainOnceItsMarkMayHaveExpired(t *testing.T) {
	rs := startRedis(t)
	o := redisOptions(t, rs)
	o.LeaseTTL = time.Hour
	o.EndDelay = time.Millisecond
	key, hash := mintKey(t)
	px := startResetProxy(t, "127.0.0.1:"+strconv.Itoa(rs.port), []byte(endsScript.Hash()), []byte(o.RedisPrefix+"{u:alice}"))
	o.State = px.url()
	g := newGov(t, o, userConfig(t, hash, `{"name":"t","quota":{"enabled":true,"windows":[{"period":"day","max_requests":10,"max_tokens":1000}]}}`, ""))
	g.rds.settleFor = 300 * time.Millisecond
	u := identify(t, g, key)
	tk := admitOK(t, g, u, Request{PromptTokens: 10, MaxTokens: 10}) // an estimate of 20
	idle(t, g)
	tk.FirstToken()
	dropped := mStateSettleDropped.Get()
	start := time.Now()
	sent := 0
	px.arm(cutBefore)
	tk.Done(Usage{Known: true, PromptTokens: 10, CompletionTokens: 2})
	// Every copy is cut before Redis reads it (the router's loop sends
	// them again without traffic), until the settlement is dropped.
	for mStateSettleDropped.Get() == dropped {
		select {
		case <-px.fired:
			sent++
			px.arm(cutBefore)
		case <-time.After(10 * time.Millisecond):
		}
		if time.Since(start) > 5*time.Second {
			t.Fatalf("the settlement is still sent again %v after its first failure (%d copies cut)", time.Since(start), sent)
		}
	}
	px.arm(cutNone)
	if el := time.Since(start); sent < 2 || el < g.rds.settleFor {
		t.Fatalf("dropped after %d copies and %v, want it sent again for %v", sent, el, g.rds.settleFor)
	}
	syncState(t, g)
	g.rds.qmu.Lock()
	n := len(g.rds.redo)
	g.rds.qmu.Unlock()
	if n != 0 {
		t.Fatalf("%d ends kept to send again", n)
	}
	// Never settled: the day keeps the request's estimate.
	v, _ := rs.client(t).HMGet(context.Background(), o.RedisPrefix+"{u:alice}", "w1r", "w1k").Result()
	if len(v) != 2 || v[0] != "1" || v[1] != "20000" {
		t.Fatalf("the day's requests and milli-tokens %v, want the estimate [1 20000]", v)
	}
}
