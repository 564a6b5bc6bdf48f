package govern

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/infera/infera/internal/lockout"
)

// Lockouts is a wrong-key lockout table (internal/lockout's rule: Max
// wrong keys from one client address within a window, counted from the
// first, lock the address out for a window from the last) kept in the
// state store, so that every router sharing it counts one address's wrong
// keys together and refuses a locked address, a restarted router
// included. Only the address and its count are stored, never a key nor
// anything derived from one. Keys (after --state's prefix):
//
//	lockout:<table>:<address>  string: the address's wrong keys in its
//	                           window; its TTL is the window, then the
//	                           lockout (from the wrong key that locked it)
//	lockout:<table>:locked     sorted set: addresses locked out, scored
//	                           by the lockout's end (Redis's clock, ms);
//	                           its TTL is the window of its latest
//	                           lockout; one of an address not counted
//	                           (past maxLockoutAddrs) is added while it
//	                           holds fewer than maxLockedRead in force
//	lockout:<table>:addresses  string: the addresses given a count in
//	                           the window from the first (its TTL);
//	                           past maxLockoutAddrs a new address is not
//	                           counted in Redis
//	lockout:<table>            pub/sub channel: "<address> <ms left>" when
//	                           a lockout begins
//
// So Redis keeps at most two entries per address with a wrong key in the
// last window, at most 3 x maxLockoutAddrs addresses (a count lives less
// than two windows), plus at most maxLockedRead lockouts of addresses not
// counted, and every entry ends at most a window after its last write.
// The
// caller keeps its in-memory table as the first check and asks Redis only
// about wrong keys: a locked address costs no round trip, nor does a right
// key on an address that is not locked.
type Lockouts struct {
	r       *redisState
	count   string // key prefix of the counts
	set     string
	made    string // the count of addresses counted in this window
	channel string
	maxRead int // maxLockedRead (tests lower it)
	// queue bounds the wrong keys Send holds for Redis: sendQueue (tests
	// lower it before Start).
	queue int
	q     chan Guess
	// mu guards unsent: the lockouts the caller's table began that Redis
	// has not taken yet (their key's call failed, or Send dropped the
	// key), by their end (Unix ns), at most queue of them; wake tells
	// Start's goroutine that Send added one.
	mu     sync.Mutex
	unsent map[netip.Addr]int64
	wake   chan struct{}
	// maxAddrs bounds the addresses Redis counts per window:
	// maxLockoutAddrs (tests lower it).
	maxAddrs int
	// maxStored bounds the lockouts in force the set may hold when one of
	// an address Redis does not count is added: maxLockedRead (tests
	// lower it).
	maxStored int
}

// Lockouts returns the shared lockout table named table ("api": the front
// door's; "admin": the admin listener's), nil with in-process counters
// (no --state).
func (g *Governor) Lockouts(table string) *Lockouts {
	if g.rds == nil {
		return nil
	}
	p := g.rds.prefix + "lockout:" + table
	return &Lockouts{r: g.rds, count: p + ":", set: p + ":locked", made: p + ":addresses", channel: p, maxRead: maxLockedRead,
		queue: sendQueue, maxAddrs: maxLockoutAddrs, maxStored: maxLockedRead, unsent: make(map[netip.Addr]int64), wake: make(chan struct{}, 1)}
}

