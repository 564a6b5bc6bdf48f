package proxy

import (
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strconv"
	"time"

	"github.com/infera/infera/config"
	"github.com/infera/infera/fleet"
	"github.com/infera/infera/govern"
	"github.com/infera/infera/internal/logx"
	"github.com/infera/infera/sched"
	upstreams "github.com/infera/infera/upstream"
	"github.com/valyala/fasthttp"
)

var methodPOST = []byte("POST")

// dispatch is the one request path for every transport: pick a worker
// (a lease), send, and either commit the answer to the client or, when the
// attempt failed before the first byte, end the lease with the failure's
// outcome and try another worker. With the split proxy on, the plan's
// entries (the local fleet, external upstreams) are tried in order the same
// way (split.go); global scheduling forwards to another region when the
// local fleet is saturated (global.go). Error-to-status mapping is
// failure's.
func (s *Server) dispatch(ctx *fasthttp.RequestCtx, cfg *config.Config, rs *reqState) {
	r := &rs.sreq
	if n := len(s.sched.Fleet.View().All); cap(rs.scratch) < n {
		rs.scratch = make([]*fleet.Worker, 0, 2*n)
	}
	c := &rs.call
	c.method = methodPOST
	if rs.acc.kind == kindResponseGet {
		c.method = methodGET // respstored.go
	}
	c.begin = rs.start
	var peer [maxPeerText]byte
	rs.hdr = appendForwardHeaders(rs.hdr[:0], &ctx.Request.Header, peerText(peer[:0], ctx), s.authOn(), rs.proto.mode == protoConvert)
	rs.hdr = appendRequestIDHeader(rs.hdr, rs.reqID)
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
	s.watch(ctx, rs)
	res := tries{allConnect: true}
	if cfg.SplitProxy.Enabled && (!byIDKind(rs.acc.kind) || s.heldByEntry(cfg, r.Prefer)) {
		// A stored Response is a local engine's, but one an external
		// entry made: the split proxy sends it to that entry alone.
		s.dispatchSplit(ctx, cfg, rs, &res)
	} else {
		s.dispatchLocal(ctx, cfg, rs, &res, false)
	}
	if res.committed {
		return
	}
	s.live.remove(rs)
	s.answerFailed(ctx, cfg, rs, &res)
}

// tries is how a request's attempts went.
type tries struct {
	committed bool     // an answer was committed to the client
	stop      bool     // the last failure may not be retried anywhere (client gone, deadline)
	last      *failure // the last attempt's failure
	// lastW is the worker whose attempt failed last (last's): a fleet
	// worker, an external upstream's standalone worker, or nil when the
	// failure is no attempt's (a seat refused, the client gone). The split
	// proxy unbinds a session only from the worker that refused it.
	lastW *fleet.Worker
	// relayedBy is the worker whose 429 or 5xx answer was committed as
	// the client's answer (no other attempt could follow it); nil when the
	// committed answer is not a refusal.
	relayedBy *fleet.Worker
	// schedErr is the scheduler's refusal before any local attempt (no
	// worker for the model, ...).
	schedErr error
	// seatRej is request rate limiting's refusal of a local seat (every
	// candidate at its concurrency limit, the queue full or timed out).
	seatRej *govern.Rejection
	// globalTried: global scheduling already had its go (forwardGlobal).
	// globalBusy: the model is no local worker's, and the members serving
	// it had no room. saturated: the request was counted in
	// infera_global_saturated_total (countSaturated).
	globalTried, globalBusy, saturated bool
	// allConnect: every failure was a connection failure; fleetDown: no
	// candidate is left (every one tried, or every breaker open).
	allConnect, fleetDown bool
}

// refuser is the worker whose refusal (429, 5xx, unreachable, a timeout,
// ...: failure.refusal) ended the request's attempts: the last failed
// attempt's, or the one whose 429 or 5xx answer was relayed as the answer;
// nil when the request was not refused.
func (res *tries) refuser() *fleet.Worker {
	if res.committed {
		return res.relayedBy
	}
	if res.last != nil && res.last.refusal() {
		return res.lastW
	}
	return nil
}

