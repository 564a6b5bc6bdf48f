package broker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/infera/infera/internal/logx"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nuid"
	"github.com/puzpuzpuz/xsync/v3"
)

var (
	mCancelsSent   = metrics.NewCounter(`infera_nats_cancels_sent_total`)
	mReqRejected   = metrics.NewCounter(`infera_nats_requests_rejected_total{reason="max_pending"}`)
	mReqSent       = metrics.NewCounter(`infera_nats_requests_total`)
	mStreamOverrun = metrics.NewCounter(`infera_nats_stream_overflows_total`)
	// mWorkerGone counts the streams failed because their worker's cancel
	// subject had no subscriber probeStrikes probes in a row.
	mWorkerGone = metrics.NewCounter(`infera_nats_streams_worker_gone_total`)
	// mGoneAnswers counts the answers to a worker's chunk or probe for a
	// request this router no longer has open (KindGone).
	mGoneAnswers = metrics.NewCounter(`infera_nats_gone_answers_total`)
)

// ClientConfig configures the router side of the NATS request transport.
type ClientConfig struct {
	// Conn is the router's NATS connection (shared; not closed by Client).
	Conn *nats.Conn
	// IdleTimeout is the longest wait for the next reply message, reset per
	// message (--nats-req-idle-timeout). 0 waits forever.
	IdleTimeout time.Duration
	// MaxDuration caps a whole request from Do to the last chunk
	// (--nats-req-max-duration). 0 is off.
	MaxDuration time.Duration
	// MaxPending is the per-worker admission limit (--nats-req-max-pending):
	// with MaxPending requests outstanding at a worker Do returns
	// ErrMaxPending without sending. 0 is off.
	MaxPending int
	// MaxQueued and MaxQueuedBytes bound the reply messages, and their
	// bytes, buffered per stream when the reader (the router relaying to
	// its client) is slower than the engine: NATS has no backpressure, so
	// without them a client reading slowly would make the router hold the
	// whole answer. Beyond either the stream fails with ErrOverrun and the
	// worker is told to cancel. Defaults 8192 messages and 8 MiB.
	MaxQueued      int
	MaxQueuedBytes int
}

// Request is one HTTP request to forward. Body is sent as is; Header holds
// the request headers to forward (hop-by-hop and Infera-* ones are dropped).
type Request struct {
	Method string
	// Path is the path with query, e.g. "/v1/chat/completions".
	Path   string
	Header http.Header
	Body   []byte
	// Idle, when positive, bounds the wait for each reply message of this
	// request after the first body chunk (the smaller of it and
	// ClientConfig.IdleTimeout applies): it is the gap between two data
	// packets of a stream, so the wait for the head and the first chunk
	// (a prefill, a queue) is FirstByte's and Deadline's, not its.
	Idle time.Duration
	// Deadline, when set, caps the whole request like MaxDuration (the
	// earlier of the two applies); past it the stream fails with
	// ErrMaxDuration and the worker is told to cancel.
	Deadline time.Time
	// Start, when set, is when the whole request began (its first
	// attempt): MaxDuration counts from it, so a retry does not get a
	// fresh window (zero: from Do).
	Start time.Time
	// FirstByte, when set, bounds the wait for the head and the first body
	// chunk: past it Do (or the first Next) fails with ErrIdleTimeout.
	FirstByte time.Time
	// Once: the request may reach the engine once only (a PD leg whose KV
	// the engine holds once it takes it). The worker then does not write
	// it again on a fresh connection when a reused keep-alive connection
	// to its engine closed under it (HdrResend is not set).
	Once bool
}

// Client sends requests to workers over NATS and streams their replies.
// It is safe for concurrent use.
type Client struct {
	cfg    ClientConfig
	nc     *nats.Conn
	prefix string
	sub    *nats.Subscription

	mu      sync.Mutex
	streams map[string]*Stream
	// probes: a worker that dies (a killed sidecar, a lost machine) sends
	// nothing more, and over NATS no closed connection tells the router.
	// Every probeEvery, each worker with open streams gets an empty message
	// on its cancel subject (which a live worker ignores) with the reply
	// subject <inbox prefix>g-<worker>: when the worker's subscription is
	// gone the NATS server answers there no-responders. probeStrikes such
	// answers in a row (not one: a route between NATS servers can drop for
	// a moment) fail the worker's open streams with ErrWorkerGone.
	probes    map[string]*workerProbe
	probeStop chan struct{}
	closeOnce sync.Once

	pending *xsync.MapOf[string, *atomic.Int64]
}

