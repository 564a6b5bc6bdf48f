package mirror

import (
	"context"
	"crypto/tls"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/infera/infera/config"
	"github.com/infera/infera/internal/logx"
)

// Options are the process-level settings of a Mirror; everything else comes
// from the config snapshot given to each Offer.
type Options struct {
	// Logger receives the log_recording lines and warnings. Default
	// slog.Default().
	Logger *slog.Logger
	// ConnectTimeout bounds dialing the target. Default 3 s.
	ConnectTimeout time.Duration
	// MaxResponseBytes bounds how much of a non-streamed answer (or of one
	// stream line) is kept to find its usage; the rest is still read and
	// discarded. What is kept counts in mirror.max_buffer_bytes too.
	// Default 16 MiB.
	MaxResponseBytes int
}

// Mirror copies sampled requests to the mirror target. Create it with New,
// call Offer from the request path, Close on shutdown.
type Mirror struct {
	opts Options
	log  *slog.Logger
	warn logx.Throttle

	q      chan *job     // capacity config.MaxMirrorQueue; admission by the snapshot's queue_size
	freed  chan struct{} // capacity 1: a sender slot was given back
	active atomic.Int64  // jobs being sent (bounded by mirror.concurrency: limit's, else each job's)
	// limit is mirror.concurrency of the config in force (Update), 0 until
	// the first Update: each job then goes by its own snapshot's.
	limit atomic.Int64
	// waiting counts jobs a sender took from q that wait for a slot (the
	// senders outnumber a lowered mirror.concurrency): still queued for
	// queue_size.
	waiting atomic.Int64
	// off: the config in force (Update) has mirroring disabled (or a
	// sampling ratio of 0): jobs sampled before are dropped, not sent.
	off     atomic.Bool
	workers atomic.Int64 // sender goroutines alive (at least one until Close)
	spawnMu sync.Mutex   // starting a sender, against Close's wg.Wait
	started bool         // New started the senders (newMirror alone does not)
	held    atomic.Int64 // bytes of path and body copies held by jobs, and of answers being read (mirror.max_buffer_bytes)
	closed  atomic.Bool
	stop    chan struct{}
	ctx     context.Context // cancelled by Close: aborts dials in flight
	cancel  context.CancelFunc
	wg      sync.WaitGroup // the senders
	seq     atomic.Uint64

	tgt   atomic.Pointer[targetPools] // the pools of the last two target addresses used
	tgtMu sync.Mutex                  // building a target
	conns connSet                     // open connections, closed by Close
	// tlsConfig is the TLS configuration of https targets; nil: Go's
	// defaults (the system's roots, the server name from the address).
	// Set by tests before the first request.
	tlsConfig *tls.Config

	// send runs a job; the job is released after it returns (replaced by
	// tests and benchmarks that measure Offer alone).
	send func(*job)

	m mirrorMetrics
}

// job is one sampled request: pooled, with its buffers.
type job struct {
	cfg     *config.Mirror
	path    []byte
	body    []byte
	reqID   []byte // the request's id: sent as X-Request-Id, logged as request_id
	scratch []byte // the body with the model replaced
	stream  bool
	at      time.Time
	held    int64 // counted in Mirror.held until released
}

var jobPool = sync.Pool{New: func() any { return new(job) }}

// maxPooledBody: jobs holding larger buffers are not pooled.
const maxPooledBody = 1 << 20

// release gives a job's bytes back to the budget and the job to the pool.
func (m *Mirror) release(j *job) {
	m.held.Add(-j.held)
	j.held = 0
	releaseJob(j)
}

func releaseJob(j *job) {
	j.cfg = nil
	if cap(j.body) > maxPooledBody || cap(j.scratch) > maxPooledBody {
		return
	}
	j.path, j.body, j.scratch, j.reqID = j.path[:0], j.body[:0], j.scratch[:0], j.reqID[:0]
	jobPool.Put(j)
}

type mirrorMetrics struct {
	set                                       *metrics.Set
	sampled                                   *metrics.Counter
	droppedFull, droppedExpired, droppedClose *metrics.Counter
	droppedOff                                *metrics.Counter
	ok, httpError, failed, timeout            *metrics.Counter
	duration                                  *metrics.Histogram
	promptTokens, completionTokens            *metrics.Counter
}

