package mirror

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/infera/infera/config"
	"github.com/infera/infera/internal/logx"
	"github.com/infera/infera/upstream"
)

// Options are the process-level settings of a Mirror; everything else comes
// from the config snapshot given to each Offer.
type Options struct {
	// Logger receives the log_recording lines and warnings. Default
	// slog.Default().
	Logger *slog.Logger
	// ConnectTimeout bounds dialing the target. Default 3 s.
	ConnectTimeout time.Duration
	// MaxResponseBytes bounds how much of a non-streamed answer is kept to
	// find its usage; the rest is still read and discarded. Default 16 MiB.
	MaxResponseBytes int
}

// Mirror copies sampled requests to the mirror target. Create it with New,
// call Offer from the request path, Close on shutdown.
type Mirror struct {
	opts   Options
	client *http.Client
	log    *slog.Logger
	warn   logx.Throttle

	q      chan *job     // capacity config.MaxMirrorQueue; admission by the snapshot's queue_size
	freed  chan struct{} // capacity 1: a sender finished
	active atomic.Int64  // senders running
	held   atomic.Int64  // bytes of path and body copies held by jobs (mirror.max_buffer_bytes)
	closed atomic.Bool
	stop   chan struct{}
	ctx    context.Context // cancelled by Close: aborts requests in flight
	cancel context.CancelFunc
	wg     sync.WaitGroup // the dispatcher and the senders
	seq    atomic.Uint64

	ep atomic.Pointer[endpointCache]

	// send runs a job; the job is released after it returns (replaced by
	// tests and benchmarks that measure Offer alone).
	send func(*job)

	m mirrorMetrics
}

type endpointCache struct {
	raw string
	ep  upstream.Endpoint
	err error
}

// job is one sampled request: pooled, with its buffers.
type job struct {
	cfg     *config.Mirror
	path    []byte
	body    []byte
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
	j.path, j.body, j.scratch = j.path[:0], j.body[:0], j.scratch[:0]
	jobPool.Put(j)
}

type mirrorMetrics struct {
	set                                       *metrics.Set
	sampled                                   *metrics.Counter
	droppedFull, droppedExpired, droppedClose *metrics.Counter
	ok, httpError, failed, timeout            *metrics.Counter
	duration                                  *metrics.Histogram
	promptTokens, completionTokens            *metrics.Counter
}

// New starts a Mirror (its dispatcher goroutine). Its metrics are
// registered until Close:
//
//	infera_mirror_sampled_total                      requests sampled
//	infera_mirror_dropped_total{reason="queue_full"} sampled but the queue or the byte budget was full
//	infera_mirror_dropped_total{reason="expired"}    timed out before being sent
//	infera_mirror_dropped_total{reason="shutdown"}   still queued at Close
//	infera_mirror_requests_total{result="ok"|"http_error"|"error"|"timeout"}
//	infera_mirror_request_duration_seconds           sampling to the answer's end
//	infera_mirror_prompt_tokens_total, infera_mirror_completion_tokens_total (from the target's usage)
//	infera_mirror_queue_length, infera_mirror_inflight, infera_mirror_buffered_bytes
func New(o Options) *Mirror {
	m := newMirror(o)
	metrics.RegisterSet(m.m.set)
	m.wg.Add(1)
	go m.dispatch()
	return m
}

