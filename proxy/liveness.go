package proxy

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/infera/infera/internal/netpeek"
	"github.com/valyala/fasthttp"
)

// liveness notices clients that leave while their request waits for the
// worker's first byte (a long prefill, a queue, a slow non-streaming
// answer) or for its turn in a governance queue (a user's concurrency slot,
// an engine's concurrency seat): fasthttp only learns about a closed
// client connection when it writes to it. A watchdog peeks (non-blocking,
// without consuming) at each waiting request's client socket a few times a
// second; when the peer has closed it, the attempt is aborted, which
// closes the upstream connection (HTTP) or publishes the cancel (NATS), so
// the engine stops generating, and the request's context is cancelled,
// which takes it out of a governance queue at once.
type liveness struct {
	mu    sync.Mutex
	items []*reqState
	since []int64
	stop  chan struct{}
	once  sync.Once
}

const (
	livenessTick = 200 * time.Millisecond
	// livenessAfter: requests answered faster than this are never checked.
	livenessAfter = int64(100 * time.Millisecond)
)

func newLiveness() *liveness { return &liveness{stop: make(chan struct{})} }

// watch puts rs under the watchdog (once per request): from admission on,
// while it waits in a governance queue, then for its worker's first byte.
func (s *Server) watch(ctx *fasthttp.RequestCtx, rs *reqState) {
	if rs.watched {
		return
	}
	if rs.clientFD = clientFD(ctx); rs.clientFD >= 0 {
		s.live.add(rs)
	}
}

func (l *liveness) add(rs *reqState) {
	rs.watched = true
	l.mu.Lock()
	rs.liveIdx = len(l.items)
	l.items = append(l.items, rs)
	l.since = append(l.since, time.Now().UnixNano())
	l.mu.Unlock()
}

// remove stops watching rs. After it returns the watchdog no longer touches
// rs (aborts happen under the same lock).
func (l *liveness) remove(rs *reqState) {
	if !rs.watched {
		return
	}
	rs.watched = false
	l.mu.Lock()
	i, last := rs.liveIdx, len(l.items)-1
	if i <= last && l.items[i] == rs {
		l.items[i], l.since[i] = l.items[last], l.since[last]
		l.items[i].liveIdx = i
		l.items[last] = nil
		l.items, l.since = l.items[:last], l.since[:last]
	}
	rs.liveIdx = -1
	l.mu.Unlock()
}

func (l *liveness) run() {
	t := time.NewTicker(livenessTick)
	defer t.Stop()
	for {
		select {
		case <-l.stop:
			return
		case <-t.C:
		}
		now := time.Now().UnixNano()
		coarseNow.Store(now)
		l.check(now)
	}
}

// coarseNow is the time in unix nanoseconds, refreshed every livenessTick:
// for bookkeeping that needs no precision (idle connection ages), so the
// request path does not read the clock for it.
var coarseNow atomic.Int64

func init() { coarseNow.Store(time.Now().UnixNano()) }

func (l *liveness) check(now int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i, rs := range l.items {
		if now-l.since[i] < livenessAfter || rs.call.cancel.wasAborted() {
			continue
		}
		if netpeek.Peek(rs.clientFD) == netpeek.Closed {
			mClientGoneWaiting.Inc()
			rs.call.cancel.abort()
			rs.gov.ctx.cancel() // a wait in a governance queue ends at once
		}
	}
}

func (l *liveness) close() { l.once.Do(func() { close(l.stop) }) }

// clientFD returns the client socket of ctx, or -1.
func clientFD(ctx *fasthttp.RequestCtx) int {
	if c, ok := ctx.Conn().(*clientConn); ok {
		return c.fd
	}
	return -1
}
