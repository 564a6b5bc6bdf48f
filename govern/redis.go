package govern

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/infera/infera/internal/logx"
	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

// Redis key layout (prefix "infera:" by default; {...} are hash tags, so a
// user's keys share a cluster slot, and so do all seat keys):
//
//	<p>{u:<user>}            hash: rl rt (RPM bucket level, last ms), tl tt
//	                         (TPM), w<i>s w<i>r w<i>k (window i = 0 5h, 1
//	                         day, 2 week, 3 month: start, requests, milli
//	                         weighted tokens)
//	<p>{u:<user>}:seats      sorted set: the user's concurrency slots,
//	                         member = ticket id, score = lease expiry (ms)
//	<p>{rl}:i:<instance>:<c> sorted set: seats of counter c (overall,
//	<p>{rl}:s:<service>:<c>  prefill, decode) of an instance, a service or
//	<p>{rl}:g:<c>            the gateway; member = seat id, score = expiry
//	<p>wake                  pub/sub channel: "u:<user>" or "rl" when a
//	                         slot or seat is given back

// Codes the admission script reports, as bit numbers.
var admitScript = redis.NewScript(fmt.Sprintf(`
local h = KEYS[1]
local now = tonumber(ARGV[1])
local member = ARGV[2]
local exp = tonumber(ARGV[3])
local conc = tonumber(ARGV[4])
local rpm = tonumber(ARGV[5])
local tpm = tonumber(ARGV[6])
local need = tonumber(ARGV[7])
local est = tonumber(ARGV[8])
local dry = ARGV[9] == '1'
local ttl = tonumber(ARGV[10])
local fails = 0
local rr, rt = 0, 0
local function refill(f, cap)
  local v = redis.call('HMGET', h, f .. 'l', f .. 't')
  local lvl, t = tonumber(v[1]), tonumber(v[2])
  if lvl == nil or t == nil then return cap, now end
  if now > t then lvl = lvl + (now - t) * cap / 60000; t = now end
  if lvl > cap then lvl = cap end
  return lvl, t
end
if conc > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
  if redis.call('ZCARD', KEYS[2]) >= conc then fails = fails + 2^%[1]d end
end
local rl, rtm, tl, ttm
if rpm > 0 then
  rl, rtm = refill('r', rpm)
  if rl < 1 then fails = fails + 2^%[2]d; rr = (1 - rl) * 60000 / rpm end
end
if tpm > 0 then
  tl, ttm = refill('t', tpm)
  if tl < need then fails = fails + 2^%[3]d; rt = (need - tl) * 60000 / tpm end
end
local wins = {}
for p = 0, 3 do
  local i = 11 + p * 4
  if ARGV[i] ~= '0' then
    local start, maxr, maxk, e = tonumber(ARGV[i]), tonumber(ARGV[i+1]), tonumber(ARGV[i+2]), tonumber(ARGV[i+3])
    local v = redis.call('HMGET', h, 'w' .. p .. 's', 'w' .. p .. 'r', 'w' .. p .. 'k')
    local r, k = 0, 0
    if tonumber(v[1]) == start then r = tonumber(v[2]) or 0; k = tonumber(v[3]) or 0 end
    if maxr > 0 and r + 1 > maxr then fails = fails + 2^(%[4]d + p) end
    if maxk > 0 and k + e > maxk then fails = fails + 2^(%[5]d + p) end
    wins[#wins + 1] = {p, start, r + 1, k + e}
  end
end
if fails == 0 or dry then
  if conc > 0 then
    redis.call('ZADD', KEYS[2], exp, member)
    redis.call('PEXPIRE', KEYS[2], ttl)
  end
  if rpm > 0 then redis.call('HSET', h, 'rl', rl - 1, 'rt', rtm) end
  if tpm > 0 then redis.call('HSET', h, 'tl', tl - est, 'tt', ttm) end
  for _, w in ipairs(wins) do
    redis.call('HSET', h, 'w' .. w[1] .. 's', w[2], 'w' .. w[1] .. 'r', w[3], 'w' .. w[1] .. 'k', w[4])
  end
  redis.call('PEXPIRE', h, 3024000000)
end
return {fails, math.ceil(rr), math.ceil(rt)}
`, CodeConcurrencyUser, CodeRPM, CodeTPM, CodeQuotaRequests5h, CodeQuotaTokens5h))