// failLua counts wrong keys: KEYS are each key's address's count, then
// the count of addresses counted in this window, then the set of
// lockouts; ARGV the max, the window (ms), the channel, the most
// addresses counted per window and the most lockouts in force the set may
// hold when one of an address not counted is added, then per key its
// address, how long the
// lockout the caller's own table began with it has left (ms; 0: none),
// and 1 to count it (0: only impose that lockout, sent again after Redis
// could not be asked). It returns per key {1 if this key locked the
// address (2: not counted, the window's addresses are at their most), ms
// the lockout has left (0: not locked)}. An address locked already is not
// counted again.
//
// The caller's own lockout is imposed when Redis's count has none as long
// (the two count from different first keys: Redis from the address's
// first on any router, a router from its own first), so that a lockout
// any router begins holds on all with the same end: the count is set to
// the max for its time, and it is added to the set and published as one
// Redis's count began.
//
// The addresses: each one whose count key is made counts in KEYS[#KEYS-1]
// for the window from the first (a fixed window); past the most, a new
// address gets no count key. A lockout the caller began for it is
// published, and added to the set (the later end kept) when the set holds
// fewer lockouts in force than ARGV[5] or holds this address already: a
// router started afterwards reads it, and the set stays bounded. A count
// key lives less than two windows (a window from the first wrong key,
// then from the one that locked), so at most three such windows'
// addresses hold a key at once.
var failLua = `
if redis.replicate_commands then redis.replicate_commands() end -- TIME before writes (Redis < 5)
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local max, win, ch, most, room = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5])
local made, set = KEYS[#KEYS - 1], KEYS[#KEYS]
local out = {}
local function fail(k, a, loc, count)
  local began, left, tell = 0, 0, false
  local cur = redis.call('GET', k)
  if not cur then
    if (tonumber(redis.call('GET', made) or '0') or 0) >= most then
      if loc > 0 then
        redis.call('ZREMRANGEBYSCORE', set, '-inf', now)
        local had = tonumber(redis.call('ZSCORE', set, a) or '-1')
        if had >= 0 or redis.call('ZCARD', set) < room then
          if had < now + loc then redis.call('ZADD', set, now + loc, a) end
          if redis.call('PTTL', set) < loc then redis.call('PEXPIRE', set, loc) end
        end
        redis.call('PUBLISH', ch, a .. ' ' .. loc)
      end
      return 2, 0
    end
    if count or loc > 0 then
      if redis.call('INCR', made) == 1 then redis.call('PEXPIRE', made, win) end
    end
  end
  local n = tonumber(cur or '0') or 0
  if n >= max then
    left = redis.call('PTTL', k)
    if left <= 0 then
      left = 0
      redis.call('DEL', k) -- no TTL (written by hand): a fresh window
    end
  end
  if left == 0 and count then
    n = redis.call('INCR', k)
    if n == 1 then redis.call('PEXPIRE', k, win) end
    if n >= max then
      redis.call('PEXPIRE', k, win)
      began, left, tell = 1, win, true
    end
  end
  if loc > left then
    if left == 0 then began = 1 end
    left, tell = loc, true
    redis.call('SET', k, max, 'PX', loc)
  end
  if tell then
    redis.call('ZREMRANGEBYSCORE', set, '-inf', now)
    redis.call('ZADD', set, now + left, a)
    if redis.call('PTTL', set) < left then redis.call('PEXPIRE', set, left) end
    redis.call('PUBLISH', ch, a .. ' ' .. left)
  end
  return began, left
end
for i = 1, #KEYS - 2 do
  local j = 3 + 3 * i
  local began, left = fail(KEYS[i], ARGV[j], tonumber(ARGV[j + 1]), ARGV[j + 2] == '1')
  out[#out + 1] = began
  out[#out + 1] = left
end
return out
`

var failScript = redis.NewScript(failLua)

const (
	// maxLockoutAddrs bounds the new addresses Redis counts per window.
	maxLockoutAddrs = 1 << 18
	// sendQueue bounds the wrong keys waiting to be counted in Redis
	// (Send): past it, under a flood while Redis is slow or down, they
	// are dropped (counted in this router's table alone).
	sendQueue = 4096
	// sendBatch is the most wrong keys counted in one script call.
	sendBatch = 128
)

// maxLockedRead bounds the lockouts a router reads at once (Locked): the
// latest to end, past what a router's table holds one by one (its
// shared windows then all locked) and whatever a flood of addresses
// wrote meanwhile. It also bounds the set when a lockout of an address
// Redis does not count is added (failLua): more than a router reads would
// tell a router that starts nothing more.
const maxLockedRead = 1 << 16

// lockedScript answers the lockouts in force in KEYS[1], at most ARGV[1]
// of them, the latest to end first: address, ms left, and so on.
var lockedScript = redis.NewScript(`
if redis.replicate_commands then redis.replicate_commands() end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local v = redis.call('ZREVRANGE', KEYS[1], 0, tonumber(ARGV[1]) - 1, 'WITHSCORES')
local out = {}
for i = 1, #v, 2 do
  out[#out + 1] = v[i]
  out[#out + 1] = tostring(tonumber(v[i + 1]) - now)
end
return out
`)

