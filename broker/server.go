package broker

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptrace"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/infera/infera/internal/h1"
	"github.com/nats-io/nats.go"
)

// WorkerMetrics holds the worker side's series (infera_worker_*), which
// the sidecar serves (infera worker --metrics-addr); a router has none.
var WorkerMetrics = metrics.NewSet()

var (
	mSrvRequests = WorkerMetrics.NewCounter(`infera_worker_nats_requests_total`)
	mSrvRejected = WorkerMetrics.NewCounter(`infera_worker_nats_requests_rejected_total`)
	mSrvCanceled = WorkerMetrics.NewCounter(`infera_worker_nats_requests_canceled_total`)
	// mSrvStaleRetries counts requests sent to the engine again on
	// another connection: the reused one had been closed (engineDo).
	mSrvStaleRetries = WorkerMetrics.NewCounter(`infera_worker_engine_stale_conn_retries_total`)
	// mSrvReaderGone counts requests cancelled because the router that
	// asked was gone (its inbox had no subscriber).
	mSrvReaderGone = WorkerMetrics.NewCounter(`infera_worker_nats_requests_reader_gone_total`)
)

// ServerConfig configures the worker side of the NATS request transport.
type ServerConfig struct {
	// Conn is the worker's NATS connection (not closed by Server).
	Conn *nats.Conn
	// WorkerID is this instance's id; the server subscribes
	// infera.req.<WorkerID> and infera.cancel.<WorkerID>.
	WorkerID string
	// EngineURL is the engine's base URL, e.g. http://127.0.0.1:8100.
	EngineURL string
	// MaxPending caps requests in flight at this worker; at the cap a
	// request is answered with an error reply, status 429. 0 is off.
	MaxPending int
	// HTTPClient talks to the engine. Default: a client with no overall
	// timeout (streams are long) and keep-alive connections.
	HTTPClient *http.Client
	// ChunkSize is the read buffer per engine response read (one NATS
	// message per read). Default 32 KiB, capped below the NATS max payload.
	ChunkSize int
}

// Server serves one worker's request subject by forwarding each request to
// the engine's HTTP API and streaming the response back.
type Server struct {
	cfg       ServerConfig
	nc        *nats.Conn
	engine    string
	hc        *http.Client
	chunk     int
	subReq    *nats.Subscription
	subCancel *nats.Subscription
	// goneInbox.<request id> is the reply subject of every data chunk: when
	// the router that asked is gone (crashed, or its connection dropped),
	// its inbox has no subscriber and the NATS server answers the chunk
	// with a no-responders status there, so the engine request is
	// cancelled as a closed HTTP connection would cancel it; no cancel
	// notice can come from a router that is gone. The chunk itself is lost
	// then, so the stream is over either way.
	goneInbox string
	subGone   *nats.Subscription
	// probes: while a request waits for its engine (a prefill, a whole
	// non-streaming answer) no chunk goes out. If the router asked for
	// probes (Infera-Probe: 1, its inbox being a wildcard subscription),
	// every probeEvery the worker sends it an empty message on
	// <router inbox>.probe, which a live router ignores, with the reply
	// subject goneInbox.<request id>.p. A probe that finds no subscriber
	// loses nothing, and a route between two NATS servers can drop for a
	// moment: only probeStrikes bounced probes in a row end the request.
	probeStop chan struct{}
	probeOnce sync.Once

	inflight atomic.Int64
	wg       sync.WaitGroup
	bufs     sync.Pool

	// closing: Close is aborting the requests in flight (a drain that
	// timed out): unlike a router's cancel, nothing told their routers, so
	// each is answered (see Server.answerErr).
	closing atomic.Bool

	mu   sync.Mutex
	reqs map[string]*served
	// early holds cancels that arrived before their request: the request
	// and cancel subjects are separate subscriptions whose callbacks race.
	early   map[string]time.Time
	stopped bool
}

// served is a request in flight at the worker (under Server.mu).
type served struct {
	cancel context.CancelFunc
	// probe is the subject probed while nothing was published for the
	// request; "" when the router did not ask or a chunk went out.
	probe    string
	bounced  bool // a probe came back no-responders since the last tick
	strikes  int  // probes in a row that came back no-responders
	gone     bool // the router was found gone (counted and cancelled once)
	canceled bool // the router's cancel notice came (counted once)
}

