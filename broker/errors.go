package broker

import (
	"context"
	"errors"
	"net/http"
)

// Error is a transport failure with the HTTP status the proxy should answer
// and whether the request may be retried on another worker (only ever before
// the first response byte). Match kinds with errors.Is(err, ErrIdleTimeout).
type Error struct {
	// Status is the HTTP status for the client.
	Status int
	// Retryable is true when the request was not served and an alternate
	// worker may take it.
	Retryable bool
	msg       string
}

func (e *Error) Error() string { return e.msg }

// Kinds of transport errors. Errors returned by Client.Do and Stream.Next
// wrap one of these.
var (
	// ErrMaxPending: the router already has --nats-req-max-pending requests
	// outstanding at this worker; nothing was sent. 429, retryable.
	ErrMaxPending = &Error{Status: http.StatusTooManyRequests, Retryable: true, msg: "router-side max pending reached for worker"}
	// ErrWorkerBusy: the worker rejected the request at its own
	// max-pending cap. 429, retryable.
	ErrWorkerBusy = &Error{Status: http.StatusTooManyRequests, Retryable: true, msg: "worker at max pending"}
	// ErrNoResponders: nobody serves the worker's request subject (worker
	// gone or not on NATS). 503, retryable.
	ErrNoResponders = &Error{Status: http.StatusServiceUnavailable, Retryable: true, msg: "no responders on worker subject"}
	// ErrEngine: the worker could not reach its engine. 502, retryable.
	ErrEngine = &Error{Status: http.StatusBadGateway, Retryable: true, msg: "worker could not reach engine"}
	// ErrEngineDial: the worker could not connect to its engine: nothing
	// was sent to it. 502, retryable. (ErrEngine is any engine failure
	// before a head, from a worker that does not say which.)
	ErrEngineDial = &Error{Status: http.StatusBadGateway, Retryable: true, msg: "worker could not connect to its engine"}
	// ErrEngineProtocol: the worker reached its engine, which answered with
	// something that is not a usable HTTP response (a malformed status
	// line or head). 502, retryable.
	ErrEngineProtocol = &Error{Status: http.StatusBadGateway, Retryable: true, msg: "worker's engine sent an invalid response"}
	// ErrIdleTimeout: no reply chunk within --nats-req-idle-timeout. 504;
	// retryable only when it happens before the first reply (Do).
	ErrIdleTimeout = &Error{Status: http.StatusGatewayTimeout, Retryable: true, msg: "idle timeout waiting for reply"}
	// ErrMaxDuration: the request ran past --nats-req-max-duration. 504,
	// not retryable (the request's budget is spent).
	ErrMaxDuration = &Error{Status: http.StatusGatewayTimeout, Retryable: false, msg: "max request duration exceeded"}
	// ErrBroken: the reply stream broke mid-way (engine error, lost or
	// out-of-order chunks). 502, not retryable.
	ErrBroken = &Error{Status: http.StatusBadGateway, Retryable: false, msg: "reply stream broken"}
	// ErrOverrun: the router read the reply stream more slowly than the
	// worker sent it (its client reads slowly) until the buffered replies
	// passed ClientConfig.MaxQueued or MaxQueuedBytes: the stream is cut
	// and the worker told to cancel. Not the worker's fault. 502, not
	// retryable.
	ErrOverrun = &Error{Status: http.StatusBadGateway, Retryable: false, msg: "reply queue overflow (the reader is too slow)"}
	// ErrConnLost: the router's broker connection dropped (a broker restart,
	// a network cut): replies in flight are lost. Not the worker's fault.
	// 503; retryable before the first reply.
	ErrConnLost = &Error{Status: http.StatusServiceUnavailable, Retryable: true, msg: "NATS connection lost"}
	// ErrWorkerGone: the worker's cancel subject had no subscriber three
	// probes in a row, 2 s apart (6-8 s after its death): the worker died
	// with the request open; or the worker answering on its subject no
	// longer knew the request two probes in a row (it was restarted under
	// the same id). 502; retryable before the first reply.
	ErrWorkerGone = &Error{Status: http.StatusBadGateway, Retryable: true, msg: "worker gone (its NATS subscriptions vanished)"}
	// ErrDenied: the broker refused the router's publish to the worker's
	// request subject (a permissions violation: the router's NATS user
	// lacks publish rights on infera.req.>); found when the request's
	// probes give up on it. Not the worker's fault. 503; retryable (another
	// worker's subject may be allowed).
	ErrDenied = &Error{Status: http.StatusServiceUnavailable, Retryable: true, msg: "the broker refused the router's publish (NATS permissions violation: the router's user needs publish rights on " + ReqPrefix + ">)"}
	// ErrTooLarge: the request does not fit one NATS message. 413.
	ErrTooLarge = &Error{Status: http.StatusRequestEntityTooLarge, Retryable: false, msg: "request larger than NATS max payload"}
	// ErrNATS: publishing failed (connection closed or reconnecting). 503,
	// retryable.
	ErrNATS = &Error{Status: http.StatusServiceUnavailable, Retryable: true, msg: "NATS publish failed"}
)

// wrapped is a kind plus detail; errors.Is matches the kind.
type wrapped struct {
	kind   *Error
	detail string
}

func (w *wrapped) Error() string {
	if w.detail == "" {
		return w.kind.msg
	}
	return w.kind.msg + ": " + w.detail
}
func (w *wrapped) Unwrap() error { return w.kind }

func wrap(kind *Error, detail string) error { return &wrapped{kind: kind, detail: detail} }

// HTTPStatus returns the HTTP status the proxy should answer for err:
// the kind's status, 499 for a canceled context, 502 otherwise.
func HTTPStatus(err error) int {
	var e *Error
	if errors.As(err, &e) {
		return e.Status
	}
	if errors.Is(err, context.Canceled) {
		return 499
	}
	return http.StatusBadGateway
}

// Retryable reports whether a failed Client.Do may be retried on another
// worker. Stream errors (after the first reply) are never retried.
func Retryable(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.Retryable
}