// dispatchLocal tries the local fleet: up to 1+--request-max-retries
// workers. more tells that other upstreams follow (split proxy failover),
// so the last worker's 5xx or 429 answer is kept aside rather than relayed.
func (s *Server) dispatchLocal(ctx *fasthttp.RequestCtx, cfg *config.Config, rs *reqState, res *tries, more bool) {
	r := &rs.sreq
	c := &rs.call
	if s.globalOn(cfg) && !s.pinnedLocal(r) && s.localSaturated(cfg, r) {
		countSaturated(res)
		if s.forwardGlobal(ctx, cfg, rs, res) {
			return
		}
	}
	if !poolingKind(rs.acc.kind) && !byIDKind(rs.acc.kind) && s.dispatchPD(ctx, cfg, rs, res) {
		return // a prefill+decode pair took it (pd.go); pooling requests never split
	}
	attempts := 1 + s.flags.RequestMaxRetries
	failed := false
	// Another region may take what the local fleet failed (every candidate
	// tried): the last local attempt's 5xx or 429 answer is then kept
	// aside too, relayed when no member takes the request.
	more = more || s.globalOn(cfg) && !res.globalTried && !hasHeader(&ctx.Request.Header, upstreams.HopHeader)
	for attempt := 0; attempt < attempts; attempt++ {
		if err := s.acquire(cfg, rs, &rs.lease, &rs.gov.seat); err != nil {
			if err == errUserRefused { // the deferred admission (govern.go): answerFailed answers it
				res.stop = true
				return
			}
			if rej, ok := seatRefusal(err); ok { // request rate limiting (govern.go)
				s.seatRefused(ctx, cfg, rs, res, rej)
				return
			}
			if failed {
				res.fleetDown = true // every candidate was tried
				s.failOverGlobal(ctx, cfg, rs, res)
				return // else report the last failure
			}
			res.schedErr = err
			if noWorker(err) && s.globalOn(cfg) {
				s.forwardGlobal(ctx, cfg, rs, res)
			}
			return
		}
		d := &rs.lease.Decision
		if attempt > 0 {
			mRetries.Inc()
			rs.acc.retries++
			if s.debug {
				logDebugRetry(rs, "", res.lastW, res.last, d.Worker.ID) // debuglog.go
			}
		}
		if d.Reason == sched.ReasonAllBreakersOpen {
			res.fleetDown = true
		}
		rs.ext.cur, rs.acc.tried = nil, d.Worker
		c.path, c.hdr = rs.path, rs.hdr
		// A Responses follow-up on the engine holding its previous
		// response (respaffinity.go) is not retried elsewhere: another
		// engine can only answer 404, hiding the failure the client may
		// retry.
		pinned := r.Prefer.ID != "" && r.Prefer.Is(d.Worker)
		switch s.attempt(ctx, cfg, rs, s.tr, (attempt < attempts-1 || more) && !pinned, res) {
		case attemptCommitted:
			return
		case attemptStop:
			s.forgetFailed(rs, res, d.Worker)
			return
		}
		if pinned {
			s.forgetFailed(rs, res, d.Worker)
			return
		}
		failed = true
		r.Tried = append(r.Tried, d.Worker.Idx)
		if attempt == attempts-1 {
			s.forgetFailed(rs, res, d.Worker)
			s.failOverGlobal(ctx, cfg, rs, res)
		}
	}
}

// failOverGlobal forwards a request whose local attempts all failed before
// the first byte to another region (forwardGlobal), unless the last
// failure may not be retried anywhere (the client left, the request's own
// deadline).
func (s *Server) failOverGlobal(ctx *fasthttp.RequestCtx, cfg *config.Config, rs *reqState, res *tries) {
	if res.stop || res.committed || !s.globalOn(cfg) {
		return
	}
	s.forwardGlobal(ctx, cfg, rs, res)
}

// forgetFailed takes the worker of a request's last failed attempt off the
// prefix index (a retry's pick does it for the others), unless the client
// left: then the engine may have cached the prompt before it was canceled.
func (s *Server) forgetFailed(rs *reqState, res *tries, w *fleet.Worker) {
	if res.last != nil && res.last.kind != failCanceled {
		s.sched.Forget(&rs.sreq, w)
	}
}

