package proxy

import (
	"bytes"
	"errors"
	"io"
	"net/netip"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/infera/infera/classify"
	"github.com/infera/infera/fleet"
	"github.com/infera/infera/internal/logx"
	"github.com/valyala/fasthttp"
)

// AccessLog writes one JSON line per inference request (--access-log):
// when it ended, its request id, the client's address, the endpoint, the
// status, the duration and time to first byte, the model asked for, smart
// model selection's tier, the worker or upstream that answered, the token
// usage the engine reported,
// the user and how the answer ended. Never a key, a header value other
// than the request id, or any prompt or answer text.
//
// The request path never waits for the disk: a line is appended to a
// buffer under a mutex (no allocation in steady state) and a goroutine
// writes the buffer out every flushEvery, or sooner when flushAt bytes are
// waiting. When the writer falls behind by maxPending bytes, new lines are
// dropped and counted (infera_access_log_dropped_lines_total).
type AccessLog struct {
	mu      sync.Mutex
	pending []byte
	closed  bool

	kick chan struct{}
	done chan struct{}
	stop sync.Once

	// The destination; wmu serializes the writer goroutine's writes with
	// Reopen and Close.
	wmu   sync.Mutex
	w     io.Writer
	f     *os.File // nil for stdout and test writers
	path  string
	spare []byte
}

const (
	flushEvery = 200 * time.Millisecond
	flushAt    = 64 << 10
	maxPending = 4 << 20
)

var (
	mAccessDropped = metrics.NewCounter(`infera_access_log_dropped_lines_total`)
	mAccessErrors  = metrics.NewCounter(`infera_access_log_write_errors_total`)
	accessLogWarn  = &logx.Throttle{Every: 10 * time.Second}
)

// OpenAccessLog opens the access log at dest: "-" is standard output,
// anything else a file, created if missing (mode 0640) and appended to.
// Reopen (on SIGHUP) opens the path again, for log rotation.
func OpenAccessLog(dest string) (*AccessLog, error) {
	if dest == "" {
		return nil, errors.New("access log: empty destination")
	}
	if dest == "-" {
		return NewAccessLog(os.Stdout), nil
	}
	f, err := openAppend(dest)
	if err != nil {
		return nil, err
	}
	l := NewAccessLog(f)
	l.f, l.path = f, dest
	return l, nil
}

func openAppend(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o640)
	if err != nil {
		return nil, errors.New("access log: " + err.Error())
	}
	return f, nil
}

// NewAccessLog returns an access log writing to w.
func NewAccessLog(w io.Writer) *AccessLog {
	l := &AccessLog{w: w, kick: make(chan struct{}, 1), done: make(chan struct{})}
	go l.run()
	return l
}

// Reopen opens the file again at its path (after a log rotator moved it);
// a no-op for standard output. On failure the old file stays in use.
func (l *AccessLog) Reopen() error {
	if l == nil || l.f == nil {
		return nil
	}
	f, err := openAppend(l.path)
	if err != nil {
		return err
	}
	l.wmu.Lock()
	old := l.f
	l.f, l.w = f, f
	l.wmu.Unlock()
	return old.Close()
}

// Close writes what is waiting and closes the file. Lines logged after it
// are dropped.
func (l *AccessLog) Close() error {
	if l == nil {
		return nil
	}
	l.stop.Do(func() {
		l.mu.Lock()
		l.closed = true
		close(l.kick)
		l.mu.Unlock()
	})
	<-l.done
	l.wmu.Lock()
	defer l.wmu.Unlock()
	if l.f != nil {
		return l.f.Close()
	}
	return nil
}

func (l *AccessLog) run() {
	defer close(l.done)
	t := time.NewTicker(flushEvery)
	defer t.Stop()
	for {
		open := true
		select {
		case <-t.C:
		case _, open = <-l.kick:
		}
		l.flush()
		if !open {
			return
		}
	}
}

// flush writes out the waiting lines.
func (l *AccessLog) flush() {
	l.mu.Lock()
	b := l.pending
	l.pending = l.spare[:0]
	l.mu.Unlock()
	if len(b) > 0 {
		l.wmu.Lock()
		_, err := l.w.Write(b)
		l.wmu.Unlock()
		if err != nil {
			mAccessErrors.Inc()
			accessLogWarn.Warn("access log write failed", "err", err)
		}
	}
	if cap(b) > 2*maxPending {
		b = nil
	}
	l.spare = b[:0]
}

