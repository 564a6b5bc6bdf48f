package proxy

import (
	"net"
	"net/netip"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/infera/infera/govern"
	"github.com/infera/infera/internal/logx"
	"github.com/valyala/fasthttp"
)

// Wrong keys lock a client address out (--auth-lockout-failures within
// --auth-lockout-window; internal/lockout keeps the bounded table). The
// address is the client's (clientaddr.go: the TCP peer's, or behind
// --trusted-proxies the one X-Forwarded-For names), an IPv6 client's /64.
// Forwarded (RFC 7239) is never read.
//
// With --state redis the wrong keys are counted in Redis too
// (govern.Lockouts), so that routers sharing it count one address's wrong
// keys together: a lockout any of them begins is told to all (pub/sub),
// and read again by a router that starts or reconnects. The in-memory
// table stays the first check, and the only one a request with a key
// takes unless the key is wrong: a locked address is refused without a
// round trip, and a right key costs none. Only a wrong key is sent to
// Redis (one script in the governance's pipelines, for up to 128 keys),
// and its 401 does not wait for it: the table answers, and Redis's answer
// (a lockout the routers' sum began) locks the address here when it
// comes. Until then the address's next requests here wait for it (at
// most govern.AnswerWait; lockout.Guard.Hold, Await), so that the key after the
// one that locked it is not let through meanwhile. When Redis cannot be asked the wrong key still counts in this
// router's table, which then locks by itself (per process, as without
// Redis), and the failure is counted; so is a key dropped because 4096
// wait for Redis already. A lockout such a key began here is kept and
// sent to Redis later (govern.Lockouts.Start), once it answers or the
// queue drains.

var (
	// mLockoutRefused counts requests refused because their address was
	// locked out; mLockouts the lockouts begun.
	mLockoutRefused = metrics.NewCounter(`infera_auth_lockout_rejections_total`)
	mLockouts       = metrics.NewCounter(`infera_auth_lockouts_total`)
	// mLockoutStateCountErrors counts wrong keys Redis could not count
	// (counted by this router alone); mLockoutStateSyncErrors the reads of
	// the lockouts in force that failed (at start, or on reconnecting).
	mLockoutStateCountErrors = metrics.NewCounter(`infera_auth_lockout_state_errors_total{op="count"}`)
	mLockoutStateSyncErrors  = metrics.NewCounter(`infera_auth_lockout_state_errors_total{op="sync"}`)
	// mLockoutStateDropped counts wrong keys not sent to Redis: sendQueue
	// of them waited already (counted by this router alone).
	mLockoutStateDropped = metrics.NewCounter(`infera_auth_lockout_state_dropped_total`)
	// mLockoutStateFull counts wrong keys Redis did not count: it counts
	// 262,144 new addresses in the window already.
	mLockoutStateFull = metrics.NewCounter(`infera_auth_lockout_state_full_total`)
	lockoutLog        = &logx.Throttle{Every: time.Second}
	// lockoutStateLog says Redis failed (apart: an outage's lines must not
	// hide the lockouts' own).
	lockoutStateLog = &logx.Throttle{Every: 10 * time.Second}
)

// wrongKey counts the key k, which was wrong, against the client address
// ip. A request without a key (a CORS preflight, a probe) is no guess.
// With the lockout shared, the key is also sent to Redis without waiting
// (counted): the client's 401 is decided by this router's table.
func (s *Server) wrongKey(ctx *fasthttp.RequestCtx, ip netip.Addr, k []byte) {
	if len(k) == 0 {
		return
	}
	began := s.fails.Failed(ip)
	var peer netip.AddrPort
	if t, ok := ctx.RemoteAddr().(*net.TCPAddr); ok {
		peer = t.AddrPort()
	}
	if s.shared != nil {
		if s.shared.Report(s.fails, govern.Guess{Addr: ip, Peer: peer}, began) {
			return // counted tells the rest
		}
		mLockoutStateDropped.Inc()
		lockoutStateLog.Warn("too many wrong API keys wait for the state store: one counted by this router alone")
	}
	if began {
		s.lockoutBegan(ip, peer)
	}
}

// lockoutBegan counts and logs a lockout of ip begun here (peer: the TCP
// peer of the key that began it).
func (s *Server) lockoutBegan(ip netip.Addr, peer netip.AddrPort) {
	mLockouts.Inc()
	// The address and the count, never the key; behind a trusted proxy,
	// the proxy's address too.
	if s.trusted == nil {
		remote := ip.String() // a listener whose peers are not TCP
		if peer.IsValid() {
			remote = peer.String()
		}
		lockoutLog.Warn("client address locked out: too many wrong API keys", "remote", remote,
			"failures", s.flags.AuthLockoutFailures, "for", s.fails.Window().String())
		return
	}
	lockoutLog.Warn("client address locked out: too many wrong API keys", "remote", ip.String(), "peer", peer.String(),
		"failures", s.flags.AuthLockoutFailures, "for", s.fails.Window().String())
}

// counted is Redis's answer about a wrong key this router counted: ip is
// locked here for what Redis says is left of its lockout. A lockout began
// with the key by Redis's word (once across routers), or, when Redis has
// the address unlocked (its window began earlier, elsewhere, and ended) or
// could not count it, by this router's table.
func (s *Server) counted(c govern.Counted) {
	began := c.Until != 0
	switch {
	case c.Err != nil:
		mLockoutStateCountErrors.Inc()
		lockoutStateLog.Warn("cannot count a wrong API key in the state store: counted by this router alone", "err", c.Err)
	case c.Full:
		mLockoutStateFull.Inc()
		lockoutStateLog.Warn("the state store counts wrong API keys of as many addresses as it may in this window: a new one counted by this router alone")
	case c.Left > 0:
		s.fails.Lock(c.Addr, c.Left)
		began = c.Began
	}
	if c.Held {
		s.fails.Release(c.Addr) // after Lock: the request waiting sees it
	}
	if began {
		s.lockoutBegan(c.Addr, c.Peer)
	}
}

// watchLockouts locks here every address the routers sharing Redis lock
// out, those locked now and those locked from now on, and starts sending
// this router's wrong keys to Redis.
func (s *Server) watchLockouts() {
	s.shared.Start(s.flags.AuthLockoutFailures, s.fails.Window(), s.counted)
	s.shared.Watch(func(a netip.Addr, left time.Duration) { s.fails.Lock(a, left) }, func(err error) {
		mLockoutStateSyncErrors.Inc()
		lockoutStateLog.Warn("cannot read the lockouts in force from the state store: until it answers, this router knows only its own", "err", err)
	})
}

// writeLockedOut refuses a request from a locked-out address: 429 in the
// client's error shape, with Retry-After (and Retry-After-Ms, as the
// governance's 429s say it) until the lockout ends. Its key is not looked
// at, and its body not read: the connection closes after the answer.
func writeLockedOut(ctx *fasthttp.RequestCtx, wait time.Duration) {
	mLockoutRefused.Inc()
	writeError(ctx, fasthttp.StatusTooManyRequests, typeRateLimit,
		"too many wrong API keys from this address: every request from it is refused until the lockout ends (Retry-After)", "", "auth_lockout")
	setRetryHeaders(ctx, &govern.Rejection{RetryAfter: int((wait + time.Second - 1) / time.Second),
		RetryAfterMS: int64((wait + time.Millisecond - 1) / time.Millisecond)})
	closeUnread(ctx)
}