// Failed counts a wrong key from the address a (a lockout key: an IPv4
// address or an IPv6 /64) against limit within window, and waits for the
// answer. It returns how long a is locked out for from now (0: not
// locked), and whether this key locked it (once per lockout, across
// routers).
func (l *Lockouts) Failed(a netip.Addr, limit int, window time.Duration) (left time.Duration, began bool, err error) {
	c := l.fail(nil, []Guess{{Addr: a}}, limit, window)[0]
	return c.Left, c.Began, c.Err
}

// A Guess is a wrong key to count in Redis (Send).
type Guess struct {
	// Addr is the client's lockout address (lockout.Key).
	Addr netip.Addr
	// Until is when the lockout this router's own table began with this
	// key ends (Unix ns; 0: it began none). Redis imposes what is left of
	// it on every router when its own count has no lockout as long.
	Until int64
	// Peer is the caller's to keep (the TCP peer, for a log line).
	Peer netip.AddrPort
	// Held is the caller's to keep (its table holds the address's next
	// requests until the answer: lockout.Guard.Hold).
	Held bool
	// resend: a lockout sent again (Until), not a wrong key to count.
	resend bool
}

// Counted is Redis's answer about a Guess (Start's fn).
type Counted struct {
	Guess
	// Full: Redis counts maxLockoutAddrs new addresses in this window
	// already, and did not count this one (the caller counts it alone;
	// the lockout it began, if any, is published and stored while the
	// set has room).
	Full bool
	// Left is how long Addr is locked out for, from the answer (0: not
	// locked out in Redis).
	Left time.Duration
	// Began: this key began Addr's lockout (once across routers).
	Began bool
	// Err: Redis could not count the key.
	Err error
}

// Start has the wrong keys given to Send counted in Redis against limit
// within window, from a goroutine of its own that runs until the governor
// closes, and calls fn with each answer (from that goroutine, in order).
// Call it once, before Send.
//
// A lockout the caller's table began with a key Redis could not count
// (unreachable, stalled) or Send dropped (the queue full) is kept, up to
// sendQueue of them, and sent again every second, and after every batch
// Redis answered, until Redis takes it or it ends: the other routers then
// hold it too. When the governor closes, the keys still queued and the
// lockouts kept are sent once more (flush).
func (l *Lockouts) Start(limit int, window time.Duration, fn func(Counted)) {
	g := l.r.g
	quit, done := make(chan struct{}), make(chan struct{})
	g.flushMu.Lock()
	if g.closing {
		g.flushMu.Unlock()
		return // Send refuses every key (no queue): the caller counts them alone
	}
	l.q = make(chan Guess, max(l.queue, 1))
	g.flushers = append(g.flushers, func() { close(quit); <-done })
	g.flushMu.Unlock()
	go func() {
		defer close(done)
		batch := make([]Guess, 0, sendBatch)
		var out []Counted
		retry := time.NewTimer(time.Hour)
		retry.Stop()
		for {
			select {
			case <-quit:
				retry.Stop()
				l.flush(out, batch, limit, window, fn)
				return
			case <-retry.C:
				out = l.resendLockouts(out, batch, limit, window)
			case <-l.wake: // Send kept a lockout: arm retry
			case x := <-l.q:
				batch = l.take(append(batch[:0], x))
				out = l.fail(out[:0], batch, limit, window)
				answered := false
				for _, c := range out {
					if c.Err != nil && c.Until != 0 {
						l.keep(c.Addr, c.Until)
					}
					answered = answered || c.Err == nil
					fn(c)
				}
				if answered && l.kept() > 0 {
					out = l.resendLockouts(out, batch, limit, window)
				}
			}
			if l.kept() > 0 {
				retry.Reset(time.Second)
			}
		}
	}()
}

// take appends to batch the keys waiting in the queue, without waiting,
// until it holds sendBatch (one script call's).
func (l *Lockouts) take(batch []Guess) []Guess {
	for len(batch) < sendBatch {
		select {
		case x := <-l.q:
			batch = append(batch, x)
		default:
			return batch
		}
	}
	return batch
}

