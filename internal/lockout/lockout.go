package lockout

import (
	"encoding/binary"
	"math/rand/v2"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
)

// Options configures a Guard.
type Options struct {
	// Max is how many wrong keys from one address within Window lock it
	// out; 0 turns the guard off (New returns nil).
	Max int
	// Window is both the time within which Max wrong keys lock an address
	// (counted from its first) and how long the lockout then lasts,
	// counted from the wrong key that caused it. 0: a minute.
	Window time.Duration
	// Tracked bounds the addresses whose windows are kept one by one
	// (memory); 0: DefaultTracked. Beyond it, and while every tracked
	// window is still open, an address's wrong keys count in a bucket it
	// shares with the other addresses of its hash (Buckets of them).
	Tracked int
	// Now is the clock (tests); nil: time.Now.
	Now func() time.Time
}

// DefaultTracked is the addresses tracked one by one by default.
const DefaultTracked = 4096

const (
	nShards = 16 // a power of two
	// Buckets is the number of shared windows of untracked addresses.
	Buckets         = 16384
	bucketsPerShard = Buckets / nShards
)

// Guard counts wrong keys per address. A nil *Guard is off: nothing is
// ever locked. Safe for concurrent use. Locked takes no lock while no
// lockout is in force (one atomic load), and one shard's lock otherwise.
type Guard struct {
	max    int32
	window int64 // nanoseconds
	now    func() time.Time
	k0, k1 uint64 // hash keys: an address's shard and bucket cannot be chosen
	per    int    // tracked addresses per shard
	// until is the latest end of a lockout set (Unix nanoseconds): from
	// then on no address is locked out, and Locked looks nothing up.
	until atomic.Int64
	// held is the number of wrong keys Hold noted and Release did not
	// yet (all windows): while 0, Await looks nothing up.
	held   atomic.Int64
	shards [nShards]shard
}

type shard struct {
	_  [64]byte // its lock on a cache line apart from the neighbour's buckets
	mu sync.Mutex
	// m holds the tracked windows; Lock must be held for both.
	m map[netip.Addr]win
	// sweep is when the earliest tracked window can end: a full shard is
	// swept for ended windows only from then on.
	sweep   int64
	buckets [bucketsPerShard]win
}

// win is a window: n wrong keys, ending at until (Unix nanoseconds).
// Once n reaches max it is a lockout, until counted from that key. held
// is the address's wrong keys sent to a shared table whose answer has not
// come (Hold, Release); a window holding some is not dropped when it ends
// until a shard's sweep.
type win struct {
	until int64
	n     int32
	held  int32
}