// attemptResult is how one attempt ended.
type attemptResult uint8

const (
	attemptCommitted attemptResult = iota // the answer went to the client
	attemptFailed                         // failed before the first byte: another upstream may take it
	attemptStop                           // failed, and nothing else may be tried
)

// attempt sends the request on the held lease through tr, reads the first
// bytes and commits the answer; or ends the lease with the failure's
// outcome and records the failure in res. mayRetry tells that another
// attempt may follow: a 5xx or 429 answer is then kept aside as a failure.
func (s *Server) attempt(ctx *fasthttp.RequestCtx, cfg *config.Config, rs *reqState, tr transport, mayRetry bool, res *tries) attemptResult {
	r := &rs.sreq
	c := &rs.call
	t := &cfg.Timeouts
	d := &rs.lease.Decision
	rs.fwd = rs.forwardBody()
	c.body = rs.fwd
	c.lease = &rs.lease
	c.firstByte = c.total
	now := rs.start
	if res.last != nil {
		now = time.Now() // a retry
	}
	c.now = now.UnixNano()
	if r.Stream && t.StreamFirstPacketSeconds > 0 {
		fb := now.Add(secs(t.StreamFirstPacketSeconds))
		if c.total.IsZero() || fb.Before(c.total) {
			c.firstByte = fb
		}
	}
	forwardBound := false
	if u := rs.ext.cur; u != nil {
		c.firstByte, forwardBound = externalFirstByte(cfg, u.kind, r.Stream, now, c.firstByte)
	}
	up, f := tr.roundTrip(c)
	if f == nil && rs.ext.cur != nil && refusesGateway(up.status()) {
		// The client's credentials never reach an external upstream: its
		// refusal is of the gateway's key, the upstream's fault, and its
		// body (which may echo that key) is not the client's.
		f = &failure{kind: failUpstreamAuth, cause: fmt.Errorf("%s answered %d to the gateway's credentials", rs.ext.cur.label, up.status())}
		c.cancel.unset()
		up.finish(false)
	} else if f == nil && up.status() >= 300 && up.status() < 400 {
		// A redirect is no answer to relay: a client following its
		// Location would send its request past the gateway (its keys,
		// limits and quotas), to the provider or to an engine's own
		// address. An invalid response, the upstream's fault.
		label := "the engine"
		if rs.ext.cur != nil {
			label = rs.ext.cur.label
		}
		f = fail(failProtocol, fmt.Errorf("%s answered %d: a redirect (3xx) is no answer to relay", label, up.status()))
		c.cancel.unset()
		up.finish(false)
	}
	if f == nil {
		status := up.status()
		retry := (status >= 500 || status == fasthttp.StatusTooManyRequests) && mayRetry
		if retry || status >= 400 && rs.ext.cur != nil {
			// Kept aside whole (up to stashMax): an answer another
			// attempt may replace, or an external upstream's error
			// answer, whose every byte is scrubbed of the gateway's key
			// before it is relayed (answerFailed).
			rs.stashAnswer(up, status, &c.cancel)
			f = &failure{kind: failStatus, status: status}
			if status < 500 {
				rs.lease.Done(sched.OutcomeNeutral)
			} else {
				rs.lease.Done(sched.OutcomeFault)
				mUpstreamErr.Inc()
			}
			res.last, res.lastW, res.allConnect = f, d.Worker, false
			if !retry || c.cancel.wasAborted() {
				res.stop = true // relayed as it is, or the client left
				return attemptStop
			}
			return attemptFailed
		}
		// Read the first bytes before committing, so a failure before
		// the first byte can still go to another worker.
		n, rerr := readFirst(rs, c, up, status)
		if rerr == nil || rerr == io.EOF {
			if forwardBound && !r.Stream {
				// The rest of a non-streamed answer has the request's
				// own bound (the relay arms a stream's reads itself).
				up.setReadDeadline(c.total)
			}
			s.live.remove(rs)
			rs.lease.FirstToken()
			rs.ttft = time.Since(rs.start)
			mTTFT.Update(rs.ttft.Seconds())
			s.commit(ctx, cfg, rs, up, status, n, rerr == io.EOF)
			res.committed = true
			if status >= 500 || status == fasthttp.StatusTooManyRequests {
				res.relayedBy = d.Worker
			}
			return attemptCommitted
		}
		// Nothing has reached the client yet, whatever was read: an
		// answer broken off part-way is an invalid response, and another
		// worker may take the request (it was a broken stream, not
		// retried, though the client had seen none of it).
		f = firstReadFailure(c, up, rerr)
		c.cancel.unset() // first: an abort must not reach the recycled connection's next user
		up.finish(false)
	}
	rs.lease.Done(f.outcome())
	s.countFailure(d.Worker, f)
	res.last, res.lastW = f, d.Worker
	if !f.unreachable() {
		res.allConnect = false
	}
	// The failed connection is closed; unset (not reset) keeps an abort
	// that races with it for the next attempt.
	if !f.retryable() || !c.cancel.unset() {
		res.stop = true
		return attemptStop
	}
	return attemptFailed
}

