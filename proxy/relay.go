package proxy

import (
	"bytes"
	"errors"
	"io"
	"net"
	"sync"
	"time"

	"github.com/infera/infera/internal/jsonscan"
	"github.com/infera/infera/protocol"
	"github.com/infera/infera/sched"
)

// relay streams an upstream body to the client after the response head
// was committed. fasthttp drives it from the connection's goroutine: it
// calls WriteTo (each Write is one flushed chunk to the client) and then
// CloseWithError, with a non-nil error when writing to the client failed.
// The relay owns the request's state from the moment it is attached and
// releases it in CloseWithError, so the lease ends exactly once, there.
type relay struct {
	s  *Server
	rs *reqState
	up upResponse

	buf     []byte // rs.rbuf: free once pending is written
	pending []byte // the first chunk (in rs.rbuf), read before the head was committed
	upEOF   bool
	failed  *failure
	sse     bool
	// judgeEnd: a close-delimited event stream whose end the relay judges
	// (endJudged, cutShort).
	judgeEnd bool
	// streamReq: the client asked for a stream (armRead).
	streamReq bool
	idle      time.Duration
	total     time.Time
	client    net.Conn
	wto       time.Duration
	outcome   sched.Outcome // at a clean end of the body
	// tail holds the last bytes sent (ntail of them): the SSE framing of
	// an error event, and whether a broken stream had already ended.
	tail  [tailLen]byte
	ntail int
	// cutAfterEnd: the engine's connection broke after its stream had
	// ended in its protocol; the client got a complete stream.
	cutAfterEnd bool
	// st transforms the body (a converted or usage-filtered stream,
	// protocols.go); nil: the bytes are relayed as they came.
	st *protoState
	// held is the length of an event cut by the end of a read, kept at
	// the start of buf until its end arrives (a relayed stream, st nil):
	// a stream that breaks inside an event ends with the error event
	// alone, never with half an event an SSE parser would dispatch.
	held int
	// lastSeq is the sequence_number of the last whole event relayed of a
	// passthrough Responses stream (-1: none yet), for its error event.
	lastSeq  int64
	trackSeq bool
	// respEnded: a relayed Responses stream (passthrough) carried its
	// terminal event (responseEnded), its end in its protocol.
	respEnded bool
	// engineErr: the engine's stream, relayed as it came (or usage
	// filtered), carried an error event (carriesError); the answer ends
	// as an upstream error though the stream may end cleanly after it.
	engineErr bool
	// engineErrStatus is the HTTP status the engine's error event stands
	// for (its code), 0 when it gave none.
	engineErrStatus int
}

var relayPool = sync.Pool{New: func() any { return &relay{} }}

// relayBufSize is the response read buffer: one client write at most.
const relayBufSize = 32 << 10

// tailLen covers the longest stream ending endedCleanly looks for.
const tailLen = 32

// SupportsBodyWriteTo makes fasthttp call WriteTo (fasthttp.BodyWriterTo).
func (r *relay) SupportsBodyWriteTo() bool { return true }

// WriteTo relays the body: every upstream read (a burst of whatever
// arrived) becomes one write to the client.
func (r *relay) WriteTo(w io.Writer) (int64, error) {
	var total int64
	hold := r.sse && r.st == nil
	r.trackSeq, r.lastSeq = hold && r.rs.proto.api == protocol.Responses, -1
	if len(r.pending) > 0 {
		p := r.pending
		r.pending = nil
		n, err := r.emit(w, p, hold)
		total += int64(n)
		if err != nil {
			return total, err
		}
	}
	for !r.upEOF && r.failed == nil {
		r.armRead()
		n, err := r.up.read(r.buf[r.held:])
		if n > 0 {
			r.rs.scanUsage(r.buf[r.held : r.held+n])
			p := r.buf[:r.held+n]
			if r.st != nil {
				p = r.st.feed(p) // may be empty: read again
				r.noteEngineError(p)
			}
			if len(p) > 0 {
				m, werr := r.emit(w, p, hold)
				total += int64(m)
				if werr != nil {
					return total, werr
				}
			}
			if r.convFailed() {
				return total, nil
			}
		}
		err = r.brokeAfterEnd(err)
		if err == io.EOF {
			// What the end of the body still sends: the last event,
			// unterminated, as the engine sent it (held), or what a
			// transforming stage kept back.
			var last []byte
			if r.held > 0 {
				last = r.buf[:r.held]
			} else if r.st != nil {
				last = r.st.finish(r.st.out[:0])
			}
			if !r.cutShort(last) {
				r.upEOF = true
				r.held = 0
				if len(last) > 0 {
					m, werr := r.write(w, last)
					total += int64(m)
					if werr != nil {
						return total, werr
					}
				}
				r.convFailed() // a converted stream the engine left incomplete
				break
			}
			err = errCutBeforeEnd
		}
		if err != nil {
			r.upstreamFailed(err)
			r.held = 0 // half an event: dropped
			if !r.sse {
				// A plain body cannot carry an error: cut it, so the client
				// sees a short body rather than a complete-looking one.
				return total, err
			}
			ev := r.errorEvent()
			m, werr := r.write(w, ev)
			total += int64(m)
			return total, werr
		}
	}
	return total, nil
}