// workerProbe is a probed worker's state (under Client.mu).
type workerProbe struct {
	bounced bool   // a probe came back no-responders since the last tick
	strikes int    // probes in a row that came back no-responders
	tick    uint64 // the last tick that probed the worker
}

// goneTag starts the reply token of a worker probe; stream ids (nuids) never
// hold a '-'.
const goneTag = "g-"

// NewClient subscribes the client's reply inbox and returns the client.
func NewClient(cfg ClientConfig) (*Client, error) {
	if cfg.Conn == nil {
		return nil, fmt.Errorf("broker: ClientConfig.Conn is nil")
	}
	if cfg.MaxQueued <= 0 {
		cfg.MaxQueued = 8192
	}
	if cfg.MaxQueuedBytes <= 0 {
		cfg.MaxQueuedBytes = 8 << 20
	}
	c := &Client{
		cfg:       cfg,
		nc:        cfg.Conn,
		prefix:    cfg.Conn.NewRespInbox() + ".",
		streams:   map[string]*Stream{},
		probes:    map[string]*workerProbe{},
		probeStop: make(chan struct{}),
		pending:   xsync.NewMapOf[string, *atomic.Int64](),
	}
	sub, err := c.nc.Subscribe(c.prefix+"*", c.dispatch)
	if err != nil {
		return nil, fmt.Errorf("cannot subscribe reply inbox: %w", err)
	}
	// Replies can be bursty; never let the NATS client drop them.
	if err := sub.SetPendingLimits(-1, -1); err != nil {
		sub.Unsubscribe()
		return nil, fmt.Errorf("cannot set reply inbox limits: %w", err)
	}
	c.sub = sub
	go c.probeLoop(probeEvery) // read here: a test may change it once this returns
	return c, nil
}

func (c *Client) probeLoop(every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	var workers []string
	var failed []*Stream
	var tick uint64
	open := map[string][]string{}
	var lost []*Stream
	for {
		select {
		case <-c.probeStop:
			return
		case <-t.C:
		}
		tick++
		// The ids a probe lists must fit the broker's max_payload beside
		// the message's other headers: a probe past it is never sent, and
		// a dead worker's requests would wait for their idle timeout.
		idBytes := int(c.nc.MaxPayload()) - ownHeaderBytes
		workers, failed, lost = workers[:0], failed[:0], lost[:0]
		for w, ids := range open {
			open[w] = ids[:0]
		}
		c.mu.Lock()
		for _, p := range c.probes { // the answers to the last tick's probes
			if p.bounced {
				p.strikes++
			} else {
				p.strikes = 0
			}
			p.bounced = false
		}
		for _, s := range c.streams {
			p := c.probes[s.worker]
			if p == nil {
				p = &workerProbe{}
				c.probes[s.worker] = p
			}
			if p.strikes >= probeStrikes {
				failed = append(failed, s)
				continue
			}
			if p.tick != tick {
				p.tick = tick
				workers = append(workers, s.worker)
			}
			// The last round's answers: a worker said it does not know the
			// request and none said it does (two sidecars may share an id
			// during a rollout; a worker older than the question says
			// nothing, which never strikes).
			if s.asked != 0 && s.asked == tick-1 {
				if s.unknownAt == s.asked && s.knownAt != s.asked {
					s.lostStrikes++
					if s.lostStrikes == unknownStrikes {
						lost = append(lost, s)
					}
				} else {
					s.lostStrikes = 0
				}
			}
			// Ask about the streams open since the last tick at least (the
			// worker has had time to take the request) that have not seen
			// their end yet.
			if s.seenTick == 0 {
				s.seenTick = tick
			} else if ids := len(open[s.worker]); !s.endQueued.Load() && ids < maxOpenPerProbe && (ids+1)*(len(s.id)+1) <= idBytes {
				s.asked = tick
				open[s.worker] = append(open[s.worker], s.id)
			}
		}
		for w, p := range c.probes { // struck out, or no open stream left
			if p.tick != tick {
				delete(c.probes, w)
				delete(open, w)
			}
		}
		c.mu.Unlock()
		for _, s := range failed {
			if err := c.denied(s); err != nil {
				s.fail(err)
				continue
			}
			mWorkerGone.Inc()
			s.fail(wrap(ErrWorkerGone, s.worker))
		}
		for _, s := range lost {
			if err := c.denied(s); err != nil {
				s.fail(err)
				continue
			}
			mWorkerGone.Inc()
			s.fail(wrap(ErrWorkerGone, s.worker+": the worker does not know the request (restarted under the same id)"))
		}
		round := strconv.FormatUint(tick, 10)
		for _, w := range workers {
			m := nats.NewMsg(CancelSubject(w))
			m.Reply = c.prefix + goneTag + w
			if ids := open[w]; len(ids) > 0 {
				m.Header.Set(HdrOpen, strings.Join(ids, " "))
				m.Header.Set(HdrRound, round)
			}
			c.nc.PublishMsg(m)
		}
	}
}