// finishScript reconciles a ticket: ARGV member, conc, now, served,
// rpm cap (0: not taken), tpm cap (0: not taken), tpm delta, quota delta,
// channel, message, then per period: start (0: not taken).
var finishScript = redis.NewScript(`
local h = KEYS[1]
local now = tonumber(ARGV[3])
local served = ARGV[4] == '1'
local function adjust(f, cap, delta)
  local v = redis.call('HMGET', h, f .. 'l', f .. 't')
  local lvl, t = tonumber(v[1]), tonumber(v[2])
  if lvl == nil or t == nil then lvl = cap; t = now end
  if now > t then lvl = lvl + (now - t) * cap / 60000; t = now end
  lvl = lvl + delta
  if lvl > cap then lvl = cap end
  redis.call('HSET', h, f .. 'l', lvl, f .. 't', t)
end
local rpm = tonumber(ARGV[5])
if rpm > 0 and not served then adjust('r', rpm, 1) end
local tpm = tonumber(ARGV[6])
if tpm > 0 then adjust('t', tpm, -tonumber(ARGV[7])) end
local qd = tonumber(ARGV[8])
for p = 0, 3 do
  local start = ARGV[11 + p]
  if start ~= '0' and redis.call('HGET', h, 'w' .. p .. 's') == start then
    if not served then redis.call('HINCRBY', h, 'w' .. p .. 'r', -1) end
    if qd ~= 0 then redis.call('HINCRBY', h, 'w' .. p .. 'k', qd) end
  end
end
if ARGV[2] == '1' and redis.call('ZREM', KEYS[2], ARGV[1]) == 1 then
  redis.call('PUBLISH', ARGV[9], ARGV[10])
end
return 0
`)

// seatScript takes a seat on the first candidate with room: KEYS are 3
// per candidate (overall, prefill, decode); ARGV now, expiry, member,
// parts mask, 3 limits, dry, ttl. It returns {candidate (1-based, 0:
// none), first full counter (1-based, 0: none), 1 if taken over the
// limit (dry run)}.
var seatScript = redis.NewScript(`
local now = tonumber(ARGV[1])
local exp = tonumber(ARGV[2])
local member = ARGV[3]
local p = tonumber(ARGV[4])
local lim = {tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])}
local dry = ARGV[8] == '1'
local ttl = tonumber(ARGV[9])
local need = {}
for i = 1, 3 do if math.floor(p / 2^(i-1)) % 2 == 1 then need[#need + 1] = i end end
local first, chosen = 0, 0
for t = 0, #KEYS / 3 - 1 do
  local ok = true
  for _, i in ipairs(need) do
    local k = KEYS[t * 3 + i]
    redis.call('ZREMRANGEBYSCORE', k, '-inf', now)
    if lim[i] > 0 and redis.call('ZCARD', k) >= lim[i] then
      ok = false
      if first == 0 then first = i end
      break
    end
  end
  if ok then chosen = t + 1; break end
end
local over = 0
if chosen == 0 and dry then chosen = 1; over = 1 end
if chosen > 0 then
  for _, i in ipairs(need) do
    local k = KEYS[(chosen - 1) * 3 + i]
    redis.call('ZADD', k, exp, member)
    redis.call('PEXPIRE', k, ttl)
  end
end
return {chosen, first, over}
`)