// New starts a Mirror (its first sender goroutine). Its metrics are
// registered until Close:
//
//	infera_mirror_sampled_total                      requests sampled
//	infera_mirror_dropped_total{reason="queue_full"} sampled but the queue or the byte budget was full
//	infera_mirror_dropped_total{reason="expired"}    timed out before being sent (queued, or taken but not yet handed to the connection)
//	infera_mirror_dropped_total{reason="shutdown"}   still queued at Close
//	infera_mirror_dropped_total{reason="disabled"}   still queued when a reload disabled mirroring
//	infera_mirror_requests_total{result="ok"|"http_error"|"error"|"timeout"}
//	infera_mirror_request_duration_seconds           sampling to the answer's end
//	infera_mirror_prompt_tokens_total, infera_mirror_completion_tokens_total (from the target's usage)
//	infera_mirror_queue_length, infera_mirror_inflight, infera_mirror_buffered_bytes
func New(o Options) *Mirror {
	m := newMirror(o)
	metrics.RegisterSet(m.m.set)
	m.started = true
	m.workers.Add(1)
	m.wg.Add(1)
	go m.worker()
	return m
}

// newMirror builds a Mirror without starting its senders or registering
// its metrics.
func newMirror(o Options) *Mirror {
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.ConnectTimeout <= 0 {
		o.ConnectTimeout = 3 * time.Second
	}
	if o.MaxResponseBytes <= 0 {
		o.MaxResponseBytes = 16 << 20
	}
	m := &Mirror{
		opts:  o,
		log:   o.Logger,
		warn:  logx.Throttle{Every: 10 * time.Second},
		q:     make(chan *job, config.MaxMirrorQueue),
		freed: make(chan struct{}, 1),
		stop:  make(chan struct{}),
	}
	m.ctx, m.cancel = context.WithCancel(context.Background())
	m.send = m.sendJob
	s := metrics.NewSet()
	m.m = mirrorMetrics{
		set:              s,
		sampled:          s.NewCounter(`infera_mirror_sampled_total`),
		droppedFull:      s.NewCounter(`infera_mirror_dropped_total{reason="queue_full"}`),
		droppedExpired:   s.NewCounter(`infera_mirror_dropped_total{reason="expired"}`),
		droppedClose:     s.NewCounter(`infera_mirror_dropped_total{reason="shutdown"}`),
		droppedOff:       s.NewCounter(`infera_mirror_dropped_total{reason="disabled"}`),
		ok:               s.NewCounter(`infera_mirror_requests_total{result="ok"}`),
		httpError:        s.NewCounter(`infera_mirror_requests_total{result="http_error"}`),
		failed:           s.NewCounter(`infera_mirror_requests_total{result="error"}`),
		timeout:          s.NewCounter(`infera_mirror_requests_total{result="timeout"}`),
		duration:         s.NewHistogram(`infera_mirror_request_duration_seconds`),
		promptTokens:     s.NewCounter(`infera_mirror_prompt_tokens_total`),
		completionTokens: s.NewCounter(`infera_mirror_completion_tokens_total`),
	}
	s.NewGauge(`infera_mirror_queue_length`, func() float64 { return float64(m.queued()) })
	s.NewGauge(`infera_mirror_inflight`, func() float64 { return float64(m.active.Load()) })
	s.NewGauge(`infera_mirror_buffered_bytes`, func() float64 { return float64(m.held.Load()) })
	return m
}