// maxOpenPerProbe caps the request ids one probe asks a worker about
// (about 23 KB); with more open, the map's order picks which.
const maxOpenPerProbe = 1000

// denied is ErrDenied when the broker's last error on this connection is
// a permissions violation for the worker's request subject that came after
// s was published: the request never reached the worker (which then does
// not know it, or the router's user may not publish its probes either), so
// the router's NATS user is at fault, not the worker. nil otherwise: nats.go
// keeps a connection's last error until it reconnects, so a violation from
// before the publish (rights granted since by a broker reload) says
// nothing of s.
func (c *Client) denied(s *Stream) error {
	err := c.nc.LastError()
	if err == nil || !errors.Is(err, nats.ErrPermissionViolation) || err == s.lastErr {
		return nil
	}
	subj := ReqSubject(s.worker)
	if !strings.Contains(err.Error(), `"`+subj+`"`) {
		return nil
	}
	return wrap(ErrDenied, subj)
}

// unknownStrikes is how many probe rounds in a row a worker must answer
// that it does not know a request before the request fails.
const unknownStrikes = 2

// answered records a worker's answer to the probe of round: which of the
// asked requests it knows and which it does not.
func (c *Client) answered(w string, m *nats.Msg) {
	round, err := strconv.ParseUint(m.Header.Get(HdrRound), 10, 64)
	if err != nil || round == 0 {
		return
	}
	mark := func(list string, known bool) {
		for n := 0; list != "" && n < maxOpenPerProbe; n++ {
			var id string
			id, list, _ = strings.Cut(list, " ")
			s := c.streams[id]
			if s == nil || s.worker != w || s.asked != round {
				continue
			}
			if known {
				s.knownAt = round
			} else {
				s.unknownAt = round
			}
		}
	}
	c.mu.Lock()
	mark(m.Header.Get(HdrKnown), true)
	mark(m.Header.Get(HdrUnknown), false)
	c.mu.Unlock()
}

// answerGone tells a worker that the request behind its chunk or probe is
// no longer open here (reply is the reply subject the worker gave).
func (c *Client) answerGone(reply string) {
	m := nats.NewMsg(reply)
	m.Header.Set(HdrKind, KindGone)
	if c.nc.PublishMsg(m) == nil {
		mGoneAnswers.Inc()
	}
}

// Close unsubscribes the reply inbox and stops the probes; open streams
// fail with ErrBroken.
func (c *Client) Close() error {
	c.closeOnce.Do(func() { close(c.probeStop) })
	err := c.sub.Unsubscribe()
	c.mu.Lock()
	ss := c.streams
	c.streams = map[string]*Stream{}
	c.mu.Unlock()
	for _, s := range ss {
		s.fail(wrap(ErrBroken, "client closed"))
	}
	return err
}