// Read implements io.Reader for fasthttp paths that do not use WriteTo.
func (r *relay) Read(p []byte) (int, error) {
	if len(r.pending) > 0 {
		n := copy(p, r.pending)
		r.pending = r.pending[n:]
		r.noteTail(p[:n])
		return n, nil
	}
	if r.upEOF || r.failed != nil {
		return 0, io.EOF
	}
	if r.st != nil {
		return r.readStaged(p)
	}
	r.armRead()
	n, err := r.up.read(p)
	if n > 0 {
		r.rs.scanUsage(p[:n])
		if r.sse {
			r.noteEngineError(p[:n])
		}
		r.noteTail(p[:n])
		r.armWrite()
	}
	err = r.brokeAfterEnd(err)
	if err == io.EOF && r.cutShort(nil) {
		err = errCutBeforeEnd
	}
	switch {
	case err == nil:
		return n, nil
	case err == io.EOF:
		r.upEOF = true
		return n, io.EOF
	}
	r.upstreamFailed(err)
	if !r.sse {
		return n, err
	}
	r.pending = r.errorEvent()
	return n, nil
}

// armRead bounds the next upstream read. For a stream request the idle
// timeout starts now, when the relay is ready for more, so time spent
// blocked on a slow client never counts against the worker; the total cap
// still does. So for whatever body answers a stream request (an event
// stream, an error answer, plain JSON): stream_idle_s is the client's
// bound on any silence.
func (r *relay) armRead() {
	if !r.streamReq {
		return // non-streaming: the total deadline set before the head holds
	}
	now := time.Now()
	var dl time.Time
	if r.idle > 0 {
		dl = now.Add(r.idle)
	}
	if !r.total.IsZero() && (dl.IsZero() || r.total.Before(dl)) {
		dl = r.total
	}
	r.up.setReadDeadline(dl)
}

// armWrite gives the client its own write timeout for what comes next: a
// client that stops reading is disconnected, and that is not the worker's
// fault.
func (r *relay) armWrite() {
	if r.client != nil && r.wto > 0 {
		r.client.SetWriteDeadline(time.Now().Add(r.wto))
	}
}

// emit writes p: its whole events only when hold (writeEvents).
func (r *relay) emit(w io.Writer, p []byte, hold bool) (int, error) {
	if hold {
		return r.writeEvents(w, p)
	}
	return r.write(w, p)
}

// writeEvents writes the whole events of p and keeps an event cut at its
// end at the start of buf (held). p is in buf. An event that fills the
// buffer by itself is written as it is.
func (r *relay) writeEvents(w io.Writer, p []byte) (int, error) {
	cut := completeEvents(p)
	if cut == 0 && len(p) == len(r.buf) {
		cut = len(p)
	}
	var n int
	var err error
	if cut > 0 {
		if r.trackSeq {
			r.noteSeq(p[:cut])
			r.respEnded = r.respEnded || responseEnded(p[:cut])
		}
		r.noteEngineError(p[:cut])
		n, err = r.write(w, p[:cut])
	}
	r.held = copy(r.buf, p[cut:])
	return n, err
}