// readFirst reads an answer's first bytes into rs.rbuf before its head is
// committed to the client, so that a failure before them can still go to
// another worker (the mixed dispatch's attempt and the PD decode legs).
// An error other than io.EOF means nothing usable came: classify it with
// firstReadFailure.
func readFirst(rs *reqState, c *call, up upResponse, status int) (int, error) {
	n, rerr := up.read(rs.rbuf)
	// A non-streamed answer that fits the buffer is read whole
	// before its head is committed: an engine that breaks it off (a
	// body shorter than its Content-Length, a bad chunk) gets the
	// client a 502 in its error shape, not a cut connection.
	//
	// So is any answer to a stream request that is not an event stream:
	// an engine that answered plain JSON, or its error answer (whose
	// error code the access log names, however many reads bring it: NATS
	// brings head, body and end apart).
	whole := !rs.sreq.Stream || !eventStream(up.contentType())
	for whole && rerr == nil && n > 0 && n < len(rs.rbuf) {
		if rs.sreq.Stream {
			c.armMore(up)
		}
		var m int
		m, rerr = up.read(rs.rbuf[n:])
		n += m
	}
	// A stream commits on its first whole event: SSE comments (an
	// engine's keep-alive) and half an event are not the first packet,
	// so an engine that sends them and then dies or stalls past
	// stream_first_packet_s can still be retried elsewhere.
	// (A content-encoded stream shows no event in its bytes: it commits on
	// its first ones.)
	for !whole && status < 400 && rerr == nil && n < len(rs.rbuf) && !hasEvent(rs.rbuf[:n]) && !encoded(up) {
		if n > 0 {
			c.armMore(up)
		}
		var m int
		m, rerr = up.read(rs.rbuf[n:])
		n += m
	}
	if rerr == io.EOF && !whole && status < 400 && endJudged(up) && !hasEvent(rs.rbuf[:n]) {
		// A close-delimited stream that ended before its first event
		// (a keep-alive, half an event, then the engine's close) is
		// how a crashed engine looks: nothing reached the client, so
		// another worker may take the request.
		rerr = errCutBeforeEnd
	}
	return n, rerr
}

// armMore bounds the wait for more of an answer once its first bytes
// came, before the commit: the first packet's deadline still holds (a NATS
// stream drops its own at its first chunk), and stream_idle_s bounds the
// wait, as after the commit.
func (c *call) armMore(up upResponse) {
	dl := c.firstByte
	if c.idle > 0 {
		if idle := time.Now().Add(c.idle); dl.IsZero() || idle.Before(dl) {
			dl = idle
		}
	}
	if !dl.IsZero() {
		up.setReadDeadline(dl)
	}
}

// firstReadFailure classifies an error of readFirst.
func firstReadFailure(c *call, up upResponse, rerr error) *failure {
	f := up.readFailure(rerr, false)
	if f.kind != failCanceled && !c.total.IsZero() && isTimeout(rerr) && !time.Now().Before(c.total) {
		f = fail(failWallClock, rerr) // the request's own cap, not the worker (as the relay has it)
	}
	return f
}

// refusesGateway reports the statuses by which an upstream refuses the
// credentials it was sent.
func refusesGateway(status int) bool {
	return status == fasthttp.StatusUnauthorized || status == fasthttp.StatusForbidden ||
		status == fasthttp.StatusProxyAuthRequired
}