// releaseScript removes a member from KEYS and announces it: ARGV member,
// channel, message.
var releaseScript = redis.NewScript(`
local n = 0
for _, k in ipairs(KEYS) do n = n + redis.call('ZREM', k, ARGV[1]) end
if n > 0 then redis.call('PUBLISH', ARGV[2], ARGV[3]) end
return n
`)

// redisState keeps the counters in Redis.
type redisState struct {
	g      *Governor
	c      *redis.Client
	prefix string
	wake   string // channel
	id     string // this router's id in lease members
	seq    atomic.Uint64
	ttl    time.Duration

	mu     sync.Mutex
	leases map[string][]string // member -> keys it holds (heartbeat)
	dirty  map[*userState]struct{}

	kick chan struct{}
	ps   *redis.PubSub
	log  logx.Throttle
}

func newRedisState(g *Governor, o Options) (*redisState, error) {
	ro, err := redis.ParseURL(o.State)
	if err != nil {
		return nil, fmt.Errorf("cannot parse --state: %w", err) // go-redis never echoes the password
	}
	ro.DialTimeout = time.Second
	ro.ReadTimeout = time.Second
	ro.WriteTimeout = time.Second
	ro.MaxRetries = 1
	ro.DisableIdentity = true
	ro.MaintNotificationsConfig = &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
	var rid [6]byte
	if _, err := rand.Read(rid[:]); err != nil {
		return nil, err
	}
	r := &redisState{
		g:      g,
		c:      redis.NewClient(ro),
		prefix: o.RedisPrefix,
		wake:   o.RedisPrefix + "wake",
		id:     hex.EncodeToString(rid[:]),
		ttl:    o.LeaseTTL,
		leases: map[string][]string{},
		dirty:  map[*userState]struct{}{},
		kick:   make(chan struct{}, 1),
		log:    logx.Throttle{Every: 10 * time.Second},
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	for _, s := range []*redis.Script{admitScript, finishScript, seatScript, releaseScript} {
		if err := s.Load(ctx, r.c).Err(); err != nil {
			r.c.Close()
			return nil, fmt.Errorf("cannot reach the state store at %s: %w", ro.Addr, err)
		}
	}
	r.ps = r.c.Subscribe(context.Background(), r.wake)
	g.wg.Add(2)
	go r.loop()
	go r.listen()
	return r, nil
}

func (r *redisState) close() error {
	r.ps.Close()
	return r.c.Close()
}

func (r *redisState) member() string {
	return r.id + ":" + strconv.FormatUint(r.seq.Add(1), 36)
}

func (r *redisState) userKeys(st *userState) (string, string) {
	h := r.prefix + "{u:" + st.name + "}"
	return h, h + ":seats"
}

// failed records a state store error and reports whether to admit (open).
func (r *redisState) failed(op string, err error, open bool) bool {
	mStateErrors.Inc()
	if op == "admit" || op == "seat" {
		if open {
			mStateFailOpen.Inc()
		} else {
			mStateFailShut.Inc()
		}
	}
	r.log.Warn("state store error", "op", op, "err", err, "fail_open", open)
	return open
}

func (r *redisState) ctx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 2*time.Second)
}

