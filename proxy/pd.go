package proxy

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/infera/infera/broker"
	"github.com/infera/infera/config"
	"github.com/infera/infera/fleet"
	"github.com/infera/infera/sched"
	"github.com/valyala/fasthttp"
)

// PD dispatch: a request whose candidate workers include a prefill and a
// decode worker (sched.Scheduler.Topology) is served by a pair. Each leg is
// its own lease and goes through the request's transport like any
// dispatch attempt; the failure table (failure.go) classifies both legs.
//
//   - vLLM (pull, NixlConnector): the prefill leg first, on the request's
//     own call: the client's body with kv_transfer_params.do_remote_decode,
//     stream false, max_tokens 1; its answer must carry kv_transfer_params.
//     Then the decode leg with the client's body and those params. Serial,
//     as vLLM's disaggregated proxy does (tests/v1/kv_connector/
//     nixl_integration/toy_proxy_server.py, send_request_to_service and
//     _handle_completions).
//   - SGLang (push, Mooncake): one body with bootstrap_host, bootstrap_port
//     and a fresh bootstrap_room to both workers at once; the decode
//     worker's answer goes to the client, the prefill worker's is drained
//     and checked on a goroutine of its own (sgl-router's
//     PDRouter::execute_dual_dispatch_internal and
//     inject_bootstrap_into_value).
//
// The prefill lease ends at the transfer: for SGLang when the prefill
// answer is drained (the engine answers after pushing the KV), for vLLM
// when the decode worker's first byte arrives (its read of the blocks is
// over). The decode lease ends with the response (the relay ends it).
//
// Failover before the client got a byte: a failed prefill leg goes to
// another prefill worker; a failed decode leg to another decode worker.
// SGLang re-sends both legs with a new room; vLLM re-sends the decode leg
// alone when the decode worker was never reached (its KV is still held on
// the prefill engine), else both legs (a read that started frees the
// blocks). docs/pd.md is the reference.

// pdDispatch is a PD request's own state, pooled. It outlives the request
// only while an SGLang prefill leg is still draining after the client's
// stream started: the prefill goroutine holds a reference, and uses only
// this struct (never the reqState, which the relay may release first).
type pdDispatch struct {
	s    *Server
	mode sched.PDMode
	refs atomic.Int32

	pl sched.Lease // the prefill leg's lease
	// ps holds the prefill leg's concurrency seat (govern.go), attached to
	// pl: here, not in the reqState, because pl may end after the request.
	ps seatHold
	pc call // the SGLang prefill leg's call (its goroutine's)

	hdr, path    []byte // the legs' header block and request target
	pbody, dbody []byte // the prefill and decode legs' bodies
	kvp          []byte // vLLM: the prefill's kv_transfer_params (raw JSON)
	// firstPacket is when a stream's first packet is due, set as vLLM's
	// prefill leg is sent (its wait is the first packet's): the decode
	// leg that follows keeps it (zero: the decode leg's own).
	firstPacket time.Time
	buf         []byte   // the prefill answer
	rooms       []uint64 // SGLang: the attempt's bootstrap rooms, one per sequence (both legs')

	// Set by the SGLang prefill goroutine, read under mu.
	mu        sync.Mutex
	committed bool     // the decode leg's answer went to the client
	dcall     *call    // the decode leg's call, aborted when the prefill fails first
	pfail     *failure // the prefill leg failed before the commit
	ended     bool     // the prefill leg has its outcome
	// waited: the decode leg timed out before its first byte while the
	// prefill leg had no outcome yet. The decode engine waits for the
	// prefill's KV, and the prefill engine for the decode engine to join the
	// room: either may be the one that hangs. The attempt ends as a timeout
	// held against neither worker, and the next attempt takes neither.
	waited bool
	// blamed: the decode leg answered 5xx before the prefill leg ended, and
	// the handoff records blame the prefill worker (fleet.HandoffFailed):
	// the prefill leg, stopped, ends as a fault.
	blamed bool
	// decodeBlamed: the prefill leg timed out (pd.prefill_timeout_s) while
	// the decode leg still waited for its first byte. The prefill engine
	// waits for the decode engine to join the room, so either may hang: the
	// handoff records decide (fleet.HandoffTimedOut), and when they blame
	// the decode worker its leg ends as the fault. Set by the
	// prefill goroutine, read by the dispatch after p.done.
	decodeBlamed bool
	dw           *fleet.Worker // the attempt's decode worker (SGLang)
	// The prefill's error answer (status >= 400), relayed when it is final.
	errStatus        int
	errBody, errType []byte
	errRetry         [len(retryHeaders)][]byte
	done             chan struct{} // the prefill goroutine ended (capacity 1)
}

const (
	pdBufSize = 16 << 10
	// pdMaxAnswer bounds a prefill answer held in memory: vLLM's (one
	// token, the params, and whatever logprobs the client asked for), and
	// an SGLang prefill engine's error answer.
	pdMaxAnswer = 8 << 20
	// pdMaxBatch bounds the sequences of an SGLang batch (one room each).
	pdMaxBatch = 4096
)

var pdPool = sync.Pool{New: func() any {
	return &pdDispatch{done: make(chan struct{}, 1), buf: make([]byte, pdBufSize)}
}}

func (p *pdDispatch) release() {
	if p.refs.Add(-1) != 0 {
		return
	}
	if p.pl.Held() {
		panic("BUG: PD dispatch released while its prefill lease is held")
	}
	p.ps.reset()
	select {
	case <-p.done:
	default:
	}
	p.pl.Reset()
	if cap(p.buf) > 4*pdBufSize {
		p.buf = make([]byte, pdBufSize)
	}
	if cap(p.rooms) > 64 {
		p.rooms = nil
	}
	*p = pdDispatch{done: p.done, buf: p.buf[:cap(p.buf)], rooms: p.rooms[:0],
		// The legs' bodies are copies of the client's: a large one is not
		// kept (as reqState.Reset does not keep the body).
		hdr: p.hdr[:0], path: p.path[:0], pbody: trimBuf(p.pbody), dbody: trimBuf(p.dbody), kvp: trimBuf(p.kvp),
		errBody: trimBuf(p.errBody), errType: p.errType[:0]}
	pdPool.Put(p)
}