// flush counts in Redis, when the governor closes, the wrong keys Send
// queued and not yet sent, and sends the lockouts waiting to be sent
// again, so that a router shut down (a restart, a rolling upgrade) right
// after the key that began a lockout leaves it in Redis for the others
// and for its successor. It stops calling Redis at the first call Redis
// fails (down or stalled: the shutdown waits for at most one call's
// timeout) and answers the keys after it with that call's error, unsent.
// fn is told each answer, as from Start: every key queued is answered.
func (l *Lockouts) flush(out []Counted, batch []Guess, limit int, window time.Duration, fn func(Counted)) {
	// failed: the first call Redis failed; the rest are answered with it,
	// unsent. Keys Send adds meanwhile wait no longer than the queue's size.
	var failed error
	for left := cap(l.q); left > 0; left -= len(batch) {
		batch = l.take(batch[:0])
		if len(batch) == 0 {
			break
		}
		if failed == nil {
			out = l.fail(out[:0], batch, limit, window)
			failed = out[0].Err
		} else {
			out = out[:0]
			for _, x := range batch {
				out = append(out, Counted{Guess: x, Err: failed})
			}
		}
		for _, c := range out {
			fn(c) // answered, a failure too: the caller's table waits for none
		}
	}
	if failed == nil && l.kept() > 0 {
		l.resendLockouts(out, batch, limit, window)
	}
}

// keep notes the lockout of a until until (Unix ns) to be sent again,
// unless sendQueue others wait already.
func (l *Lockouts) keep(a netip.Addr, until int64) {
	l.mu.Lock()
	if u, ok := l.unsent[a]; ok || len(l.unsent) < l.queue {
		l.unsent[a] = max(u, until)
	}
	l.mu.Unlock()
}

// kept is the number of lockouts waiting to be sent again.
func (l *Lockouts) kept() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.unsent)
}

// resendLockouts sends again the lockouts kept (unsent) still in force,
// sendBatch per script call until Redis fails one, and forgets those Redis
// took (unless kept meanwhile with a later end) or that ended. buf and out
// are scratch.
func (l *Lockouts) resendLockouts(out []Counted, buf []Guess, limit int, window time.Duration) []Counted {
	for {
		now := time.Now().UnixNano()
		buf = buf[:0]
		l.mu.Lock()
		for a, until := range l.unsent {
			if until <= now {
				delete(l.unsent, a)
				continue
			}
			buf = append(buf, Guess{Addr: a, Until: until, resend: true})
			if len(buf) == sendBatch {
				break
			}
		}
		l.mu.Unlock()
		if len(buf) == 0 {
			return out
		}
		out = l.fail(out[:0], buf, limit, window)
		if out[0].Err != nil {
			return out // kept, for the next try
		}
		l.mu.Lock()
		for _, c := range out {
			if l.unsent[c.Addr] <= c.Until {
				delete(l.unsent, c.Addr)
			}
		}
		l.mu.Unlock()
	}
}

// AnswerWait bounds how long an address's request waits for Redis's
// answers about its wrong keys sent before (lockout.Guard.Await): the
// state store's call timeout, within which a call is answered or fails
// (and then fails at once while Redis stalls). Past it the request goes
// on, checked by the caller's table alone.
const AnswerWait = callTimeout

// Report sends the wrong key x to be counted in Redis (Send), that the
// caller's table t counted already (began: it began x.Addr's lockout
// there, whose end goes with it): the address is held in t until the
// answer (t.Hold; the caller's fn, given Counted.Held, releases it after
// imposing the lockout the answer tells). It reports false, and releases
// the hold, when the key was dropped (the queue is full).
func (l *Lockouts) Report(t *lockout.Guard, x Guess, began bool) bool {
	if began {
		wait, _ := t.Locked(x.Addr)
		x.Until = time.Now().Add(wait).UnixNano()
	}
	x.Held = t.Hold(x.Addr) // before Send: the answer may come first
	if l.Send(x) {
		return true
	}
	if x.Held {
		t.Release(x.Addr)
	}
	return false
}

// Send queues the wrong key x to be counted in Redis (Start), without
// waiting: the caller answers its client from its own table meanwhile. It
// reports false, and drops x, when sendQueue keys wait already (Redis
// slow or unreachable under a flood); the lockout x began (Until), if
// any, is then kept as one Redis could not count, and sent once the
// queue drains (Start).
func (l *Lockouts) Send(x Guess) bool {
	select {
	case l.q <- x:
		return true
	default:
	}
	if x.Until != 0 && l.q != nil {
		l.keep(x.Addr, x.Until)
		select {
		case l.wake <- struct{}{}:
		default:
		}
	}
	return false
}