// answerFailed answers a request no attempt committed an answer for.
func (s *Server) answerFailed(ctx *fasthttp.RequestCtx, cfg *config.Config, rs *reqState, res *tries) {
	if rej := rs.gov.refused; rej != nil { // the user's deferred admission (govern.go)
		s.writeRejection(ctx, rs, rej)
		return
	}
	last := res.last
	if last == nil {
		if res.seatRej != nil {
			s.writeRejection(ctx, rs, res.seatRej)
			return
		}
		if res.globalBusy {
			countStatus(fasthttp.StatusServiceUnavailable)
			writeError(ctx, fasthttp.StatusServiceUnavailable, typeUnavailable,
				"the model is served by other regions, none of which has room for this request now; retry later", "", "global_capacity_exhausted")
			ctx.Response.Header.Set("Retry-After", "1")
			return
		}
		if res.schedErr != nil {
			s.writeSchedError(ctx, &rs.sreq, res.schedErr)
			return
		}
		// Nothing could be tried: every upstream of the split plan is
		// disabled or its breaker is open.
		countStatus(fasthttp.StatusServiceUnavailable)
		writeError(ctx, fasthttp.StatusServiceUnavailable, typeUnavailable, "no upstream available for this request", "", "no_upstreams")
		return
	}
	if last.kind == failStatus && rs.errStatus != 0 {
		// Every worker tried answered an error: relay the last answer, as a
		// proxy does with an upstream's response.
		w := rs.acc.tried
		if rs.errFrom != nil {
			w = rs.errFrom // a PD prefill leg's answer
		}
		s.relayStashed(ctx, cfg, rs, w)
		return
	}
	s.writeFailure(ctx, last, res.allConnect && (res.fleetDown || !s.untriedWorker(&rs.sreq)))
}

// retryHeaders are the headers of a stashed error answer relayed with it:
// when to come back (Retry-After; Retry-After-Ms, which the OpenAI and
// Anthropic SDKs read first) and whether to (X-Should-Retry).
var retryHeaders = [...][]byte{[]byte("Retry-After"), []byte("Retry-After-Ms"), []byte("X-Should-Retry")}

// stashRetry keeps an error answer's retryHeaders in dst: an engine's 429
// or 503 says when (and whether) to come back.
func stashRetry(dst *[len(retryHeaders)][]byte, up upResponse) {
	for i, name := range retryHeaders {
		dst[i] = append(dst[i][:0], up.header(name)...)
	}
}

// relayStashed answers with the error answer stashed in rs (stashAnswer),
// in the client's protocol (protocols.go). w is the worker that answered
// it (rs.ext.cur's upstream when that is set), named by the decision
// headers as on any relayed answer.
func (s *Server) relayStashed(ctx *fasthttp.RequestCtx, cfg *config.Config, rs *reqState, w *fleet.Worker) {
	countStatus(rs.errStatus)
	rs.gov.committed(rs.errStatus) // a 4xx (a PD leg's) counts against the user
	resetResponse(ctx)
	ctx.SetStatusCode(rs.errStatus)
	if cfg.Debug.DecisionHeader {
		if u := rs.ext.cur; u != nil {
			ctx.Response.Header.Set("X-Infera-Upstream", u.label)
		} else if w != nil {
			ctx.Response.Header.Set("X-Infera-Worker", w.ID)
		}
	}
	body := rs.errorBody()
	if len(rs.errType) > 0 {
		ctx.Response.Header.SetContentTypeBytes(rs.errType)
	}
	for i, name := range retryHeaders {
		if v := rs.errRetry[i]; len(v) > 0 && validHeaderValue(v) {
			ctx.Response.Header.SetCanonical(name, v)
		}
	}
	ctx.SetBody(body)
}