// Metrics of PD dispatches.
var (
	mPDRequests = [...]*metrics.Counter{
		sched.PDModeSGLang: metrics.NewCounter(`infera_pd_requests_total{mode="sglang"}`),
		sched.PDModeVLLM:   metrics.NewCounter(`infera_pd_requests_total{mode="vllm"}`),
	}
	mPDLegFailures = [...]*metrics.Counter{
		sched.LegPrefill: metrics.NewCounter(`infera_pd_leg_failures_total{leg="prefill"}`),
		sched.LegDecode:  metrics.NewCounter(`infera_pd_leg_failures_total{leg="decode"}`),
	}
	mPDRetries = [...]*metrics.Counter{
		sched.LegPrefill: metrics.NewCounter(`infera_pd_retries_total{leg="prefill"}`),
		sched.LegDecode:  metrics.NewCounter(`infera_pd_retries_total{leg="decode"}`),
	}
	mPDPrefillLate = metrics.NewCounter(`infera_pd_prefill_failures_after_commit_total`)
	mPDPrefillTime = metrics.NewHistogram(`infera_pd_prefill_leg_seconds`)
	// mPDNoKVParams counts vLLM prefill answers without kv_transfer_params
	// (a prefill that stopped before its length cap): their decode leg
	// went without them.
	mPDNoKVParams = metrics.NewCounter(`infera_pd_prefill_without_kv_params_total`)
)

var (
	errNoKVParams = errors.New("the prefill answer has no kv_transfer_params with do_remote_prefill true")
	errPDAnswer   = errors.New("the prefill answer is too large")
	// errDecodeWaited: the decode leg timed out before its first byte while
	// the prefill leg had not answered (see pdDispatch.waited).
	errDecodeWaited = errors.New("no prefill answer when the decode leg, which waits for its KV, timed out")
	// errRoomNotJoined: the SGLang prefill leg timed out while the decode
	// leg had not answered, and the handoff records blame the decode worker
	// (pdDispatch.decodeBlamed).
	errRoomNotJoined = errors.New("the prefill leg timed out waiting for the decode engine to join the bootstrap room")
)

// dispatchPD serves r by a prefill+decode pair when its topology says so,
// recording in res how it went (as dispatchLocal does: the caller answers
// when nothing was committed); it returns false, having done nothing, when
// one mixed worker serves r.
func (s *Server) dispatchPD(ctx *fasthttp.RequestCtx, cfg *config.Config, rs *reqState, res *tries) bool {
	r := &rs.sreq
	top, err := s.sched.Topology(cfg, r, rs.scratch[:0])
	if err != nil {
		res.schedErr = err
		if noWorker(err) && s.globalOn(cfg) {
			s.forwardGlobal(ctx, cfg, rs, res)
		}
		return true
	}
	if top != sched.TopologyPD {
		return false
	}
	rs.ext.cur = nil // the local fleet answers (split proxy)
	p := pdPool.Get().(*pdDispatch)
	p.s, p.mode = s, r.PDMode()
	p.refs.Store(1)
	mPDRequests[p.mode].Inc()
	p.path = append(p.path[:0], rs.path...)
	p.hdr = append(p.hdr[:0], rs.hdr...)
	if p.mode == sched.PDModeVLLM {
		// Both legs carry the request's X-Request-Id (takeRequestID), as
		// vLLM's proxy sends them one.
		s.pdPull(ctx, cfg, rs, p, res)
	} else {
		s.pdPush(ctx, cfg, rs, p, res)
	}
	rs.call.once = false // the split proxy's next upstream may follow on it
	if !res.committed && res.last != nil && res.last.kind != failCanceled {
		// The last attempt's failed workers did not cache the prompt, as
		// forgetFailed says of a mixed request's (a retry's pick does it
		// for the attempts before).
		s.sched.ForgetTried(r)
	}
	p.release()
	return true
}

// pdOutcome collects a PD request's failures for the final answer.
type pdOutcome struct {
	last       *failure
	lastW      *fleet.Worker // the worker of the leg that failed last
	allConnect bool
	fleetDown  bool
	fails      [3]int // by sched.Leg
	retries    int
	acc        *accessEntry // counts the retries for the access log
	// retrying: the leg whose failure allowed another attempt, counted as
	// a retry once that attempt holds its leases (retried), as a mixed
	// request's is: not when no worker is left to take it.
	retrying bool
	retryLeg sched.Leg
}

// finish reports the failures to the dispatch (which answers, or tries the
// split proxy's next upstream unless the failure may not be retried).
func (o *pdOutcome) finish(res *tries) {
	res.last, res.lastW = o.last, o.lastW
	res.allConnect = res.allConnect && o.allConnect
	res.fleetDown = res.fleetDown || o.fleetDown
	res.stop = o.last != nil && !o.last.retryable()
}

// failed records f on leg, whose worker is w; it reports whether the
// request may try again. left says the client left, which made the leg
// fail: not a leg failure (infera_stream_client_disconnects_total counts
// it, once), and no retry.
func (o *pdOutcome) failed(leg sched.Leg, w *fleet.Worker, f *failure, left bool) bool {
	o.last, o.lastW = f, w
	if !f.unreachable() {
		o.allConnect = false
	}
	if left {
		return false
	}
	mPDLegFailures[leg].Inc()
	o.fails[leg]++
	if !f.retryable() || o.fails[leg] > o.retries {
		return false
	}
	o.retrying, o.retryLeg = true, leg
	return true
}

// retried counts the retry a failure allowed (failed), once the attempt
// that follows it holds its leases (p's prefill lease, if any, and dl, the
// decode lease); with debug on it is logged.
func (s *Server) retried(rs *reqState, o *pdOutcome, p *pdDispatch, dl *sched.Lease) {
	if !o.retrying {
		return
	}
	o.retrying = false
	mPDRetries[o.retryLeg].Inc()
	mRetries.Inc()
	o.acc.retries++
	if s.debug {
		next := dl.Worker.ID
		if pw := p.pl.Worker; pw != nil && p.pl.Held() {
			next = pw.ID + "+" + next // prefill+decode
		}
		logDebugRetry(rs, o.retryLeg.String(), o.lastW, o.last, next) // debuglog.go
	}
}

// pdAcquire takes the lease of r's next leg; on error the outcome is
// reported (the last failure when there was one, else the scheduling
// error) and false returned.
func (s *Server) pdAcquire(ctx *fasthttp.RequestCtx, cfg *config.Config, rs *reqState, leg sched.Leg, o *pdOutcome, res *tries, p *pdDispatch, l *sched.Lease) bool {
	r := &rs.sreq
	var partner = p.pl.Worker
	if leg == sched.LegPrefill {
		partner = nil
	}
	r.SetLeg(leg, partner)
	h := &rs.gov.seat // the decode leg's lease is rs.lease
	if leg == sched.LegPrefill {
		h = &p.ps
	}
	err := s.acquire(cfg, rs, l, h) // the leg's lease and concurrency seat (govern.go)
	if err == errUserRefused {
		// The deferred admission was refused: answerFailed answers it.
		res.stop = true
		return false
	}
	if rej, ok := seatRefusal(err); ok {
		s.seatRefused(ctx, cfg, rs, res, rej)
		return false
	}
	if err == nil {
		if l.Reason == sched.ReasonAllBreakersOpen {
			o.fleetDown = true
		}
		if l == &rs.lease {
			rs.acc.tried = l.Worker // the access log's worker (accesslog.go)
		} else {
			rs.acc.prefill = l.Worker // and its prefill_worker
		}
		return true
	}
	if o.last == nil {
		res.schedErr = err
		if noWorker(err) && s.globalOn(cfg) {
			s.forwardGlobal(ctx, cfg, rs, res)
		}
		return false
	}
	o.fleetDown = true // every candidate of the leg was tried
	o.finish(res)
	return false
}

