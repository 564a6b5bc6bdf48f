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

var (
	// mLockoutRefused counts requests refused because their address was
	// locked out; mLockouts the lockouts begun.
	mLockoutRefused = metrics.NewCounter(`infera_auth_lockout_rejections_total`)
	mLockouts       = metrics.NewCounter(`infera_auth_lockouts_total`)
	lockoutLog      = &logx.Throttle{Every: time.Second}
)

// wrongKey counts the key k, which was wrong, against the client address
// ip. A request without a key (a CORS preflight, a probe) is no guess.
func (s *Server) wrongKey(ctx *fasthttp.RequestCtx, ip netip.Addr, k []byte) {
	if len(k) == 0 || !s.fails.Failed(ip) {
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