// Disconnected fails every open stream with ErrConnLost: replies sent while
// the connection was down are lost (core NATS), so waiting for them would
// only end at the idle timeout. Call it from the connection's disconnect
// handler: nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
// client.Disconnected(err) }).
func (c *Client) Disconnected(err error) {
	c.mu.Lock()
	ss := make([]*Stream, 0, len(c.streams))
	for _, s := range c.streams {
		ss = append(ss, s)
	}
	c.mu.Unlock()
	detail := ""
	if err != nil {
		detail = err.Error()
	}
	for _, s := range ss {
		s.fail(wrap(ErrConnLost, detail))
	}
}

// Pending returns the requests outstanding at workerID (for metrics).
func (c *Client) Pending(workerID string) int {
	if p, ok := c.pending.Load(workerID); ok {
		return int(p.Load())
	}
	return 0
}

// Forget drops the pending counter of a removed worker.
func (c *Client) Forget(workerID string) { c.pending.Delete(workerID) }

// Retain drops the pending counters of the workers keep refuses. A request
// dispatched to a worker as it was removed (it took the worker from the
// fleet's previous view) re-creates the counter Forget dropped: call Retain
// with the live workers when one leaves, so such counters last until the
// next removal rather than forever.
func (c *Client) Retain(keep func(workerID string) bool) {
	c.pending.Range(func(id string, _ *atomic.Int64) bool {
		if !keep(id) {
			c.pending.Delete(id)
		}
		return true
	})
}

// Counters returns how many workers hold a pending counter (for metrics
// and tests).
func (c *Client) Counters() int { return c.pending.Size() }

func (c *Client) dispatch(m *nats.Msg) {
	id := m.Subject[len(c.prefix):]
	if w, ok := strings.CutPrefix(id, goneTag); ok {
		if m.Header.Get("Status") == "503" {
			c.mu.Lock()
			if p := c.probes[w]; p != nil {
				p.bounced = true
			}
			c.mu.Unlock()
		} else if m.Header.Get(HdrRound) != "" {
			c.answered(w, m)
		}
		return
	}
	if id == probeToken {
		// A worker's probe while it waits for its engine; its reply subject
		// is <its inbox>.<request id>.p. A request this router no longer
		// has open is over: its cancel notice was lost (published while
		// the broker connection was down).
		r, ok := strings.CutSuffix(m.Reply, ".p")
		if i := strings.LastIndexByte(r, '.'); ok && i >= 0 {
			c.mu.Lock()
			s := c.streams[r[i+1:]]
			c.mu.Unlock()
			if s == nil {
				c.answerGone(m.Reply)
			}
		}
		return
	}
	c.mu.Lock()
	s := c.streams[id]
	c.mu.Unlock()
	if s != nil {
		s.push(m)
		return
	}
	if m.Reply != "" && m.Header.Get("Status") == "" && m.Header.Get(HdrKind) == KindData {
		// A chunk of a request given up on: the worker goes on only when
		// the cancel notice was lost. Tell it on the chunk's own reply
		// subject (see Server.goneInbox).
		c.answerGone(m.Reply)
	}
}

// probeToken is the last token of the subject workers probe a router's
// inbox on (see the package doc); stream ids (nuids) are never this short.
const probeToken = "probe"