// prefillDeadline is when a prefill leg sent now must have answered:
// pd.prefill_timeout_s, within the request's own cap total.
func prefillDeadline(cfg *config.Config, total time.Time) time.Time {
	var dl time.Time
	if t := cfg.PD.PrefillTimeoutSeconds; t > 0 {
		dl = time.Now().Add(secs(t))
	}
	if !total.IsZero() && (dl.IsZero() || total.Before(dl)) {
		dl = total
	}
	return dl
}

// decodeCall sets the request's call up for the decode leg, as dispatch
// sets up an attempt.
func decodeCall(cfg *config.Config, rs *reqState, p *pdDispatch, total time.Time, idle time.Duration) *call {
	c := &rs.call
	c.lease, c.path, c.hdr, c.body, c.stream = &rs.lease, p.path, p.hdr, p.dbody, rs.sreq.Stream
	c.total, c.idle = total, idle
	c.now = time.Now().UnixNano()
	c.firstByte = firstPacketDeadline(cfg, rs, total, time.Now())
	if !p.firstPacket.IsZero() { // right after the prefill leg; a retry of the decode leg alone restarts it
		c.firstByte, p.firstPacket = p.firstPacket, time.Time{}
	}
	return c
}

// firstPacketDeadline is when a stream started at now must have sent its
// first packet (timeouts.stream_first_packet_s), within total; total for
// a non-streamed request.
func firstPacketDeadline(cfg *config.Config, rs *reqState, total, now time.Time) time.Time {
	if t := &cfg.Timeouts; rs.sreq.Stream && t.StreamFirstPacketSeconds > 0 {
		if fb := now.Add(secs(t.StreamFirstPacketSeconds)); total.IsZero() || fb.Before(total) {
			return fb
		}
	}
	return total
}

// legModel is the model name a leg's body carries ("" keeps the client's):
// the name routing resolved for the leg's worker, or the one smart model
// selection chose.
func legModel(rs *reqState, d *sched.Decision) string {
	if d.Rewrite {
		return d.Model
	}
	return rs.ext.model
}

// pdCommit hands the decode leg's answer to the client.
func (s *Server) pdCommit(ctx *fasthttp.RequestCtx, cfg *config.Config, rs *reqState, p *pdDispatch, up upResponse, n int, eof bool, res *tries) {
	s.live.remove(rs)
	rs.lease.FirstToken()
	rs.ttft = time.Since(rs.start)
	mTTFT.Update(rs.ttft.Seconds())
	res.committed = true
	if cfg.Debug.DecisionHeader {
		h := &ctx.Response.Header
		h.Set("X-Infera-Prefill-Worker", p.pl.Worker.ID)
		rs.route = p.pl.Decision.AppendRoute(rs.route[:0])
		h.SetBytesV("X-Infera-Prefill-Route", rs.route)
	}
	s.commit(ctx, cfg, rs, up, up.status(), n, eof)
}

// pdPull is vLLM's serial dispatch.
func (s *Server) pdPull(ctx *fasthttp.RequestCtx, cfg *config.Config, rs *reqState, p *pdDispatch, res *tries) {
	r := &rs.sreq
	c := &rs.call
	total, idle := c.total, c.idle
	o := pdOutcome{allConnect: true, retries: s.flags.RequestMaxRetries, acc: &rs.acc}
	needPrefill := true
	for {
		if needPrefill && !s.pdAcquire(ctx, cfg, rs, sched.LegPrefill, &o, res, p, &p.pl) {
			return
		}
		// The decode lease (and seat) is taken before a prefill is sent: a
		// prefill with no decode worker left to read its KV would hold it
		// on the prefill engine until its abort timeout, for nothing.
		if !s.pdAcquire(ctx, cfg, rs, sched.LegDecode, &o, res, p, &rs.lease) {
			p.pl.Done(sched.OutcomeNeutral)
			return
		}
		s.retried(rs, &o, p, &rs.lease)
		if needPrefill {
			f := s.pullPrefill(cfg, rs, p, total)
			if f != nil {
				rs.lease.Done(sched.OutcomeNeutral) // the decode leg is not sent
				if f.kind == failStatus && f.status < 500 && f.status != fasthttp.StatusTooManyRequests {
					// The engine refused the request (4xx): relay it.
					s.live.remove(rs)
					s.relayStashed(ctx, cfg, rs, p.pl.Worker)
					res.committed = true
					return
				}
				r.Tried = append(r.Tried, p.pl.Worker.Idx)
				if !o.failed(sched.LegPrefill, p.pl.Worker, f, c.cancel.wasAborted() || f.kind == failCanceled) {
					break
				}
				c.cancel.reset()
				continue
			}
			needPrefill = false
		}
		p.dbody = appendPullDecodeBody(p.dbody[:0], rs.body, legModel(rs, &rs.lease.Decision), p.kvp)
		c = decodeCall(cfg, rs, p, total, idle)
		c.once = len(p.kvp) > 0 // its read frees the KV
		up, f := s.tr.roundTrip(c)
		status := 0
		// reached: the decode worker got the request, even partly, so its
		// read of the KV may have started (and freed the blocks).
		reached := f == nil || !neverReached(f)
		if f == nil {
			status = up.status()
			if status < 500 && status != fasthttp.StatusTooManyRequests {
				// The answer commits as the mixed dispatch's does: whole, or
				// on its first event (a keep-alive is no answer yet).
				n, rerr := readFirst(rs, c, up, status)
				if rerr == nil || rerr == io.EOF {
					// The decode engine has the KV: the transfer is over.
					p.pl.Done(sched.OutcomeSuccess)
					if status < 400 && len(p.kvp) > 0 {
						fleet.HandoffTaken(p.pl.Worker, rs.lease.Worker)
					}
					s.pdCommit(ctx, cfg, rs, p, up, n, rerr == io.EOF, res)
					return
				}
				f = firstReadFailure(c, up, rerr)
				c.cancel.unset() // first: an abort must not reach the recycled connection's next user
				up.finish(false)
			} else {
				rs.stashAnswer(up, status, &c.cancel)
				f = &failure{kind: failStatus, status: status}
			}
		}
		// A decode 500 after a handoff may be the prefill worker's KV
		// (fleet.HandoffFailed); without params no KV was handed off (the
		// decode engine computed the prompt itself).
		if handoffAmbiguous(status) && len(p.kvp) > 0 && fleet.HandoffFailed(p.pl.Worker, rs.lease.Worker) {
			rs.lease.Done(sched.OutcomeNeutral)
			p.pl.Done(sched.OutcomeFault)
			mUpstreamErr.Inc()
			r.Tried = append(r.Tried, p.pl.Worker.Idx)
		} else {
			s.decodeFailed(rs, f, status)
			if status != 0 {
				// The decode engine answered for itself: the prefill
				// worker did its part, and a half-open breaker learns it
				// (its lease ends below, or with the next decode leg).
				p.pl.Verdict(sched.OutcomeSuccess)
			}
		}
		r.Tried = append(r.Tried, rs.lease.Worker.Idx)
		if !o.failed(sched.LegDecode, rs.lease.Worker, f, c.cancel.wasAborted() || f.kind == failCanceled) {
			p.pl.Done(sched.OutcomeNeutral)
			break
		}
		c.cancel.reset()
		// A decode worker that never got the request (not dialled, busy)
		// left the KV held on the prefill engine for another decode worker;
		// one that got it, even partly, may have started the read, which
		// frees it: both legs run again.
		if reached && status != fasthttp.StatusTooManyRequests {
			p.pl.Done(sched.OutcomeNeutral)
			needPrefill = true
		}
	}
	o.finish(res)
}

