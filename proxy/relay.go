package proxy

import (
	"errors"
	"io"
	"net"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/infera/infera/broker"
	"github.com/infera/infera/config"
	"github.com/infera/infera/fleet"
	"github.com/infera/infera/sched"
	"github.com/valyala/fasthttp"
)

type outcome uint8

const (
	outDone  outcome = iota // a response (or stream) was committed to the client
	outRetry                // failed before the first byte; rs.fail says why
)

// failure is why the last attempt failed before its first byte.
type failure struct {
	status int
	typ    string
	msg    string
	code   string
	// body and contentType hold an upstream error response to relay as-is.
	body        []byte
	contentType []byte
}

func (f *failure) set(status int, typ, msg, code string) {
	f.status, f.typ, f.msg, f.code = status, typ, msg, code
	f.body, f.contentType = f.body[:0], f.contentType[:0]
}

func (s *Server) dispatch(ctx *fasthttp.RequestCtx, cfg *config.Config, rs *reqState) {
	r := &rs.sreq
	start := s.now()
	attempts := 1 + s.flags.RequestMaxRetries
	if n := len(s.sched.Fleet.View().All); cap(rs.scratch) < n {
		rs.scratch = make([]*fleet.Worker, 0, 2*n)
	}
	fail := &rs.fail
	fail.set(0, "", "", "")
	for attempt := 0; attempt < attempts; attempt++ {
		d, err := s.sched.Pick(cfg, r, rs.scratch[:0])
		if err != nil {
			if attempt > 0 {
				break // report the last upstream failure
			}
			s.writeSchedError(ctx, r, err)
			return
		}
		if attempt > 0 {
			mRetries.Inc()
		}
		countLayer(d.Layer)
		rs.fwd = ctx.PostBody()
		if d.Rewrite {
			rs.fwd = rs.rewriteModel(rs.fwd, d.Model)
		}
		if cfg.Debug.DecisionHeader {
			rs.route = d.AppendRoute(rs.route[:0])
			ctx.Response.Header.SetBytesV("X-Infera-Route", rs.route)
		}
		fwd := s.forward
		if s.o.NATS != nil {
			fwd = s.forwardNATS
		}
		if fwd(ctx, cfg, rs, d, start, attempt == attempts-1, fail) == outDone {
			countStatus(ctx.Response.StatusCode())
			return
		}
		r.Tried = append(r.Tried, d.Worker.Idx)
	}
	countStatus(fail.status)
	if len(fail.body) > 0 {
		ctx.Response.Reset()
		ctx.SetStatusCode(fail.status)
		ctx.Response.Header.SetContentTypeBytes(fail.contentType)
		ctx.SetBody(fail.body)
		return
	}
	writeError(ctx, fail.status, fail.typ, fail.msg, "", fail.code)
}

func (s *Server) writeSchedError(ctx *fasthttp.RequestCtx, r *sched.Request, err error) {
	switch {
	case errors.Is(err, sched.ErrUnknownModel):
		countStatus(404)
		msg := "The model `" + string(r.Model) + "` does not exist or is not served by any worker"
		var hint interface{ Suggestions() []string }
		if errors.As(err, &hint) {
			if names := hint.Suggestions(); len(names) > 0 {
				msg += "; close names: "
				for i, n := range names {
					if i > 0 {
						msg += ", "
					}
					msg += n
				}
			}
		}
		writeError(ctx, fasthttp.StatusNotFound, typeNotFound, msg, "model", "model_not_found")
	case errors.Is(err, sched.ErrNoWorkers), errors.Is(err, sched.ErrExhausted):
		countStatus(503)
		writeError(ctx, fasthttp.StatusServiceUnavailable, typeUnavailable, err.Error(), "", "no_workers")
	default:
		var st interface{ HTTPStatus() int }
		if errors.As(err, &st) {
			code := st.HTTPStatus()
			countStatus(code)
			typ := typeInvalidRequest
			if code >= 500 {
				typ = typeServer
			} else if code == 429 {
				typ = typeRateLimit
			}
			writeError(ctx, code, typ, err.Error(), "", "")
			return
		}
		countStatus(503)
		writeError(ctx, fasthttp.StatusServiceUnavailable, typeUnavailable, err.Error(), "", "")
	}
}

// rewriteModel returns body with its model value replaced by model.
func (rs *reqState) rewriteModel(body []byte, model string) []byte {
	b := &rs.body
	if b.modelEnd <= b.modelStart || b.modelEnd > len(body) {
		return body
	}
	rs.rewrite = append(rs.rewrite[:0], body[:b.modelStart]...)
	rs.rewrite = appendJSONString(rs.rewrite, model)
	rs.rewrite = append(rs.rewrite, body[b.modelEnd:]...)
	return rs.rewrite
}

