package mirror

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/infera/infera/internal/netpeek"
	"github.com/infera/infera/protocol"
	"github.com/infera/infera/upstream"
	"github.com/valyala/fasthttp"
)

// MirrorHeader is set ("1") on every mirrored request, so the target can
// tell mirrored traffic from its own.
const MirrorHeader = "X-Infera-Mirror"

// result is what one mirrored request gave.
type result struct {
	status           int
	err              error
	timedOut         bool
	dropped          bool          // not sent: no room in mirror.max_buffer_bytes for the substituted copy
	expired          bool          // not sent: mirror.timeout_ms ran out before the request was handed to the connection
	ttfe             time.Duration // first SSE event (streams) or response headers
	bytes            int64
	events           int
	usage            bool
	prompt, complete int
	// api is the usage vocabulary of the answer: a chat or completions one
	// (prompt_tokens, completion_tokens: scanUsage), an Anthropic Messages
	// or an OpenAI Responses one (input_tokens, output_tokens:
	// scanAPIUsage).
	api apiKind
	// input holds the input parts of a Messages or Responses usage as
	// last seen (partInput, partCacheWrite, partCacheRead): a stream's
	// events each may carry some of them, prompt is their sum.
	input protocol.AnthropicInput
}

// sender is the reusable state of one send (pooled): the request URL, the
// Authorization value, the line reader of streams, the kept part of a
// non-streamed answer.
type sender struct {
	url     []byte
	bearer  []byte
	model   []byte // modelOf as a JSON string
	modelOf string // the mirror.target_model model encodes
	br      *bufio.Reader
	body    []byte // a non-streamed answer, at most Options.MaxResponseBytes
	long    []byte // a stream line longer than br's buffer, reassembled
}

// streamBufSize is the line reader's buffer: an SSE event longer than this
// is reassembled in sender.long.
const streamBufSize = 16 << 10

var senderPool = sync.Pool{New: func() any { return &sender{br: bufio.NewReaderSize(nil, streamBufSize)} }}

func acquireSender() *sender { return senderPool.Get().(*sender) }

func releaseSender(s *sender) {
	if cap(s.body) > maxPooledBody {
		s.body = nil
	}
	if cap(s.long) > maxPooledBody {
		s.long = nil
	}
	senderPool.Put(s)
}

// sendJob sends one job to the target, reads the answer to its end, and
// accounts for it (metrics, log line).
func (m *Mirror) sendJob(j *job) {
	cfg := j.cfg
	deadline := j.at.Add(millis(cfg.TimeoutMS))
	var res result
	start := time.Now()
	s := acquireSender()
	m.do(s, j, deadline, &res)
	releaseSender(s)
	if res.dropped {
		m.m.droppedFull.Inc()
		return
	}
	if res.expired {
		// Nothing reached the target: a drop, as a job that expired
		// waiting for a sender, not a request that timed out.
		m.m.droppedExpired.Inc()
		return
	}
	end := time.Now()
	if res.err != nil && (!end.Before(deadline) || isTimeout(res.err)) {
		res.timedOut = true
	}
	if m.ctx.Err() != nil && !res.timedOut && res.err != nil {
		return // shut down: not the target's fault, nothing to record
	}
	m.m.duration.UpdateDuration(j.at)
	switch {
	case res.timedOut:
		m.m.timeout.Inc()
	case res.err != nil:
		m.m.failed.Inc()
	case res.status >= 200 && res.status < 300:
		m.m.ok.Inc()
	default:
		m.m.httpError.Inc()
	}
	if res.usage {
		m.m.promptTokens.Add(res.prompt)
		m.m.completionTokens.Add(res.complete)
	}
	if !cfg.LogRecording {
		if res.err != nil && !res.timedOut {
			m.warn.Warn("mirror: request failed", "err", describe(res.err))
		}
		return
	}
	attrs := make([]slog.Attr, 0, 16)
	attrs = append(attrs,
		slog.Uint64("id", m.seq.Add(1)),
		slog.String("request_id", string(j.reqID)),
		slog.String("path", safePath(j.path)),
		slog.Bool("stream", j.stream),
		slog.String("target_model", cfg.TargetModel),
		slog.Int("status", res.status),
		slog.String("result", resultName(&res)),
		slog.Float64("queue_ms", ms(start.Sub(j.at))),
		slog.Float64("latency_ms", ms(end.Sub(start))),
		slog.Float64("first_event_ms", ms(res.ttfe)),
		slog.Int64("response_bytes", res.bytes),
		slog.Bool("usage", res.usage),
		slog.Int("prompt_tokens", res.prompt),
		slog.Int("completion_tokens", res.complete),
	)
	if j.stream {
		attrs = append(attrs, slog.Int("events", res.events))
	}
	if res.err != nil {
		attrs = append(attrs, slog.String("err", describe(res.err)))
	}
	m.log.LogAttrs(context.Background(), slog.LevelInfo, "mirror", attrs...)
}

