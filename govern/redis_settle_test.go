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
)

// resetProxy is a loopback TCP proxy in front of a redis-server that, once
// armed, resets the client's connection of the next request whose bytes
// hold every trigger (and one of the cut's anyOf, when set): before the request
// reaches Redis (cutBefore: it never runs), once Redis answered it
// (cutAfter: it ran, the answer is lost), or before it reaches Redis but
// with its bytes held on the connection to Redis until runLate (cutLate:
// it runs late, as a request stuck in a stalled connection or a proxy's
// buffer). Either way the client sees a pooled connection reset mid-call.
type resetProxy struct {
	t       *testing.T
	addr    string
	target  string
	trigger [][]byte
	cuts    []cut // armed, in order (mu)
	fired   chan int32
	late    chan struct{} // runLate: the held request goes to Redis
	ranLate chan struct{} // Redis answered the held request
	mu      sync.Mutex
	conns   []net.Conn
	ln      net.Listener
}

// cut is one armed cut: its mode, and bytes of which the request must
// hold one (none: the triggers suffice).
type cut struct {
	mode  int32
	anyOf [][]byte
}

const (
	cutNone int32 = iota
	cutBefore
	cutAfter
	cutLate
)

func startResetProxy(t *testing.T, target string, trigger ...[]byte) *resetProxy {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &resetProxy{t: t, addr: ln.Addr().String(), target: target, trigger: trigger, fired: make(chan int32, 1),
		late: make(chan struct{}), ranLate: make(chan struct{}, 1), ln: ln}
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
func (p *resetProxy) arm(mode int32) { p.armCuts(cut{mode: mode}) }

// armCuts makes the next requests that match them be cut, one per cut, in
// order.
func (p *resetProxy) armCuts(cs ...cut) {
	p.mu.Lock()
	p.cuts = nil
	for _, c := range cs {
		if c.mode != cutNone {
			p.cuts = append(p.cuts, c)
		}
	}
	p.mu.Unlock()
}

// runLate sends the request held by a cutLate to Redis and waits for its
// answer (which nobody reads).
func (p *resetProxy) runLate() {
	p.t.Helper()
	p.late <- struct{}{}
	recvWithin(p.t, p.ranLate, 3*time.Second, "Redis's answer to the late request")
}

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
		var held atomic.Bool // the next answer is the late request's (cutLate)
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
				if mode := p.take(buf[:n]); mode != cutNone {
					switch mode {
					case cutBefore:
						reset(mode)
						return
					case cutAfter:
						drop.Store(true)
					case cutLate:
						late := bytes.Clone(buf[:n])
						held.Store(true)
						c.(*net.TCPConn).SetLinger(0)
						c.Close()
						p.fired <- mode
						select {
						case <-p.late:
							u.Write(late)
						case <-time.After(10 * time.Second):
							u.Close()
						}
						return
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
				if held.Load() {
					u.Close()
					p.ranLate <- struct{}{}
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

// take returns the mode of the first cut armed if b matches it (and
// disarms it), else cutNone.
func (p *resetProxy) take(b []byte) int32 {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.cuts) == 0 {
		return cutNone
	}
	for _, x := range p.trigger {
		if !bytes.Contains(b, x) {
			return cutNone
		}
	}
	c := p.cuts[0]
	hit := len(c.anyOf) == 0
	for _, x := range c.anyOf {
		hit = hit || bytes.Contains(b, x)
	}
	if !hit {
		return cutNone
	}
	p.cuts = p.cuts[1:]
	return c.mode
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
			return g.rds.keptLocked() == 0
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
	g := newGov(t, o, userConfig(t, hash, `{"name":"t","concurrency":{"enabled":true,"limit":10},"quota":{"enabled":true,"windows":[{"period":"day","max_requests":10,"max_tokens":1000}]}}`, ""))
	g.rds.settleFor = 300 * time.Millisecond
	released := metrics.GetOrCreateCounter(`infera_governance_state_releases_dropped_total{reason="expired"}`).Get()
	u := identify(t, g, key)
	tk := admitOK(t, g, u, Request{PromptTokens: 10, MaxTokens: 10}) // an estimate of 20
	idle(t, g)
	tk.FirstToken()
	dropped := mStateSettleExpired.Get()
	start := time.Now()
	sent := 0
	px.arm(cutBefore)
	tk.Done(Usage{Known: true, PromptTokens: 10, CompletionTokens: 2})
	// Every copy is cut before Redis reads it (the router's loop sends
	// them again without traffic), until the settlement is dropped.
	for mStateSettleExpired.Get() == dropped {
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
	n := g.rds.keptLocked()
	g.rds.qmu.Unlock()
	if n != 0 {
		t.Fatalf("%d ends kept to send again", n)
	}
	// Never settled: the day keeps the request's estimate, and its slot
	// stays until its lease expires (counted as a release dropped).
	v, _ := rs.client(t).HMGet(context.Background(), o.RedisPrefix+"{u:alice}", "w1r", "w1k").Result()
	if len(v) != 2 || v[0] != "1" || v[1] != "20000" {
		t.Fatalf("the day's requests and milli-tokens %v, want the estimate [1 20000]", v)
	}
	if n := rs.client(t).ZCard(context.Background(), o.RedisPrefix+"{u:alice}:seats").Val(); n != 1 {
		t.Fatalf("%d concurrency slots in Redis, want the dropped settlement's", n)
	}
	if got := metrics.GetOrCreateCounter(`infera_governance_state_releases_dropped_total{reason="expired"}`).Get() - released; got != 1 {
		t.Fatalf("%d releases counted as expired, want the dropped settlement's slot", got)
	}
}

// An admission (the user's RPM and TPM take, its quota window's count and
// estimate, its concurrency slot and, with AdmitAcquire, its first seat)
// sent on a pooled connection that Redis or a proxy resets mid-call is
// ambiguous: it may have run. Its request is refused (on_state_error
// closed) or admitted uncounted (open), so whatever the admission took is
// given back, once, whether it ran before the reset, never ran, or runs
// late (held in a connection, after the router gave it back), and
// whether what gives it back is itself cut after it ran and sent again:
// two routers sharing Redis leave the day window, the RPM and TPM
// buckets, the slot set and the seat set exactly as the requests served
// say.
func TestRedisAnAdmissionOnAResetConnectionChargesNothing(t *testing.T) {
	rs := startRedis(t)
	o := redisOptions(t, rs)
	o.LeaseTTL = time.Hour // no renewals in the way
	o.EndDelay = time.Millisecond
	clk := newFakeClock(time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)) // buckets do not refill: exact levels
	o.Now = clk.Now
	target := "127.0.0.1:" + strconv.Itoa(rs.port)
	var px [2]*resetProxy
	for i := range px {
		px[i] = startResetProxy(t, target, []byte(o.RedisPrefix+"{u:alice}"))
	}
	admissions := [][]byte{[]byte(admitScript.Hash()), []byte(admitSeatScript.Hash())}
	ends := [][]byte{[]byte(endsScript.Hash())}
	key, hash := mintKey(t)
	const rpm, tpm = 1000, 1000000
	var gs [2]*Governor
	var us [2]*User
	modes := [2]string{"closed", "open"}
	for i := range gs {
		c := userConfig(t, hash, `{"name":"t","concurrency":{"enabled":true,"limit":100},"rate":{"enabled":true,"rpm":1000,"tpm":1000000},
			"quota":{"enabled":true,"windows":[{"period":"day","max_requests":1000,"max_tokens":1000000}]}}`, `"rate_limit":{"overall_concurrency":100}`)
		c.UserLimit.OnStateError = modes[i]
		oi := o
		oi.State = px[i].url()
		gs[i] = newGov(t, oi, c)
		us[i] = identify(t, gs[i], key)
	}
	r := Request{PromptTokens: 10, MaxTokens: 10} // an estimate of 20
	var served, tokens int64
	cuts := 0
	for i := range 32 {
		g, u, p := gs[i%2], us[i%2], px[i%2]
		mode := int32(i/2) % 4 // both routers see each kind of cut
		withSeat := i/8%2 == 1 // AdmitAcquire: the admission and the seat in one script
		again := i >= 16 && mode != cutNone
		if again { // the return of the admission runs, its answer is lost: sent again
			p.armCuts(cut{mode, admissions}, cut{cutAfter, ends})
		} else {
			p.armCuts(cut{mode, admissions})
		}
		var tk Ticket
		var seat Seat
		var rej *Rejection
		if withSeat {
			a := g.AdmitAcquire(u, r, []Target{w1}, PhaseMixed)
			tk, seat, rej = a.Ticket, a.Seat, a.Refused
			if a.Queue || a.SeatRefused != nil {
				t.Fatalf("request %d: %+v", i, a)
			}
		} else {
			tk, rej = g.Admit(context.Background(), u, r)
		}
		if mode != cutNone {
			recvWithin(t, p.fired, 3*time.Second, "the admission's connection reset")
			cuts++
			if again {
				recvWithin(t, p.fired, 3*time.Second, "the connection reset of the admission's return")
			}
			if modes[i%2] == "closed" {
				if rej == nil || rej.Code != CodeStateUnavailable {
					t.Fatalf("request %d, admission cut: %v, want %s", i, rej, CodeStateUnavailable)
				}
			} else if rej != nil || tk.ts == nil || tk.ts.remote {
				t.Fatalf("request %d, admission cut: %v, want admitted uncounted (open)", i, rej)
			}
		} else if rej != nil || tk.ts == nil || !tk.ts.remote {
			t.Fatalf("request %d: %v, want admitted and counted", i, rej)
		}
		idle(t, g) // what the router gives back for the cut admission has landed
		waitFor(t, func() bool { g.rds.qmu.Lock(); defer g.rds.qmu.Unlock(); return g.rds.keptLocked() == 0 })
		if mode == cutLate {
			p.runLate() // the admission runs now, after it was given back
		}
		if rej == nil {
			tk.FirstToken()
			use := Usage{Known: true, PromptTokens: 10, CompletionTokens: 1 + i%7}
			if tk.ts.remote {
				served++
				tokens += int64(use.PromptTokens + use.CompletionTokens)
			}
			seat.Done()
			tk.Done(use)
			idle(t, g)
		}
	}
	if cuts != 24 {
		t.Fatalf("%d admissions cut, want 24", cuts)
	}
	for _, g := range gs {
		syncState(t, g)
	}
	h := rs.client(t)
	bg := context.Background()
	v, err := h.HMGet(bg, o.RedisPrefix+"{u:alice}", "w1r", "w1k", "tl", "rl").Result()
	if err != nil {
		t.Fatal(err)
	}
	want := []any{strconv.FormatInt(served, 10), strconv.FormatInt(tokens*1000, 10), strconv.FormatInt(tpm-tokens, 10), strconv.FormatInt(rpm-served, 10)}
	for i, name := range []string{"day's requests", "day's milli-tokens", "TPM level", "RPM level"} {
		if v[i] != want[i] {
			t.Errorf("%s %v, want %v (%d requests served, %d tokens; %d admissions cut)", name, v[i], want[i], served, tokens, cuts)
		}
	}
	for _, k := range []string{o.RedisPrefix + "{u:alice}:seats", o.RedisPrefix + "{rl}:i:w1:overall"} {
		if m := h.ZCard(bg, k).Val(); m != 0 {
			t.Errorf("%s holds %d members after every request ended", k, m)
		}
	}
}

// An admission whose answer a connection reset lost is given back; if
// Redis runs it later still (held in a connection or a proxy's buffer)
// after the mark of its return expired (2 minutes in Redis; expired here
// at once), it finds no mark, yet it must take nothing: it carries a
// deadline, callLife after it was made (shortened here), that Redis checks
// against its own clock. Before, it charged the request, the estimate,
// the RPM and TPM takes, the slot and the seat of a request that was
// refused.
func TestRedisAnAdmissionRunAfterItsReturnsMarkExpiredChargesNothing(t *testing.T) {
	rs := startRedis(t)
	o := redisOptions(t, rs)
	o.LeaseTTL = time.Hour // no renewals in the way
	o.EndDelay = time.Millisecond
	px := startResetProxy(t, "127.0.0.1:"+strconv.Itoa(rs.port), []byte(o.RedisPrefix+"{u:alice}"))
	o.State = px.url()
	key, hash := mintKey(t)
	c := userConfig(t, hash, `{"name":"t","concurrency":{"enabled":true,"limit":100},"rate":{"enabled":true,"rpm":1000,"tpm":1000000},
		"quota":{"enabled":true,"windows":[{"period":"day","max_requests":1000,"max_tokens":1000000}]}}`, `"rate_limit":{"overall_concurrency":100}`)
	c.UserLimit.OnStateError = "closed"
	g := newGov(t, o, c)
	const life = 300 * time.Millisecond
	g.rds.callLife = life
	u := identify(t, g, key)
	h := rs.client(t)
	bg := context.Background()
	hk := o.RedisPrefix + "{u:alice}"
	admissions := [][]byte{[]byte(admitScript.Hash()), []byte(admitSeatScript.Hash())}
	r := Request{PromptTokens: 10, MaxTokens: 10}
	for _, withSeat := range []bool{false, true} {
		px.armCuts(cut{cutLate, admissions})
		made := time.Now()
		var rej *Rejection
		if withSeat {
			rej = g.AdmitAcquire(u, r, []Target{w1}, PhaseMixed).Refused
		} else {
			_, rej = g.Admit(bg, u, r)
		}
		recvWithin(t, px.fired, 3*time.Second, "the admission's connection reset")
		if rej == nil || rej.Code != CodeStateUnavailable {
			t.Fatalf("seat %v: admission cut: %v, want %s", withSeat, rej, CodeStateUnavailable)
		}
		// Its return has landed: the ticket's mark is set.
		idle(t, g)
		waitFor(t, func() bool { g.rds.qmu.Lock(); defer g.rds.qmu.Unlock(); return g.rds.keptLocked() == 0 })
		marks := h.Keys(bg, hk+":f:*").Val()
		if len(marks) != 1 || h.Get(bg, marks[0]).Val() != "1" {
			t.Fatalf("seat %v: marks %v, want the return's", withSeat, marks)
		}
		h.PExpire(bg, marks[0], time.Millisecond) // its 2 minutes are over
		waitFor(t, func() bool { return h.Exists(bg, marks[0]).Val() == 0 })
		time.Sleep(time.Until(made.Add(2 * life)))
		px.runLate() // Redis runs the admission now
		if n := h.Exists(bg, hk).Val(); n != 0 {
			t.Errorf("seat %v: the user's counters %v after a refused request, want none", withSeat, h.HGetAll(bg, hk).Val())
		}
		for _, k := range []string{hk + ":seats", o.RedisPrefix + "{rl}:i:w1:overall"} {
			if m := h.ZCard(bg, k).Val(); m != 0 {
				t.Errorf("seat %v: %s holds %d members after a refused request", withSeat, k, m)
			}
		}
		if t.Failed() {
			return
		}
		for _, k := range h.Keys(bg, hk+":f:*").Val() {
			h.Del(bg, k)
		}
	}
}

// A settlement whose connection was reset is sent again until a copy
// lands; a copy that Redis runs later still (held in a connection or a
// proxy's buffer) after the mark of the copy that landed expired (2
// minutes in Redis; expired here at once) must change nothing: the
// settlement carries a deadline, callLife after it was sent (shortened
// here), that Redis checks against its own clock. Before, the late copy
// counted the settlement twice: a refund gave back a second request, a
// reconciliation refunded the difference to the estimate twice.
func TestRedisASettlementRunAfterItsMarkExpiredCountsOnce(t *testing.T) {
	rs := startRedis(t)
	o := redisOptions(t, rs)
	o.LeaseTTL = time.Hour // no renewals in the way
	o.EndDelay = time.Millisecond
	clk := newFakeClock(time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)) // buckets do not refill: exact levels
	o.Now = clk.Now
	px := startResetProxy(t, "127.0.0.1:"+strconv.Itoa(rs.port), []byte(endsScript.Hash()), []byte(o.RedisPrefix+"{u:alice}"))
	o.State = px.url()
	key, hash := mintKey(t)
	const tpm = 1000000
	g := newGov(t, o, userConfig(t, hash, `{"name":"t","concurrency":{"enabled":true,"limit":100},"rate":{"enabled":true,"tpm":1000000},
		"quota":{"enabled":true,"windows":[{"period":"day","max_requests":1000,"max_tokens":1000000}]}}`, ""))
	const life = 300 * time.Millisecond
	g.rds.callLife = life
	u := identify(t, g, key)
	h := rs.client(t)
	bg := context.Background()
	hk := o.RedisPrefix + "{u:alice}"
	r := Request{PromptTokens: 10, MaxTokens: 10} // an estimate of 20
	var served, tokens int64
	for _, serve := range []bool{false, true} {
		tk := admitOK(t, g, u, r)
		idle(t, g)
		use := Usage{}
		if serve {
			tk.FirstToken()
			use = Usage{Known: true, PromptTokens: 10, CompletionTokens: 2}
			served++
			tokens += 12
		}
		px.arm(cutLate)
		sent := time.Now()
		tk.Done(use)
		recvWithin(t, px.fired, 3*time.Second, "the settlement's connection reset")
		// A copy sent again lands and sets the mark.
		waitFor(t, func() bool {
			g.rds.qmu.Lock()
			defer g.rds.qmu.Unlock()
			return g.rds.keptLocked() == 0 && !g.rds.busy && len(g.rds.q) == 0
		})
		marks := h.Keys(bg, hk+":f:*").Val()
		if len(marks) != 1 || h.Get(bg, marks[0]).Val() != "1" {
			t.Fatalf("served %v: marks %v, want the settlement's", serve, marks)
		}
		h.PExpire(bg, marks[0], time.Millisecond) // its 2 minutes are over
		waitFor(t, func() bool { return h.Exists(bg, marks[0]).Val() == 0 })
		time.Sleep(time.Until(sent.Add(2 * life)))
		px.runLate() // Redis runs the held copy now
		v, err := h.HMGet(bg, hk, "w1r", "w1k", "tl").Result()
		if err != nil {
			t.Fatal(err)
		}
		want := []any{strconv.FormatInt(served, 10), strconv.FormatInt(tokens*1000, 10), strconv.FormatInt(tpm-tokens, 10)}
		for i, name := range []string{"day's requests", "day's milli-tokens", "TPM level"} {
			if v[i] != want[i] {
				t.Errorf("served %v: %s %v, want %v", serve, name, v[i], want[i])
			}
		}
		if m := h.ZCard(bg, hk+":seats").Val(); m != 0 {
			t.Errorf("served %v: %d concurrency slots left after the request ended", serve, m)
		}
		if t.Failed() {
			return
		}
	}
}

// A router whose clock runs behind Redis's by more than a call's life
// (here: a life of -1 s, every call past its deadline on arrival) has its
// admissions refused as late, taking nothing (on_state_error decides), and
// its settlements change no counter but return their slot: nothing is
// charged that its return could not find.
func TestRedisCallsPastTheirDeadlineTakeNothingButReturnTheirSlot(t *testing.T) {
	rs := startRedis(t)
	o := redisOptions(t, rs)
	o.LeaseTTL = time.Hour
	o.EndDelay = time.Millisecond
	key, hash := mintKey(t)
	c := userConfig(t, hash, `{"name":"t","concurrency":{"enabled":true,"limit":10},
		"quota":{"enabled":true,"windows":[{"period":"day","max_requests":10,"max_tokens":1000}]}}`, "")
	c.UserLimit.OnStateError = "closed"
	g := newGov(t, o, c)
	u := identify(t, g, key)
	h := rs.client(t)
	bg := context.Background()
	hk := o.RedisPrefix + "{u:alice}"
	tk := admitOK(t, g, u, Request{PromptTokens: 10, MaxTokens: 10}) // an estimate of 20
	tk.FirstToken()
	syncState(t, g)
	g.rds.callLife = -time.Second
	errs := mStateErrors.Get()
	admitRejected(t, g, u, Request{PromptTokens: 10, MaxTokens: 10}, CodeStateUnavailable)
	tk.Done(Usage{Known: true, PromptTokens: 10, CompletionTokens: 2})
	syncState(t, g)
	if mStateErrors.Get()-errs < 2 {
		t.Errorf("%d state errors, want the late admission's and the late settlement's", mStateErrors.Get()-errs)
	}
	v, _ := h.HMGet(bg, hk, "w1r", "w1k").Result()
	if len(v) != 2 || v[0] != "1" || v[1] != "20000" {
		t.Errorf("the day's requests and milli-tokens %v, want the first admission's alone [1 20000]", v)
	}
	if n := h.ZCard(bg, hk+":seats").Val(); n != 0 {
		t.Errorf("%d slots taken after the late settlement", n)
	}
	g.rds.qmu.Lock()
	n := g.rds.keptLocked()
	g.rds.qmu.Unlock()
	if n != 0 {
		t.Errorf("%d ends kept to send again: a late settlement is not", n)
	}
}

// An admission whose answer a connection reset lost is given back by its
// return, sent until it lands; when Redis cannot take the return for long
// (an outage, a partition), it lands long after the admission ran, and
// must still give back everything the admission took: its record, the
// windows it counted in, outlives the time a return may be kept. Redis's
// 2 minutes and 1 second are played here by taking them off the record's
// remaining TTL, as they would have run down. Before, the record lived 2
// minutes from the admission: a later return found none and gave back
// only the slot, leaving the refused request counted in the day window and
// its RPM and TPM takes charged.
func TestRedisAnAdmissionsReturnLandingMinutesLateGivesBackWhatItTook(t *testing.T) {
	rs := startRedis(t)
	o := redisOptions(t, rs)
	o.LeaseTTL = time.Hour                                             // no renewals in the way
	o.PollInterval = time.Hour                                         // the kept return waits for the next call
	o.EndDelay = time.Millisecond                                      // the return goes at once, and is cut
	clk := newFakeClock(time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)) // buckets do not refill: exact levels
	o.Now = clk.Now
	px := startResetProxy(t, "127.0.0.1:"+strconv.Itoa(rs.port), []byte(o.RedisPrefix+"{u:alice}"))
	o.State = px.url()
	key, hash := mintKey(t)
	const rpm, tpm = 1000, 1000000
	c := userConfig(t, hash, `{"name":"t","rate":{"enabled":true,"rpm":1000,"tpm":1000000},
		"quota":{"enabled":true,"windows":[{"period":"day","max_requests":1000,"max_tokens":1000000}]}}`, "")
	c.UserLimit.OnStateError = "closed"
	g := newGov(t, o, c)
	u := identify(t, g, key)
	h := rs.client(t)
	bg := context.Background()
	hk := o.RedisPrefix + "{u:alice}"
	// The admission runs, its answer is lost; its return is cut before
	// Redis reads it, and kept.
	px.armCuts(cut{cutAfter, [][]byte{[]byte(admitScript.Hash())}}, cut{cutBefore, [][]byte{[]byte(endsScript.Hash())}})
	if _, rej := g.Admit(bg, u, Request{PromptTokens: 10, MaxTokens: 10}); rej == nil || rej.Code != CodeStateUnavailable {
		t.Fatalf("admission cut: %v, want %s", rej, CodeStateUnavailable)
	}
	recvWithin(t, px.fired, 3*time.Second, "the admission's connection reset")
	recvWithin(t, px.fired, 3*time.Second, "the return's connection reset")
	waitFor(t, func() bool { return g.rds.redoLen() == 1 })
	if v := h.HGet(bg, hk, "w1r").Val(); v != "1" {
		t.Fatalf("the day counts %q requests after the admission ran, want 1", v)
	}
	marks := h.Keys(bg, hk+":f:*").Val()
	if len(marks) != 1 {
		t.Fatalf("marks %v, want the admission's record", marks)
	}
	const late = 2*time.Minute + time.Second
	if left := h.PTTL(bg, marks[0]).Val(); left > late {
		h.PExpire(bg, marks[0], left-late)
	} else {
		h.Del(bg, marks[0])
	}
	syncState(t, g) // the return goes ahead of this call
	if n := g.rds.redoLen(); n != 0 {
		t.Fatalf("%d ends still kept after Redis answered", n)
	}
	v, err := h.HMGet(bg, hk, "w1r", "w1k", "rl", "tl").Result()
	if err != nil {
		t.Fatal(err)
	}
	want := []any{"0", "0", strconv.Itoa(rpm), strconv.Itoa(tpm)}
	for i, name := range []string{"day's requests", "day's milli-tokens", "RPM level", "TPM level"} {
		if v[i] != want[i] {
			t.Errorf("%s %v after a refused request's return landed %v after its admission, want %v", name, v[i], late, want[i])
		}
	}
	if m := h.Get(bg, marks[0]).Val(); m != "1" {
		t.Errorf("the ticket's mark %q after its return, want the return's (1)", m)
	}
}

// A seat call whose answer a connection reset lost is given back: a
// release queued at the failure, and sent once more after Redis answers a
// later pipeline. If Redis runs the call after both (held in a stalled
// connection or a proxy's buffer), it must take nothing: the first return
// to run leaves a mark that the call finds, and once that mark has
// expired (2 minutes in Redis; expired here at once) the call is past its
// deadline, callLife after it was made (shortened here), by Redis's
// clock. Before, it took its seat for a whole lease, a phantom seat for
// every router until LeaseTTL ran out.
func TestRedisASeatCallRunAfterItsReturnsTakesNothing(t *testing.T) {
	rs := startRedis(t)
	o := redisOptions(t, rs)
	o.LeaseTTL = time.Hour // no renewals in the way; a phantom would stay an hour
	o.EndDelay = time.Millisecond
	px := startResetProxy(t, "127.0.0.1:"+strconv.Itoa(rs.port), []byte(o.RedisPrefix+"{rl}"))
	o.State = px.url()
	g := newGov(t, o, parseConfig(t, `{"rate_limit":{"overall_concurrency":1,"on_state_error":"closed"}}`))
	const life = 300 * time.Millisecond
	h := rs.client(t)
	bg := context.Background()
	set := o.RedisPrefix + "{rl}:i:w1:overall"
	for _, markExpired := range []bool{false, true} {
		if markExpired {
			g.rds.callLife = life
		}
		px.armCuts(cut{cutLate, [][]byte{[]byte(seatScript.Hash())}})
		made := time.Now()
		if _, _, rej := g.TryAcquire([]Target{w1}, PhaseMixed); rej == nil || rej.Code != CodeStateUnavailable {
			t.Fatalf("mark expired %v: seat call cut: %v, want %s", markExpired, rej, CodeStateUnavailable)
		}
		recvWithin(t, px.fired, 3*time.Second, "the seat call's connection reset")
		// Both returns land: the one queued at the failure, and the one
		// sent again once Redis answered a later pipeline.
		idle(t, g)
		syncState(t, g)
		waitFor(t, func() bool { return g.rds.redoLen() == 0 })
		if markExpired {
			for _, k := range h.Keys(bg, o.RedisPrefix+"{rl}:f:*").Val() {
				h.Del(bg, k) // their 2 minutes are over
			}
			time.Sleep(time.Until(made.Add(2 * life)))
		}
		px.runLate() // Redis runs the seat call now
		if n := h.ZCard(bg, set).Val(); n != 0 {
			t.Fatalf("mark expired %v: %s holds %d members after the seat call's returns ran before it", markExpired, set, n)
		}
		acquireOK(t, g, []Target{w1}, PhaseMixed, 0).Done()
		syncState(t, g)
	}
}