// maxEarlyCancels bounds Server.early; entries older than earlyCancelTTL
// are pruned when it is full.
const (
	maxEarlyCancels = 4096
	earlyCancelTTL  = 30 * time.Second
)

// NewServer validates cfg and returns a server; Start subscribes.
func NewServer(cfg ServerConfig) (*Server, error) {
	if cfg.Conn == nil {
		return nil, fmt.Errorf("broker: ServerConfig.Conn is nil")
	}
	if !ValidWorkerID(cfg.WorkerID) {
		return nil, fmt.Errorf("broker: worker id %q is not a valid NATS subject token", cfg.WorkerID)
	}
	if !strings.HasPrefix(cfg.EngineURL, "http://") && !strings.HasPrefix(cfg.EngineURL, "https://") {
		return nil, fmt.Errorf("broker: engine url %q must be http(s)://", cfg.EngineURL)
	}
	s := &Server{
		cfg:    cfg,
		nc:     cfg.Conn,
		engine: strings.TrimRight(cfg.EngineURL, "/"),
		hc:     cfg.HTTPClient,
		chunk:  cfg.ChunkSize,
		reqs:   map[string]*served{},
		early:  map[string]time.Time{},
	}
	if s.hc == nil {
		// Engine answers are judged as the router's HTTP client judges
		// them (judgedConn).
		dial, dialTLS := dialJudged(&net.Dialer{Timeout: 3 * time.Second, KeepAlive: 30 * time.Second}, nil)
		s.hc = &http.Client{Transport: &http.Transport{
			DialContext:         dial,
			DialTLSContext:      dialTLS,
			MaxIdleConnsPerHost: 1024,
			IdleConnTimeout:     90 * time.Second,
			DisableCompression:  true,
		}}
	}
	if s.chunk <= 0 {
		s.chunk = 32 << 10
	}
	if max := int(s.nc.MaxPayload()) - 1024; max > 0 && s.chunk > max {
		s.chunk = max
	}
	s.bufs.New = func() any { b := make([]byte, s.chunk); return &b }
	return s, nil
}

// reqQueue is the queue group of the request subject.
const reqQueue = "infera-worker"

// Start subscribes the request and cancel subjects.
func (s *Server) Start() error {
	var err error
	if s.subCancel, err = s.nc.Subscribe(CancelSubject(s.cfg.WorkerID), s.onCancel); err != nil {
		return fmt.Errorf("cannot subscribe %s: %w", CancelSubject(s.cfg.WorkerID), err)
	}
	s.goneInbox = s.nc.NewInbox()
	if s.subGone, err = s.nc.Subscribe(s.goneInbox+".>", s.onReaderGone); err != nil {
		s.subCancel.Unsubscribe()
		return fmt.Errorf("cannot subscribe %s: %w", s.goneInbox, err)
	}
	// A queue group: should two sidecars run under one worker id (a
	// misconfiguration, or a rollout's new one before the old one stops),
	// each request reaches one of them, not both.
	if s.subReq, err = s.nc.QueueSubscribe(ReqSubject(s.cfg.WorkerID), reqQueue, s.onRequest); err != nil {
		s.subCancel.Unsubscribe()
		s.subGone.Unsubscribe()
		return fmt.Errorf("cannot subscribe %s: %w", ReqSubject(s.cfg.WorkerID), err)
	}
	s.subReq.SetPendingLimits(-1, -1)
	// Make sure the server knows the subscriptions before we advertise.
	if err := s.nc.Flush(); err != nil {
		return fmt.Errorf("cannot flush NATS subscriptions: %w", err)
	}
	s.probeStop = make(chan struct{})
	go s.probeLoop(probeEvery) // read here: a test may change it once this returns
	return nil
}

// probeEvery is how often a request still waiting for its engine checks
// that its router is there; probeStrikes bounced probes in a row (about
// probeStrikes*probeEvery of an unreachable router) end it.
var probeEvery = 2 * time.Second

const probeStrikes = 3

