package proxy

import (
	"sync"
	"sync/atomic"
	"time"
	"weak"

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
	// reg holds every request state the server's pool ever made, weakly:
	// a state the pool drops is collected and leaves the registry at the
	// next check. Watching a request then touches only the request's own
	// state, no line shared with other requests; registering happens only
	// when the pool grows.
	mu   sync.Mutex
	reg  []weak.Pointer[reqState]
	stop chan struct{}
	once sync.Once
}

// liveSlot is a request's entry with the watchdog. since is 0 while the
// request is not watched; the watchdog reads and aborts under mu, so once
// remove returns it no longer touches the request.
type liveSlot struct {
	mu    sync.Mutex
	since int64 // unix ns the request started; 0: not watched
	fd    int
	// tls: the client speaks TLS, whose close_notify comes as data before
	// the FIN, so the socket's TCP state tells a client that left.
	tls bool
}

const (
	livenessTick = 200 * time.Millisecond
	// livenessAfter: requests answered faster than this are never checked.
	livenessAfter = int64(100 * time.Millisecond)
)

func newLiveness() *liveness { return &liveness{stop: make(chan struct{})} }

// register adds a new request state to the registry (the pool's New).
func (l *liveness) register(rs *reqState) {
	w := weak.Make(rs)
	l.mu.Lock()
	l.reg = append(l.reg, w)
	l.mu.Unlock()
}

// watch puts rs under the watchdog (once per request): from admission on,
// while it waits in a governance queue, then for its worker's first byte.
func (s *Server) watch(ctx *fasthttp.RequestCtx, rs *reqState) {
	if rs.watched {
		return
	}
	fd, tls := clientFD(ctx)
	if fd < 0 {
		return
	}
	since := rs.start.UnixNano()
	if rs.start.IsZero() {
		since = time.Now().UnixNano()
	}
	rs.watched = true
	rs.live.mu.Lock()
	rs.live.since, rs.live.fd, rs.live.tls = since, fd, tls
	rs.live.mu.Unlock()
}

// remove stops watching rs. After it returns the watchdog no longer touches
// rs (aborts happen under the same lock).
func (l *liveness) remove(rs *reqState) {
	if !rs.watched {
		return
	}
	rs.watched = false
	rs.live.mu.Lock()
	rs.live.since, rs.live.fd = 0, -1
	rs.live.mu.Unlock()
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
	kept := l.reg[:0]
	for _, w := range l.reg {
		rs := w.Value()
		if rs == nil {
			continue // the pool dropped it
		}
		kept = append(kept, w)
		rs.live.mu.Lock()
		if since := rs.live.since; since != 0 && now-since >= livenessAfter && !rs.call.cancel.wasAborted() &&
			clientLeft(rs.live.fd, rs.live.tls) {
			mClientGoneWaiting.Inc()
			rs.call.cancel.abort()
			rs.gov.ctx.cancel() // a wait in a governance queue ends at once
		}
		rs.live.mu.Unlock()
	}
	clear(l.reg[len(kept):])
	l.reg = kept
}

func (l *liveness) close() { l.once.Do(func() { close(l.stop) }) }

// clientFD returns the client socket of ctx, or -1, and whether the client
// speaks TLS.
func clientFD(ctx *fasthttp.RequestCtx) (fd int, tls bool) {
	if c, ok := ctx.Conn().(*clientConn); ok {
		return c.fd, c.tls
	}
	return -1, false
}

// clientLeft reports whether the client of socket fd closed or reset it.
// Bytes waiting ahead of its FIN (a TLS record, a pipelined request that
// the server's read buffer did not take) hide the close from a peek: then
// the socket's state tells.
func clientLeft(fd int, tls bool) bool {
	if tls {
		return netpeek.PeerClosed(fd)
	}
	switch netpeek.Peek(fd) {
	case netpeek.Closed:
		return true
	case netpeek.Data:
		return netpeek.PeerClosed(fd)
	}
	return false
}