// admitUser runs the admission script for ts (one round trip).
func (r *redisState) admitUser(st *userState, t *template, ts *ticketState, cs *calState, e estimate, dry bool, now int64) (failures, int64, error) {
	hk, sk := r.userKeys(st)
	nowMS := now / 1e6
	member := r.member()
	args := make([]any, 0, 26)
	args = append(args, nowMS, member, nowMS+r.ttl.Milliseconds(), t.concLimit, t.rpm, t.tpm, min(e.tpm, t.tpm), e.tpm, b01(dry), 2*r.ttl.Milliseconds())
	for p := range numPeriods {
		w := &t.win[p]
		if !t.quota || !w.on {
			args = append(args, 0, 0, 0, 0)
			continue
		}
		args = append(args, cs.win[p].start, w.maxReq, w.maxTok, e.quota)
	}
	ctx, cancel := r.ctx()
	defer cancel()
	res, err := admitScript.Run(ctx, r.c, []string{hk, sk}, args...).Int64Slice()
	if err != nil {
		return 0, 0, err
	}
	if len(res) != 3 {
		return 0, 0, fmt.Errorf("admission script returned %d values", len(res))
	}
	f := failures(res[0])
	retry := max(res[1], res[2]) * 1e6
	for p := range numPeriods {
		if f.has(quotaRequestsCode(p)) || f.has(quotaTokensCode(p)) {
			retry = max(retry, (cs.win[p].end-now/1e9)*1e9)
		}
	}
	if f == 0 || dry {
		ts.at = now
		ts.remote = true
		ts.member = member
		ts.conc = t.concLimit > 0
		ts.rpm = t.rpm > 0
		ts.tpm = t.tpm > 0
		ts.tpmEst = e.tpm
		if t.quota {
			ts.quotaEst = e.quota
			for p := range numPeriods {
				if t.win[p].on {
					ts.win[p] = takenWin{on: true, start: cs.win[p].start}
				}
			}
		}
		if ts.conc {
			r.mu.Lock()
			r.leases[member] = []string{sk}
			r.mu.Unlock()
		}
	}
	return f, retry, nil
}

// finishUser reconciles ts in Redis (one round trip).
func (r *redisState) finishUser(ts *ticketState, served bool, u Usage, now int64) {
	t := ts.t
	var tpmCharge, quotaCharge int64
	switch {
	case !served:
	case u.Known:
		tpmCharge = int64(max(u.PromptTokens, 0) + max(u.CompletionTokens, 0))
		quotaCharge = t.weighted(u)
	default:
		tpmCharge, quotaCharge = ts.tpmEst, ts.quotaEst
	}
	hk, sk := r.userKeys(ts.u.st)
	rpmCap, tpmCap := int64(0), int64(0)
	if ts.rpm {
		rpmCap = max(t.rpm, 1)
	}
	if ts.tpm {
		tpmCap = max(t.tpm, 1)
	}
	args := make([]any, 0, 14)
	args = append(args, ts.member, b01(ts.conc), now/1e6, b01(served), rpmCap, tpmCap, tpmCharge-ts.tpmEst, quotaCharge-ts.quotaEst, r.wake, "u:"+ts.u.st.name)
	for p := range numPeriods {
		if ts.win[p].on {
			args = append(args, ts.win[p].start)
		} else {
			args = append(args, 0)
		}
	}
	if ts.conc {
		r.mu.Lock()
		delete(r.leases, ts.member)
		r.mu.Unlock()
	}
	ctx, cancel := r.ctx()
	defer cancel()
	if err := finishScript.Run(ctx, r.c, []string{hk, sk}, args...).Err(); err != nil {
		r.failed("finish", err, true)
	}
	if ts.conc {
		r.kickUser(ts.u.st) // a local waiter may take the slot at once
	}
}

// admitRemote is Admit with the counters in Redis.
func (g *Governor) admitRemote(ctx context.Context, s *snapshot, u *User, t *template, ts *ticketState, cs *calState, e estimate, dry bool, now int64) (Ticket, *Rejection) {
	st := u.st
	if t.concQueue && !dry {
		st.mu.Lock()
		if st.q.n > 0 { // no overtaking the queue
			return g.queueUser(ctx, u, t, ts, e)
		}
		st.mu.Unlock()
	}
	f, retry, err := g.rds.admitUser(st, t, ts, cs, e, dry, now)
	if err != nil {
		if g.rds.failed("admit", err, s.userOpen) {
			return ts.handle(u), nil // fail open: nothing to give back
		}
		g.putTicket(ts)
		u.rejected()
		return Ticket{}, reject(CodeStateUnavailable, 0, false)
	}
	if f != 0 {
		if !dry && f == 1<<CodeConcurrencyUser && t.concQueue {
			st.mu.Lock()
			return g.queueUser(ctx, u, t, ts, e) // counts it
		}
		hits(f, dry)
		if !dry {
			g.putTicket(ts)
			u.rejected()
			return Ticket{}, reject(f.first(), retry, false)
		}
	}
	return ts.handle(u), nil
}