// Do publishes req to workerID and waits for the first reply message. On
// success the caller owns the Stream and must Close it. Every error from Do
// happens before the first response byte: Retryable(err) says whether
// another worker may take the request and HTTPStatus(err) what to answer.
// ctx bounds the wait for the first reply (and every later Next); once ctx
// is done Do never returns a Stream, even if the first reply had arrived.
func (c *Client) Do(ctx context.Context, workerID string, req *Request) (*Stream, error) {
	if !ValidWorkerID(workerID) {
		return nil, fmt.Errorf("broker: invalid worker id %q", workerID)
	}
	if !strings.HasPrefix(req.Path, "/") || !validHeaderValue(req.Path) {
		return nil, fmt.Errorf("broker: invalid request path %q", req.Path)
	}
	if !c.nc.IsConnected() {
		// While reconnecting nats.go would buffer the request and the reply
		// could only time out: fail now, nothing was sent.
		return nil, wrap(ErrNATS, "not connected to the broker")
	}
	var ctr *atomic.Int64
	if c.cfg.MaxPending > 0 {
		ctr, _ = c.pending.LoadOrCompute(workerID, func() *atomic.Int64 { return new(atomic.Int64) })
		if ctr.Add(1) > int64(c.cfg.MaxPending) {
			ctr.Add(-1)
			mReqRejected.Inc()
			return nil, wrap(ErrMaxPending, workerID)
		}
	}
	id := nuid.Next()
	m := nats.NewMsg(ReqSubject(workerID))
	m.Reply = c.prefix + id
	m.Data = req.Body
	hsize := 0
	for k, vs := range req.Header {
		if skipHeader(k) {
			continue
		}
		for _, v := range vs {
			if validHeaderValue(v) {
				m.Header.Add(k, v)
				hsize += len(k) + len(v) + 4
			}
		}
	}
	method := req.Method
	if method == "" {
		method = http.MethodPost
	}
	m.Header.Set(HdrID, id)
	m.Header.Set(HdrMethod, method)
	m.Header.Set(HdrPath, req.Path)
	m.Header.Set(HdrProbe, "1") // c.prefix+"*" takes <prefix>probe too (probeToken)
	if !req.Once {
		m.Header.Set(HdrResend, "1")
	}
	if int64(len(req.Body)+hsize+len(req.Path)+128) > c.nc.MaxPayload() {
		if ctr != nil {
			ctr.Add(-1)
		}
		return nil, wrap(ErrTooLarge, fmt.Sprintf("%d bytes, max %d", len(req.Body), c.nc.MaxPayload()))
	}
	s := &Stream{
		c: c, worker: workerID, id: id, ctx: ctx, ctr: ctr,
		sig:  make(chan struct{}, 1),
		idle: c.cfg.IdleTimeout,
	}
	if c.cfg.MaxDuration > 0 {
		start := req.Start
		if start.IsZero() {
			start = time.Now()
		}
		s.deadline = start.Add(c.cfg.MaxDuration)
	}
	if !req.Deadline.IsZero() && (s.deadline.IsZero() || req.Deadline.Before(s.deadline)) {
		s.deadline = req.Deadline
	}
	s.reqIdle = req.Idle
	s.firstByte = req.FirstByte
	s.lastErr = c.nc.LastError() // denied: what the broker said before this publish
	c.mu.Lock()
	c.streams[id] = s
	c.mu.Unlock()
	if err := c.nc.PublishMsg(m); err != nil {
		s.release()
		return nil, wrap(ErrNATS, err.Error())
	}
	mReqSent.Inc()
	first, err := s.wait()
	if err == nil && ctx != nil && ctx.Err() != nil {
		// The reply and the cancel were both ready and wait took the reply:
		// the caller has gone, so it would never close this stream.
		err = fmt.Errorf("request to worker %q: %w", workerID, ctx.Err())
	}
	if err != nil {
		s.Close()
		return nil, err
	}
	switch first.Header.Get(HdrKind) {
	case KindHead:
		st, err := strconv.Atoi(first.Header.Get(HdrStatus))
		if err != nil || st < 100 || st > 999 {
			s.Close()
			return nil, wrap(ErrBroken, "bad status in head")
		}
		s.status = st
		s.header = make(http.Header, len(first.Header))
		for k, vs := range first.Header {
			if !reserved(k) {
				s.header[k] = vs
			}
		}
		s.pendingData = first.Data
		s.closeDelimited = first.Header.Get(HdrCloseDelimited) == "1"
		if first.Header.Get(HdrLast) == "1" {
			s.finished, s.err = true, io.EOF
			s.release()
		}
		return s, nil
	case KindError:
		s.finished = true
		s.Close()
		reason := first.Header.Get(HdrError)
		if first.Header.Get(HdrStatus) == "429" {
			return nil, wrap(ErrWorkerBusy, reason)
		}
		switch first.Header.Get(HdrReason) {
		case ReasonProtocol:
			return nil, wrap(ErrEngineProtocol, reason)
		case ReasonUnreachable:
			return nil, wrap(ErrEngineDial, reason)
		}
		return nil, wrap(ErrEngine, reason) // broken before a head, or an older worker
	default:
		s.Close()
		return nil, wrap(ErrBroken, "first reply is not head")
	}
}