func (s *Server) probeLoop(every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	type probe struct{ subject, reply string }
	var probes []probe
	var gone []context.CancelFunc
	for {
		select {
		case <-s.probeStop:
			return
		case <-t.C:
		}
		probes, gone = probes[:0], gone[:0]
		s.mu.Lock()
		for id, r := range s.reqs {
			if r.probe == "" || r.gone {
				continue
			}
			if r.bounced {
				r.strikes++
			} else {
				r.strikes = 0
			}
			r.bounced = false
			if r.strikes >= probeStrikes {
				r.gone = true
				gone = append(gone, r.cancel)
				continue
			}
			probes = append(probes, probe{r.probe, s.goneInbox + "." + id + ".p"})
		}
		s.mu.Unlock()
		for _, c := range gone {
			mSrvReaderGone.Inc()
			c()
		}
		for _, p := range probes {
			m := nats.NewMsg(p.subject)
			m.Reply = p.reply
			s.nc.PublishMsg(m)
		}
	}
}

// InFlight returns the requests being served now.
func (s *Server) InFlight() int { return int(s.inflight.Load()) }

// StopAccepting unsubscribes the request subject: requests already
// received keep streaming, new ones get "no responders".
func (s *Server) StopAccepting() {
	s.mu.Lock()
	already := s.stopped
	s.stopped = true
	s.mu.Unlock()
	if s.subReq == nil || already {
		return
	}
	// Drain, not Unsubscribe: a request the NATS server routed to us before
	// it processed the UNSUB (or still queued in the client) must be served;
	// Unsubscribe would drop it and the router would only notice at the idle
	// timeout. After the drain, new requests get "no responders".
	closed := s.subReq.StatusChanged(nats.SubscriptionClosed)
	if err := s.subReq.Drain(); err != nil {
		s.subReq.Unsubscribe()
		return
	}
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
	}
}

// Close stops accepting, aborts every in-flight request and waits for their
// goroutines.
func (s *Server) Close() {
	s.StopAccepting()
	s.closing.Store(true)
	s.mu.Lock()
	for _, r := range s.reqs {
		r.cancel()
	}
	s.mu.Unlock()
	s.wg.Wait()
	if s.probeStop != nil {
		s.probeOnce.Do(func() { close(s.probeStop) })
	}
	if s.subCancel != nil {
		s.subCancel.Unsubscribe()
	}
	if s.subGone != nil {
		s.subGone.Unsubscribe()
	}
}