func secs(f float64) time.Duration { return time.Duration(f * float64(time.Second)) }

// forward sends the request to d.Worker over HTTP and commits the answer, or
// reports a failure before the first response byte.
func (s *Server) forward(ctx *fasthttp.RequestCtx, cfg *config.Config, rs *reqState, d sched.Decision, start time.Time, final bool, fail *failure) outcome {
	w := d.Worker
	r := &rs.sreq
	hc, ok := w.Client.(*fasthttp.HostClient)
	if !ok {
		w.Breaker.Abandon(d.Probe)
		fail.set(fasthttp.StatusBadGateway, typeServer, "worker "+w.ID+" is not reachable over HTTP", "")
		return outRetry
	}
	req := fasthttp.AcquireRequest()
	ctx.Request.Header.CopyTo(&req.Header)
	req.Header.Del(hdrWorkerID)
	req.Header.Del(hdrPrefillID)
	if s.flags.APIKey != "" {
		req.Header.Del("Authorization")
	}
	req.Header.SetHost(w.Addr)
	if w.TLS {
		req.URI().SetScheme("https") // HostClient{IsTLS} refuses an http URI
	}
	req.SetBodyRaw(rs.fwd)

	prompt := d.PrefillTokens(r) // prefill load: the uncached part
	tokens := int64(r.PromptTokens) + int64(r.MaxTokens)
	bs := int64(s.o.BlockSize)
	blocks := (tokens + bs - 1) / bs
	w.Acquire(tokens, prompt, blocks)

	t := &cfg.Timeouts
	var deadline, total time.Time
	if r.Stream {
		if t.StreamTotalSeconds > 0 {
			total = start.Add(secs(t.StreamTotalSeconds))
		}
		if t.StreamFirstPacketSeconds > 0 {
			deadline = time.Now().Add(secs(t.StreamFirstPacketSeconds))
		}
		if !total.IsZero() && (deadline.IsZero() || total.Before(deadline)) {
			deadline = total
		}
	} else if t.NonStreamTotalSeconds > 0 {
		deadline = start.Add(secs(t.NonStreamTotalSeconds))
	}

	if !deadline.IsZero() && !time.Now().Before(deadline) {
		// The request's budget was spent by earlier attempts: the worker
		// was never contacted, so it gets no breaker fault.
		fasthttp.ReleaseRequest(req)
		w.Release(tokens, prompt, blocks, false)
		w.Breaker.Abandon(d.Probe)
		mTimeouts.Inc()
		fail.set(fasthttp.StatusGatewayTimeout, typeTimeout, "request deadline passed before worker "+w.ID+" was tried", "timeout")
		return outRetry
	}
	resp := fasthttp.AcquireResponse()
	resp.StreamBody = r.Stream // non-stream bodies are read whole inside Do
	var err error
	if deadline.IsZero() {
		err = hc.Do(req, resp)
	} else {
		err = hc.DoDeadline(req, resp, deadline)
	}
	fasthttp.ReleaseRequest(req)
	if err != nil {
		w.Release(tokens, prompt, blocks, false)
		fasthttp.ReleaseResponse(resp)
		s.upstreamFailed(w, d.Probe, err, fail)
		return outRetry
	}

	status := resp.StatusCode()
	stream := resp.BodyStream()
	if status >= 500 || status == fasthttp.StatusTooManyRequests {
		if status >= 500 {
			w.Breaker.Failure(time.Now().UnixNano())
			mUpstreamErr.Inc()
		} else {
			w.Breaker.Abandon(d.Probe)
		}
		if !final {
			typ := typeServer
			if status == fasthttp.StatusTooManyRequests {
				typ = typeRateLimit
			}
			fail.set(status, typ, "worker "+w.ID+" answered "+strconv.Itoa(status), "")
			if stream == nil {
				fail.body = append(fail.body, resp.Body()...)
				fail.contentType = append(fail.contentType, resp.Header.ContentType()...)
			}
			resp.CloseBodyStream()
			w.Release(tokens, prompt, blocks, false)
			fasthttp.ReleaseResponse(resp)
			return outRetry
		}
	} else if status >= 400 {
		w.Breaker.Abandon(d.Probe)
	}

	if stream == nil {
		// Whole body already read (fixed length): copy and finish.
		if status < 400 {
			w.Breaker.Success(d.Probe)
		}
		copyResponseHeaders(ctx, resp)
		ctx.Response.SetBodyRaw(nil)
		ctx.Response.SetBody(resp.Body())
		var u usage
		u.scan(resp.Body())
		u.record()
		w.Release(tokens, prompt, blocks, false)
		fasthttp.ReleaseResponse(resp)
		el := time.Since(start).Seconds()
		mTTFT.Update(el)
		mDuration.Update(el)
		if cfg.Debug.DecisionHeader {
			ctx.Response.Header.Set("X-Infera-Worker", w.ID)
		}
		return outDone
	}

	// Streamed body: read the first chunk before committing, so a failure
	// before the first byte can still go to another worker.
	tp := acquireTap()
	n, rerr := readSome(stream, tp.buf[:cap(tp.buf)])
	if n == 0 && rerr != nil && rerr != io.EOF {
		closeStream(stream, rerr)
		releaseTap(tp)
		w.Release(tokens, prompt, blocks, false)
		fasthttp.ReleaseResponse(resp)
		s.upstreamFailed(w, d.Probe, rerr, fail)
		return outRetry
	}
	w.FirstToken(prompt)
	mTTFT.Update(time.Since(start).Seconds())
	tp.pending = tp.buf[:n]
	tp.upEOF = rerr == io.EOF
	tp.s, tp.w, tp.up, tp.body = s, w, resp, stream
	tp.conn = connOf(resp)
	tp.sse = r.Stream
	tp.start, tp.total = start, total
	// For status >= 400 the breaker was told above; the probe is settled.
	tp.tokens, tp.prompt, tp.blocks, tp.probe = tokens, prompt, blocks, d.Probe && status < 400
	tp.ok = status < 400
	if r.Stream {
		tp.idle = secs(t.StreamIdleSeconds)
		tp.refresh()
	}
	tp.usage.scan(tp.pending)
	copyResponseHeaders(ctx, resp)
	if cfg.Debug.DecisionHeader {
		ctx.Response.Header.Set("X-Infera-Worker", w.ID)
	}
	ctx.Response.SetBodyStream(tp, -1)
	ctx.Response.ImmediateHeaderFlush = true
	return outDone
}