// stashAnswer keeps a complete error answer of a worker that is about to
// be retried elsewhere (up to stashMax bytes, read to its end however many
// reads it takes, the rest of it within stashRestWait), in case it is the
// last answer there is. The connection goes back to the pool only once
// slot (the attempt's abort slot, which the client's liveness watch
// aborts) no longer points at it: a client leaving later must not close a
// connection another request has taken from the pool.
func (rs *reqState) stashAnswer(up upResponse, status int, slot *abortSlot) {
	rs.errStatus, rs.errFrom = 0, nil
	if encoded(up) {
		// A content-encoded answer (gzip) is relayed without its
		// Content-Encoding (relayStashed), and an external upstream's
		// cannot be scrubbed of the gateway's key: not kept, as a broken
		// one (the client gets the router's own error).
		rs.errBody = rs.errBody[:0]
		slot.unset()
		up.finish(false)
		return
	}
	b := rs.errBody[:0]
	var err error
	for reads := 0; err == nil; reads++ {
		if len(b) >= stashMax {
			break
		}
		if cap(b)-len(b) < 4096 {
			b = slices.Grow(b, min(max(2*cap(b), 4096), stashMax)-len(b))
		}
		if reads == 1 {
			// The engine is answering: the rest of it is due now, not
			// when the request's first-byte or idle bound says.
			d := time.Now().Add(stashRestWait)
			if t := rs.call.total; !t.IsZero() && t.Before(d) {
				d = t
			}
			up.setReadDeadline(d)
		}
		var n int
		n, err = up.read(b[len(b):min(cap(b), stashMax)])
		b = b[:len(b)+n]
	}
	rs.errBody = scrubKey(b, rs.ext.cur)
	if err == io.EOF && len(b) > 0 {
		rs.errStatus = status
		rs.errType = append(rs.errType[:0], up.contentType()...)
		stashRetry(&rs.errRetry, up)
		up.finish(slot.unset())
		return
	}
	rs.errBody = b[:0]
	slot.unset()
	up.finish(false)
}

// stashMax bounds an error answer kept for a retry (stashAnswer); a larger
// one is not relayed (the client gets infera's own error). stashRestWait
// bounds the wait for the rest of it once its first bytes came.
const (
	stashMax      = 256 << 10
	stashRestWait = 2 * time.Second
)

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
	if rs.ext.cur != nil {
		dropKeyHeaders(h, rs.ext.cur) // external.go
	}
	d := &rs.lease.Decision
	if cfg.Debug.DecisionHeader {
		if u := rs.ext.cur; u != nil {
			h.Set("X-Infera-Upstream", u.label) // external.go
		} else {
			h.Set("X-Infera-Worker", d.Worker.ID)
			rs.route = d.AppendRoute(rs.route[:0])
			h.SetBytesV("X-Infera-Route", rs.route)
		}
	}
	outcome := statusOutcome(status)
	if status >= 400 {
		rs.lease.Verdict(outcome) // known now: do not hold a probe slot while the body is relayed
		if rs.ext.cur == nil {
			// The engine refused or failed the request: it did not cache
			// the prompt its pick recorded it as holding.
			s.sched.Forget(&rs.sreq, d.Worker)
		}
	}
	rs.gov.committed(status)
	sse := rs.sreq.Stream && status < 400 && eventStream(up.contentType())
	judge := sse && endJudged(up)
	if eof && judge {
		eof = false // the relay tells a whole stream from a cut one (cutShort)
	}
	rs.scanUsage(rs.rbuf[:n])
	if rs.proto.passesResponses() && status < 300 && (rs.ext.cur == nil || rs.ext.cur.kind == extSplit) {
		// A local engine's answer, or a split proxy entry's: its
		// follow-ups go back to it (split.go). A member region's is
		// learned there.
		c := respCred{addr: s.clientIP(ctx)}
		if u := rs.gov.user; u != nil {
			c = respCred{user: u.Name()}
		}
		rs.proto.resp.start(&s.respAff, rs.rbuf[:n], d.Worker, c, cfg.Protocol.ResponsesStateTTL()) // respaffinity.go
	}
	first := rs.rbuf[:n]
	if status >= 400 {
		first = scrubKey(first, rs.ext.cur)
	}
	if rs.proto.transforms() { // converted or filtered answers (protocols.go)
		var done bool
		if first, eof, done = s.transformHead(ctx, rs, up, status, first, eof, outcome); done {
			return
		}
	}
	countStatus(status)
	// The engine's error event in the stream's first bytes (vLLM's and
	// SGLang's answer to a request that fails before its first token).
	engineErr := sse && rs.engineError(first)
	errStatus := 0
	if engineErr {
		errStatus = engineErrorStatus(first)
	}
	if eof {
		f := rs.convFailure() // a whole converted stream the engine left incomplete
		if f == nil && engineErr {
			f = rs.engineStreamFailure(nil, errStatus)
		}
		if f != nil {
			outcome = f.outcome()
			rs.acc.failed = true
			if !rs.usage.settled(sse) {
				rs.usage.forget() // the usage so far of a failed answer (relay.CloseWithError)
			}
		}
		resp.SetBody(first)
		up.finish(true)
		rs.lease.Done(outcome)
		rs.usage.record(rs.lease.Worker)
		rs.dur = rs.ttft // the whole answer came with the first read
		mDuration.Update(rs.dur.Seconds())
		return
	}
	rl := relayPool.Get().(*relay)
	*rl = relay{
		s: s, rs: rs, up: up,
		buf: rs.rbuf, pending: first,
		sse:             sse,
		judgeEnd:        judge,
		streamReq:       rs.sreq.Stream,
		idle:            rs.call.idle,
		total:           rs.call.total,
		client:          ctx.Conn(),
		wto:             s.wto,
		outcome:         outcome,
		engineErr:       engineErr,
		engineErrStatus: errStatus,
	}
	if rs.proto.relaying {
		rl.st = &rs.proto // the relay transforms the answer (protocols.go)
	}
	rs.handedOff = true
	size := up.contentLength()
	if size > int64(^uint(0)>>1) || rl.st != nil || len(first) != n {
		size = -1 // (a scrubbed key changed the length)
	}
	resp.SetBodyStream(rl, int(size))
	if rs.sreq.Stream {
		resp.ImmediateHeaderFlush = true
	}
}