// kickUser asks the queue loop to serve st's queue.
func (r *redisState) kickUser(st *userState) {
	st.mu.Lock()
	n := st.q.n
	st.mu.Unlock()
	if n == 0 {
		return
	}
	r.mu.Lock()
	r.dirty[st] = struct{}{}
	r.mu.Unlock()
	r.poke()
}

func (r *redisState) kickSeats() { r.poke() }

func (r *redisState) poke() {
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// loop serves the queues (on kicks, release notifications and every
// PollInterval while requests wait) and renews leases.
func (r *redisState) loop() {
	defer r.g.wg.Done()
	poll := time.NewTicker(r.g.opts.PollInterval)
	defer poll.Stop()
	hb := time.NewTicker(r.ttl / 3)
	defer hb.Stop()
	for {
		select {
		case <-r.g.stop:
			return
		case <-hb.C:
			r.heartbeat()
			continue
		case <-r.kick:
		case <-poll.C:
		}
		r.pumpUsers()
		r.pumpSeats()
	}
}

// listen turns release notifications into kicks.
func (r *redisState) listen() {
	defer r.g.wg.Done()
	ch := r.ps.Channel()
	for {
		select {
		case <-r.g.stop:
			return
		case m, ok := <-ch:
			if !ok {
				return
			}
			if name, ok := cutPrefix(m.Payload, "u:"); ok {
				r.g.mu.Lock()
				st := r.g.states[name]
				r.g.mu.Unlock()
				if st != nil {
					r.kickUser(st)
				}
			} else {
				r.poke()
			}
		}
	}
}

func cutPrefix(s, p string) (string, bool) {
	if len(s) >= len(p) && s[:len(p)] == p {
		return s[len(p):], true
	}
	return "", false
}

// heartbeat renews the leases of every slot and seat this router holds.
func (r *redisState) heartbeat() {
	r.mu.Lock()
	type kv struct{ key, member string }
	var all []kv
	for m, keys := range r.leases {
		for _, k := range keys {
			all = append(all, kv{k, m})
		}
	}
	r.mu.Unlock()
	if len(all) == 0 {
		return
	}
	exp := r.g.now().UnixMilli() + r.ttl.Milliseconds()
	ctx, cancel := r.ctx()
	defer cancel()
	_, err := r.c.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, x := range all {
			p.ZAddXX(ctx, x.key, redis.Z{Score: float64(exp), Member: x.member})
			p.PExpire(ctx, x.key, 2*r.ttl)
		}
		return nil
	})
	if err != nil {
		r.failed("heartbeat", err, true)
	}
}

// pumpUsers serves the heads of the queues of dirty users.
func (r *redisState) pumpUsers() {
	r.mu.Lock()
	users := make([]*userState, 0, len(r.dirty))
	for st := range r.dirty {
		users = append(users, st)
	}
	r.mu.Unlock()
	s := r.g.snap.Load()
	for _, st := range users {
		for {
			st.mu.Lock()
			w := st.q.head
			st.mu.Unlock()
			if w == nil {
				r.mu.Lock()
				if st.q.n == 0 {
					delete(r.dirty, st)
				}
				r.mu.Unlock()
				break
			}
			now := r.g.now().UnixNano()
			cs := s.cal.state(now / 1e9)
			dry := s.userDry || w.t.dry
			f, retry, err := r.admitUser(st, w.t, w.ts, cs, w.e, dry, now)
			if err == nil && f == 1<<CodeConcurrencyUser && !dry {
				break // still full: wait for the next release or poll
			}
			st.mu.Lock()
			if w.state != waiting { // it left during the round trip
				st.mu.Unlock()
				if err == nil && (f == 0 || dry) {
					r.finishUser(w.ts, false, Usage{}, now)
				}
				continue
			}
			st.q.remove(w)
			switch {
			case err != nil && !r.failed("admit", err, s.userOpen):
				w.state, w.rej = rejected, reject(CodeStateUnavailable, 0, false)
			case err != nil:
				w.state = granted
			case f != 0 && !dry:
				hits(f, false)
				w.state, w.rej = rejected, reject(f.first(), retry, false)
			default:
				w.state = granted
			}
			w.ch <- struct{}{}
			st.mu.Unlock()
		}
	}
}