// Stream is one request's reply. Status and Header are valid after Do; Next
// returns body chunks. A Stream is used by one goroutine.
type Stream struct {
	c         *Client
	worker    string
	id        string
	ctx       context.Context
	ctr       *atomic.Int64
	idle      time.Duration // ClientConfig.IdleTimeout: every reply message
	reqIdle   time.Duration // Request.Idle: reply messages after the first body chunk
	deadline  time.Time
	firstByte time.Time
	timer     *time.Timer
	// lastErr is the connection's LastError just before the request was
	// published (Client.denied).
	lastErr error
	// readDeadline is the reader's bound on its next waits
	// (SetReadDeadline); closeDelimited is HdrCloseDelimited of the head.
	readDeadline   time.Time
	closeDelimited bool

	mu         sync.Mutex
	q          []*nats.Msg
	qhead      int
	qbytes     int  // data bytes of q[qhead:]
	cancelSent bool // the cancel notice went out (push or sendCancel)
	closed     bool // released: push drops what still arrives
	failErr    error
	sig        chan struct{}
	released   bool

	// Under Client.mu (probeLoop and answered): the probe tick that first
	// saw the stream, the last round that asked the worker about it, the
	// last rounds a worker answered it knows / does not know it, and the
	// rounds in a row it was not known.
	seenTick, asked, knownAt, unknownAt uint64
	lostStrikes                         int
	// endQueued: the end (or error) message has arrived, or the stream
	// failed: the worker is done with the request, or told to be.
	endQueued atomic.Bool

	status      int
	header      http.Header
	pendingData []byte
	seq         uint64
	finished    bool // end or error message seen
	err         error
}

// Status returns the engine's HTTP status.
func (s *Stream) Status() int { return s.status }

// Header returns the engine's response headers (hop-by-hop ones removed).
func (s *Stream) Header() http.Header { return s.header }

// CloseDelimited reports a body the engine ended by closing its connection
// (HdrCloseDelimited): its end may be a crash.
func (s *Stream) CloseDelimited() bool { return s.closeDelimited }

// SetReadDeadline bounds the waits of the next reads (zero: none) besides
// the stream's own timeouts: a read past it fails with ErrIdleTimeout and
// stops the worker's request. Called by the goroutine that reads.
func (s *Stream) SetReadDeadline(t time.Time) { s.readDeadline = t }

// ID returns the request id (as sent in cancel notices).
func (s *Stream) ID() string { return s.id }

func (s *Stream) push(m *nats.Msg) {
	overrun := false
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	if s.failErr == nil {
		// The end (or error) message may take one slot over the bound: a
		// reader holding the whole answer must still see its end.
		limit := s.c.cfg.MaxQueued
		switch m.Header.Get(HdrKind) {
		case KindData:
		case KindEnd, KindError:
			s.endQueued.Store(true)
			limit++
		default:
			limit++
		}
		if len(s.q)-s.qhead >= limit || s.qbytes+len(m.Data) > s.c.cfg.MaxQueuedBytes {
			mStreamOverrun.Inc()
			s.failErr = wrap(ErrOverrun, s.worker)
			s.endQueued.Store(true) // the worker is told to cancel: no more probing
			overrun = !s.cancelSent
			s.cancelSent = true
		} else {
			s.q = append(s.q, m)
			s.qbytes += len(m.Data)
		}
	}
	s.mu.Unlock()
	if overrun {
		// The worker would go on sending into a stream that is over: stop
		// it now, not when the slow reader gets here.
		if s.c.nc.Publish(CancelSubject(s.worker), []byte(s.id)) == nil {
			mCancelsSent.Inc()
		}
	}
	select {
	case s.sig <- struct{}{}:
	default:
	}
}

func (s *Stream) fail(err error) {
	s.mu.Lock()
	if s.failErr == nil {
		s.failErr = err
	}
	s.mu.Unlock()
	s.endQueued.Store(true) // given up on: not asked about again
	select {
	case s.sig <- struct{}{}:
	default:
	}
}