// New returns a Guard, or nil when o.Max is 0 (off).
func New(o Options) *Guard {
	if o.Max <= 0 {
		return nil
	}
	if o.Window <= 0 {
		o.Window = time.Minute
	}
	if o.Tracked <= 0 {
		o.Tracked = DefaultTracked
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	g := &Guard{max: int32(min(o.Max, 1<<30)), window: int64(o.Window), now: o.Now,
		k0: rand.Uint64(), k1: rand.Uint64(), per: max(1, (o.Tracked+nShards-1)/nShards)}
	for i := range g.shards {
		g.shards[i].m = make(map[netip.Addr]win)
	}
	return g
}

// Window is the guard's window (how long a lockout lasts).
func (g *Guard) Window() time.Duration { return time.Duration(g.window) }

// Locked reports whether a is locked out now, and for how long still. A
// tracked address answers by its own window; an untracked one by its
// bucket. It does not allocate.
func (g *Guard) Locked(a netip.Addr) (time.Duration, bool) {
	if g == nil {
		return 0, false
	}
	now := g.now().UnixNano()
	if now >= g.until.Load() {
		return 0, false // no lockout in force anywhere
	}
	h := g.hash(a)
	s := &g.shards[h&(nShards-1)]
	var left int64
	s.mu.Lock()
	if w, ok := s.m[a]; ok {
		if w.n >= g.max {
			left = w.until - now
		}
		if now >= w.until && w.held == 0 {
			delete(s.m, a)
		}
	} else if b := &s.buckets[(h>>32)%bucketsPerShard]; b.n >= g.max {
		left = b.until - now
	}
	s.mu.Unlock()
	if left <= 0 {
		return 0, false
	}
	return time.Duration(left), true
}

// Failed counts a wrong key from a. It reports whether this key locked a
// out (once per lockout; for a log line).
func (g *Guard) Failed(a netip.Addr) bool {
	if g == nil {
		return false
	}
	now := g.now().UnixNano()
	return g.at(a, now, func(w *win) bool {
		if now >= w.until {
			w.until, w.n = now+g.window, 0 // a new window, or the last one ended
		}
		return g.count(w, now)
	})
}

// at runs f on a's window under its shard's lock: a's tracked window (a
// new, zero one when the shard has room for it), or, when every tracked
// window of the shard is still open (a flood from more addresses than are
// tracked), the bucket a falls in. No window is given up for a, which
// would let an address guess again once others pushed its count out; a
// bucket that locks locks every untracked address that falls in it.
func (g *Guard) at(a netip.Addr, now int64, f func(w *win) bool) bool {
	h := g.hash(a)
	s := &g.shards[h&(nShards-1)]
	s.mu.Lock()
	defer s.mu.Unlock()
	w, tracked := s.m[a]
	if !tracked && len(s.m) >= g.per && now >= s.sweep {
		g.sweepEnded(s, now)
	}
	if tracked || len(s.m) < g.per {
		r := f(&w)
		s.m[a] = w
		return r
	}
	return f(&s.buckets[(h>>32)%bucketsPerShard])
}

// Lock locks a out for d from now, or keeps the lockout in force if it
// ends later: a lockout learned from elsewhere (other routers sharing the
// state store). It takes a's place in the table as Failed does (a
// tracked window, or its bucket when the shard holds only open windows).
// It reports whether a was not locked out before.
func (g *Guard) Lock(a netip.Addr, d time.Duration) bool {
	if g == nil || d <= 0 {
		return false
	}
	now := g.now().UnixNano()
	until := now + int64(d)
	return g.at(a, now, func(w *win) bool { return g.impose(w, now, until) })
}

// impose makes w a lockout until until, unless it is one ending later.
// Lock must be held.
func (g *Guard) impose(w *win, now, until int64) bool {
	fresh := w.n < g.max || now >= w.until
	if !fresh && w.until >= until {
		return false
	}
	w.n, w.until = g.max, until
	for u := g.until.Load(); u < until && !g.until.CompareAndSwap(u, until); u = g.until.Load() {
	}
	return fresh
}

// count adds a wrong key to w; the key that reaches max starts a lockout
// of a whole window. Lock must be held.
func (g *Guard) count(w *win, now int64) bool {
	if w.n >= g.max {
		return false // already locked (a request that raced its lockout)
	}
	w.n++
	if w.n < g.max {
		return false
	}
	w.until = now + g.window
	for u := g.until.Load(); u < w.until && !g.until.CompareAndSwap(u, w.until); u = g.until.Load() {
	}
	return true
}

// sweepEnded drops the ended windows of the full shard s (those holding
// keys whose answer never came included: their requests are held no
// more) and notes when the earliest window can end: the earliest of the
// rest, or of one opened from now on (a window or lockout lasts a whole
// window). s's lock must be held.
func (g *Guard) sweepEnded(s *shard, now int64) {
	next := now + g.window
	for k, w := range s.m {
		if now >= w.until {
			g.held.Add(-int64(w.held))
			delete(s.m, k)
		} else {
			next = min(next, w.until)
		}
	}
	s.sweep = next
}

// Hold notes that a wrong key of a was sent to a shared table (other
// routers' count) and that its answer, which may lock a out, has not come:
// until Release, a's requests wait in Await. Only an address tracked one
// by one is held (not one counted in a shared window); Hold reports
// whether a was, and then Release must follow, once.
func (g *Guard) Hold(a netip.Addr) bool {
	if g == nil {
		return false
	}
	return g.tracked(a, func(w *win) {
		w.held++
		g.held.Add(1)
	})
}

// Release notes that the answer about a wrong key Hold noted came (after
// the lockout it told, if any, was imposed with Lock).
func (g *Guard) Release(a netip.Addr) {
	if g == nil {
		return
	}
	g.tracked(a, func(w *win) {
		if w.held > 0 {
			w.held--
			g.held.Add(-1)
		}
	})
}

// Await waits while a has wrong keys held (Hold) whose answer has not
// come, for at most d, polling: a lockout one of those answers begins
// then holds for a's request that follows, which Locked checks next. It
// takes one atomic load and does not allocate while no key is held
// anywhere.
func (g *Guard) Await(a netip.Addr, d time.Duration) {
	if g == nil || g.held.Load() == 0 {
		return
	}
	var deadline time.Time
	for g.isHeld(a) {
		now := time.Now()
		if deadline.IsZero() {
			deadline = now.Add(d)
		} else if !now.Before(deadline) {
			return
		}
		time.Sleep(awaitPoll)
	}
}

// awaitPoll is how often Await looks whether the answers came.
const awaitPoll = 500 * time.Microsecond

// isHeld reports whether a holds keys whose answer has not come.
func (g *Guard) isHeld(a netip.Addr) bool {
	s := &g.shards[g.hash(a)&(nShards-1)]
	s.mu.Lock()
	w := s.m[a]
	s.mu.Unlock()
	return w.held > 0
}

// tracked runs f on a's tracked window, under its shard's lock, and
// reports whether a has one.
func (g *Guard) tracked(a netip.Addr, f func(w *win)) bool {
	s := &g.shards[g.hash(a)&(nShards-1)]
	s.mu.Lock()
	defer s.mu.Unlock()
	w, ok := s.m[a]
	if ok {
		f(&w)
		s.m[a] = w
	}
	return ok
}

// Len is the number of addresses tracked one by one.
func (g *Guard) Len() int {
	if g == nil {
		return 0
	}
	n := 0
	for i := range g.shards {
		s := &g.shards[i]
		s.mu.Lock()
		n += len(s.m)
		s.mu.Unlock()
	}
	return n
}

// hash mixes a's 16 bytes with the guard's random keys (splitmix64's
// finalizer), so that no client can choose its shard or bucket.
func (g *Guard) hash(a netip.Addr) uint64 {
	b := a.As16()
	x := binary.LittleEndian.Uint64(b[:8]) ^ g.k0
	y := binary.LittleEndian.Uint64(b[8:]) ^ g.k1
	return mix(mix(x) ^ y)
}

func mix(z uint64) uint64 {
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// Key is the address a client is counted as: an IPv4 address (an
// IPv4-mapped IPv6 one unmapped), or an IPv6 address's /64, which one
// client holds whole (so that it cannot spread its guesses over it). The
// zone is dropped.
func Key(a netip.Addr) netip.Addr {
	a = a.Unmap().WithZone("")
	if a.Is6() {
		a = netip.PrefixFrom(a, 64).Masked().Addr()
	}
	return a
}

// KeyOf is Key of a connection's remote address (a *net.TCPAddr, without
// allocating, or any address whose String is host:port). ok is false
// when it holds no IP address.
func KeyOf(addr net.Addr) (k netip.Addr, ok bool) {
	if t, is := addr.(*net.TCPAddr); is {
		a, ok := netip.AddrFromSlice(t.IP)
		return Key(a), ok
	}
	if addr == nil {
		return netip.Addr{}, false
	}
	return KeyOfString(addr.String())
}

// KeyOfString is Key of "host:port" (net/http's RemoteAddr) or a bare
// host address.
func KeyOfString(s string) (netip.Addr, bool) {
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return Key(ap.Addr()), true
	}
	if a, err := netip.ParseAddr(s); err == nil {
		return Key(a), true
	}
	return netip.Addr{}, false
}