// handoffAmbiguous reports a decode leg's answer after the KV handoff that
// may be either worker's fault (fleet.HandoffFailed): a 500, which is how
// vLLM and SGLang fail a request whose KV transfer failed. Other 5xx (503
// overloaded, 502 or 504 from a proxy in front of it) are the decode
// worker's own state.
func handoffAmbiguous(status int) bool { return status == fasthttp.StatusInternalServerError }

// neverReached reports whether a failed leg's request never reached its
// worker: the connection could not be dialled, the router's connection
// limit or the worker's capacity refused it, or the deadline had passed.
// A failure after the connection was made (the request written, even
// partly) counts as reached: the transport does not tell how much of it
// the engine read.
func neverReached(f *failure) bool {
	switch f.kind {
	case failLocalConns, failBusy, failSpent:
		return true
	case failEngine:
		// NATS: the worker could not connect to its engine (not a
		// connection that broke after the request went out, nor a worker
		// too old to say which).
		return errors.Is(f.cause, broker.ErrEngineDial)
	case failNoResponder:
		// NATS: nobody took the request off the worker's subject; not a
		// worker that died (or restarted) with the request open.
		return !errors.Is(f.cause, broker.ErrWorkerGone)
	case failBroker:
		// Not connected to the broker (nothing was published), or nobody
		// on the worker's subject just after a reconnect. A connection lost
		// with the request out may have delivered it.
		return errors.Is(f.cause, broker.ErrNATS) || errors.Is(f.cause, broker.ErrNoResponders)
	case failConnect, failTimeout:
		var op *net.OpError
		return errors.Is(f.cause, errNotHTTP) || errors.As(f.cause, &op) && op.Op == "dial"
	}
	return false
}

// decodeFailed ends the decode leg's lease after a failure before its first
// byte (status is the worker's answer, 0 when there was none).
func (s *Server) decodeFailed(rs *reqState, f *failure, status int) {
	switch {
	case status == fasthttp.StatusTooManyRequests:
		rs.lease.Done(sched.OutcomeNeutral)
	case status >= 500:
		rs.lease.Done(sched.OutcomeFault)
		mUpstreamErr.Inc()
	default:
		rs.lease.Done(f.outcome())
		s.countFailure(rs.lease.Worker, f)
	}
}

// pullPrefill sends vLLM's prefill leg on the request's call and reads its
// answer into p.kvp. On success the prefill lease stays held (its blocks
// wait for the decode worker's read); on failure it has ended and a 4xx or
// 5xx answer is stashed in rs.
func (s *Server) pullPrefill(cfg *config.Config, rs *reqState, p *pdDispatch, total time.Time) *failure {
	c := &rs.call
	p.pbody = appendPullPrefillBody(p.pbody[:0], rs.body, legModel(rs, &p.pl.Decision))
	c.lease, c.path, c.hdr, c.body, c.stream = &p.pl, p.path, p.hdr, p.pbody, false
	c.total, c.idle = total, 0
	c.once = true // the engine holds the KV of each prefill it takes
	c.now = time.Now().UnixNano()
	c.firstByte = prefillDeadline(cfg, total)
	p.firstPacket = time.Time{}
	if rs.sreq.Stream {
		// The prefill's wait is the stream's first packet's: its deadline
		// holds for the prefill leg and the decode leg after it.
		p.firstPacket = firstPacketDeadline(cfg, rs, total, time.Now())
		if !p.firstPacket.IsZero() && (c.firstByte.IsZero() || p.firstPacket.Before(c.firstByte)) {
			c.firstByte = p.firstPacket
		}
	}
	start := time.Now()
	up, f := s.tr.roundTrip(c)
	if f != nil {
		p.pl.Done(f.outcome())
		s.countFailure(p.pl.Worker, f)
		return f
	}
	status := up.status()
	body, rerr := readAnswer(up, &p.buf, func() { p.pl.FirstToken() })
	if rerr != nil {
		if rerr == errPDAnswer {
			f = fail(failAnswerTooLarge, rerr)
		} else {
			f = prefillReadFailure(up, rerr)
		}
		c.cancel.unset() // first: an abort must not reach the recycled connection's next user
		up.finish(false)
		p.pl.Done(f.outcome())
		if f.kind != failAnswerTooLarge {
			s.countFailure(p.pl.Worker, f)
		}
		return f
	}
	if status >= 400 {
		stashRetry(&rs.errRetry, up) // this answer's, not an earlier decode answer's
	}
	if !c.cancel.unset() {
		// The client left while the answer was read: its connection is closed.
		up.finish(false)
		p.pl.Done(sched.OutcomeNeutral)
		return failureCanceled
	}
	up.finish(true)
	mPDPrefillTime.UpdateDuration(start)
	if status >= 400 {
		rs.errStatus, rs.errFrom = status, p.pl.Worker
		rs.errBody = append(rs.errBody[:0], body...)
		rs.errType = append(rs.errType[:0], up.contentType()...)
		f = &failure{kind: failStatus, status: status}
		if o := statusOutcome(status); status == fasthttp.StatusTooManyRequests {
			p.pl.Done(sched.OutcomeNeutral)
		} else {
			p.pl.Done(o)
		}
		if status >= 500 {
			mUpstreamErr.Inc()
		}
		return f
	}
	kvp, ok, valid := kvTransferParams(body)
	if status != fasthttp.StatusOK || !valid {
		f = fail(failProtocol, errNoKVParams)
		p.pl.Done(f.outcome())
		s.countFailure(p.pl.Worker, f)
		return f
	}
	if !ok {
		// A prefill that ended before its length cap (its first token
		// was a stop: vLLM's connector then hands no KV over) answers
		// without params; the decode leg goes without them, as vLLM's
		// own proxy sends it, and computes the prompt itself.
		kvp = nil
		mPDNoKVParams.Inc()
	}
	p.kvp = append(p.kvp[:0], kvp...)
	// The lease ends at the transfer, with its verdict: a handoff that
	// decode workers cannot take is the prefill worker's fault
	// (fleet.HandoffFailed).
	return nil
}