var seqKey = []byte(`"sequence_number":`)

// noteSeq records the last sequence_number in the whole events p.
func (r *relay) noteSeq(p []byte) {
	i := bytes.LastIndex(p, seqKey)
	if i < 0 {
		return
	}
	i += len(seqKey)
	for i < len(p) && p[i] == ' ' {
		i++
	}
	var n int64
	j := i
	for ; j < len(p) && j-i < 18 && p[j] >= '0' && p[j] <= '9'; j++ {
		n = n*10 + int64(p[j]-'0')
	}
	if j > i {
		r.lastSeq = n
	}
}

var (
	quotedError      = []byte(`"error"`)
	afterObjectKey   = []byte(`"object":`)
	afterTypeKey     = []byte(`"type":`)
	quotedRespFailed = []byte(`"response.failed"`)
)

// noteEngineError records whether the bytes p of a relayed event stream
// (not a converted one: its converter judges the engine's chunks) carry
// the engine's error event.
func (r *relay) noteEngineError(p []byte) {
	if r.engineErr || !r.sse {
		return
	}
	if r.engineErr = r.rs.engineError(p); r.engineErr {
		r.engineErrStatus = engineErrorStatus(p)
	}
}

// engineErrorStatus is the HTTP status the first error event in the bytes p
// of an event stream stands for (protocol.EngineErrorStatus of its data),
// 0 when it gives none.
func engineErrorStatus(p []byte) int {
	for len(p) > 0 {
		line := p
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			i = bytes.IndexByte(p, '\r')
		}
		if i >= 0 {
			line, p = p[:i], p[i+1:]
		} else {
			p = nil
		}
		if data, ok := bytes.CutPrefix(line, dataField); ok {
			if n := protocol.EngineErrorStatus(bytes.TrimRight(data, "\r")); n != 0 {
				return n
			}
		}
	}
	return 0
}

// engineError reports whether the bytes p of an event stream answering rs
// carry the engine's error event; never for a converted stream (its
// converter judges the engine's chunks).
func (rs *reqState) engineError(p []byte) bool {
	if rs.proto.conv != nil {
		return false
	}
	if rs.proto.api == protocol.Chat {
		return chatCarriesError(p)
	}
	return carriesError(p) || rs.proto.api == protocol.Responses && responseFailed(p)
}

// chatCarriesError is carriesError for a chat or completions stream, whose
// error events (vLLM's and SGLang's data: {"error":{...}}, older vLLM's
// {"object":"error",...}) put the mark first in their data: only the
// start of each data line is looked at, where carriesError searches all
// of p (about 40 ns for a 220-byte chat chunk against 90).
func chatCarriesError(p []byte) bool {
	for len(p) > 0 {
		if bytes.HasPrefix(p, dataField) && errorFirst(p[len(dataField):]) {
			return true
		}
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			i = bytes.IndexByte(p, '\r') // a stream framed by bare CRs
		}
		if i < 0 {
			return false
		}
		p = p[i+1:]
	}
	return false
}

// errorFirst reports whether the data value v (after "data:") is an object
// whose first member is "error" with a value other than null, or "object"
// or "type" with the value "error".
func errorFirst(v []byte) bool {
	v = bytes.TrimLeft(v, " ")
	if len(v) == 0 || v[0] != '{' {
		return false
	}
	v = bytes.TrimLeft(v[1:], " ")
	errKey := bytes.HasPrefix(v, quotedError)
	switch {
	case errKey:
		v = v[len(quotedError):]
	case bytes.HasPrefix(v, quotedObject):
		v = v[len(quotedObject):]
	case bytes.HasPrefix(v, quotedType):
		v = v[len(quotedType):]
	default:
		return false
	}
	if len(v) == 0 || v[0] != ':' { // engines write no space before a colon, nor does carriesError take one
		return false
	}
	v = bytes.TrimLeft(v[1:], " ")
	if errKey {
		return len(v) > 0 && v[0] != 'n'
	}
	return bytes.HasPrefix(v, quotedError)
}

var (
	quotedObject = []byte(`"object"`)
	quotedType   = []byte(`"type"`)
)

