package proxy

import (
	"bytes"
	"errors"
	"io"
	"syscall"
	"time"

	"github.com/infera/infera/fleet"
	"github.com/infera/infera/internal/h1"
	"github.com/valyala/fasthttp"
)

// httpHook gives every worker a connection pool (--request-transport http).
type httpHook struct {
	maxConns       int
	connectTimeout time.Duration
}

var _ fleet.Hook = (*httpHook)(nil)

// WorkerAdded implements fleet.Hook.
func (h *httpHook) WorkerAdded(w *fleet.Worker) error {
	w.Client = newHTTPPool(w, h.maxConns, h.connectTimeout)
	return nil
}

// WorkerRemoved implements fleet.Hook. Idle connections are closed; live
// streams keep theirs until they end, then close them.
func (h *httpHook) WorkerRemoved(w *fleet.Worker) {
	if p, ok := w.Client.(*httpPool); ok {
		p.closeIdle(true)
	}
}

// httpTransport sends requests to workers over HTTP/1.1 (upstream.go).
type httpTransport struct{}

var errNotHTTP = errors.New("worker has no HTTP connection pool")

func (httpTransport) roundTrip(c *call) (upResponse, *failure) {
	p, ok := c.lease.Worker.Client.(*httpPool)
	if !ok {
		return nil, fail(failConnect, errNotHTTP)
	}
	deadline := c.firstByte
	if !deadline.IsZero() && deadline.UnixNano() <= c.now {
		// The request's budget was spent by earlier attempts: the worker
		// was never contacted, so it gets no fault.
		return nil, failureSpent
	}
	c.lease.Sent()
	for try := 0; ; try++ {
		uc, reused, err := p.get(deadline)
		if err != nil {
			switch {
			case errors.Is(err, errUpNoConns), errors.Is(err, syscall.EMFILE), errors.Is(err, syscall.ENFILE):
				// The router's own limit (per worker, or its open
				// files: the socket could not be made): not the
				// worker's fault, whose breaker a descriptor shortage
				// tripped, the whole fleet's with it.
				return nil, fail(failLocalConns, err)
			case isTimeout(err):
				return nil, c.timeoutFailure(deadline, err)
			}
			return nil, fail(failConnect, err)
		}
		c.cancel.set(uc)
		uc.setDeadline(deadline)
		err = uc.writeRequest(c.method, c.path, c.hdr, c.body)
		written := err == nil
		if written {
			c.wrote = true
			err = uc.readHead()
		} else if eerr := uc.earlyAnswer(err, deadline); eerr != nil {
			// Nothing usable came (err stays the write's), or what came
			// is no HTTP response (an invalid one, as after the body).
			err = eerr
		} else if !(reused && try == 0 && uc.Code == 408) {
			// The engine answered before taking all of the request (413
			// to a body over its limit, say): that answer is the
			// engine's, not a connection failure. A 408 on a reused
			// connection is the engine closing it as idle (RFC 9110
			// 15.5.9), no answer to this request: it stays stale.
			err = nil
		}
		if err == nil {
			return (*httpUpstream)(uc), nil
		}
		aborted := uc.wasAborted()
		c.cancel.set(nil)
		uc.closeConn()
		switch {
		case aborted || c.cancel.wasAborted():
			return nil, failureCanceled
		case reused && try == 0 && isStale(err) && !(c.once && written):
			// The engine closed the idle keep-alive connection as we
			// reused it: nothing was processed; try a fresh connection.
			// (A request sent once is sent again only if it could not be
			// written: see call.once.)
			continue
		case isTimeout(err):
			return nil, c.timeoutFailure(deadline, err)
		case h1.Invalid(err):
			return nil, fail(failProtocol, err)
		}
		return nil, fail(failConnect, err)
	}
}

// timeoutFailure classifies a deadline that fired before the first byte:
// the wall-clock cap of the request is not the worker's fault, the first
// packet timeout is.
func (c *call) timeoutFailure(deadline time.Time, err error) *failure {
	if !c.total.IsZero() && !deadline.Before(c.total) {
		return fail(failWallClock, err)
	}
	return fail(failTimeout, err)
}

// isStale reports an error a reused keep-alive connection gives when the
// peer had closed it: nothing of the response was read.
func isStale(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// httpUpstream is an upConn seen as an upstream.
type httpUpstream upConn

var _ upResponse = (*httpUpstream)(nil)

func (u *httpUpstream) conn() *upConn { return (*upConn)(u) }

func (u *httpUpstream) status() int { return u.conn().Code }

func (u *httpUpstream) contentType() []byte {
	c := u.conn()
	return c.Buf[c.CType[0]:c.CType[1]]
}

func (u *httpUpstream) contentLength() int64 {
	c := u.conn()
	if c.Chunked {
		return -1
	}
	return c.CLen
}

func (u *httpUpstream) closeDelimited() bool {
	c := u.conn()
	return !c.Chunked && c.CLen < 0
}

func (u *httpUpstream) copyHeaders(h *fasthttp.ResponseHeader) {
	c := u.conn()
	for i := range c.Hdrs {
		if c.Hdrs[i].Kind != h1.Other {
			continue // hop-by-hop or framing, told when the head was read
		}
		// The value is valid: h1 refused control bytes in every value
		// (relayableHeader's check of it).
		k, v := c.Header(i)
		if isFramingOrOwnHeader(k) || c.NamedByConnection(k) || !validHeaderName(k) || underscoreAlias(k, true) {
			continue
		}
		h.AddBytesKV(k, v)
	}
}

func (u *httpUpstream) header(name []byte) []byte {
	c := u.conn()
	for i := range c.Hdrs {
		if k, v := c.Header(i); bytes.EqualFold(k, name) {
			return v
		}
	}
	return nil
}

func (u *httpUpstream) read(p []byte) (int, error) { return u.conn().read(p) }

func (u *httpUpstream) setReadDeadline(t time.Time) {
	u.conn().setDeadline(t) // no write happens while the body is read
}

func (u *httpUpstream) finish(ok bool) {
	c := u.conn()
	if ok {
		c.finish()
		return
	}
	c.closeConn()
}

func (u *httpUpstream) readFailure(err error, afterFirstByte bool) *failure {
	c := u.conn()
	switch {
	case c.wasAborted():
		return failureCanceled
	case isTimeout(err):
		if !afterFirstByte {
			return fail(failTimeout, err)
		}
		return fail(failBroken, err)
	case afterFirstByte:
		return fail(failBroken, err)
	}
	// The head came, then the answer broke off before its first body
	// byte (a bad chunk size, or the engine closed): an invalid response,
	// not a connection that could not be made (that was a 502
	// upstream_unreachable, and every worker doing it a 503
	// no_workers_reachable, though each had answered).
	return fail(failProtocol, err)
}