// hasEvent reports whether p starts with a whole SSE event that has a
// field: something other than comment lines (":...") and blank lines.
func hasEvent(p []byte) bool {
	p = p[:completeEvents(p)]
	lineStart := true
	for _, ch := range p {
		if lineStart && ch != '\n' && ch != '\r' && ch != ':' {
			return true
		}
		lineStart = ch == '\n' || ch == '\r'
	}
	return false
}

// eventStream reports whether an answer's Content-Type is an event stream
// (or absent: an engine that names none is taken at the request's word).
func eventStream(ct []byte) bool {
	const es = "text/event-stream"
	return len(ct) == 0 || len(ct) >= len(es) && eqFold(ct[:len(es)], es)
}

// namesEventStream reports a Content-Type that names an event stream.
func namesEventStream(ct []byte) bool {
	return len(ct) > 0 && eventStream(ct)
}

// endJudged reports a close-delimited event stream whose end the router
// can judge from its bytes (cutShort): its Content-Type names
// text/event-stream (an engine that names none may have answered plain
// JSON, whose end says nothing) and it is not content-encoded (a gzip
// body's tail shows no data: [DONE]).
func endJudged(up upResponse) bool {
	if !up.closeDelimited() || !namesEventStream(up.contentType()) {
		return false
	}
	return !encoded(up)
}

// encoded reports a content-encoded body (gzip, say): its bytes are not
// the protocol's.
func encoded(up upResponse) bool {
	ce := up.header(hdrContentEncoding)
	return len(ce) > 0 && !eqFold(ce, "identity")
}

var hdrContentEncoding = []byte("Content-Encoding")

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

// dropClient ends the exchange of a client that left before its answer
// began: 499 is counted and logged, nothing is written (a client that only
// half-closed its side would otherwise read a status line no HTTP client
// knows, with no body), and the connection is closed.
func dropClient(ctx *fasthttp.RequestCtx) {
	mClientGone.Inc()
	countStatus(499)
	ctx.Response.Reset()
	ctx.SetStatusCode(499)
	ctx.SetConnectionClose()
	ctx.HijackSetNoResponse(true)
	ctx.Hijack(closeHijacked)
}

// closeHijacked does nothing: fasthttp closes a hijacked connection when
// its handler returns.
func closeHijacked(net.Conn) {}