// responseFailed reports whether the bytes p of a Responses event stream
// hold a response.failed event: "type":"response.failed" in an event's
// data (inData), not in an object of the request it echoes.
func responseFailed(p []byte) bool { return responseEvent(p, quotedRespFailed) }

var (
	quotedRespCompleted  = []byte(`"response.completed"`)
	quotedRespIncomplete = []byte(`"response.incomplete"`)
)

// responseEnded reports whether the bytes p of a Responses event stream
// hold the event that ends a Response that was not failed:
// response.completed or response.incomplete (a Responses stream has no
// [DONE]: that event is its end, in OpenAI's API as in vLLM's).
func responseEnded(p []byte) bool {
	return responseEvent(p, quotedRespCompleted) || responseEvent(p, quotedRespIncomplete)
}

// responseEvent reports whether the bytes p of a Responses event stream
// hold an event of type quoted: "type":quoted in an event's data (inData).
func responseEvent(p, quoted []byte) bool {
	off := 0
	for {
		i := jsonscan.IndexKey(p[off:], quoted)
		if i < 0 {
			return false
		}
		i += off
		pre := bytes.TrimRight(p[off:i], " ")
		off = i + len(quoted)
		if bytes.HasSuffix(pre, afterTypeKey) && inData(p, i) {
			return true
		}
	}
}

// carriesError reports whether an engine's event stream bytes hold an
// error object: "error" as the first key of an event's data with a value
// other than null (data: {"error":{...}}: OpenAI's, vLLM's and SGLang's error
// event), or "error" as the value of the data's "object" (older vLLM's
// error event) or "type" (Anthropic's and the Responses API's). A quote
// inside a JSON string is escaped, so no model text (say
// "content":"error") matches; nor does an object nested in the data (a
// legacy completion's top_logprobs {"error":-0.01}, the tools, metadata
// or schema of the request a Responses event echoes, which a client
// chooses).
func carriesError(p []byte) bool {
	off := 0
	for {
		i := jsonscan.IndexTail(p[off:], quotedError, 3) // `ror"` is rare in text; `"` and `e` are not
		if i < 0 {
			return false
		}
		i += off
		pre := bytes.TrimRight(p[off:i], " ")
		off = i + len(quotedError)
		v := bytes.TrimLeft(p[off:], " ")
		switch {
		case bytes.HasSuffix(pre, afterObjectKey), bytes.HasSuffix(pre, afterTypeKey):
			if inData(p, i) {
				return true
			}
		case len(pre) > 0 && pre[len(pre)-1] == '{' && len(v) > 0 && v[0] == ':':
			v = bytes.TrimLeft(v[1:], " ")
			if len(v) > 0 && v[0] != 'n' && inData(p, i) {
				return true
			}
		}
	}
}

var dataField = []byte("data:")

// inData reports whether p[i], outside any JSON string, lies directly in
// an event's data object: its line is a data: field whose value is an
// object, and p[i] is in that object, not in one nested in it.
func inData(p []byte, i int) bool {
	line := p[bytes.LastIndexAny(p[:i], "\r\n")+1 : i]
	if !bytes.HasPrefix(line, dataField) {
		return false
	}
	line = bytes.TrimLeft(line[len(dataField):], " ")
	if len(line) == 0 || line[0] != '{' {
		return false
	}
	depth, str := 0, false
	for k := 0; k < len(line); k++ {
		switch c := line[k]; {
		case str && c == '\\':
			k++
		case c == '"':
			str = !str
		case str:
		case c == '{', c == '[':
			depth++
		case c == '}', c == ']':
			depth--
		}
	}
	return depth == 1 && !str
}

// completeEvents returns the length of p's leading whole SSE events: up to
// the end of its last blank line (LF LF, CRLF CRLF or CR CR).
func completeEvents(p []byte) int {
	for i := len(p) - 1; i > 0; i-- {
		switch p[i] {
		case '\n':
			if p[i-1] == '\n' || p[i-1] == '\r' && i >= 2 && p[i-2] == '\n' {
				return i + 1
			}
		case '\r':
			if p[i-1] == '\r' {
				return i + 1
			}
		}
	}
	return 0
}