// newMirror builds a Mirror without starting its dispatcher or
// registering its metrics.
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
		client: &http.Client{
			Transport: &http.Transport{
				Proxy:                 nil, // the target is addressed directly, never through HTTP_PROXY
				DialContext:           (&net.Dialer{Timeout: o.ConnectTimeout, KeepAlive: 30 * time.Second}).DialContext,
				MaxIdleConns:          1024,
				MaxIdleConnsPerHost:   256,
				IdleConnTimeout:       90 * time.Second,
				DisableCompression:    true, // the request carries only the listed headers
				ForceAttemptHTTP2:     true,
				ExpectContinueTimeout: 0,
			},
			// Never follow a redirect: it could take the token elsewhere.
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		},
	}
	m.ctx, m.cancel = context.WithCancel(context.Background())
	m.send = m.sendHTTP
	s := metrics.NewSet()
	m.m = mirrorMetrics{
		set:              s,
		sampled:          s.NewCounter(`infera_mirror_sampled_total`),
		droppedFull:      s.NewCounter(`infera_mirror_dropped_total{reason="queue_full"}`),
		droppedExpired:   s.NewCounter(`infera_mirror_dropped_total{reason="expired"}`),
		droppedClose:     s.NewCounter(`infera_mirror_dropped_total{reason="shutdown"}`),
		ok:               s.NewCounter(`infera_mirror_requests_total{result="ok"}`),
		httpError:        s.NewCounter(`infera_mirror_requests_total{result="http_error"}`),
		failed:           s.NewCounter(`infera_mirror_requests_total{result="error"}`),
		timeout:          s.NewCounter(`infera_mirror_requests_total{result="timeout"}`),
		duration:         s.NewHistogram(`infera_mirror_request_duration_seconds`),
		promptTokens:     s.NewCounter(`infera_mirror_prompt_tokens_total`),
		completionTokens: s.NewCounter(`infera_mirror_completion_tokens_total`),
	}
	s.NewGauge(`infera_mirror_queue_length`, func() float64 { return float64(len(m.q)) })
	s.NewGauge(`infera_mirror_inflight`, func() float64 { return float64(m.active.Load()) })
	s.NewGauge(`infera_mirror_buffered_bytes`, func() float64 { return float64(m.held.Load()) })
	return m
}

// Offer mirrors a request with probability cfg.SamplingRatio percent: it
// copies path and body (the caller may reuse them as soon as Offer
// returns) into a queued job and reports true, or reports false when the
// request is not sampled, the queue is full (counted), mirroring is
// disabled or the Mirror is closed. It never blocks, and allocates
// nothing when the request is not sampled. cfg is the request's config
// snapshot; it must stay unchanged (config snapshots are immutable).
func (m *Mirror) Offer(cfg *config.Mirror, path, body []byte, stream bool) bool {
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
	if len(m.q) >= cfg.QueueSize {
		m.m.droppedFull.Inc()
		return false
	}
	need := int64(len(path) + len(body))
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
	j.stream = stream
	j.at = time.Now()
	select {
	case m.q <- j:
		return true
	default:
		m.release(j)
		m.m.droppedFull.Inc()
		return false
	}
}

// Close stops mirroring: queued jobs are dropped (counted), requests in
// flight are cancelled, and Close returns when every goroutine has ended.
// Offer returns false afterwards. Idempotent.
func (m *Mirror) Close() {
	if m.closed.Swap(true) {
		return
	}
	close(m.stop)
	m.cancel()
	m.wg.Wait()
	metrics.UnregisterSet(m.m.set, true)
	m.client.CloseIdleConnections()
}

// dispatch hands queued jobs to senders, at most the job's
// mirror.concurrency at once, dropping jobs that expire while they wait.
func (m *Mirror) dispatch() {
	defer m.wg.Done()
	wait := time.NewTimer(time.Hour)
	wait.Stop()
	for {
		var j *job
		select {
		case <-m.stop:
			m.drain()
			return
		case j = <-m.q:
		}
		timeout := millis(j.cfg.TimeoutMS)
		limit := int64(max(1, j.cfg.Concurrency))
		expired := false
		for !expired && m.active.Load() >= limit {
			wait.Reset(time.Until(j.at.Add(timeout)))
			select {
			case <-m.freed:
			case <-wait.C:
				expired = true
			case <-m.stop:
				m.m.droppedClose.Inc()
				m.release(j)
				m.drain()
				return
			}
			if !wait.Stop() {
				select {
				case <-wait.C:
				default:
				}
			}
		}
		if expired || time.Since(j.at) >= timeout {
			m.m.droppedExpired.Inc()
			m.release(j)
			continue
		}
		m.active.Add(1)
		m.wg.Add(1)
		go func() {
			defer func() {
				m.active.Add(-1)
				select {
				case m.freed <- struct{}{}:
				default:
				}
				m.wg.Done()
			}()
			m.send(j)
			m.release(j)
		}()
	}
}

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

// endpoint returns the parsed target address (cached across requests).
func (m *Mirror) endpoint(raw string) (*upstream.Endpoint, error) {
	if c := m.ep.Load(); c != nil && c.raw == raw {
		return &c.ep, c.err
	}
	ep, err := upstream.ParseEndpoint(raw)
	c := &endpointCache{raw: raw, ep: ep, err: err}
	m.ep.Store(c)
	return &c.ep, err
}

func millis(v float64) time.Duration {
	d := time.Duration(v * float64(time.Millisecond))
	if d <= 0 {
		return 60 * time.Second
	}
	return d
}