// upstreamFailed classifies a transport error before the first byte.
func (s *Server) upstreamFailed(w *fleet.Worker, probe bool, err error, fail *failure) {
	switch {
	case errors.Is(err, fasthttp.ErrNoFreeConns):
		// Local connection limit: not the worker's fault.
		w.Breaker.Abandon(probe)
		fail.set(fasthttp.StatusServiceUnavailable, typeUnavailable, "too many concurrent requests to worker "+w.ID, "")
	case isTimeout(err):
		mTimeouts.Inc()
		w.Breaker.Failure(time.Now().UnixNano())
		fail.set(fasthttp.StatusGatewayTimeout, typeTimeout, "worker "+w.ID+" did not answer in time", "timeout")
	default:
		mUpstreamErr.Inc()
		w.Breaker.Failure(time.Now().UnixNano())
		fail.set(fasthttp.StatusBadGateway, typeServer, "cannot reach worker "+w.ID+": "+err.Error(), "upstream_error")
	}
	logUpstreamError(w, err)
}

func isTimeout(err error) bool {
	if errors.Is(err, fasthttp.ErrTimeout) || errors.Is(err, os.ErrDeadlineExceeded) {
		return true
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// readSome reads at least one byte unless the stream fails or ends.
func readSome(r io.Reader, p []byte) (int, error) {
	for i := 0; i < 100; i++ {
		n, err := r.Read(p)
		if n > 0 || err != nil {
			return n, err
		}
	}
	return 0, io.ErrNoProgress
}

var errEOF = io.EOF

// closeStream closes an upstream body: fasthttp streams take the error
// (non-nil discards the connection), other streams (NATS) are closed.
func closeStream(r io.Reader, err error) {
	switch c := r.(type) {
	case fasthttp.ReadCloserWithError:
		c.CloseWithError(err)
	case io.Closer:
		c.Close()
	}
}

func copyResponseHeaders(ctx *fasthttp.RequestCtx, resp *fasthttp.Response) {
	h := &ctx.Response.Header
	h.SetStatusCode(resp.StatusCode())
	h.SetContentTypeBytes(resp.Header.ContentType())
	for k, v := range resp.Header.All() {
		if isHopHeader(k) || isSkippedRespHeader(k) {
			continue
		}
		h.AddBytesKV(k, v)
	}
}

func isSkippedRespHeader(k []byte) bool {
	switch len(k) {
	case 4:
		return eqFold(k, "Date")
	case 6:
		return eqFold(k, "Server")
	case 12:
		return eqFold(k, "Content-Type")
	case 14:
		return eqFold(k, "Content-Length")
	}
	return false
}

func eqFold(b []byte, s string) bool {
	if len(b) != len(s) {
		return false
	}
	for i := 0; i < len(b); i++ {
		c, d := b[i]|0x20, s[i]|0x20
		if c != d {
			return false
		}
	}
	return true
}

// tap relays an upstream body stream to the client: each Read returns what
// the upstream delivered (one flushed chunk to the client), refreshes the
// streaming idle deadline, and scans for usage. fasthttp calls CloseWithError
// from the same goroutine when the response is done or the client is gone.
type tap struct {
	s     *Server
	w     *fleet.Worker
	up    *fasthttp.Response
	body  io.Reader
	conn  *dconn
	buf   []byte
	tail  []byte
	usage usage

	pending []byte // first chunk, read before committing
	start   time.Time
	total   time.Time
	idle    time.Duration
	sse     bool
	ok      bool // status < 400
	upEOF   bool
	upErr   error

	tokens, prompt, blocks int64
	probe                  bool
}

var tapPool = sync.Pool{New: func() any { return &tap{buf: make([]byte, 0, 16<<10)} }}

func acquireTap() *tap { return tapPool.Get().(*tap) }

func releaseTap(t *tap) {
	buf, tail := t.buf[:0], t.tail[:0]
	*t = tap{buf: buf, tail: tail}
	tapPool.Put(t)
}

// refresh sets the read deadline for the next chunk: idle from now, capped by
// the stream's total deadline; no deadline when both are off.
func (t *tap) refresh() {
	if t.conn == nil {
		return
	}
	var dl time.Time
	if t.idle > 0 {
		dl = time.Now().Add(t.idle)
	}
	if !t.total.IsZero() && (dl.IsZero() || t.total.Before(dl)) {
		dl = t.total
	}
	t.conn.setReadDeadline(dl)
}

// Read implements io.Reader.
func (t *tap) Read(p []byte) (int, error) {
	if len(t.pending) > 0 {
		n := copy(p, t.pending)
		t.pending = t.pending[n:]
		return n, nil
	}
	if len(t.tail) > 0 {
		n := copy(p, t.tail)
		t.tail = t.tail[n:]
		return n, nil
	}
	if t.upEOF || t.upErr != nil {
		return 0, io.EOF
	}
	n, err := t.body.Read(p)
	if n > 0 {
		if t.sse {
			t.refresh()
		}
		t.usage.scan(p[:n])
	}
	if err == nil {
		return n, nil
	}
	if err == io.EOF {
		t.upEOF = true
		return n, io.EOF
	}
	// The upstream failed mid-stream: never retried. SSE streams end cleanly
	// with an error event; other bodies are cut (the client sees a short body).
	t.upErr = err
	mMidStreamErr.Inc()
	msg, typ := "upstream stream from worker "+t.w.ID+" failed", typeServer
	if isTimeout(err) {
		typ = typeTimeout
		mTimeouts.Inc()
		msg = "upstream stream from worker " + t.w.ID + " timed out"
	}
	if (isTimeout(err) && !t.total.IsZero() && !time.Now().Before(t.total)) || errors.Is(err, broker.ErrMaxDuration) {
		// The configured wall-clock cap, not a worker fault.
		t.w.Breaker.Abandon(t.probe)
	} else {
		t.w.Breaker.Failure(time.Now().UnixNano())
	}
	logUpstreamError(t.w, err)
	if !t.sse {
		return n, err
	}
	t.tail = appendSSEError(t.tail[:0], typ, msg)
	return n, nil
}

// CloseWithError implements fasthttp.ReadCloserWithError. err is non-nil when
// writing to the client failed (client gone): the upstream connection is then
// closed so the engine stops generating.
func (t *tap) CloseWithError(err error) error {
	switch {
	case err != nil:
		mClientGone.Inc()
		t.w.Breaker.Abandon(t.probe)
		closeStream(t.body, err)
	case t.upErr != nil:
		closeStream(t.body, t.upErr)
	default:
		if t.ok && t.upEOF {
			t.w.Breaker.Success(t.probe)
		} else {
			t.w.Breaker.Abandon(t.probe)
		}
		if t.conn != nil {
			t.conn.clearDeadline()
		}
		var cerr error
		if !t.upEOF {
			cerr = io.ErrUnexpectedEOF
		}
		closeStream(t.body, cerr)
	}
	t.usage.record()
	t.w.Release(t.tokens, t.prompt, t.blocks, true)
	mDuration.Update(time.Since(t.start).Seconds())
	if t.up != nil {
		fasthttp.ReleaseResponse(t.up)
	}
	releaseTap(t)
	return nil
}