func (r *relay) write(w io.Writer, p []byte) (int, error) {
	r.armWrite()
	r.noteTail(p)
	return w.Write(p)
}

func (r *relay) noteTail(p []byte) {
	if len(p) >= tailLen {
		copy(r.tail[:], p[len(p)-tailLen:])
		r.ntail = tailLen
		return
	}
	copy(r.tail[:], r.tail[len(p):])
	copy(r.tail[tailLen-len(p):], p)
	r.ntail = min(r.ntail+len(p), tailLen)
}

// last returns the last byte sent before the final i (0: the last byte),
// and false when fewer were sent.
func (r *relay) last(i int) (byte, bool) {
	if i >= r.ntail {
		return 0, false
	}
	return r.tail[tailLen-1-i], true
}

// Stream endings after which an engine's broken connection loses nothing.
var (
	endDone        = []byte("data: [DONE]")    // OpenAI
	endDoneNoSpace = []byte("data:[DONE]")     // the same without the optional space
	endMessageStop = []byte(`"message_stop"}`) // Anthropic's message_stop event
)

// brokeAfterEnd turns a read error of a stream that had already ended in
// its protocol (a converted stream finished; the bytes relayed so far end
// with OpenAI's data: [DONE] or Anthropic's message_stop event) into the
// end of the body: the client has a complete stream, so it gets no error
// event after it, and the worker is not blamed (the connection is not
// reused: cutAfterEnd). Other errors are returned unchanged.
func (r *relay) brokeAfterEnd(err error) error {
	if err == nil || err == io.EOF || !r.sse || !r.endedCleanly() {
		return err
	}
	r.cutAfterEnd = true
	return io.EOF
}

// errCutBeforeEnd is a close-delimited stream's end before its protocol's.
var errCutBeforeEnd = errors.New("the worker closed its stream before the stream's end")

// cutShort reports a close-delimited stream (its body ends only when the
// worker closes the connection: HTTP/1.0, or Connection: close with
// neither Content-Length nor chunked framing) that ended before its
// protocol's end (OpenAI's data: [DONE], Anthropic's message_stop), with
// last, what the end of the body still sends. That close is how a crashed
// or killed engine looks, where a chunked or sized body would have said it
// was cut: it is a broken stream, not a complete one. Only a stream that
// names text/event-stream and is not content-encoded is judged (endJudged).
// A converted stream's
// converter judges its own end (convFailed); a passthrough Responses
// stream ends with its terminal event (respEnded, responseEnded).
func (r *relay) cutShort(last []byte) bool {
	if !r.judgeEnd || r.st != nil && r.st.conv != nil {
		return false
	}
	if r.rs.proto.api == protocol.Responses {
		// Its end is its terminal event (endedCleanly), or the engine's
		// own failure event (response.failed, error: engineErr). Noted
		// only where whole events are relayed (WriteTo: trackSeq); Read
		// sees reads, where an event may be cut, and takes the stream
		// as complete.
		return r.trackSeq && !r.engineErr && !r.respEnded && !responseEnded(last)
	}
	return !r.endsWith(last)
}

// endsWith reports whether the bytes sent so far, then more, end with a
// stream's protocol ending (line breaks after it aside).
func (r *relay) endsWith(more []byte) bool {
	var w [2 * tailLen]byte
	t := append(w[:0], r.tail[tailLen-r.ntail:]...)
	t = append(t, more[max(0, len(more)-tailLen):]...)
	for len(t) > 0 && (t[len(t)-1] == '\n' || t[len(t)-1] == '\r' || t[len(t)-1] == ' ' || t[len(t)-1] == '\t') {
		t = t[:len(t)-1]
	}
	return bytes.HasSuffix(t, endDone) || bytes.HasSuffix(t, endDoneNoSpace) || bytes.HasSuffix(t, endMessageStop)
}

