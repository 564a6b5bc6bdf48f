package proxy

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/infera/infera/broker"
	"github.com/infera/infera/config"
	"github.com/infera/infera/sched"
	"github.com/valyala/fasthttp"
)

// forwardNATS sends the request to d.Worker over NATS (--request-transport
// nats) with the same failover, breaker and relay semantics as HTTP. The
// NATS request controls (idle timeout, max duration, max pending) are the
// broker client's.
func (s *Server) forwardNATS(ctx *fasthttp.RequestCtx, cfg *config.Config, rs *reqState, d sched.Decision, start time.Time, final bool, fail *failure) outcome {
	w := d.Worker
	r := &rs.sreq
	hdr := make(http.Header, 8)
	for k, v := range ctx.Request.Header.All() {
		if isHopHeader(k) || eqFold(k, hdrWorkerID) || eqFold(k, hdrPrefillID) || eqFold(k, "Host") ||
			eqFold(k, "Content-Length") || (s.flags.APIKey != "" && eqFold(k, "Authorization")) {
			continue
		}
		hdr.Add(string(k), string(v))
	}
	prompt := d.PrefillTokens(r) // prefill load: the uncached part
	tokens := int64(r.PromptTokens) + int64(r.MaxTokens)
	bs := int64(s.o.BlockSize)
	blocks := (tokens + bs - 1) / bs
	w.Acquire(tokens, prompt, blocks)

	st, err := s.o.NATS.Do(context.Background(), w.ID, &broker.Request{
		Method: "POST", Path: string(ctx.RequestURI()), Header: hdr, Body: rs.fwd,
	})
	if err != nil {
		w.Release(tokens, prompt, blocks, false)
		code := broker.HTTPStatus(err)
		switch {
		case errors.Is(err, broker.ErrMaxPending), errors.Is(err, broker.ErrWorkerBusy), errors.Is(err, broker.ErrTooLarge),
			errors.Is(err, broker.ErrMaxDuration):
			// Admission, size and the request's own wall-clock cap are not
			// the worker's fault.
			w.Breaker.Abandon(d.Probe)
		default:
			if code == fasthttp.StatusGatewayTimeout {
				mTimeouts.Inc()
			} else {
				mUpstreamErr.Inc()
			}
			w.Breaker.Failure(time.Now().UnixNano())
		}
		typ := typeServer
		switch code {
		case fasthttp.StatusTooManyRequests:
			typ = typeRateLimit
		case fasthttp.StatusGatewayTimeout:
			typ = typeTimeout
		case fasthttp.StatusRequestEntityTooLarge:
			typ = typeInvalidRequest
		case fasthttp.StatusServiceUnavailable:
			typ = typeUnavailable
		}
		fail.set(code, typ, "worker "+w.ID+": "+err.Error(), "")
		logUpstreamError(w, err)
		if !broker.Retryable(err) {
			writeError(ctx, code, typ, fail.msg, "", "")
			return outDone
		}
		return outRetry
	}
	status := st.Status()
	if status >= 500 || status == fasthttp.StatusTooManyRequests {
		if status >= 500 {
			w.Breaker.Failure(time.Now().UnixNano())
			mUpstreamErr.Inc()
		} else {
			w.Breaker.Abandon(d.Probe)
		}
		if !final {
			fail.set(status, typeServer, "worker "+w.ID+" answered an error", "")
			st.Close()
			w.Release(tokens, prompt, blocks, false)
			return outRetry
		}
	} else if status >= 400 {
		w.Breaker.Abandon(d.Probe)
	}

	tp := acquireTap()
	n, rerr := readSome(st, tp.buf[:cap(tp.buf)])
	if n == 0 && rerr != nil && rerr != errEOF {
		st.Close()
		releaseTap(tp)
		w.Release(tokens, prompt, blocks, false)
		code := broker.HTTPStatus(rerr)
		typ := typeServer
		if code == fasthttp.StatusGatewayTimeout {
			typ = typeTimeout
			mTimeouts.Inc()
		}
		if errors.Is(rerr, broker.ErrMaxDuration) {
			w.Breaker.Abandon(d.Probe)
		} else {
			w.Breaker.Failure(time.Now().UnixNano())
		}
		fail.set(code, typ, "worker "+w.ID+": "+rerr.Error(), "")
		if !broker.Retryable(rerr) {
			writeError(ctx, code, typ, fail.msg, "", "")
			return outDone
		}
		return outRetry
	}
	w.FirstToken(prompt)
	mTTFT.Update(time.Since(start).Seconds())
	tp.pending = tp.buf[:n]
	tp.upEOF = rerr == errEOF
	tp.s, tp.w, tp.body = s, w, st
	tp.sse = r.Stream
	tp.start = start
	tp.tokens, tp.prompt, tp.blocks, tp.probe = tokens, prompt, blocks, d.Probe
	tp.ok = status < 400
	tp.usage.scan(tp.pending)

	h := &ctx.Response.Header
	h.SetStatusCode(status)
	for k, vs := range st.Header() {
		kb := []byte(k)
		if isHopHeader(kb) || isSkippedRespHeader(kb) {
			if eqFold(kb, "Content-Type") && len(vs) > 0 {
				h.SetContentType(vs[0])
			}
			continue
		}
		for _, v := range vs {
			h.Add(k, v)
		}
	}
	if cfg.Debug.DecisionHeader {
		h.Set("X-Infera-Worker", w.ID)
	}
	if r.Stream {
		ctx.Response.SetBodyStream(tp, -1)
		ctx.Response.ImmediateHeaderFlush = true
	} else {
		ctx.Response.SetBodyStream(tp, -1)
	}
	return outDone
}