// writeFailure answers a request whose every attempt failed before the
// first byte. When no worker could be reached and none is left to try (or
// every candidate's breaker is open), the fleet is down for this request:
// 503, not 502.
func (s *Server) writeFailure(ctx *fasthttp.RequestCtx, f *failure, allConnect bool) {
	if f == nil {
		f = fail(failConnect, nil)
	}
	if f.kind == failCanceled {
		dropClient(ctx)
		return
	}
	c := f.class()
	status, typ, code, msg := f.httpStatus(), c.typ, c.code, c.msg
	if f.unreachable() && allConnect {
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
		return // counted once, where the request ends (dropClient)
	case failTimeout, failWallClock, failSpent:
		mTimeouts.Inc()
	default:
		mUpstreamErr.Inc()
	}
	logUpstreamError(w, f)
}

// cooldownLeft is the whole seconds, rounded up and at least 1, until the
// cooldown of the breaker of engine ref's worker ends (Retry-After).
func (s *Server) cooldownLeft(ref fleet.Ref) int64 {
	var left int64
	if w := s.sched.Fleet.Get(ref.ID); w != nil && ref.Is(w) {
		left = w.Breaker.OpenUntil() - s.sched.Now()
	}
	return max(1, (left+int64(time.Second)-1)/int64(time.Second))
}

func (s *Server) writeSchedError(ctx *fasthttp.RequestCtx, r *sched.Request, err error) {
	switch {
	case errors.Is(err, sched.ErrUnknownModel):
		countStatus(404)
		msg := unknownModel(r.Model)
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
	case errors.As(err, new(*sched.PDModeError)):
		// A configuration problem the operator must see: say which worker.
		countStatus(503)
		writeError(ctx, fasthttp.StatusServiceUnavailable, typeUnavailable, err.Error(), "", "pd_mode_unknown")
	case errors.Is(err, sched.ErrNoWorkers), errors.Is(err, sched.ErrExhausted):
		countStatus(503)
		writeError(ctx, fasthttp.StatusServiceUnavailable, typeUnavailable, "no worker available for this request", "", "no_workers")
	case errors.Is(err, sched.ErrPreferredOnTrial):
		// A Responses follow-up whose engine is on trial after failures
		// (respaffinity.go): another engine can only answer 404.
		countStatus(503)
		writeError(ctx, fasthttp.StatusServiceUnavailable, typeUnavailable,
			"the engine holding "+heldName(ctx)+" (worker "+r.Prefer.ID+") is unavailable: it failed, and its trial request is in flight; retry shortly", "", "worker_on_trial")
		ctx.Response.Header.Set("Retry-After", "1")
	case errors.Is(err, sched.ErrPreferredOpen):
		// A Responses follow-up whose engine's breaker is open: back when
		// its cooldown ends (its trial then decides).
		countStatus(503)
		writeError(ctx, fasthttp.StatusServiceUnavailable, typeUnavailable,
			"the engine holding "+heldName(ctx)+" (worker "+r.Prefer.ID+") is unavailable: it failed, and is excluded until its cooldown ends; retry then", "", "worker_breaker_open")
		var b [20]byte
		ctx.Response.Header.SetBytesV("Retry-After", strconv.AppendInt(b[:0], s.cooldownLeft(r.Prefer), 10))
	case errors.Is(err, sched.ErrPreferredDraining):
		// A Responses follow-up whose engine is draining (respaffinity.go):
		// drain admits no new request (the sidecar counts in-flight work
		// to stop the engine, and over NATS stops taking requests), and
		// no other engine holds the response. It is leaving for good: not
		// a 503 an SDK would retry into the same answer.
		countStatus(410)
		if _, _, ok := responseByIDKind(ctx.Path()); ok { // respstored.go
			writeError(ctx, fasthttp.StatusGone, typeInvalidRequest,
				"the engine holding the response (worker "+r.Prefer.ID+") is draining: it is leaving the fleet and takes no new requests, and no other engine holds the response", "response_id", "response_draining")
			break
		}
		writeError(ctx, fasthttp.StatusGone, typeInvalidRequest,
			"the engine holding previous_response_id (worker "+r.Prefer.ID+") is draining: it is leaving the fleet and takes no new requests, and no other engine holds the response; send the whole conversation in input", "previous_response_id", "previous_response_draining")
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