// pumpSeats offers seats to queued requests in arrival order; a pass
// skips scopes it found full.
func (r *redisState) pumpSeats() {
	l := &r.g.seats
	l.mu.Lock()
	if l.q.n == 0 {
		l.mu.Unlock()
		return
	}
	ws := make([]*seatWaiter, 0, l.q.n)
	for w := l.q.head; w != nil; w = w.next {
		ws = append(ws, w)
	}
	l.mu.Unlock()
	rl := &r.g.snap.Load().rl
	full := map[*counters]bool{}
	for _, w := range ws {
		var cands []*counters
		var idx []int
		for i, c := range w.cs {
			if !full[c] {
				cands, idx = append(cands, c), append(idx, i)
			}
		}
		if len(cands) == 0 {
			continue
		}
		var seat Seat
		i, err := 0, error(nil) // no limit any more: a zero Seat
		if rl.limited {
			var ss *seatState
			ss, i, _, err = r.acquireSeat(rl, cands, w.ph, false)
			if ss != nil {
				seat = Seat{ss: ss, gen: ss.state.Load() >> ssFlags}
			}
		}
		if err == nil && i < 0 {
			for _, c := range cands {
				full[c] = true
			}
			continue
		}
		l.mu.Lock()
		if w.state != waiting {
			l.mu.Unlock()
			seat.Done()
			continue
		}
		l.dequeueLocked(w)
		switch {
		case err != nil && !r.failed("seat", err, rl.open):
			w.state, w.rej = rejected, reject(CodeStateUnavailable, 0, false)
		case err != nil:
			w.state, w.idx = granted, idx[0]
		default:
			w.state, w.seat, w.idx = granted, seat, idx[i]
		}
		w.ch <- struct{}{}
		l.mu.Unlock()
	}
}

// acquireSeat runs the seat script over cands (one round trip); it
// returns the seat's state and the index of the chosen candidate, or -1
// and the code of the first full counter.
func (r *redisState) acquireSeat(rl *rlConf, cands []*counters, ph Phase, dry bool) (*seatState, int, Code, error) {
	keys := make([]string, 0, 3*len(cands))
	for _, c := range cands {
		keys = append(keys, c.keys[0], c.keys[1], c.keys[2])
	}
	now := r.g.now().UnixMilli()
	member := r.member()
	p := parts(ph)
	ctx, cancel := r.ctx()
	defer cancel()
	res, err := seatScript.Run(ctx, r.c, keys, now, now+r.ttl.Milliseconds(), member, p, rl.lim[0], rl.lim[1], rl.lim[2], b01(dry), 2*r.ttl.Milliseconds()).Int64Slice()
	if err != nil {
		return nil, -1, CodeNone, err
	}
	if len(res) != 3 {
		return nil, -1, CodeNone, fmt.Errorf("seat script returned %d values", len(res))
	}
	code := phaseCode(ph, &rl.lim)
	if res[1] >= 1 && res[1] <= 3 {
		code = counterCodes[res[1]-1]
	}
	if res[0] == 0 {
		return nil, -1, code, nil
	}
	if res[2] == 0 {
		code = CodeNone // a seat within the limit
	}
	c := cands[res[0]-1]
	ss := r.g.seatPool.Get().(*seatState)
	ss.c = nil
	ss.keys = c.keys
	ss.member, ss.remote = member, true
	gen := ss.state.Load()>>ssFlags + 1
	ss.state.Store(gen<<ssFlags | ssActive | p)
	held := make([]string, 0, 2)
	for i := range 3 {
		if p&(1<<i) != 0 {
			held = append(held, c.keys[i])
			heldSeats[i].Add(1)
		}
	}
	r.mu.Lock()
	r.leases[member] = held
	r.mu.Unlock()
	return ss, int(res[0] - 1), code, nil
}