// Wait waits until no request is in flight or ctx ends.
func (s *Server) Wait(ctx context.Context) error {
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for s.inflight.Load() > 0 {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
	return nil
}

// onReaderGone handles a no-responders status on goneInbox: for a data
// chunk (goneInbox.<id>) the router is gone and the chunk lost, so the
// request is cancelled at once; for a probe (goneInbox.<id>.p) it is a
// strike, counted by probeLoop.
//
// A message of kind KindGone there is the router's own answer to a chunk
// or a probe: it no longer has the request open (its cancel notice was
// lost while a connection to the broker was down), so the request is
// cancelled at once.
func (s *Server) onReaderGone(m *nats.Msg) {
	gone := m.Header.Get(HdrKind) == KindGone
	if (!gone && m.Header.Get("Status") != "503") || len(m.Subject) <= len(s.goneInbox)+1 {
		return
	}
	id, isProbe := strings.CutSuffix(m.Subject[len(s.goneInbox)+1:], ".p")
	s.mu.Lock()
	r := s.reqs[id]
	if r == nil || r.gone || r.canceled {
		s.mu.Unlock()
		return
	}
	if isProbe && !gone {
		r.bounced = true
		s.mu.Unlock()
		return
	}
	r.gone = true
	s.mu.Unlock()
	mSrvReaderGone.Inc()
	r.cancel()
}

func (s *Server) onCancel(m *nats.Msg) {
	if open := m.Header.Get(HdrOpen); open != "" {
		s.answerOpen(m, open)
		return
	}
	id := string(m.Data)
	s.mu.Lock()
	r := s.reqs[id]
	if r == nil && id != "" {
		s.rememberEarlyLocked(id)
	}
	counted := r != nil && !r.canceled && !r.gone
	if r != nil {
		r.canceled = true
	}
	s.mu.Unlock()
	if r != nil {
		if counted {
			mSrvCanceled.Inc()
		}
		r.cancel()
	}
}

// answerOpen answers a router's probe that lists the requests it has open
// at this worker id: which of them this process serves and which it does
// not know (a worker restarted under the same id has forgotten them; two
// sidecars sharing an id during a rollout each say which are theirs).
func (s *Server) answerOpen(m *nats.Msg, open string) {
	if m.Reply == "" {
		return
	}
	var known, unknown []byte
	s.mu.Lock()
	for n := 0; open != "" && n < maxOpenAsked; n++ {
		var id string
		id, open, _ = strings.Cut(open, " ")
		if id == "" {
			continue
		}
		list := &unknown
		if s.reqs[id] != nil {
			list = &known
		}
		if len(*list) > 0 {
			*list = append(*list, ' ')
		}
		*list = append(*list, id...)
	}
	s.mu.Unlock()
	a := nats.NewMsg(m.Reply)
	a.Header.Set(HdrRound, m.Header.Get(HdrRound))
	if len(known) > 0 {
		a.Header.Set(HdrKnown, string(known))
	}
	if len(unknown) > 0 {
		a.Header.Set(HdrUnknown, string(unknown))
	}
	s.nc.PublishMsg(a)
}

// maxOpenAsked bounds the ids one probe's answer looks at.
const maxOpenAsked = 4096

// rememberEarlyLocked records a cancel for a request not seen yet. s.mu held.
func (s *Server) rememberEarlyLocked(id string) {
	now := time.Now()
	if len(s.early) >= maxEarlyCancels {
		for k, t := range s.early {
			if now.Sub(t) > earlyCancelTTL {
				delete(s.early, k)
			}
		}
		if len(s.early) >= maxEarlyCancels {
			return
		}
	}
	s.early[id] = now
}

func (s *Server) reply(to string, seq uint64, kind string, status int, errMsg string, hdr http.Header, data []byte) error {
	m := nats.NewMsg(to)
	s.copyHeaders(m.Header, hdr, len(data))
	m.Header.Set(HdrKind, kind)
	m.Header.Set(HdrSeq, strconv.FormatUint(seq, 10))
	if status != 0 {
		m.Header.Set(HdrStatus, strconv.Itoa(status))
	}
	if errMsg != "" {
		m.Header.Set(HdrError, sanitize(errMsg))
	}
	m.Data = data
	return s.nc.PublishMsg(m)
}

// headMsg is the head of resp as a reply message to to: the engine's
// headers a client may see, its status, sequence 0.
func (s *Server) headMsg(to string, resp *http.Response) *nats.Msg {
	m := nats.NewMsg(to)
	s.copyHeaders(m.Header, resp.Header, 0)
	m.Header.Set(HdrKind, KindHead)
	m.Header.Set(HdrSeq, "0")
	m.Header.Set(HdrStatus, strconv.Itoa(resp.StatusCode))
	return m
}

// replyHead sends the head of a response whose body follows in chunks;
// closeDelimited is HdrCloseDelimited's value ("" for none).
func (s *Server) replyHead(to string, resp *http.Response, closeDelimited string) error {
	m := s.headMsg(to, resp)
	if resp.ContentLength >= 0 {
		// copyHeaders drops it with the framing headers, but the router
		// frames its client's answer by it, as over HTTP.
		m.Header.Set("Content-Length", strconv.FormatInt(resp.ContentLength, 10))
	}
	if closeDelimited != "" {
		m.Header.Set(HdrCloseDelimited, closeDelimited)
	}
	return s.nc.PublishMsg(m)
}

// replyLast sends a whole response, head and body, in one message, or in
// three (head, body, end) when the engine's headers and the body together
// pass the broker's max_payload.
func (s *Server) replyLast(to string, resp *http.Response, body []byte) {
	m := s.headMsg(to, resp)
	if headerBytes(m.Header)+len(body) > int(s.nc.MaxPayload()) {
		if s.nc.PublishMsg(m) != nil {
			return // NATS gone: nobody to tell
		}
		dm := nats.NewMsg(to)
		dm.Header.Set(HdrKind, KindData)
		dm.Header.Set(HdrSeq, "1")
		dm.Data = body
		if s.nc.PublishMsg(dm) == nil {
			s.reply(to, 2, KindEnd, 0, "", nil, nil)
		}
		return
	}
	m.Header.Set(HdrLast, "1")
	m.Data = body
	s.nc.PublishMsg(m)
}

// ownHeaderBytes is room kept in a reply for the broker's own headers
// (kind, sequence, status, last, error).
const ownHeaderBytes = 512

// copyHeaders adds to dst the engine headers of src a client may see, as
// many as fit, beside a body of n bytes and the broker's own headers, in
// the broker's max_payload: a reply that does not fit is refused by NATS,
// and the router would wait for it in vain. Headers past that are dropped
// (logged).
func (s *Server) copyHeaders(dst nats.Header, src http.Header, n int) {
	budget := int(s.nc.MaxPayload()) - n - ownHeaderBytes
	dropped := 0
	for k, vs := range src {
		if skipHeader(k) {
			continue
		}
		for _, v := range vs {
			if !validHeaderValue(v) {
				continue
			}
			if budget -= len(k) + len(v) + 4; budget < 0 {
				dropped++
				continue
			}
			dst.Add(k, v)
		}
	}
	if dropped > 0 {
		slog.Warn("engine headers dropped: they pass the broker's max_payload", "worker", s.cfg.WorkerID, "dropped", dropped)
	}
}

// headerBytes is about the size of h encoded in a NATS message.
func headerBytes(h nats.Header) int {
	n := len("NATS/1.0\r\n\r\n")
	for k, vs := range h {
		for _, v := range vs {
			n += len(k) + len(v) + 4
		}
	}
	return n
}

// replyEngineError answers a request whose engine exchange failed before
// a response head: 502, with HdrReason saying how: the engine could not be
// connected to (nothing was sent to it), it answered something that is not
// HTTP, or the connection broke before a head (the engine may have read
// the request: it crashed, or closed an idle connection), as the HTTP
// transport tells them apart.
func (s *Server) replyEngineError(to string, err error) {
	m := nats.NewMsg(to)
	m.Header.Set(HdrKind, KindError)
	m.Header.Set(HdrSeq, "0")
	m.Header.Set(HdrStatus, strconv.Itoa(http.StatusBadGateway))
	m.Header.Set(HdrError, sanitize(err.Error()))
	m.Header.Set(HdrReason, engineFailure(err))
	s.nc.PublishMsg(m)
}

// engineFailure is HdrReason's value for an engine exchange that failed
// before a response head.
func engineFailure(err error) string {
	var op *net.OpError
	switch {
	case errors.As(err, &op) && op.Op == "dial":
		return ReasonUnreachable
	case h1.Invalid(err): // a head the router's HTTP client refuses too (judgedConn)
		return ReasonProtocol
	case strings.Contains(err.Error(), "malformed"): // net/http's words for a head that is not HTTP
		return ReasonProtocol
	case strings.Contains(err.Error(), "transfer encoding"): // a coding other than chunked, as over HTTP
		return ReasonProtocol
	case errors.Is(err, io.ErrUnexpectedEOF): // a head cut part-way: it answered, not HTTP
		return ReasonProtocol
	}
	return ReasonBroken
}

// engineDo sends req with body to the engine. A reused keep-alive
// connection that the engine had closed (it ends or resets before any byte
// of an answer: the engine closed it as idle while the request went out)
// is no engine that could not be reached: the request goes again, once, on
// another connection, as the router's HTTP transport sends it
// (proxy/transport_http.go); a request the router sends once (no HdrResend) only
// if none of it was written.
func (s *Server) engineDo(ctx context.Context, req *http.Request, body []byte, once bool) (*http.Response, error) {
	for try := 0; ; try++ {
		var ex exchange
		r := req.WithContext(httptrace.WithClientTrace(ctx, ex.trace()))
		r.Body, r.ContentLength = http.NoBody, int64(len(body))
		if len(body) > 0 {
			r.Body = io.NopCloser(bytes.NewReader(body))
		}
		// Never replayed by net/http (no GetBody): a client's
		// Idempotency-Key (passed through) made a POST replayable, and a
		// reused connection that closed after the write got it sent again,
		// a PD leg twice. The replay is this loop's, by the router's rules.
		resp, err := s.hc.Do(r)
		if err == nil || try > 0 || ctx.Err() != nil || !ex.reused.Load() || ex.answered.Load() ||
			!staleConn(err) || once && ex.wrote.Load() {
			return resp, err
		}
		mSrvStaleRetries.Inc()
	}
}

// exchange is what the trace of one engine request saw.
type exchange struct {
	reused   atomic.Bool // the connection had carried an earlier request
	wrote    atomic.Bool // the request was written whole
	answered atomic.Bool // a byte of an answer was read
}

func (ex *exchange) trace() *httptrace.ClientTrace {
	return &httptrace.ClientTrace{
		GotConn: func(info httptrace.GotConnInfo) {
			expectHead(info)
			ex.reused.Store(info.Reused)
		},
		WroteRequest: func(w httptrace.WroteRequestInfo) {
			if w.Err == nil {
				ex.wrote.Store(true)
			}
		},
		GotFirstResponseByte: func() { ex.answered.Store(true) },
	}
}

// staleConn reports the error of an engine request whose connection ended
// or was reset before an answer (net/http's "server closed idle
// connection" included), not a head the router's rules refuse.
func staleConn(err error) bool {
	if h1.Invalid(err) {
		return false
	}
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) ||
		strings.Contains(err.Error(), "server closed idle connection")
}