// fail counts the wrong keys gs in one script call and appends the
// answers to dst.
func (l *Lockouts) fail(dst []Counted, gs []Guess, limit int, window time.Duration) []Counted {
	keys := make([]string, 0, len(gs)+2)
	args := make([]any, 0, 5+3*len(gs))
	args = append(args, max(limit, 1), max(window.Milliseconds(), 1), l.channel, max(l.maxAddrs, 1), max(l.maxStored, 1))
	now := time.Now().UnixNano()
	for _, x := range gs {
		as := x.Addr.String()
		var loc int64 // ms left of the caller's own lockout
		if x.Until > now {
			loc = (x.Until - now + int64(time.Millisecond) - 1) / int64(time.Millisecond)
		}
		count := 1
		if x.resend {
			count = 0
		}
		keys = append(keys, l.count+as)
		args = append(args, as, loc, count)
	}
	keys = append(keys, l.made, l.set)
	v, err := l.r.call(failScript, keys, args...).Int64Slice()
	if err == nil && len(v) != 2*len(gs) {
		err = fmt.Errorf("BUG: the lockout script answered %d values for %d keys", len(v), len(gs))
	}
	for i, x := range gs {
		c := Counted{Guess: x, Err: err}
		if err == nil {
			c.Left, c.Began, c.Full = time.Duration(v[2*i+1])*time.Millisecond, v[2*i] == 1, v[2*i] == 2
		}
		dst = append(dst, c)
	}
	return dst
}

// Locked calls fn with every lockout in force in Redis (up to
// maxLockedRead, the latest to end) and how long it has left.
func (l *Lockouts) Locked(fn func(a netip.Addr, left time.Duration)) error {
	v, err := l.r.call(lockedScript, []string{l.set}, l.maxRead).StringSlice()
	if err != nil {
		return err
	}
	for i := 0; i+1 < len(v); i += 2 {
		a, err1 := netip.ParseAddr(v[i])
		ms, err2 := strconv.ParseInt(v[i+1], 10, 64)
		if err1 != nil || err2 != nil {
			continue // not ours (written by hand)
		}
		fn(a, time.Duration(ms)*time.Millisecond)
	}
	return nil
}

// errLockoutMessage is a message on the channel that is not a lockout.
var errLockoutMessage = errors.New("a lockout message that is not <address> <ms>")

func parseLockout(s string) (netip.Addr, time.Duration, error) {
	as, ms, ok := strings.Cut(s, " ")
	if !ok {
		return netip.Addr{}, 0, errLockoutMessage
	}
	a, err := netip.ParseAddr(as)
	if err != nil {
		return netip.Addr{}, 0, errLockoutMessage
	}
	n, err := strconv.ParseInt(ms, 10, 64)
	if err != nil || n <= 0 {
		return netip.Addr{}, 0, errLockoutMessage
	}
	return a, time.Duration(n) * time.Millisecond, nil
}

// Watch tells fn every lockout that begins on any router, from the
// channel, and every lockout in force (Locked) now and whenever the
// subscription is made again (after Redis was unreachable, when a
// lockout's message may have been missed); onErr is told when the list of
// lockouts cannot be read. The first list is read before Watch returns,
// after the subscription is made (a lockout begun between the two is told
// twice, none is missed); the rest runs until the governor closes. fn is
// called from one goroutine at a time.
func (l *Lockouts) Watch(fn func(a netip.Addr, left time.Duration), onErr func(error)) {
	g := l.r.g
	ctx, cancel := context.WithCancel(context.Background())
	ps := l.r.c.Subscribe(ctx, l.channel)
	if err := l.Locked(fn); err != nil {
		onErr(err)
	}
	g.wg.Add(2)
	go func() {
		defer g.wg.Done()
		<-g.stop
		cancel()
		ps.Close()
	}()
	go func() {
		defer g.wg.Done()
		for {
			m, err := ps.Receive(ctx)
			if err != nil {
				select {
				case <-g.stop:
					return
				case <-time.After(time.Second): // Redis unreachable: dial again
				}
				continue
			}
			switch m := m.(type) {
			case *redis.Subscription:
				// Made again after Redis was unreachable (or the first,
				// read just above already): lockouts begun meanwhile.
				if err := l.Locked(fn); err != nil {
					onErr(err)
				}
			case *redis.Message:
				if a, left, err := parseLockout(m.Payload); err == nil {
					fn(a, left)
				}
			}
		}
	}()
}
