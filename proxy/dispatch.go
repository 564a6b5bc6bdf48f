package proxy

import (
	"errors"
	"io"
	"time"

	"github.com/infera/infera/config"
	"github.com/infera/infera/fleet"
	"github.com/infera/infera/internal/logx"
	"github.com/infera/infera/sched"
	"github.com/valyala/fasthttp"
)

var methodPOST = []byte("POST")

// dispatch is the one request path for every transport: pick a worker
// (a lease), send, and either commit the answer to the client or, when the
// attempt failed before the first byte, end the lease with the failure's
// outcome and try another worker. Error-to-status mapping is failure's.
func (s *Server) dispatch(ctx *fasthttp.RequestCtx, cfg *config.Config, rs *reqState) {
	r := &rs.sreq
	attempts := 1 + s.flags.RequestMaxRetries
	if n := len(s.sched.Fleet.View().All); cap(rs.scratch) < n {
		rs.scratch = make([]*fleet.Worker, 0, 2*n)
	}
	c := &rs.call
	c.method = methodPOST
	c.path = rs.path
	rs.hdr = appendForwardHeaders(rs.hdr[:0], &ctx.Request.Header, s.authBytes != nil)
	c.hdr = rs.hdr
	c.stream = r.Stream
	t := &cfg.Timeouts
	if r.Stream {
		if t.StreamTotalSeconds > 0 {
			c.total = rs.start.Add(secs(t.StreamTotalSeconds))
		}
		c.idle = secs(t.StreamIdleSeconds)
	} else if t.NonStreamTotalSeconds > 0 {
		c.total = rs.start.Add(secs(t.NonStreamTotalSeconds))
	}
	if rs.clientFD = clientFD(ctx); rs.clientFD >= 0 {
		s.live.add(rs)
	}
	var last *failure
	allConnect, fleetDown := true, false
	for attempt := 0; attempt < attempts; attempt++ {
		if err := s.sched.Acquire(cfg, r, rs.scratch[:0], &rs.lease); err != nil {
			if last != nil {
				fleetDown = true // every candidate was tried
				break            // report the last worker failure
			}
			s.live.remove(rs)
			s.writeSchedError(ctx, r, err)
			return
		}
		if attempt > 0 {
			mRetries.Inc()
		}
		d := &rs.lease.Decision
		if d.Reason == sched.ReasonAllBreakersOpen {
			fleetDown = true
		}
		rs.fwd = rs.body
		if d.Rewrite {
			rs.fwd = rs.rewriteModel(rs.fwd, d.Model)
		}
		c.body = rs.fwd
		c.lease = &rs.lease
		c.firstByte = c.total
		now := rs.start
		if attempt > 0 {
			now = time.Now()
		}
		c.now = now.UnixNano()
		if r.Stream && t.StreamFirstPacketSeconds > 0 {
			fb := now.Add(secs(t.StreamFirstPacketSeconds))
			if c.total.IsZero() || fb.Before(c.total) {
				c.firstByte = fb
			}
		}
		up, f := s.tr.roundTrip(c)
		if f == nil {
			status := up.status()
			if (status >= 500 || status == fasthttp.StatusTooManyRequests) && attempt < attempts-1 {
				rs.stashAnswer(up, status)
				f = &failure{kind: failStatus, status: status}
				if status == fasthttp.StatusTooManyRequests {
					rs.lease.Done(sched.OutcomeNeutral)
				} else {
					rs.lease.Done(sched.OutcomeFault)
					mUpstreamErr.Inc()
				}
				last, allConnect = f, false
				r.Tried = append(r.Tried, d.Worker.Idx)
				continue
			}
			// Read the first bytes before committing, so a failure before
			// the first byte can still go to another worker.
			n, rerr := up.read(rs.rbuf)
			if n > 0 || rerr == nil || rerr == io.EOF {
				s.live.remove(rs)
				rs.lease.FirstToken()
				rs.ttft = time.Since(rs.start)
				mTTFT.Update(rs.ttft.Seconds())
				s.commit(ctx, cfg, rs, up, status, n, rerr == io.EOF)
				return
			}
			f = up.readFailure(rerr, false)
			up.finish(false)
		}
		rs.lease.Done(f.outcome())
		s.countFailure(d.Worker, f)
		last = f
		if f.kind != failConnect {
			allConnect = false
		}
		if !f.retryable() || c.cancel.wasAborted() {
			break
		}
		r.Tried = append(r.Tried, d.Worker.Idx)
		c.cancel.reset()
	}
	s.live.remove(rs)
	if last != nil && last.kind == failStatus && rs.errStatus != 0 {
		// Every worker tried answered an error: relay the last answer, as a
		// proxy does with an upstream's response.
		countStatus(rs.errStatus)
		ctx.Response.Reset()
		ctx.SetStatusCode(rs.errStatus)
		if len(rs.errType) > 0 {
			ctx.Response.Header.SetContentTypeBytes(rs.errType)
		}
		ctx.SetBody(rs.errBody)
		return
	}
	s.writeFailure(ctx, last, allConnect && (fleetDown || s.healthyWorkers() == 0))
}

// stashAnswer keeps a small, complete error answer of a worker that is
// about to be retried elsewhere, in case it is the last answer there is.
func (rs *reqState) stashAnswer(up upResponse, status int) {
	rs.errStatus = 0
	n, err := up.read(rs.rbuf[:4096])
	if err == io.EOF && n > 0 {
		rs.errStatus = status
		rs.errBody = append(rs.errBody[:0], rs.rbuf[:n]...)
		rs.errType = append(rs.errType[:0], up.contentType()...)
		up.finish(true)
		return
	}
	up.finish(false)
}