// add appends a finished line.
func (l *AccessLog) add(line []byte) {
	l.mu.Lock()
	if l.closed || len(l.pending)+len(line) > maxPending {
		l.mu.Unlock()
		mAccessDropped.Inc()
		return
	}
	l.pending = append(l.pending, line...)
	if n := len(l.pending); n >= flushAt && n-len(line) < flushAt {
		select { // under mu: Close closes kick under it
		case l.kick <- struct{}{}:
		default:
		}
	}
	l.mu.Unlock()
}

// accessEntry is what the access log (and the per-model series) say of
// one request beyond what reqState holds; the handler fills it as it
// returns.
type accessEntry struct {
	on     bool // logged when the state is released (--access-log)
	status int
	kind   int // the client's endpoint
	client netip.Addr
	// code is the error code of an error answer the router holds whole
	// (its own, or an engine's relayed): OpenAI's error.code, or
	// Anthropic's error.type; empty otherwise.
	code  [maxErrorCode]byte
	ncode int
	// retries counts the attempts that followed a failed one (mixed
	// workers, or either PD leg).
	retries int
	// tried is the worker of the last local attempt (the decode worker of
	// a PD pair): named when every attempt failed and the lease, which a
	// retry that found no candidate reset, holds none.
	tried *fleet.Worker
	// prefill is the worker of a PD pair's last prefill leg.
	prefill *fleet.Worker
	// failed: an answer written whole (not relayed) carried the worker's
	// failure (a stream read whole that holds the engine's error event):
	// it ends upstream_error.
	failed bool
	// method is the request's method, kept for the debug line
	// (debuglog.go) when --log-level is debug.
	method  [16]byte
	nmethod int
}

// maxErrorCode bounds the error code the access log shows.
const maxErrorCode = 48

var (
	keyCode = []byte(`"code":"`)
	keyType = []byte(`"type":"`)
)

// noteErrorCode keeps the error code of an error answer's body: the first
// "code" string, else the last "type" string (Anthropic's error type comes
// after its "type":"error"), letters, digits and '_' only.
func (a *accessEntry) noteErrorCode(body []byte) {
	a.ncode = 0
	v := stringAfter(body, keyCode, false)
	if v == nil {
		v = stringAfter(body, keyType, true)
	}
	for _, c := range v {
		if a.ncode == maxErrorCode || !(c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9') {
			break
		}
		a.code[a.ncode] = c
		a.ncode++
	}
}

// stringAfter returns the characters after the first (or last) key in b up
// to the next quote.
func stringAfter(b, key []byte, last bool) []byte {
	i := bytes.Index(b, key)
	if last {
		i = bytes.LastIndex(b, key)
	}
	if i < 0 {
		return nil
	}
	v := b[i+len(key):]
	if j := bytes.IndexByte(v, '"'); j >= 0 {
		return v[:j]
	}
	return nil
}

// How an answer ended.
const (
	endComplete    = "complete"
	endClientGone  = "client_gone"
	endUpstreamErr = "upstream_error"
)