// endedCleanly reports whether the stream sent so far, with what is
// pending, is complete in its protocol.
func (r *relay) endedCleanly() bool {
	if r.st != nil && r.st.conv != nil {
		return r.st.conv.Finished()
	}
	if r.rs.proto.api == protocol.Responses {
		// A Responses stream ends with its terminal event, which the
		// tail cannot show (its data, the whole Response, comes after
		// its type): relayed whole, or the event the engine did not
		// terminate (held) before the cut.
		return r.respEnded || r.held > 0 && responseEnded(r.buf[:r.held])
	}
	if r.held > 0 { // an ending the engine did not terminate: "data: [DONE]", then a cut
		return r.endsWith(r.buf[:r.held])
	}
	if r.st != nil && r.st.stage == stageFilter {
		if held := r.st.filter.Held(); len(held) > 0 { // the same, held by the usage filter
			return r.endsWith(held)
		}
	}
	return r.endsWith(r.pending)
}

// convFailed reports whether a converted stream was ended by its
// converter with an error event (the engine's error chunk, a malformed
// chunk, a stream left without its finish): the client's stream is over,
// so the relay stops there, records the failure and closes the upstream,
// which stops the engine, instead of reading on until the engine finishes.
func (r *relay) convFailed() bool {
	if r.st == nil || r.st.conv == nil || !r.st.conv.Failed() {
		return false
	}
	if r.failed == nil {
		r.failed = r.rs.convFailure()
	}
	return true
}

// convFailure returns the failure of a converted stream its converter
// ended with an error event, counted and logged; nil when the stream is
// not converted or did not fail. Call it once per request.
func (rs *reqState) convFailure() *failure {
	c := rs.proto.conv
	if c == nil || !c.Failed() {
		return nil
	}
	return rs.engineStreamFailure(c.Err(), c.FailStatus())
}

// engineStreamFailure returns the failure of a stream whose engine reported
// an error inside it (err, or errEngineStreamError when nil), counted as a
// mid-stream error and logged against the worker. status is the HTTP
// status the engine's error stands for (its code; 0 when it gave none): a
// client error (4xx) is not the worker's fault, as a 4xx answer is not
// (statusOutcome): a client whose requests fail inside the stream (an
// over-long prompt, say) must not trip a healthy worker's breaker.
func (rs *reqState) engineStreamFailure(err error, status int) *failure {
	if err == nil {
		err = errEngineStreamError
	}
	kind := failBroken
	if status >= 400 && status < 500 {
		kind = failEngineRefused
	}
	f := fail(kind, err)
	mMidStreamErr.Inc()
	logUpstreamError(rs.lease.Worker, f)
	return f
}

var errEngineStreamError = errors.New("the engine's stream carried an error")

// upstreamFailed records a mid-stream failure: never retried.
func (r *relay) upstreamFailed(err error) {
	f := r.up.readFailure(err, true)
	if f.kind != failCanceled && !r.total.IsZero() && isTimeout(err) && !time.Now().Before(r.total) {
		f = fail(failWallClock, err) // the configured cap, not the worker
	}
	r.failed = f
	mMidStreamErr.Inc()
	if f.kind == failWallClock || f.kind == failBroken && isTimeout(err) {
		mTimeouts.Inc()
	}
	logUpstreamError(r.rs.lease.Worker, f)
}

// errorEvent is the event a failed stream ends with. When the stream
// stopped inside an event, the partial line and event are terminated first,
// so SSE parsers see the error event on its own.
func (r *relay) errorEvent() []byte {
	c := r.failed.class()
	typ, msg, code, status := c.typ, c.msg, c.code, r.failed.httpStatus()
	if r.failed.kind == failBroken {
		msg = "the worker's response stream broke"
		if isTimeout(r.failed.cause) {
			typ, msg, code = typeTimeout, "the worker's stream timed out (no data within the idle timeout)", "timeout"
		}
	}
	if typ == typeTimeout {
		status = 504
	}
	if r.st != nil {
		// A converted stream ends with the client protocol's error event.
		if b := r.st.failEvent(r.rs.scratchOut[:0], status, typ, msg); b != nil {
			r.rs.scratchOut = b
			return b
		}
	}
	b := r.rs.scratchOut[:0]
	// What a filtered stream held back (an event cut mid-way) is dropped,
	// as the relayed stream's: half an event would reach the client's SSE
	// parser as an event of broken JSON (both SDKs throw on it) before the
	// error event.
	b1, ok1 := r.last(0)
	b0, ok0 := r.last(1)
	switch {
	case !ok1:
	case b1 != '\n':
		b = append(b, "\n\n"...)
	case !ok0 || b0 != '\n':
		b = append(b, '\n')
	}
	b = r.rs.proto.appendSSEError(b, status, typ, msg, code, r.lastSeq) // in the client's protocol (protocols.go)
	r.rs.scratchOut = b
	return b
}