// commit writes the response head and the body: at once when the whole
// body came with the first read (the common non-streaming case), else by
// handing the request to a relay.
func (s *Server) commit(ctx *fasthttp.RequestCtx, cfg *config.Config, rs *reqState, up upResponse, status, n int, eof bool) {
	resp := &ctx.Response
	h := &resp.Header
	h.SetStatusCode(status)
	if ct := up.contentType(); len(ct) > 0 {
		h.SetContentTypeBytes(ct)
	}
	up.copyHeaders(h)
	d := &rs.lease.Decision
	if cfg.Debug.DecisionHeader {
		h.Set("X-Infera-Worker", d.Worker.ID)
		rs.route = d.AppendRoute(rs.route[:0])
		h.SetBytesV("X-Infera-Route", rs.route)
	}
	outcome := statusOutcome(status)
	if status >= 400 {
		rs.lease.Verdict(outcome) // known now: do not hold a probe slot while the body is relayed
	}
	rs.usage.scan(rs.rbuf[:n])
	countStatus(status)
	if eof {
		resp.SetBody(rs.rbuf[:n])
		up.finish(true)
		rs.lease.Done(outcome)
		rs.usage.record()
		mDuration.Update(rs.ttft.Seconds()) // the whole answer came with the first read
		return
	}
	rl := relayPool.Get().(*relay)
	*rl = relay{
		s: s, rs: rs, up: up,
		buf: rs.rbuf, pending: rs.rbuf[:n],
		sse:     rs.sreq.Stream && status < 400,
		idle:    rs.call.idle,
		total:   rs.call.total,
		client:  ctx.Conn(),
		wto:     s.flags.ClientWriteTimeout,
		outcome: outcome,
	}
	rs.handedOff = true
	size := up.contentLength()
	if size > int64(^uint(0)>>1) {
		size = -1
	}
	resp.SetBodyStream(rl, int(size))
	if rs.sreq.Stream {
		resp.ImmediateHeaderFlush = true
	}
}

// statusOutcome is the breaker outcome of a response with status.
func statusOutcome(status int) sched.Outcome {
	switch {
	case status >= 500:
		return sched.OutcomeFault
	case status >= 400:
		return sched.OutcomeNeutral
	}
	return sched.OutcomeSuccess
}

// writeFailure answers a request whose every attempt failed before the
// first byte. When no worker could be reached and none is left to try (or
// every candidate's breaker is open), the fleet is down for this request:
// 503, not 502.
func (s *Server) writeFailure(ctx *fasthttp.RequestCtx, f *failure, allConnect bool) {
	if f == nil {
		f = fail(failConnect, nil)
	}
	if f.kind == failCanceled {
		mClientGone.Inc()
		countStatus(499)
		ctx.SetConnectionClose()
		ctx.Response.Reset()
		ctx.SetStatusCode(499)
		return
	}
	c := f.class()
	status, typ, code, msg := f.httpStatus(), c.typ, c.code, c.msg
	if f.kind == failConnect && allConnect {
		status, typ, code, msg = fasthttp.StatusServiceUnavailable, typeUnavailable, "no_workers_reachable", "no worker could be reached"
	}
	if f.kind == failStatus {
		if f.status == fasthttp.StatusTooManyRequests {
			typ, code, msg = typeRateLimit, "worker_busy", "every worker tried is at capacity"
		} else {
			msg = "every worker tried failed"
		}
	}
	countStatus(status)
	writeError(ctx, status, typ, msg, "", code)
}

// countFailure updates the failure metrics and logs (throttled, without
// client or engine bytes).
func (s *Server) countFailure(w *fleet.Worker, f *failure) {
	switch f.kind {
	case failCanceled:
		mClientGone.Inc()
		return
	case failTimeout, failWallClock, failSpent:
		mTimeouts.Inc()
	default:
		mUpstreamErr.Inc()
	}
	logUpstreamError(w, f)
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
		writeError(ctx, fasthttp.StatusServiceUnavailable, typeUnavailable, "no worker available for this request", "", "no_workers")
	case errors.Is(err, sched.ErrSessionRequired):
		countStatus(400)
		writeError(ctx, fasthttp.StatusBadRequest, typeInvalidRequest, err.Error(), "", "session_required")
	default:
		var st interface{ HTTPStatus() int }
		code := 503
		if errors.As(err, &st) {
			code = st.HTTPStatus()
		}
		countStatus(code)
		typ := typeUnavailable
		switch {
		case code == 429:
			typ = typeRateLimit
		case code < 500:
			typ = typeInvalidRequest
		}
		writeError(ctx, code, typ, err.Error(), "", "")
	}
}

// rewriteModel returns body with its model value replaced by model.
func (rs *reqState) rewriteModel(body []byte, model string) []byte {
	b := &rs.parsed
	if b.modelEnd <= b.modelStart || b.modelEnd > len(body) {
		return body
	}
	rs.rewrite = append(rs.rewrite[:0], body[:b.modelStart]...)
	rs.rewrite = appendJSONString(rs.rewrite, model)
	rs.rewrite = append(rs.rewrite, body[b.modelEnd:]...)
	return rs.rewrite
}

func secs(f float64) time.Duration { return time.Duration(f * float64(time.Second)) }

var upstreamLog = &logx.Throttle{Every: time.Second}

// logUpstreamError logs a worker failure: its kind and the transport's
// error (a network error, never bytes the engine sent).
func logUpstreamError(w *fleet.Worker, f *failure) {
	msg := ""
	if f.cause != nil {
		msg = f.cause.Error()
		if len(msg) > 200 {
			msg = msg[:200]
		}
	}
	upstreamLog.Warn("upstream request failed", "worker", w.ID, "kind", f.class().code, "err", msg)
}