// logAccess appends rs's line (releaseState, before the state is reset).
func (s *Server) logAccess(rs *reqState, end string) {
	a := &rs.acc
	b := rs.accLine[:0]
	b = append(b, `{"time":"`...)
	b = time.Now().UTC().AppendFormat(b, "2006-01-02T15:04:05.000Z")
	b = append(b, `","request_id":`...)
	b = appendJSONString(b, arenaString(rs.reqID))
	if a.client.IsValid() {
		b = append(b, `,"client":"`...)
		b = a.client.Unmap().AppendTo(b)
		b = append(b, '"')
	}
	b = append(b, `,"path":"`...)
	b = append(b, canonicalPath(a.kind)...)
	b = append(b, `","status":`...)
	b = strconv.AppendInt(b, int64(a.status), 10)
	b = append(b, `,"duration_ms":`...)
	b = appendMillis(b, rs.duration())
	if rs.ttft > 0 {
		b = append(b, `,"ttft_ms":`...)
		b = appendMillis(b, rs.ttft)
	}
	if m := rs.parsed.model; len(m) > 0 {
		b = append(b, `,"model":`...)
		b = appendJSONString(b, arenaString(m[:min(len(m), 256)]))
	}
	b = append(b, `,"stream":`...)
	b = strconv.AppendBool(b, rs.parsed.stream)
	if t := rs.ext.tier; t != classify.TierUnknown { // smart.go
		b = append(b, `,"tier":"`...)
		b = append(b, t.String()...)
		b = append(b, `","tier_source":"`...)
		b = append(b, rs.ext.tierSource.String()...)
		b = append(b, '"')
	}
	if u := rs.ext.cur; u != nil {
		b = append(b, `,"upstream":`...)
		b = appendJSONString(b, u.label)
	} else if w := rs.lease.Worker; w != nil {
		b = append(b, `,"worker":`...)
		b = appendJSONString(b, w.ID)
	} else if w := a.tried; w != nil {
		b = append(b, `,"worker":`...)
		b = appendJSONString(b, w.ID)
	}
	if w := a.prefill; w != nil && rs.ext.cur == nil {
		b = append(b, `,"prefill_worker":`...)
		b = appendJSONString(b, w.ID)
	}
	if u := &rs.usage; u.known() {
		b = append(b, `,"prompt_tokens":`...)
		b = strconv.AppendInt(b, int64(u.prompt), 10)
		b = append(b, `,"completion_tokens":`...)
		b = strconv.AppendInt(b, int64(u.completion), 10)
		b = append(b, `,"cached_tokens":`...)
		b = strconv.AppendInt(b, int64(u.cached), 10)
	}
	if u := rs.gov.user; u != nil {
		b = append(b, `,"user":`...)
		b = appendJSONString(b, u.Name())
	}
	if a.ncode > 0 {
		b = append(b, `,"error":"`...)
		b = append(b, a.code[:a.ncode]...)
		b = append(b, '"')
	}
	if n := rs.acc.retries; n > 0 {
		b = append(b, `,"retries":`...)
		b = strconv.AppendInt(b, int64(n), 10)
	}
	b = append(b, `,"end":"`...)
	b = append(b, end...)
	b = append(b, "\"}\n"...)
	rs.accLine = b
	s.access.add(b)
}

// appendMillis appends d in milliseconds with three decimals.
func appendMillis(b []byte, d time.Duration) []byte {
	us := d.Microseconds()
	b = strconv.AppendInt(b, us/1000, 10)
	b = append(b, '.')
	f := us % 1000
	if f < 100 {
		b = append(b, '0')
	}
	if f < 10 {
		b = append(b, '0')
	}
	return strconv.AppendInt(b, f, 10)
}

// The request id: the client's X-Request-Id when it is 1-128 visible ASCII
// characters, else a new one (32 hex digits). The engine gets it in place of
// the client's header (appendForwardHeaders leaves that out; both PD legs
// and external upstreams get it too) and the answer carries it.
const hdrRequestID = "X-Request-Id"

var (
	hdrRequestIDBytes     = []byte(hdrRequestID)
	hdrAnthropicRequestID = []byte("Request-Id")
)

func validRequestID(v []byte) bool {
	if len(v) == 0 || len(v) > 128 {
		return false
	}
	for _, c := range v {
		if c <= ' ' || c >= 0x7f {
			return false
		}
	}
	return true
}

// takeRequestID sets rs.reqID from the request, or to a new id.
func takeRequestID(ctx *fasthttp.RequestCtx, rs *reqState) {
	rs.reqID = appendClientRequestID(rs.reqID[:0], ctx)
}

// appendClientRequestID appends the request's id: the client's
// X-Request-Id when it is a valid one, else a new id.
func appendClientRequestID(dst []byte, ctx *fasthttp.RequestCtx) []byte {
	if v := ctx.Request.Header.Peek(hdrRequestID); validRequestID(v) {
		return append(dst, v...)
	}
	return appendRequestID(dst)
}

// appendRequestIDHeader appends the request id's header line.
func appendRequestIDHeader(dst, id []byte) []byte {
	dst = append(dst, hdrRequestID+": "...)
	dst = append(dst, id...)
	return append(dst, "\r\n"...)
}