// errShutdown is why a request aborted by Close failed.
var errShutdown = errors.New("the worker shut down with the request in flight")

// answerErr is the error to answer a request with whose engine exchange
// ended with err on ctx, or nil when no answer is due: its router canceled
// it (or is gone), so nobody listens. A request Close aborted gets
// errShutdown: its router still waits, and would notice only when its
// probes of this worker found it gone, 6-8 s later.
func (s *Server) answerErr(ctx context.Context, err error) error {
	switch {
	case ctx.Err() == nil && !errors.Is(err, context.Canceled):
		return err
	case s.closing.Load():
		return errShutdown
	}
	return nil
}

// stopProbing ends the probes of request id (see Server.probeLoop).
func (s *Server) stopProbing(id string) {
	s.mu.Lock()
	if r := s.reqs[id]; r != nil {
		r.probe = ""
	}
	s.mu.Unlock()
}

func sanitize(s string) string {
	s = strings.ReplaceAll(s, "\r", " ")
	return strings.ReplaceAll(s, "\n", " ")
}

func (s *Server) onRequest(m *nats.Msg) {
	if m.Reply == "" {
		return
	}
	mSrvRequests.Inc()
	n := s.inflight.Add(1)
	if s.cfg.MaxPending > 0 && n > int64(s.cfg.MaxPending) {
		s.inflight.Add(-1)
		mSrvRejected.Inc()
		s.reply(m.Reply, 0, KindError, http.StatusTooManyRequests, fmt.Sprintf("worker %s at max pending %d", s.cfg.WorkerID, s.cfg.MaxPending), nil, nil)
		return
	}
	id := m.Header.Get(HdrID)
	ctx, cancel := context.WithCancel(context.Background())
	s.mu.Lock()
	if _, gone := s.early[id]; gone && id != "" {
		// The router canceled before we got here: do not start the engine.
		delete(s.early, id)
		s.mu.Unlock()
		cancel()
		s.inflight.Add(-1)
		mSrvCanceled.Inc()
		return
	}
	if id != "" {
		r := &served{cancel: cancel}
		if m.Header.Get(HdrProbe) == "1" && ValidWorkerID(id) && s.goneInbox != "" {
			if i := strings.LastIndexByte(m.Reply, '.'); i > 0 {
				r.probe = m.Reply[:i] + ".probe"
			}
		}
		s.reqs[id] = r
	}
	s.mu.Unlock()
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer s.inflight.Add(-1)
		defer func() {
			s.mu.Lock()
			delete(s.reqs, id)
			s.mu.Unlock()
			cancel()
		}()
		s.serve(ctx, m, id)
	}()
}