// prefillReadFailure classifies a read error of a prefill answer. Nothing
// of a prefill leg reaches the client, so a broken answer is no broken
// stream: before the decode leg's commit it goes to another prefill worker
// (after it, it is only counted). The worker answered a head, so it is no
// connection failure either: an invalid answer, or a timeout.
func prefillReadFailure(up upResponse, err error) *failure {
	f := up.readFailure(err, false)
	if f.kind == failConnect {
		f = fail(failProtocol, err)
	}
	return f
}

// readAnswer reads a whole (small) answer into *buf, growing it up to
// pdMaxAnswer; first runs once the first bytes arrived.
func readAnswer(up upResponse, buf *[]byte, first func()) ([]byte, error) {
	b := (*buf)[:0]
	for {
		if len(b) == cap(b) {
			if cap(b) >= pdMaxAnswer {
				return b, errPDAnswer
			}
			nb := make([]byte, len(b), 2*cap(b))
			copy(nb, b)
			b = nb
			*buf = b
		}
		n, err := up.read(b[len(b):cap(b)])
		if n > 0 && len(b) == 0 && first != nil {
			first()
		}
		b = b[:len(b)+n]
		if err == io.EOF {
			return b, nil
		}
		if err != nil {
			return b, err
		}
	}
}

// pdPush is SGLang's concurrent dispatch.
func (s *Server) pdPush(ctx *fasthttp.RequestCtx, cfg *config.Config, rs *reqState, p *pdDispatch, res *tries) {
	r := &rs.sreq
	c := &rs.call
	total, idle := c.total, c.idle
	o := pdOutcome{allConnect: true, retries: s.flags.RequestMaxRetries, acc: &rs.acc}
	batch, berr := sglangBatch(rs)
	if berr != nil {
		s.live.remove(rs)
		mBadRequests.Inc()
		countStatus(fasthttp.StatusBadRequest)
		param := "n" // chat: the choices asked for
		if rs.acc.kind == kindCompletion {
			param = "prompt" // a list of prompts (n multiplies it)
		}
		writeError(ctx, fasthttp.StatusBadRequest, typeInvalidRequest, berr.Error(), param, "")
		res.committed = true
		return
	}
	for {
		if !s.pdAcquire(ctx, cfg, rs, sched.LegPrefill, &o, res, p, &p.pl) {
			return
		}
		if !s.pdAcquire(ctx, cfg, rs, sched.LegDecode, &o, res, p, &rs.lease) {
			p.pl.Done(sched.OutcomeNeutral)
			return
		}
		s.retried(rs, &o, p, &rs.lease)
		// One room per sequence, uniform in [0, 2^63-1], fresh per attempt
		// and the same in both legs' bodies.
		p.rooms = p.rooms[:0]
		for k := max(batch, 1); k > 0; k-- {
			p.rooms = append(p.rooms, rand.Uint64()>>1)
		}
		pw := &p.pl.Worker.PD
		pm, dm := legModel(rs, &p.pl.Decision), legModel(rs, &rs.lease.Decision)
		p.pbody = appendPushRooms(p.pbody[:0], rs.body, pm, pw.BootstrapHost, pw.BootstrapPort, p.rooms, batch)
		dbody := p.pbody // the same body, unless routing gave the legs other model names
		if dm != pm {
			p.dbody = appendPushRooms(p.dbody[:0], rs.body, dm, pw.BootstrapHost, pw.BootstrapPort, p.rooms, batch)
			dbody = p.dbody
		}
		pc := &p.pc
		// Both legs carry the attempt's rooms: neither is sent twice
		// (call.once); a retry takes new rooms. (vLLM's legs are not
		// either: pullPrefill, pdPull.)
		*pc = call{lease: &p.pl, method: c.method, path: p.path, hdr: p.hdr, body: p.pbody, stream: r.Stream,
			total: total, idle: idle, firstByte: prefillDeadline(cfg, total), now: time.Now().UnixNano(), once: true}
		c = decodeCall(cfg, rs, p, total, idle)
		c.body, c.once = dbody, true
		p.mu.Lock()
		p.committed, p.pfail, p.dcall, p.errStatus = false, nil, c, 0
		p.ended, p.waited, p.blamed = false, false, false
		p.decodeBlamed, p.dw = false, rs.lease.Worker
		p.mu.Unlock()
		p.refs.Add(1)
		go p.pushPrefill()

		up, f := s.tr.roundTrip(c)
		status, n, eof, ok := 0, 0, false, false
		if f == nil {
			status = up.status()
			if status < 500 && status != fasthttp.StatusTooManyRequests {
				// The answer commits as the mixed dispatch's does: whole, or
				// on its first event (a keep-alive is no answer yet).
				var rerr error
				n, rerr = readFirst(rs, c, up, status)
				if ok = rerr == nil || rerr == io.EOF; ok {
					eof = rerr == io.EOF
				} else {
					f = firstReadFailure(c, up, rerr)
				}
			}
		}
		p.mu.Lock()
		if ok && p.pfail == nil {
			p.committed = true
		}
		// From here on the prefill goroutine leaves the decode call alone
		// (its connection may go back to the pool).
		p.dcall = nil
		committed := p.committed
		if !committed && f != nil && f.kind == failTimeout && !p.ended {
			p.waited = true
		}
		// A decode 5xx while the prefill leg still waits to push its KV:
		// either worker may be at fault; the handoff records decide
		// (fleet.HandoffFailed).
		blamed := !committed && f == nil && handoffAmbiguous(status) && !p.ended &&
			fleet.HandoffFailed(p.pl.Worker, rs.lease.Worker)
		p.blamed = blamed
		p.mu.Unlock()
		if committed {
			if status >= 200 && status <= 299 {
				fleet.HandoffTaken(p.pl.Worker, rs.lease.Worker)
			}
			if status < 200 || status > 299 {
				// The decode engine refused the request (its answer is the
				// client's): it never joins the room, so the prefill leg
				// would wait for it until its timeout. Stop it: its lease
				// ends neutral (pushPrefill).
				p.pc.cancel.abort()
			}
			s.pdCommit(ctx, cfg, rs, p, up, n, eof, res)
			return
		}
		// The attempt failed before the client got a byte: stop the
		// prefill leg and wait for its goroutine. The abort reaches the
		// prefill's connection only while the goroutine owns it (it
		// unsets the slot before closing or pooling the connection).
		p.pc.cancel.abort()
		<-p.done
		pf := p.pfail // the goroutine has ended: no lock needed
		// The prefill engine may have had the request alone (govState.end).
		c.wrote = c.wrote || p.pc.wrote
		if up != nil {
			switch {
			case ok: // the decode answered, but the prefill had failed
				c.cancel.unset() // first: an abort must not reach the recycled connection's next user
				up.finish(false)
			case f == nil && pf == nil:
				rs.stashAnswer(up, status, &c.cancel)
				f = &failure{kind: failStatus, status: status}
			default:
				c.cancel.unset()
				up.finish(false)
			}
		}
		leg := sched.LegDecode
		if pf != nil {
			// The prefill failed first: the decode engine never got its KV.
			// It is blamed only for its own connection failure, or when the
			// prefill timed out waiting for it to join the room and the
			// handoff records blame it (pushPrefill).
			if f != nil && (f.kind == failConnect || f.kind == failNoResponder || f.kind == failEngine) {
				s.decodeFailed(rs, f, 0)
				r.Tried = append(r.Tried, rs.lease.Worker.Idx)
			} else if p.decodeBlamed {
				s.decodeFailed(rs, fail(failTimeout, errRoomNotJoined), 0)
				r.Tried = append(r.Tried, rs.lease.Worker.Idx)
				leg = sched.LegDecode
			} else {
				rs.lease.Done(sched.OutcomeNeutral)
				if pf.cause == errDecodeWaited {
					r.Tried = append(r.Tried, rs.lease.Worker.Idx) // either may hang: another pair
				}
			}
			r.Tried = append(r.Tried, p.pl.Worker.Idx)
			if f = pf; !p.decodeBlamed {
				leg = sched.LegPrefill
			}
			if f.kind == failStatus && f.status < 500 && f.status != fasthttp.StatusTooManyRequests && p.errStatus != 0 {
				s.live.remove(rs)
				p.stashedInto(rs)
				s.relayStashed(ctx, cfg, rs, p.pl.Worker)
				res.committed = true
				return
			}
			if f.kind == failStatus && p.errStatus != 0 {
				// A prefill 5xx or 429: the answer relayed if it is the last
				// failure, as the vLLM mode and mixed workers do.
				p.stashedInto(rs)
			} else if f.kind == failStatus {
				// Its answer broke or outgrew pdMaxAnswer: kept nowhere, and
				// an earlier attempt's stashed answer is not this failure's.
				rs.errStatus = 0
			}
		} else if blamed {
			rs.lease.Done(sched.OutcomeNeutral) // the prefill leg took the fault (pushPrefill)
			r.Tried = append(r.Tried, rs.lease.Worker.Idx, p.pl.Worker.Idx)
		} else {
			s.decodeFailed(rs, f, status)
			r.Tried = append(r.Tried, rs.lease.Worker.Idx)
		}
		lw := rs.lease.Worker
		if leg == sched.LegPrefill {
			lw = p.pl.Worker
		}
		if !o.failed(leg, lw, f, pf == nil && c.cancel.wasAborted() || f.kind == failCanceled) {
			break // out of retries, or the client left
		}
		c.cancel.reset()
		p.pc.cancel.reset()
	}
	o.finish(res)
}

