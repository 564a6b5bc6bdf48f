// Package logx holds the throttled logger used on hot and noisy paths:
// bad input from the network must not turn into a log flood.
package logx

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"time"
)

// Throttle logs at most once per Every, counting what it suppressed; the
// next line it lets through carries "suppressed", N. The zero value logs
// every line. Safe for concurrent use; it never blocks.
type Throttle struct {
	Every      time.Duration
	last       atomic.Int64
	suppressed atomic.Int64
}

// Allow reports whether a line may be logged now, and how many were
// suppressed since the last one.
func (t *Throttle) Allow() (ok bool, suppressed int64) {
	now := time.Now().UnixNano()
	last := t.last.Load()
	if now-last < int64(t.Every) || !t.last.CompareAndSwap(last, now) {
		t.suppressed.Add(1)
		return false, 0
	}
	return true, t.suppressed.Swap(0)
}

// Warn logs msg at warning level if allowed.
func (t *Throttle) Warn(msg string, args ...any) { t.log(slog.LevelWarn, msg, args) }

// Error logs msg at error level if allowed.
func (t *Throttle) Error(msg string, args ...any) { t.log(slog.LevelError, msg, args) }

func (t *Throttle) log(level slog.Level, msg string, args []any) {
	ok, n := t.Allow()
	if !ok {
		return
	}
	if n > 0 {
		args = append(args, "suppressed", n)
	}
	slog.Log(context.Background(), level, msg, args...)
}

// Redis passes the Redis client library's own lines (a pool that cannot
// dial, a pub/sub that reconnects) to slog at warning level, throttled to
// one a second: the library printed them unstructured on standard error,
// whatever --log-level said. Install it with redis.SetLogger(logx.NewRedis()).
type Redis struct{ t Throttle }

// NewRedis returns the Redis client's logger.
func NewRedis() *Redis { return &Redis{t: Throttle{Every: time.Second}} }

// Printf implements the Redis client's logging interface.
func (r *Redis) Printf(_ context.Context, format string, v ...any) {
	r.t.Warn("redis client: " + strings.TrimSpace(fmt.Sprintf(format, v...)))
}