// readStaged is Read for a transformed body: upstream bytes are read into
// the relay's buffer and transformed; the output is handed out as pending.
func (r *relay) readStaged(p []byte) (int, error) {
	for len(r.pending) == 0 {
		if r.upEOF || r.failed != nil {
			return 0, io.EOF
		}
		r.armRead()
		n, err := r.up.read(r.buf)
		if n > 0 {
			r.rs.scanUsage(r.buf[:n])
			r.pending = r.st.feed(r.buf[:n])
			r.noteEngineError(r.pending)
			r.armWrite()
			if r.convFailed() {
				break
			}
		}
		err = r.brokeAfterEnd(err)
		if err == io.EOF {
			// What the end still sends; on a cut, the half event a stage
			// held back is dropped, as WriteTo drops it.
			if rest := r.st.finish(r.pending); r.cutShort(rest) {
				err = errCutBeforeEnd
			} else {
				r.pending = rest
			}
		}
		switch {
		case err == io.EOF:
			r.upEOF = true
			r.convFailed() // a converted stream the engine left incomplete
		case err != nil:
			r.upstreamFailed(err)
			r.pending = append(r.pending, r.errorEvent()...)
		}
	}
	n := copy(p, r.pending)
	r.pending = r.pending[n:]
	r.noteTail(p[:n])
	return n, nil
}

// CloseWithError implements fasthttp.ReadCloserWithError: the response is
// over. A failure of the upstream comes first: a plain body cut by the
// worker is ended by returning its error, which fasthttp hands back here.
// Otherwise err != nil means writing to the client failed (the client left
// or stalled past its write timeout): the upstream is closed so the engine
// stops generating, and the worker is not blamed.
func (r *relay) CloseWithError(err error) error {
	rs := r.rs
	outcome := r.outcome
	end := endComplete
	switch {
	case r.failed != nil && (err == nil || r.failed.kind != failCanceled):
		r.up.finish(false)
		outcome = r.failed.outcome()
		end = endUpstreamErr
	case err != nil:
		mClientGone.Inc()
		r.up.finish(false)
		outcome = sched.OutcomeNeutral
		end = endClientGone
	case r.upEOF && r.engineErr:
		// The engine reported its own failure inside a stream it then
		// ended: the client has the engine's error event; the answer is
		// the worker's failure, as a converted stream's error chunk is.
		r.up.finish(!r.cutAfterEnd)
		outcome = rs.engineStreamFailure(nil, r.engineErrStatus).outcome()
		end = endUpstreamErr
	case r.upEOF:
		r.up.finish(!r.cutAfterEnd)
	default:
		r.up.finish(false)
		outcome = sched.OutcomeNeutral
	}
	r.armWrite() // fasthttp's last chunk and flush come after the relay
	s := r.s
	rs.dur = time.Since(rs.start)
	mDuration.Update(rs.dur.Seconds())
	if (!r.upEOF || r.failed != nil || r.engineErr) && !rs.usage.settled(r.sse) {
		// The body did not end as the engine ends an answer, before its
		// final usage: a usage seen on the way (continuous usage stats,
		// on every chunk) is the usage so far, not the request's. It is
		// dropped, so the stream is accounted as one without usage (the
		// user's estimate stays charged, no tokens in the metrics),
		// whatever the client asked. The engine's final count, read
		// whole (a stream's usage chunk, message_delta or terminal
		// event; a plain body's usage), is the request's however the
		// answer ended after it: the client left before [DONE] or its
		// write failed, the engine's connection broke.
		rs.usage.forget()
	}
	rs.usage.record(rs.lease.Worker)
	rs.lease.Done(outcome)
	s.releaseState(rs, end)
	*r = relay{}
	relayPool.Put(r)
	return nil
}
