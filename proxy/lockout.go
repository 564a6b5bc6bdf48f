package proxy

import (
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
// round trip, and a right key costs none. Only a wrong key asks Redis
// (one script in the governance's pipelines). When Redis cannot be asked
// the wrong key still counts in this router's table, which then locks by
// itself (per process, as without Redis), and the failure is counted.

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
	lockoutLog               = &logx.Throttle{Every: time.Second}
	// lockoutStateLog says Redis failed (apart: an outage's lines must not
	// hide the lockouts' own).
	lockoutStateLog = &logx.Throttle{Every: 10 * time.Second}
)

// wrongKey counts the key k, which was wrong, against the client address
// ip. A request without a key (a CORS preflight, a probe) is no guess.
func (s *Server) wrongKey(ctx *fasthttp.RequestCtx, ip netip.Addr, k []byte) {
	if len(k) == 0 {
		return
	}
	began := s.fails.Failed(ip)
	if s.shared != nil {
		began = s.sharedWrongKey(ip, began)
	}
	if !began {
		return
	}
	mLockouts.Inc()
	// The address and the count, never the key; behind a trusted proxy,
	// the proxy's address too.
	if s.trusted == nil {
		lockoutLog.Warn("client address locked out: too many wrong API keys", "remote", ctx.RemoteAddr().String(),
			"failures", s.flags.AuthLockoutFailures, "for", s.fails.Window().String())
		return
	}
	lockoutLog.Warn("client address locked out: too many wrong API keys", "remote", s.clientIP(ctx).String(), "peer", ctx.RemoteAddr().String(),
		"failures", s.flags.AuthLockoutFailures, "for", s.fails.Window().String())
}

// sharedWrongKey counts a wrong key from ip in Redis, after this router's
// table counted it (local: that count began a lockout here), and locks ip
// here for what Redis says is left of its lockout. It reports whether a
// lockout began with this key: Redis's word (once across routers), or,
// when Redis has ip unlocked (its window began earlier, elsewhere, and
// ended) or cannot be asked, this router's.
func (s *Server) sharedWrongKey(ip netip.Addr, local bool) bool {
	left, began, err := s.shared.Failed(ip, s.flags.AuthLockoutFailures, s.fails.Window())
	if err != nil {
		mLockoutStateCountErrors.Inc()
		lockoutStateLog.Warn("cannot count a wrong API key in the state store: counted by this router alone", "err", err)
		return local
	}
	if left <= 0 {
		return local
	}
	s.fails.Lock(ip, left)
	return began
}

// watchLockouts locks here every address the routers sharing Redis lock
// out, those locked now and those locked from now on.
func (s *Server) watchLockouts() {
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