func (s *Stream) pop() (*nats.Msg, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.qhead < len(s.q) {
		m := s.q[s.qhead]
		s.q[s.qhead] = nil
		s.qhead++
		s.qbytes -= len(m.Data)
		if s.qhead == len(s.q) {
			s.q, s.qhead = s.q[:0], 0
		}
		return m, nil
	}
	return nil, s.failErr
}

// wait returns the next reply message in order, enforcing the timeouts.
func (s *Stream) wait() (*nats.Msg, error) {
	for {
		m, err := s.pop()
		if m != nil {
			if m.Header.Get("Status") == "503" && len(m.Data) == 0 && m.Header.Get(HdrKind) == "" {
				return nil, wrap(ErrNoResponders, s.worker)
			}
			seq, perr := strconv.ParseUint(m.Header.Get(HdrSeq), 10, 64)
			if perr != nil || seq != s.seq {
				s.sendCancel() // the worker may still be sending; stop it
				return nil, wrap(ErrBroken, fmt.Sprintf("reply out of order: got seq %q, want %d", m.Header.Get(HdrSeq), s.seq))
			}
			s.seq++
			return m, nil
		}
		if err != nil {
			return nil, err
		}
		var tc <-chan time.Time
		d := s.idle
		if s.seq > 1 && s.reqIdle > 0 && (d == 0 || s.reqIdle < d) {
			d = s.reqIdle // between two data packets
		}
		isDeadline, isFirst := false, false
		if !s.deadline.IsZero() {
			if left := time.Until(s.deadline); d == 0 || left < d {
				d, isDeadline = left, true
			}
		}
		if !s.firstByte.IsZero() && s.seq <= 1 {
			// Waiting for the head or the first body chunk.
			if left := time.Until(s.firstByte); (d == 0 && !isDeadline) || left < d {
				d, isDeadline, isFirst = left, false, true
			}
		}
		isRead := false
		if !s.readDeadline.IsZero() && (s.deadline.IsZero() || s.readDeadline.Before(s.deadline)) {
			// The reader's own bound (SetReadDeadline); the total cap is
			// the stream's (ErrMaxDuration).
			if left := time.Until(s.readDeadline); (d == 0 && !isDeadline && !isFirst) || left < d {
				d, isDeadline, isFirst, isRead = left, false, false, true
			}
		}
		if d > 0 || isDeadline || isFirst || isRead {
			if d <= 0 {
				d = 1
			}
			if s.timer == nil {
				s.timer = time.NewTimer(d)
			} else {
				s.timer.Reset(d)
			}
			tc = s.timer.C
		}
		var done <-chan struct{}
		if s.ctx != nil {
			done = s.ctx.Done()
		}
		select {
		case <-s.sig:
			if s.timer != nil {
				s.timer.Stop()
			}
		case <-tc:
			s.sendCancel()
			if isFirst {
				return nil, wrap(ErrIdleTimeout, s.worker+": no first reply before the first-packet deadline")
			}
			if isDeadline {
				return nil, wrap(ErrMaxDuration, s.worker)
			}
			return nil, wrap(ErrIdleTimeout, s.worker)
		case <-done:
			if s.timer != nil {
				s.timer.Stop()
			}
			s.sendCancel()
			return nil, fmt.Errorf("request to worker %q: %w", s.worker, s.ctx.Err())
		}
	}
}

// Next returns the next body chunk; io.EOF after the last one. The chunk is
// the caller's (never reused). Any other error ends the stream mid-way;
// timeouts have already sent a cancel to the worker.
func (s *Stream) Next() ([]byte, error) {
	if s.pendingData != nil {
		b := s.pendingData
		s.pendingData = nil
		if len(b) > 0 {
			return b, nil
		}
	}
	if s.err != nil {
		return nil, s.err
	}
	for {
		m, err := s.wait()
		if err != nil {
			s.err = err
			return nil, err
		}
		switch m.Header.Get(HdrKind) {
		case KindData:
			if len(m.Data) == 0 {
				continue
			}
			return m.Data, nil
		case KindEnd:
			s.finished = true
			if e := m.Header.Get(HdrError); e != "" {
				s.err = wrap(ErrBroken, "engine: "+e)
			} else {
				s.err = io.EOF
			}
			s.release()
			return nil, s.err
		default:
			s.sendCancel()
			s.err = wrap(ErrBroken, "unexpected reply kind "+strconv.Quote(m.Header.Get(HdrKind)))
			return nil, s.err
		}
	}
}