// pushPrefill is the SGLang prefill leg, on its own goroutine: it sends the
// leg, drains the answer (the engine answers once the KV is pushed) and
// ends the prefill lease. A failure before the decode leg's answer reached
// the client aborts the decode leg. Before the connection is closed or
// pooled, p.pc's abort slot stops pointing at it: the dispatch aborts that
// slot to stop the leg, and must not reach a connection another request
// took from the pool. An abort by the dispatch (the decode leg failed or
// refused the request, or the client left) ends the lease neutral and
// counts nothing: the dispatch counts the client leaving, once.
func (p *pdDispatch) pushPrefill() {
	s := p.s
	start := time.Now()
	up, f := s.tr.roundTrip(&p.pc)
	outcome := sched.OutcomeSuccess
	if f == nil {
		status := up.status()
		if status >= 400 {
			f = &failure{kind: failStatus, status: status}
			outcome = statusOutcome(status)
			if status == fasthttp.StatusTooManyRequests {
				outcome = sched.OutcomeNeutral
			}
			// The whole answer, however many reads it takes: a 4xx is the
			// client's, a 5xx or 429 is relayed if it is the last failure.
			// One that breaks, or outgrows pdMaxAnswer, is kept nowhere.
			body, err := readAnswer(up, &p.buf, nil)
			if err == nil {
				p.mu.Lock()
				p.errStatus = status
				p.errBody = append(p.errBody[:0], body...)
				p.errType = append(p.errType[:0], up.contentType()...)
				stashRetry(&p.errRetry, up)
				p.mu.Unlock()
			}
			alive := p.pc.cancel.unset()
			up.finish(alive && err == nil)
		} else {
			n, err := up.read(p.buf)
			if n > 0 || err == nil || err == io.EOF {
				p.pl.FirstToken()
			}
			for err == nil {
				// After its first bytes the leg is bounded as a stream is,
				// by stream_idle_s (prefill_timeout_s only bounds the wait
				// for them, and may be 0).
				p.pc.armMore(up) // (firstByte: pd.prefill_timeout_s, capped by the total)
				_, err = up.read(p.buf)
			}
			if err == io.EOF {
				up.finish(p.pc.cancel.unset())
				mPDPrefillTime.UpdateDuration(start)
			} else {
				f = prefillReadFailure(up, err)
				outcome = f.outcome()
				p.pc.cancel.unset()
				up.finish(false)
			}
		}
	} else {
		outcome = f.outcome()
	}
	p.mu.Lock()
	p.ended = true
	waited, blamed := p.waited, p.blamed
	if f != nil && f.kind == failTimeout && !p.committed && p.dcall != nil && !waited && !blamed {
		// Timed out while the decode leg waits for its KV: either engine
		// may hang (see pdDispatch.decodeBlamed). The failure is set now so
		// that the decode leg cannot commit after the verdict.
		p.decodeBlamed = !fleet.HandoffTimedOut(p.pl.Worker, p.dw)
		p.pfail = f
		p.dcall.cancel.abort()
	}
	decodeBlamed := p.decodeBlamed
	p.mu.Unlock()
	if decodeBlamed {
		// The decode worker takes the fault (pdPush); this leg ends neutral.
		outcome = sched.OutcomeNeutral
	} else if blamed && f != nil && f.kind == failCanceled {
		// Stopped because a decode worker could not take its KV, and the
		// handoff records blame this worker (pdPush).
		outcome = sched.OutcomeFault
		mUpstreamErr.Inc()
	} else if waited && f != nil && p.pc.cancel.wasAborted() {
		// Neither leg can be blamed (see pdDispatch.waited): a timeout, on
		// no breaker.
		f = fail(failTimeout, errDecodeWaited)
		outcome = sched.OutcomeNeutral
		mTimeouts.Inc()
	} else if f != nil && f.kind != failStatus && f.kind != failCanceled {
		s.countFailure(p.pl.Worker, f)
	} else if f != nil && f.kind == failStatus && f.status >= 500 {
		mUpstreamErr.Inc()
	}
	p.pl.Done(outcome)
	if f != nil && f.kind != failCanceled {
		p.mu.Lock()
		if p.committed {
			mPDPrefillLate.Inc()
		} else {
			p.pfail = f
			if p.dcall != nil {
				p.dcall.cancel.abort()
			}
		}
		p.mu.Unlock()
	}
	p.done <- struct{}{}
	p.release()
}