func resultName(r *result) string {
	switch {
	case r.timedOut:
		return "timeout"
	case r.err != nil:
		return "error"
	case r.status >= 200 && r.status < 300:
		return "ok"
	}
	return "http_error"
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

var (
	strApplicationJSON = []byte("application/json")
	strEventStream     = []byte("text/event-stream")
	strAuthorization   = []byte("Authorization")
	strRequestID       = []byte("X-Request-Id")
	strDataPrefix      = []byte("data:")
)

// do builds the mirrored request from the allowed headers only, sends it
// and consumes the answer. Everything, connecting and reading included,
// ends by deadline: the connection's deadline is set before the request is
// written, so a slow answer fails its next read and its connection is
// closed.
func (m *Mirror) do(s *sender, j *job, deadline time.Time, res *result) {
	cfg := j.cfg
	t := m.targetPool(cfg.TargetAddress)
	if t.err != nil {
		res.err = localError("invalid mirror.target_address")
		return
	}
	body := j.body
	if cfg.TargetModel != "" {
		if s.modelOf != cfg.TargetModel {
			// Encoded once per target model (per pooled sender).
			q, err := json.Marshal(cfg.TargetModel)
			if err != nil {
				res.err = localError("invalid mirror.target_model")
				return
			}
			s.model, s.modelOf = append(s.model[:0], q...), cfg.TargetModel
		}
		// The substituted copy is held while the request is sent: it counts
		// in mirror.max_buffer_bytes with the job (given back when the job
		// is released). Without room the request is dropped, as for a full
		// queue.
		need := int64(len(j.body) + len(s.model))
		if m.held.Add(need) > cfg.BufferBytes() {
			m.held.Add(-need)
			res.dropped = true
			return
		}
		j.held += need
		j.scratch = replaceModelQuoted(j.scratch[:0], j.body, s.model)
		body = j.scratch
	}
	req := fasthttp.AcquireRequest()
	resp := fasthttp.AcquireResponse()
	defer func() {
		resp.CloseBodyStream() // closes the connection unless the answer was read to its end
		fasthttp.ReleaseResponse(resp)
		fasthttp.ReleaseRequest(req)
	}()
	s.url = t.ep.AppendURL(s.url[:0], j.path)
	req.SetRequestURIBytes(s.url)
	req.Header.SetMethod(fasthttp.MethodPost)
	// The whole header list (with Host and Content-Length): nothing from
	// the client but the request's id (its own when it sent a usable one:
	// 1-128 visible ASCII characters, checked by the router).
	req.Header.SetContentTypeBytes(strApplicationJSON)
	if j.stream {
		req.Header.SetBytesV("Accept", strEventStream)
	} else {
		req.Header.SetBytesV("Accept", strApplicationJSON)
	}
	req.Header.SetUserAgent("infera-mirror")
	req.Header.Set(MirrorHeader, "1")
	if len(j.reqID) > 0 {
		// The request's id, as the engine got it: the target's log, the
		// access log and this line name the same request.
		req.Header.SetBytesKV(strRequestID, j.reqID)
	}
	if cfg.AuthToken.IsSet() {
		s.bearer = cfg.AuthToken.AppendBearer(s.bearer[:0])
		req.Header.SetBytesKV(strAuthorization, s.bearer)
	}
	req.SetBodyRaw(body)
	start := time.Now()
	// The budget may have run out since the sender took the job (the
	// wake-up that admitted it raced its expiry, or the substitution
	// above): the request is then not sent at all. DoTimeout with what is
	// left, measured once here, so that fasthttp does not find it spent
	// either and answer ErrTimeout, which would count as a timeout of a
	// request the target never saw.
	left := deadline.Sub(start)
	if left <= 0 {
		res.expired = true
		return
	}
	if err := t.hc.DoTimeout(req, resp, left); err != nil {
		res.err = err
		return
	}
	res.status = resp.StatusCode()
	res.ttfe = time.Since(start)
	switch {
	case bytes.HasPrefix(j.path, pathMessages):
		res.api = apiMessages
	case bytes.HasPrefix(j.path, pathResponses):
		res.api = apiResponses
	}
	r := resp.BodyStream()
	if r == nil {
		return // no body (204, 304)
	}
	// The answer's kept bytes count in the byte budget with the request
	// copies, until the answer is read.
	k := keeper{m: m, budget: cfg.BufferBytes()}
	defer k.release()
	if j.stream && res.status == fasthttp.StatusOK {
		m.readStream(s, r, &k, start, res)
	} else {
		m.readBody(s, r, &k, res)
	}
}

// keeper counts the buffers that keep parts of an answer (a non-streamed
// answer, a long stream line) in mirror.max_buffer_bytes, with the request
// copies: a target that sends long answers to every sender cannot make the
// mirror hold more than the budget.
type keeper struct {
	m      *Mirror
	budget int64
	held   int64 // bytes counted in Mirror.held
}

// room returns buf with capacity for want bytes (grown to at least twice
// its capacity, at most limit unless want is more), the capacity counted
// in the budget; false, and buf unchanged, when the budget has no room.
func (k *keeper) room(buf []byte, want, limit int) ([]byte, bool) {
	c := cap(buf)
	if want > c {
		c = max(want, min(max(2*c, 4<<10), limit))
	}
	if need := int64(c) - k.held; need > 0 {
		if k.m.held.Add(need) > k.budget {
			k.m.held.Add(-need)
			return buf, false
		}
		k.held += need
	}
	if c > cap(buf) {
		nb := make([]byte, len(buf), c)
		copy(nb, buf)
		buf = nb
	}
	return buf, true
}

// release gives the counted bytes back (the buffers go back to the
// sender's pool, or to the garbage collector).
func (k *keeper) release() {
	k.m.held.Add(-k.held)
	k.held = 0
}

// readBody reads a whole answer (keeping at most MaxResponseBytes in a
// pooled buffer, within the byte budget, the rest read and discarded) and
// takes the usage from it.
func (m *Mirror) readBody(s *sender, r io.Reader, k *keeper, res *result) {
	buf := s.body[:0]
	limit := m.opts.MaxResponseBytes
	var err error
	for len(buf) < limit {
		var ok bool
		if buf, ok = k.room(buf, len(buf)+1, limit); !ok {
			break // no budget left: the rest is read and discarded
		}
		var n int
		n, err = r.Read(buf[len(buf):min(cap(buf), limit)])
		buf = buf[:len(buf)+n]
		res.bytes += int64(n)
		if err != nil {
			break
		}
	}
	s.body = buf
	if err == nil {
		var rest int64
		rest, err = io.Copy(io.Discard, r)
		res.bytes += rest
	} else if err == io.EOF {
		err = nil
	}
	if err != nil {
		res.err = err
		return
	}
	res.scanUsage(buf)
}

// readStream reads an SSE answer to its end (the connection is pooled
// again only then), counting events and taking the usage of the last chunk
// that carries one.
func (m *Mirror) readStream(s *sender, r io.Reader, k *keeper, start time.Time, res *result) {
	br := s.br
	br.Reset(r)
	defer br.Reset(nil)
	first := true
	long := s.long[:0]
	inLong := false // long holds the start of the current line
	// cut: the current line is longer than could be kept (MaxResponseBytes,
	// the byte budget); dataLine: it is an event (a "data:" line).
	cut, dataLine := false, false
	for {
		line, err := br.ReadSlice('\n')
		res.bytes += int64(len(line))
		if err == bufio.ErrBufferFull {
			if !inLong {
				dataLine = bytes.HasPrefix(line, strDataPrefix)
			}
			long, cut = k.keepLine(long, line, m.opts.MaxResponseBytes, cut)
			inLong = true
			continue
		}
		partial := false
		if inLong {
			long, cut = k.keepLine(long, line, m.opts.MaxResponseBytes, cut)
			line, partial = long, cut
			long, inLong, cut = long[:0], false, false
		}
		if partial {
			// Counted as an event, but only part of it was kept: no
			// usage is taken from it.
			if dataLine {
				m.event(&first, start, nil, res)
			}
		} else if data, ok := bytes.CutPrefix(bytes.TrimRight(line, "\r\n"), strDataPrefix); ok {
			m.event(&first, start, bytes.TrimSpace(data), res)
		}
		if err != nil {
			if err != io.EOF {
				res.err = err
			}
			s.long = long
			return
		}
	}
}

// event counts an SSE event (its data, nil when not kept) of a stream
// whose reading started at start.
func (m *Mirror) event(first *bool, start time.Time, data []byte, res *result) {
	if *first {
		res.ttfe = time.Since(start)
		*first = false
	}
	res.events++
	if data != nil {
		res.scanUsage(data)
	}
}

var (
	pathMessages  = []byte("/v1/messages")
	pathResponses = []byte("/v1/responses")
)

// scanUsage takes the usage of an answer or stream event b, in the form
// of the API the copy was sent to.
func (r *result) scanUsage(b []byte) {
	if r.api != apiChat {
		scanAPIUsage(b, r)
	} else {
		scanUsage(b, r)
	}
}

// keepLine appends part, the next part of a stream line too long for the
// line reader's buffer, to long (the line so far), within limit and the
// byte budget. cut tells that an earlier part could not be kept: nothing
// more of the line is kept, and keepLine returns cut true whenever a part
// is left out.
func (k *keeper) keepLine(long, part []byte, limit int, cut bool) ([]byte, bool) {
	if cut || len(long)+len(part) > limit {
		return long, true
	}
	long, ok := k.room(long, len(long)+len(part), limit)
	if !ok {
		return long, true
	}
	return append(long, part...), false
}

// localError is an error of the mirror itself (not from the network):
// its text is safe to log.
type localError string

func (e localError) Error() string { return string(e) }

// describe is the log form of a request error, in fixed words (transport
// errors can quote bytes the target sent).
func describe(err error) string {
	var le localError
	switch {
	case errors.As(err, &le):
		return le.Error()
	case isTimeout(err):
		return "timeout"
	case errors.Is(err, netpeek.ErrStale) || errors.Is(err, fasthttp.ErrConnectionClosed):
		return "connection closed early"
	case errors.Is(err, fasthttp.ErrNoFreeConns):
		return "no free connections"
	}
	return upstream.DescribeError(err)
}

// isTimeout reports a deadline that fired: the request's (fasthttp's
// ErrTimeout, a connection deadline) or the connect timeout.
func isTimeout(err error) bool {
	if errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	var te interface{ Timeout() bool }
	return errors.As(err, &te) && te.Timeout()
}

// safePath returns the request path for a log line: at most 128 bytes of
// [A-Za-z0-9/._-], anything else as '?' (raw client bytes never reach a
// log line).
func safePath(p []byte) string {
	if len(p) > 128 {
		p = p[:128]
	}
	b := make([]byte, len(p))
	for i, c := range p {
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '/' || c == '.' || c == '_' || c == '-' {
			b[i] = c
		} else {
			b[i] = '?'
		}
	}
	return string(b)
}