// Offer mirrors a request with probability cfg.SamplingRatio percent: it
// copies path, body and reqID (the request's id, sent to the target as
// X-Request-Id and logged as request_id; nil for none: the caller may
// reuse them as soon as Offer returns) into a queued job and reports true, or reports false when the
// request is not sampled, the queue is full (counted), mirroring is
// disabled or the Mirror is closed. It never blocks, and allocates
// nothing when the request is not sampled. cfg is the request's config
// snapshot; it must stay unchanged (config snapshots are immutable).
func (m *Mirror) Offer(cfg *config.Mirror, path, body, reqID []byte, stream bool) bool {
	if !cfg.Enabled || cfg.SamplingRatio <= 0 {
		return false
	}
	if cfg.SamplingRatio < 100 && rand.Float64()*100 >= cfg.SamplingRatio {
		return false
	}
	if m.closed.Load() {
		return false
	}
	m.m.sampled.Inc()
	if m.queued() >= cfg.QueueSize {
		m.m.droppedFull.Inc()
		return false
	}
	need := int64(len(path) + len(body) + len(reqID))
	if m.held.Add(need) > cfg.BufferBytes() {
		m.held.Add(-need)
		m.m.droppedFull.Inc()
		return false
	}
	j := jobPool.Get().(*job)
	j.held = need
	j.cfg = cfg
	j.path = append(j.path[:0], path...)
	j.body = append(j.body[:0], body...)
	j.reqID = append(j.reqID[:0], reqID...)
	j.stream = stream
	j.at = time.Now()
	select {
	case m.q <- j:
		// A job left in the buffer found no sender waiting: add one, up
		// to mirror.concurrency (a sender taking it at once leaves the
		// buffer as it was).
		if len(m.q) > 0 && m.workers.Load() < int64(max(1, cfg.Concurrency)) {
			m.spawn(int64(max(1, cfg.Concurrency)))
		}
		return true
	default:
		m.release(j)
		m.m.droppedFull.Inc()
		return false
	}
}

// Update tells the Mirror the config in force (call it at start and on
// every reload): its mirror.concurrency bounds the senders at once, the
// jobs sampled before the reload included. A raised limit wakes the jobs
// waiting for a slot; without it they kept the limit of the snapshot they
// were sampled under, so after mirror.concurrency went from 1 to 8 the
// queue (the requests sampled after the reload too) still drained one at
// a time behind a slow target until the old jobs expired.
//
// A config that disables mirroring (enabled false, or sampling_ratio 0)
// drops the jobs sampled before it that are still queued or waiting for a
// slot (counted as reason "disabled"): an operator who switches mirroring
// off, a misbehaving target say, sees no more copies sent. Copies already
// in flight finish (within their timeout_ms).
func (m *Mirror) Update(cfg *config.Mirror) {
	n := int64(max(1, cfg.Concurrency))
	off := !cfg.Enabled || cfg.SamplingRatio <= 0
	m.off.Store(off)
	if off {
		for len(m.q) > 0 {
			select {
			case j := <-m.q:
				m.m.droppedOff.Inc()
				m.release(j)
			default:
			}
		}
	}
	if old := m.limit.Swap(n); n <= old && !off {
		return
	}
	select {
	case m.freed <- struct{}{}: // a woken sender passes it on while slots are left (or drops its job, off)
	default:
	}
	// Senders for the jobs already queued, up to the new limit (Offer
	// starts them only as new jobs come).
	for i := len(m.q); i > 0 && m.workers.Load() < n; i-- {
		m.spawn(n)
	}
}

// limitFor is the number of jobs that may be sent at once while j is
// taken: mirror.concurrency of the config in force, or of j's snapshot
// before the first Update.
func (m *Mirror) limitFor(j *job) int64 {
	if n := m.limit.Load(); n > 0 {
		return n
	}
	return int64(max(1, j.cfg.Concurrency))
}

// Close stops mirroring: queued jobs are dropped (counted), requests in
// flight are cancelled, and Close returns when every goroutine has ended.
// Offer returns false afterwards. Idempotent.
func (m *Mirror) Close() {
	m.spawnMu.Lock() // no sender starts after this (spawn checks closed under the lock)
	was := m.closed.Swap(true)
	m.spawnMu.Unlock()
	if was {
		return
	}
	close(m.stop)
	m.cancel()
	m.conns.closeAll()
	m.wg.Wait()
	m.drain()
	metrics.UnregisterSet(m.m.set, true)
	m.closeIdle()
}

// workerIdle: a sender beyond the first ends after one to two workerIdle
// without a job.
const workerIdle = 5 * time.Second

// spawn starts a sender if fewer than limit are alive.
func (m *Mirror) spawn(limit int64) {
	m.spawnMu.Lock()
	defer m.spawnMu.Unlock()
	if !m.started || m.closed.Load() || m.workers.Load() >= limit {
		return
	}
	m.workers.Add(1)
	m.wg.Add(1)
	go m.worker()
}

