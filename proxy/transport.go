package proxy

import (
	"sync"
	"time"

	"github.com/infera/infera/sched"
	"github.com/valyala/fasthttp"
)

// transport sends one dispatch attempt to its worker and returns once the
// response head is in. HTTP and NATS are transports; external upstreams
// and PD legs will be too. Every error a transport returns is a *failure
// (classified: whose fault, whether another worker may take the request,
// what the client is told), so the dispatch loop never inspects transport
// specific errors. A transport calls c.lease.Sent once it contacts the
// worker (not when it refuses the attempt before: a spent budget), and
// sets c.wrote once the worker was sent the whole request.
type transport interface {
	roundTrip(c *call) (upResponse, *failure)
}

// upResponse is a response being received: its head, and its body as a
// stream. read returns everything already received (one client write per
// burst); finish ends the body exactly once, from the goroutine that reads.
type upResponse interface {
	status() int
	// copyHeaders adds the response headers a client may see to h:
	// hop-by-hop headers, those named by the response's Connection header,
	// framing headers, Date and Server are left out.
	copyHeaders(h *fasthttp.ResponseHeader)
	// header returns the value of the response's header name (nil: none).
	header(name []byte) []byte
	contentType() []byte
	// contentLength is the body length, -1 when unknown.
	contentLength() int64
	// closeDelimited reports a body that ends only when the worker closes
	// the connection (HTTP/1.x with neither Content-Length nor chunked
	// framing): its end looks the same as a crash.
	closeDelimited() bool
	// read reads body bytes; io.EOF at the end. A failure is returned as is
	// (classify it with readFailure).
	read(p []byte) (int, error)
	// setReadDeadline bounds the next read (zero: none); now is the time
	// in unix nanoseconds (a deadline may be kept if it is already close).
	setReadDeadline(t time.Time)
	// finish ends the response. ok=false means the body was not read to its
	// end or the client left: the connection is not reused, and the engine
	// request is cancelled.
	finish(ok bool)
	// readFailure classifies an error returned by read.
	readFailure(err error, afterFirstByte bool) *failure
}

// call is one dispatch attempt as the transports see it. It lives in the
// pooled per-request state; transports must not keep it after roundTrip
// returns (except through the upstream they return).
type call struct {
	lease *sched.Lease
	// method and path are the request line: the canonical path of the
	// endpoint (never the client's raw request target) plus its query.
	method, path []byte
	// hdr is the forwarded header block ("Name: value\r\n" lines), rendered
	// once per request (forwardHeaders).
	hdr  []byte
	body []byte
	// stream is true for SSE responses (the client asked "stream": true).
	stream bool
	// firstByte bounds the wait for the response head and first body bytes;
	// total is the wall-clock cap of the whole response (zero: none); idle
	// bounds each wait for more of a stream (0: none).
	firstByte, total time.Time
	idle             time.Duration
	// now is when the attempt started (unix ns); begin when the request
	// did (--nats-req-max-duration counts from it, over every attempt).
	now   int64
	begin time.Time
	// once: the request must not reach its engine twice (a PD leg: an
	// SGLang leg's bootstrap_room is one transfer's, a vLLM prefill makes
	// its engine hold the KV for one read, which a decode leg with
	// kv_transfer_params does and frees). It is sent again on a fresh
	// connection only when writing it to a reused one failed, never after
	// it was written: a reused connection closed without an answer may be
	// an engine that took the request and then dropped it.
	once bool
	// wrote: an attempt on this call wrote the request to its engine (the
	// connection took all of it, or the broker published it). The
	// transports set it and nothing clears it between attempts: the
	// request's own call (reqState.call) tells at its end whether any
	// engine was sent the request, which a client that leaves before the
	// first byte is charged for (govState.end).
	wrote bool

	cancel abortSlot
}

// abortSlot lets the client-liveness watchdog abort an attempt in flight
// from another goroutine: the transport registers what to abort once it
// has it (a connection, a broker request).
type abortSlot struct {
	mu      sync.Mutex
	aborted bool
	target  interface{ abort() }
}

// set registers t; if the attempt was already aborted, t is aborted now.
func (a *abortSlot) set(t interface{ abort() }) {
	a.mu.Lock()
	a.target = t
	aborted := a.aborted
	a.mu.Unlock()
	if aborted && t != nil {
		t.abort()
	}
}

// abort aborts the registered target, and any registered later. The
// target is aborted under the lock: once set(nil) or unset has returned,
// no abort reaches the old target, which may then be recycled.
func (a *abortSlot) abort() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.aborted = true
	if a.target != nil {
		a.target.abort()
	}
}

// wasAborted reports whether abort was called (the client left).
func (a *abortSlot) wasAborted() bool {
	a.mu.Lock()
	v := a.aborted
	a.mu.Unlock()
	return v
}

func (a *abortSlot) reset() {
	a.mu.Lock()
	a.aborted, a.target = false, nil
	a.mu.Unlock()
}

// unset unregisters the slot's target whether or not the attempt was
// aborted, so that no later abort reaches it (its connection is about to
// be closed or pooled). It reports whether the attempt was not aborted
// (the connection may be pooled).
func (a *abortSlot) unset() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.target = nil
	return !a.aborted
}