// stashedInto copies the prefill's error answer into rs (relayStashed
// sends it). After the prefill goroutine ended: no lock needed.
func (p *pdDispatch) stashedInto(rs *reqState) {
	rs.errStatus, rs.errFrom = p.errStatus, p.pl.Worker
	rs.errBody = append(rs.errBody[:0], p.errBody...)
	rs.errType = append(rs.errType[:0], p.errType...)
	for i := range p.errRetry {
		rs.errRetry[i] = append(rs.errRetry[i][:0], p.errRetry[i]...)
	}
}

// appendRequestID appends a random request id (32 hex digits).
func appendRequestID(dst []byte) []byte {
	return appendNibblesHex(appendNibblesHex(dst, rand.Uint64()), rand.Uint64())
}

// appendNibblesHex appends the 16 nibbles of v as lower-case hex digits,
// the lowest nibble first, eight at a time: the nibbles spread one to a
// byte, '0' added to each, and 'a'-'0'-10 more to those above 9.
func appendNibblesHex(dst []byte, v uint64) []byte {
	const ones = 0x0101010101010101
	var b [16]byte
	for i := 0; i < 2; i++ {
		x := uint64(uint32(v >> (32 * i)))
		x = (x | x<<16) & 0x0000ffff0000ffff
		x = (x | x<<8) & 0x00ff00ff00ff00ff
		x = (x | x<<4) & 0x0f0f0f0f0f0f0f0f
		above9 := (x + 6*ones) >> 4 & ones
		binary.LittleEndian.PutUint64(b[8*i:], x+'0'*ones+above9*('a'-'0'-10))
	}
	return append(dst, b[:]...)
}

// The legs' bodies. The client's body was validated by the parser; these
// walks copy its top-level members byte for byte, drop the ones the router
// sets (every duplicate of them: an engine would see the last one), replace
// the model when routing resolved another name, and append the router's
// members. Keys are compared decoded (a key written with \u escapes is the
// same key to the engine).

// member is one top-level member: the key (raw), and the span from the
// key's opening quote to the value's end.
type member struct {
	key          []byte
	start, vs, e int
}

// nextMember scans the member at d[i] (just after '{' or ','). It returns
// the index after the following ',' and last=true at the closing '}'. d
// must be valid JSON (the parser or skipValue checked it): values are
// spanned, not validated again.
func nextMember(d []byte, i int) (m member, next int, last bool, err error) {
	i = skipSpace(d, i)
	if i < len(d) && d[i] == '}' {
		return m, i + 1, true, errEmpty
	}
	if i >= len(d) || d[i] != '"' {
		return m, i, false, errJSON
	}
	m.start = i
	m.key, i, err = scanString(d, i)
	if err != nil {
		return m, i, false, err
	}
	i = skipSpace(d, i)
	if i >= len(d) || d[i] != ':' {
		return m, i, false, errJSON
	}
	m.vs = skipSpace(d, i+1)
	if m.vs >= len(d) {
		return m, m.vs, false, errJSON
	}
	m.e = spanValue(d, m.vs)
	i = skipSpace(d, m.e)
	switch {
	case i < len(d) && d[i] == ',':
		return m, i + 1, false, nil
	case i < len(d) && d[i] == '}':
		return m, i + 1, true, nil
	}
	return m, i, false, errJSON
}

// spanValue returns the end of the valid JSON value at d[i]: strings are
// skipped with bytes.IndexByte (a prompt is mostly string bytes), the rest
// byte by byte.
func spanValue(d []byte, i int) int {
	switch d[i] {
	case '"':
		return spanString(d, i)
	case '{', '[':
		depth := 0
		for i < len(d) {
			switch d[i] {
			case '"':
				i = spanString(d, i)
				continue
			case '{', '[':
				depth++
			case '}', ']':
				if depth--; depth == 0 {
					return i + 1
				}
			}
			i++
		}
		return len(d)
	}
	for i < len(d) {
		if c := d[i]; c == ',' || c == '}' || c == ']' || isSpace(c) {
			return i
		}
		i++
	}
	return i
}

// spanString returns the index after the string whose opening quote is at
// d[i]: its first quote not escaped by an odd run of backslashes.
func spanString(d []byte, i int) int {
	i++
	for {
		j := bytes.IndexByte(d[i:], '"')
		if j < 0 {
			return len(d)
		}
		i += j
		n := 0
		for k := i - 1; d[k] == '\\'; k-- {
			n++
		}
		if n%2 == 0 {
			return i + 1
		}
		i++
	}
}

// errEmpty marks an empty object (no member).
var errEmpty = errors.New("empty object")

// keyIs reports whether the raw key decodes to name.
func keyIs(raw []byte, name string) bool {
	if !hasEscape(raw) {
		return string(raw) == name
	}
	var b [64]byte
	return string(unescape(b[:0], raw)) == name
}

// bodyEdit copies the client's body's members, minus drop, with the model
// replaced when model is set, leaving the object open for the router's
// members (with a trailing ',' when a member was copied). It reports
// whether a member named note was present.
func bodyEdit(dst, body []byte, model string, drop []string, note string) ([]byte, bool) {
	i := skipSpace(body, 0)
	out := append(dst, '{')
	noted := false
	if i >= len(body) || body[i] != '{' {
		return out, false
	}
	first := true
	for i++; ; {
		m, next, last, err := nextMember(body, i)
		if err != nil {
			break
		}
		i = next
		if note != "" && keyIs(m.key, note) {
			noted = true
		}
		skip := false
		for _, k := range drop {
			if keyIs(m.key, k) {
				skip = true
				break
			}
		}
		if !skip {
			if !first {
				out = append(out, ',')
			}
			first = false
			if model != "" && keyIs(m.key, "model") {
				out = append(out, `"model":`...)
				out = appendJSONString(out, model)
			} else {
				out = append(out, body[m.start:m.e]...)
			}
		}
		if last {
			break
		}
	}
	if !first {
		out = append(out, ',')
	}
	return out, noted
}