// worker is a sender: it takes jobs from the queue and sends them, one at
// a time, within each job's mirror.concurrency. Senders are started by
// Offer when jobs wait (up to mirror.concurrency); one stays until Close,
// the others end when idle (workerIdle) or when they outnumber the
// concurrency of the job they just sent.
func (m *Mirror) worker() {
	defer m.wg.Done()
	idle := time.NewTicker(workerIdle)
	defer idle.Stop()
	busy := false        // a job was taken since the last tick
	var wait *time.Timer // waiting for a slot (only when the senders outnumber the concurrency)
	for {
		if m.closed.Load() {
			m.workers.Add(-1)
			return
		}
		var j *job
		select {
		case j = <-m.q:
		case <-m.stop:
			m.workers.Add(-1)
			return
		case <-idle.C:
			if !busy && m.retire(1) {
				return
			}
			busy = false
			continue
		}
		busy = true
		if m.closed.Load() {
			m.m.droppedClose.Inc()
			m.release(j)
			m.workers.Add(-1)
			return
		}
		if m.off.Load() {
			m.m.droppedOff.Inc()
			m.release(j)
			continue
		}
		if wait == nil {
			wait = time.NewTimer(time.Hour)
			wait.Stop()
		}
		if !m.admit(j, wait) {
			continue
		}
		m.send(j)
		limit := m.limitFor(j)
		m.release(j)
		m.active.Add(-1)
		select {
		case m.freed <- struct{}{}:
		default:
		}
		if m.retire(limit) {
			return
		}
	}
}

// retire ends this sender if more than keep are alive.
func (m *Mirror) retire(keep int64) bool {
	for {
		n := m.workers.Load()
		if n <= keep {
			return false
		}
		if m.workers.CompareAndSwap(n, n-1) {
			return true
		}
	}
}

// admit takes a sender slot for j, at most limitFor(j) at once (looked up
// again at each wake-up, so a reload applies to a waiting job), waiting
// while they are all taken. It reports false when j expired (its timeout_ms
// counts from sampling), mirroring was disabled by a reload, or the Mirror
// closed: j is then dropped, counted and released.
func (m *Mirror) admit(j *job, wait *time.Timer) bool {
	expires := j.at.Add(millis(j.cfg.TimeoutMS))
	waited := false
	defer func() {
		if waited {
			m.waiting.Add(-1)
		}
	}()
	for {
		if m.off.Load() {
			if waited {
				// Pass the wake-up on: the other waiting jobs go too.
				select {
				case m.freed <- struct{}{}:
				default:
				}
			}
			m.m.droppedOff.Inc()
			m.release(j)
			return false
		}
		left := time.Until(expires)
		if left <= 0 {
			m.m.droppedExpired.Inc()
			m.release(j)
			return false
		}
		n, limit := m.active.Load(), m.limitFor(j)
		if n < limit {
			if !m.active.CompareAndSwap(n, n+1) {
				continue
			}
			if waited && n+1 < limit {
				// Pass on a wake-up this sender may have taken from
				// another waiting one.
				select {
				case m.freed <- struct{}{}:
				default:
				}
			}
			return true
		}
		if !waited {
			waited = true
			m.waiting.Add(1)
		}
		wait.Reset(left)
		select {
		case <-m.freed:
		case <-wait.C:
		case <-m.stop:
			wait.Stop()
			m.m.droppedClose.Inc()
			m.release(j)
			return false
		}
		wait.Stop()
	}
}

// queued is how many sampled jobs wait for a sender: in the queue, or
// taken by a sender that waits for a slot.
func (m *Mirror) queued() int { return len(m.q) + int(m.waiting.Load()) }

// drain drops the queued jobs at shutdown.
func (m *Mirror) drain() {
	for {
		select {
		case j := <-m.q:
			m.m.droppedClose.Inc()
			m.release(j)
		default:
			return
		}
	}
}

func millis(v float64) time.Duration {
	d := time.Duration(v * float64(time.Millisecond))
	if d <= 0 {
		return 60 * time.Second
	}
	return d
}