// Read implements io.Reader over Next (copying), for relays that want one.
func (s *Stream) Read(p []byte) (int, error) {
	if len(s.pendingData) == 0 {
		b, err := s.Next()
		if err != nil {
			return 0, err
		}
		s.pendingData = b
	}
	n := copy(p, s.pendingData)
	s.pendingData = s.pendingData[n:]
	if len(s.pendingData) == 0 {
		s.pendingData = nil
	}
	return n, nil
}

// sendCancel publishes the cancel notice once (push may have sent it when
// it cut an overrun stream).
func (s *Stream) sendCancel() {
	if s.finished {
		return
	}
	s.mu.Lock()
	sent := s.cancelSent
	s.cancelSent = true
	s.mu.Unlock()
	if sent {
		return
	}
	if err := s.c.nc.Publish(CancelSubject(s.worker), []byte(s.id)); err == nil {
		mCancelsSent.Inc()
	}
}

// Close ends the stream: if the reply has not finished, it publishes a
// cancel notice so the worker aborts the engine request. Idempotent.
func (s *Stream) Close() error {
	s.sendCancel()
	s.release()
	if s.err == nil {
		s.err = wrap(ErrBroken, "stream closed")
	}
	return nil
}

func (s *Stream) release() {
	if s.released {
		return
	}
	s.released = true
	s.c.mu.Lock()
	delete(s.c.streams, s.id)
	s.c.mu.Unlock()
	s.mu.Lock()
	s.closed = true
	s.q, s.qhead, s.qbytes = nil, 0, 0 // what was queued goes with the stream
	s.mu.Unlock()
	if s.ctr != nil {
		s.ctr.Add(-1)
	}
	if s.timer != nil {
		s.timer.Stop()
	}
}

// Reconnect is the reconnection policy of every infera process's NATS
// connection (router and worker sidecars): retry forever, every 250 ms plus
// up to 100 ms of jitter (nats.go waits 2 s by default). While the broker
// is away every NATS request is a 503, so each second counts.
//
// Forever includes a broker that refuses the credentials for a while (a
// bad auth config pushed then rolled back, an account resolver not up yet):
// by default nats.go closes the connection for good once a server answers
// the same auth error twice in a row, and the process stayed off the
// broker until restarted. The library's asynchronous errors (that refusal,
// a slow consumer, a permissions violation) go to slog, throttled, instead
// of a line on standard error per reconnect attempt; so do failed connect
// attempts (refused, TLS, and a refusal of the credentials while a
// RetryOnFailedConnect connection makes its first connection, which
// nats.go reports there only), with their reason: a router started with a
// token the broker refuses logged only that the broker was not reachable.
//
// A broker that hangs, or a network path to it that goes dark without a
// reset, leaves the connection open: only unanswered pings tell. nats.go
// pings every 2 minutes and gives up after two outstanding, so for 4-6
// minutes /health said ok and every NATS request hung until its own
// timeout; a ping every 5 s gives such a connection up within 15 s.
func Reconnect() []nats.Option {
	t := &logx.Throttle{Every: 10 * time.Second}
	return []nats.Option{
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250 * time.Millisecond),
		nats.ReconnectJitter(100*time.Millisecond, 100*time.Millisecond),
		nats.PingInterval(5 * time.Second),
		nats.MaxPingsOutstanding(2),
		nats.IgnoreAuthErrorAbort(),
		nats.ErrorHandler(func(_ *nats.Conn, sub *nats.Subscription, err error) {
			if sub != nil {
				t.Warn("NATS error", "err", err, "subject", sub.Subject)
				return
			}
			t.Warn("NATS error", "err", err)
		}),
		nats.ReconnectErrHandler(func(_ *nats.Conn, err error) {
			t.Warn("NATS broker not connected; retrying", "err", err)
		}),
	}
}
