package proxy

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/infera/infera/broker"
	"github.com/valyala/fasthttp"
)

// natsTransport sends requests over NATS (--request-transport nats): the
// broker client publishes to the worker's subject and streams the reply.
type natsTransport struct {
	bc *broker.Client
	// reconnected is when the broker connection last came back (unix ns):
	// for a grace period after it, workers that have not re-subscribed yet
	// are not blamed for "no responders".
	reconnected atomic.Int64
	connected   func() bool
}

// natsGrace is how long after a broker reconnect missing responders are
// the broker's fault, not the workers'.
const natsGrace = 10 * time.Second

func (t *natsTransport) roundTrip(c *call) (upResponse, *failure) {
	if !c.firstByte.IsZero() && c.firstByte.UnixNano() <= c.now {
		return nil, failureSpent
	}
	c.lease.Sent()
	ctx, cancel := context.WithCancel(context.Background())
	nu := &natsUpstream{cancel: cancel, t: t}
	c.cancel.set(nu)
	hdr := make(http.Header, 8)
	forEachHeaderLine(c.hdr, func(k, v []byte) { hdr.Add(string(k), string(v)) })
	req := &broker.Request{
		Method: string(c.method), Path: string(c.path), Header: hdr, Body: c.body,
		FirstByte: c.firstByte, Deadline: c.total, Start: c.begin, Once: c.once,
	}
	if c.stream {
		req.Idle = c.idle
	}
	st, err := t.bc.Do(ctx, c.lease.Worker.ID, req)
	// Published: answered, or cancelled while the router waited for the
	// answer (Do fails before it publishes on other errors than these).
	c.wrote = c.wrote || err == nil || errors.Is(err, context.Canceled)
	if err != nil {
		cancel()
		c.cancel.set(nil)
		f := t.failure(err, false, c.cancel.wasAborted())
		if f.kind == failTimeout {
			// The first-packet wait ran into the request's own cap (a
			// non-streamed request's total, say): not the worker's fault,
			// as over HTTP (it was blamed, retried and tripped breakers).
			f = c.timeoutFailure(time.Now(), err)
		}
		return nil, f
	}
	nu.st = st
	return nu, nil
}

// failure classifies a broker error.
func (t *natsTransport) failure(err error, afterFirstByte, aborted bool) *failure {
	switch {
	case aborted || errors.Is(err, context.Canceled):
		return failureCanceled
	case errors.Is(err, broker.ErrMaxPending), errors.Is(err, broker.ErrWorkerBusy):
		return fail(failBusy, err)
	case errors.Is(err, broker.ErrNoResponders):
		if t.inGrace() {
			return fail(failBroker, err)
		}
		return fail(failNoResponder, err)
	case errors.Is(err, broker.ErrWorkerGone):
		if afterFirstByte {
			return fail(failBroken, err)
		}
		return fail(failNoResponder, err)
	case errors.Is(err, broker.ErrEngine), errors.Is(err, broker.ErrEngineDial):
		return fail(failEngine, err)
	case errors.Is(err, broker.ErrEngineProtocol):
		return fail(failProtocol, err)
	case errors.Is(err, broker.ErrIdleTimeout):
		if afterFirstByte {
			return fail(failBroken, err)
		}
		return fail(failTimeout, err)
	case errors.Is(err, broker.ErrMaxDuration):
		return fail(failWallClock, err)
	case errors.Is(err, broker.ErrConnLost), errors.Is(err, broker.ErrNATS), errors.Is(err, broker.ErrDenied):
		return fail(failBroker, err)
	case errors.Is(err, broker.ErrTooLarge):
		return fail(failTooLarge, err)
	case errors.Is(err, broker.ErrOverrun):
		return fail(failSlowReader, err)
	case errors.Is(err, broker.ErrBroken):
		if afterFirstByte {
			return fail(failBroken, err)
		}
		return fail(failProtocol, err)
	}
	if afterFirstByte {
		return fail(failBroken, err)
	}
	return fail(failConnect, err)
}