// topMember returns the value span of the object's last top-level member
// named name (a JSON decoder keeps the last duplicate); ok is false when
// there is none or body is not an object.
func topMember(body []byte, name string) (vs, ve int, ok bool) {
	i := skipSpace(body, 0)
	if i >= len(body) || body[i] != '{' {
		return 0, 0, false
	}
	for i++; ; {
		m, next, last, err := nextMember(body, i)
		if err != nil {
			return vs, ve, ok
		}
		if keyIs(m.key, name) {
			vs, ve, ok = m.vs, m.e, true
		}
		if last {
			return vs, ve, ok
		}
		i = next
	}
}

var (
	// prompt_logprobs: the decode leg's answer is the client's, so the
	// prefill's would be computed and dropped (and a long prompt's make
	// its answer megabytes).
	pullPrefillDrop = []string{"kv_transfer_params", "stream", "stream_options", "max_tokens",
		"max_completion_tokens", "min_tokens", "min_completion_tokens", "prompt_logprobs"}
	pullDecodeDrop = []string{"kv_transfer_params"}
	pushDrop       = []string{"bootstrap_host", "bootstrap_port", "bootstrap_room"}
)

// appendPullPrefillBody is vLLM's prefill leg: the client's body with
// kv_transfer_params {do_remote_decode: true, ...}, stream false,
// max_tokens 1 (max_completion_tokens 1 too when present), without
// stream_options, min_tokens and min_completion_tokens (toy_proxy_server.py,
// send_request_to_service).
func appendPullPrefillBody(dst, body []byte, model string) []byte {
	out, mct := bodyEdit(dst, body, model, pullPrefillDrop, "max_completion_tokens")
	out = append(out, `"kv_transfer_params":{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null},"stream":false,"max_tokens":1`...)
	if mct {
		out = append(out, `,"max_completion_tokens":1`...)
	}
	return append(out, '}')
}

// appendPullDecodeBody is vLLM's decode leg: the client's body with the
// prefill's kv_transfer_params (none when the prefill gave none: the
// decode engine computes the prompt itself).
func appendPullDecodeBody(dst, body []byte, model string, kvp []byte) []byte {
	out, _ := bodyEdit(dst, body, model, pullDecodeDrop, "")
	if len(kvp) == 0 {
		if out[len(out)-1] == ',' {
			out = out[:len(out)-1]
		}
		return append(out, '}')
	}
	out = append(out, `"kv_transfer_params":`...)
	out = append(out, kvp...)
	return append(out, '}')
}

// appendPushBody is appendPushRooms with room for the first sequence and a
// fresh room for each other one.
func appendPushBody(dst, body []byte, model, host string, port int, room uint64, batch int) []byte {
	var one [1]uint64
	rooms := one[:]
	if batch > 1 {
		rooms = make([]uint64, batch)
		for k := 1; k < batch; k++ {
			rooms[k] = rand.Uint64() >> 1
		}
	}
	rooms[0] = room
	return appendPushRooms(dst, body, model, host, port, rooms, batch)
}

// appendPushRooms is SGLang's body for both legs: the client's body with
// bootstrap_host, bootstrap_port (null when the prefill worker's record has
// none) and bootstrap_room; for a batch of n > 0 sequences, lists of n
// entries with a room each (PDRouter::inject_bootstrap_into_value). rooms
// has max(batch, 1) entries: both legs of an attempt get the same rooms.
func appendPushRooms(dst, body []byte, model, host string, port int, rooms []uint64, batch int) []byte {
	if len(rooms) != max(batch, 1) {
		panic("BUG: appendPushRooms needs one room per sequence")
	}
	out, _ := bodyEdit(dst, body, model, pushDrop, "")
	n := max(batch, 1)
	list := func(f func(k int)) {
		if batch > 0 {
			out = append(out, '[')
		}
		for k := 0; k < n; k++ {
			if k > 0 {
				out = append(out, ',')
			}
			f(k)
		}
		if batch > 0 {
			out = append(out, ']')
		}
	}
	out = append(out, `"bootstrap_host":`...)
	list(func(int) { out = appendJSONString(out, host) })
	out = append(out, `,"bootstrap_port":`...)
	list(func(int) {
		if port > 0 {
			out = strconv.AppendInt(out, int64(port), 10)
		} else {
			out = append(out, "null"...)
		}
	})
	out = append(out, `,"bootstrap_room":`...)
	list(func(k int) { out = strconv.AppendUint(out, rooms[k], 10) })
	return append(out, '}')
}

var errBatchTooLarge = errors.New("a batch of more than " + strconv.Itoa(pdMaxBatch) + " sequences cannot be sent to a prefill/decode pair")

// sglangBatch is the number of sequences of an SGLang batch request, 0 for
// a single sequence, as sgl-router counts them: a completion prompt that is
// a list of prompts (its length), a chat request with n > 1 (n).
func sglangBatch(rs *reqState) (int, error) {
	b := &rs.parsed
	d := rs.body
	n := 0
	if b.promptEnd > b.promptStart && d[b.promptStart] == '[' {
		i := skipSpace(d, b.promptStart+1)
		if i < len(d) && (d[i] == '"' || d[i] == '[') {
			for i < b.promptEnd && d[i] != ']' {
				e, err := skipValue(d, i, 1)
				if err != nil {
					break
				}
				n++
				i = skipSpace(d, e)
				if i < len(d) && d[i] == ',' {
					i = skipSpace(d, i+1)
				}
			}
		}
	} else if b.msgEnd > b.msgStart {
		if vs, ve, ok := topMember(d, "n"); ok {
			if v := laxInt(d[vs:ve]); v > 1 { // as SGLang reads it: 3.0 and "3" too
				n = v
			}
		}
	}
	if n > pdMaxBatch {
		return 0, errBatchTooLarge
	}
	return n, nil
}

// kvTransferParams returns the top-level kv_transfer_params object of a
// vLLM prefill answer (the last one, as a JSON decoder keeps), when it has
// do_remote_prefill true (ok). valid is false when the answer is no JSON
// object, or its params are neither such an object nor null or absent
// (what vLLM answers for a prefill that stopped before its length cap).
func kvTransferParams(body []byte) (kv []byte, ok, valid bool) {
	i := skipSpace(body, 0)
	if end, err := skipValue(body, i, 0); err != nil || skipSpace(body, end) != len(body) || i >= len(body) || body[i] != '{' {
		return nil, false, false
	}
	vs, ve, found := topMember(body, "kv_transfer_params")
	if !found || string(body[vs:ve]) == "null" {
		return nil, false, true
	}
	if body[vs] != '{' {
		return nil, false, false
	}
	kv = body[vs:ve]
	rs, re, found := topMember(kv, "do_remote_prefill")
	if found && string(kv[rs:re]) == "true" {
		return kv, true, true
	}
	return nil, false, false
}