func (s *Server) serve(ctx context.Context, m *nats.Msg, id string) {
	method := m.Header.Get(HdrMethod)
	if method == "" {
		method = http.MethodPost
	}
	path := m.Header.Get(HdrPath)
	if !strings.HasPrefix(path, "/") {
		s.reply(m.Reply, 0, KindError, http.StatusBadRequest, fmt.Sprintf("bad path %q", path), nil, nil)
		return
	}
	req, err := http.NewRequestWithContext(ctx, method, s.engine+path, nil)
	if err != nil {
		s.reply(m.Reply, 0, KindError, http.StatusBadRequest, err.Error(), nil, nil)
		return
	}
	for k, vs := range m.Header {
		if !skipHeader(k) {
			req.Header[k] = vs
		}
	}
	resp, err := s.engineDo(ctx, req, m.Data, m.Header.Get(HdrResend) != "1")
	if err != nil {
		if err = s.answerErr(ctx, err); err != nil {
			s.stopProbing(id) // the router has its answer once this is out
			s.replyEngineError(m.Reply, err)
		}
		return
	}
	defer resp.Body.Close()
	bp := s.bufs.Get().(*[]byte)
	defer s.bufs.Put(bp)
	buf := *bp
	// The broker reconnected to may take less than the one NewServer saw
	// (a cluster node configured apart, a restart with a new config): a
	// reply past its max_payload would be refused, and the answer lost.
	if max := int(s.nc.MaxPayload()) - 1024; max > 0 && len(buf) > max {
		buf = buf[:max]
	}
	if resp.ContentLength >= 0 && resp.ContentLength <= int64(len(buf)) && resp.StatusCode < 400 {
		// Small fixed-length body: head and body in one message. (Not an
		// error answer: its head goes out at once, so the router bounds
		// the wait for its body and may retry it, as over HTTP.)
		n, err := io.ReadFull(resp.Body, buf[:resp.ContentLength])
		// From here the router has the whole reply as soon as it is out: a
		// probe would find the request over there and answer 'gone'.
		s.stopProbing(id)
		if err == nil {
			s.replyLast(m.Reply, resp, buf[:n])
			return
		}
		if err = s.answerErr(ctx, err); err != nil {
			// The engine answered and broke off: as over HTTP, the head
			// and what came of the body, then the break.
			slog.Warn("engine answer broke", "worker", s.cfg.WorkerID, "path", path, "err", err)
			if s.reply(m.Reply, 0, KindHead, resp.StatusCode, "", resp.Header, buf[:n]) == nil {
				s.reply(m.Reply, 1, KindEnd, 0, "cannot read engine response: "+err.Error(), nil, nil)
			}
		}
		return
	}
	var cd string
	if resp.ContentLength < 0 && len(resp.TransferEncoding) == 0 {
		cd = "1"
	}
	if err := s.replyHead(m.Reply, resp, cd); err != nil {
		return
	}
	seq := uint64(1)
	// One reused message for data chunks: PublishMsg encodes synchronously.
	dm := nats.NewMsg(m.Reply)
	dm.Header.Set(HdrKind, KindData)
	if s.goneInbox != "" && ValidWorkerID(id) { // one subject token
		dm.Reply = s.goneInbox + "." + id // see Server.goneInbox
	}
	for {
		n, rerr := resp.Body.Read(buf)
		if n > 0 {
			if seq == 1 && dm.Reply != "" {
				s.stopProbing(id) // the chunks check the router from now on
			}
			dm.Header.Set(HdrSeq, strconv.FormatUint(seq, 10))
			dm.Data = buf[:n]
			if err := s.nc.PublishMsg(dm); err != nil {
				return // NATS gone: nobody to tell
			}
			seq++
		}
		if rerr == io.EOF {
			s.reply(m.Reply, seq, KindEnd, 0, "", nil, nil)
			return
		}
		if rerr != nil {
			if rerr = s.answerErr(ctx, rerr); rerr == nil {
				return // canceled by the router: it is not listening
			}
			slog.Warn("engine stream broke", "worker", s.cfg.WorkerID, "path", path, "err", rerr)
			s.reply(m.Reply, seq, KindEnd, 0, rerr.Error(), nil, nil)
			return
		}
	}
}