func (t *natsTransport) inGrace() bool {
	if t.connected != nil && !t.connected() {
		return true
	}
	at := t.reconnected.Load()
	return at != 0 && time.Since(time.Unix(0, at)) < natsGrace
}

// Reconnected tells the transport the broker connection came back.
func (t *natsTransport) Reconnected() { t.reconnected.Store(time.Now().UnixNano()) }

// natsUpstream is a broker stream seen as an upstream.
type natsUpstream struct {
	t      *natsTransport
	st     *broker.Stream
	cancel context.CancelFunc
	ctype  []byte
}

func (u *natsUpstream) abort() { u.cancel() }

func (u *natsUpstream) status() int { return u.st.Status() }

func (u *natsUpstream) contentType() []byte {
	if u.ctype == nil {
		u.ctype = []byte(u.st.Header().Get("Content-Type"))
	}
	return u.ctype
}

// closeDelimited reports an engine body that ended with the engine's
// close, as the worker saw it (broker.HdrCloseDelimited): the NATS stream
// ends with its own last message either way.
func (u *natsUpstream) closeDelimited() bool { return u.st.CloseDelimited() }

func (u *natsUpstream) contentLength() int64 {
	if v := u.st.Header().Get("Content-Length"); v != "" {
		if n, err := strconv.ParseInt(v, 10, 64); err == nil && n >= 0 {
			return n
		}
	}
	return -1
}

func (u *natsUpstream) header(name []byte) []byte {
	if v := u.st.Header().Get(string(name)); v != "" {
		return []byte(v)
	}
	return nil
}

func (u *natsUpstream) copyHeaders(h *fasthttp.ResponseHeader) { copyRelayedHeaders(h, u.st.Header()) }

// copyRelayedHeaders adds to h the headers of src, an engine's answer
// relayed by its sidecar, that reach the client.
func copyRelayedHeaders(h *fasthttp.ResponseHeader, src http.Header) {
	var conn []byte
	if v := src.Get("Connection"); v != "" {
		conn = []byte(v)
	}
	for k, vs := range src {
		kb := []byte(k)
		if droppedResponseHeader(kb) || (conn != nil && namedIn(conn, kb)) || underscoreAlias(kb, true) {
			continue
		}
		for _, v := range vs {
			if relayableHeader(kb, []byte(v)) {
				h.Add(k, v)
			}
		}
	}
}

func (u *natsUpstream) read(p []byte) (int, error) { return u.st.Read(p) }

// setReadDeadline bounds the next reads, besides the broker stream's own
// idle and total timeouts.
func (u *natsUpstream) setReadDeadline(t time.Time) { u.st.SetReadDeadline(t) }

func (u *natsUpstream) finish(ok bool) {
	u.st.Close() // publishes a cancel unless the reply finished
	u.cancel()
}

func (u *natsUpstream) readFailure(err error, afterFirstByte bool) *failure {
	f := u.t.failure(err, afterFirstByte, false)
	if f.kind == failConnect {
		// The head came (errCutBeforeEnd, say): an invalid response, as
		// over HTTP, not a worker that could not be reached.
		f = fail(failProtocol, err)
	}
	return f
}

// forEachHeaderLine calls f for each "Name: value\r\n" line of a header
// block built by appendForwardHeaders.
func forEachHeaderLine(b []byte, f func(k, v []byte)) {
	for len(b) > 0 {
		i := 0
		for i+1 < len(b) && !(b[i] == '\r' && b[i+1] == '\n') {
			i++
		}
		line := b[:i]
		if i+2 <= len(b) {
			b = b[i+2:]
		} else {
			b = nil
		}
		for j := 0; j+1 < len(line); j++ {
			if line[j] == ':' && line[j+1] == ' ' {
				f(line[:j], line[j+2:])
				break
			}
		}
	}
}
