package govern

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
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
//	                           its TTL is the window of its latest lockout
//	lockout:<table>            pub/sub channel: "<address> <ms left>" when
//	                           a lockout begins
//
// So Redis keeps at most two entries per address with a wrong key in the
// last window, and every entry ends a window after its last write. The
// caller keeps its in-memory table as the first check and asks Redis only
// about wrong keys: a locked address costs no round trip, nor does a right
// key on an address that is not locked.
type Lockouts struct {
	r       *redisState
	count   string // key prefix of the counts
	set     string
	channel string
	maxRead int // maxLockedRead (tests lower it)
}

// Lockouts returns the shared lockout table named table ("api": the front
// door's; "admin": the admin listener's), nil with in-process counters
// (no --state).
func (g *Governor) Lockouts(table string) *Lockouts {
	if g.rds == nil {
		return nil
	}
	p := g.rds.prefix + "lockout:" + table
	return &Lockouts{r: g.rds, count: p + ":", set: p + ":locked", channel: p, maxRead: maxLockedRead}
}

// failLua counts a wrong key: KEYS are the address's count and the set of
// lockouts, ARGV the max, the window (ms), the address and the channel. It
// returns {1 if this key locked the address, ms the lockout has left (0:
// not locked)}. An address locked already is not counted again.
var failLua = `
if redis.replicate_commands then redis.replicate_commands() end -- TIME before writes (Redis < 5)
local max, win = tonumber(ARGV[1]), tonumber(ARGV[2])
local n = tonumber(redis.call('GET', KEYS[1]) or '0') or 0
if n >= max then
  local left = redis.call('PTTL', KEYS[1])
  if left > 0 then return {0, left} end
  redis.call('DEL', KEYS[1]) -- no TTL (written by hand): a fresh window
end
n = redis.call('INCR', KEYS[1])
if n == 1 then redis.call('PEXPIRE', KEYS[1], win) end
if n < max then return {0, 0} end
redis.call('PEXPIRE', KEYS[1], win)
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
redis.call('ZADD', KEYS[2], now + win, ARGV[3])
if redis.call('PTTL', KEYS[2]) < win then redis.call('PEXPIRE', KEYS[2], win) end
redis.call('PUBLISH', ARGV[4], ARGV[3] .. ' ' .. win)
return {1, win}
`

var failScript = redis.NewScript(failLua)

// maxLockedRead bounds the lockouts a router reads at once (Locked): the
// latest to end, past what a router's table holds one by one (its
// shared windows then all locked) and whatever a flood of addresses
// wrote meanwhile.
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
// address or an IPv6 /64) against limit within window. It returns how long
// a is locked out for from now (0: not locked), and whether this key
// locked it (once per lockout, across routers).
func (l *Lockouts) Failed(a netip.Addr, limit int, window time.Duration) (left time.Duration, began bool, err error) {
	as := a.String()
	ms := max(window.Milliseconds(), 1)
	v, err := l.r.call(failScript, []string{l.count + as, l.set}, max(limit, 1), ms, as, l.channel).Int64Slice()
	if err != nil {
		return 0, false, err
	}
	if len(v) != 2 {
		return 0, false, fmt.Errorf("BUG: the lockout script answered %d values", len(v))
	}
	return time.Duration(v[1]) * time.Millisecond, v[0] == 1, nil
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