// releaseSeat returns the held counters of ss (one round trip).
func (r *redisState) releaseSeat(ss *seatState, held uint64) {
	keys := make([]string, 0, 2)
	for i := range 3 {
		if held&(1<<i) != 0 {
			keys = append(keys, ss.keys[i])
			heldSeats[i].Add(-1)
		}
	}
	r.mu.Lock()
	if rest := ss.state.Load() & ssHeld; rest == 0 {
		delete(r.leases, ss.member)
	} else if _, ok := r.leases[ss.member]; ok { // Done may have run already
		kept := make([]string, 0, 2)
		for i := range 3 {
			if rest&(1<<i) != 0 {
				kept = append(kept, ss.keys[i])
			}
		}
		r.leases[ss.member] = kept
	}
	r.mu.Unlock()
	ctx, cancel := r.ctx()
	defer cancel()
	if err := releaseScript.Run(ctx, r.c, keys, ss.member, r.wake, "rl").Err(); err != nil {
		r.failed("release", err, true)
	}
	r.poke() // a local waiter may take the seat at once
}

// acquireRemote is acquire with the seats in Redis.
func (g *Governor) acquireRemote(ctx context.Context, rl *rlConf, targets []Target, ph Phase, wait bool) (Seat, int, *Rejection) {
	l := &g.seats
	r := g.rds
	l.mu.Lock()
	cs := make([]*counters, len(targets))
	var cands []*counters
	var idx []int
	for i := range targets {
		c := l.counter(rl.scope, &targets[i])
		cs[i] = c
		if c.waiting == 0 || rl.dry { // no overtaking the queue
			cands, idx = append(cands, c), append(idx, i)
		}
	}
	l.mu.Unlock()
	code := phaseCode(ph, &rl.lim)
	if len(cands) > 0 {
		ss, i, c, err := r.acquireSeat(rl, cands, ph, rl.dry)
		if err != nil {
			if r.failed("seat", err, rl.open) {
				return Seat{}, 0, nil
			}
			return Seat{}, -1, reject(CodeStateUnavailable, 0, false)
		}
		if i >= 0 {
			if c != CodeNone {
				hit(c, true) // dry run: taken over the limit
			}
			return Seat{ss: ss, gen: ss.state.Load() >> ssFlags}, idx[i], nil
		}
		code = c
	}
	if !rl.queue {
		hit(code, false)
		return Seat{}, -1, reject(code, 0, false)
	}
	if !wait {
		return Seat{}, -1, reject(code, 0, false) // not counted: the caller queues next
	}
	l.mu.Lock()
	if l.q.n >= rl.queueSize {
		l.mu.Unlock()
		hit(code, false)
		return Seat{}, -1, reject(code, 0, true)
	}
	w := &seatWaiter{ch: make(chan struct{}, 1), ph: ph, code: code, since: time.Now(), cs: cs}
	for _, c := range cs {
		c.waiting++
	}
	l.q.push(w)
	seatQueued.Add(1)
	l.mu.Unlock()
	hitQueued(code)
	r.poke()
	return g.waitSeat(ctx, w, rl.timeout)
}

func b01(b bool) int {
	if b {
		return 1
	}
	return 0
}
