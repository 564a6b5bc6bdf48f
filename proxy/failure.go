package proxy

import (
	"errors"
	"net"
	"os"

	"github.com/infera/infera/broker"
	"github.com/infera/infera/sched"
)

// failKind is why an attempt failed before its first byte reached the
// client (or, for the few kinds marked, after).
type failKind uint8

const (
	failNone           failKind = iota
	failConnect                 // could not connect to or write to the worker
	failTimeout                 // no answer from the worker before the deadline
	failProtocol                // the worker answered with something that is not a usable HTTP response
	failStatus                  // the worker answered 5xx or 429 (retried before the first byte)
	failLocalConns              // the router's own connection limit to the worker is reached
	failBusy                    // the worker (or the router's per-worker cap) refused: at capacity
	failNoResponder             // NATS: nobody serves the worker's subject
	failBroker                  // NATS: the broker connection is down or restarting
	failEngine                  // NATS: the worker sidecar could not reach its engine
	failTooLarge                // the request does not fit the transport
	failSpent                   // the request's own deadline passed before the worker was tried
	failWallClock               // the request's wall-clock cap expired (NATS max duration, stream total)
	failCanceled                // the client left
	failBroken                  // the response stream broke mid-way
	failSlowReader              // NATS: the client read the stream too slowly; its buffered replies overflowed
	failUpstreamAuth            // an external upstream refused the gateway's own credentials (401, 403, 407)
	failAnswerTooLarge          // a PD prefill answer outgrew what the router holds (not the worker's fault)
	failEngineRefused           // the engine's error event inside a stream stands for a client error (4xx)
	numFailKinds
)

// failClass is what each kind means, in one table: the breaker outcome,
// whether another worker may take the request, and what the client is told.
type failClass struct {
	outcome sched.Outcome
	retry   bool
	status  int
	typ     string
	code    string
	msg     string
}

var failClasses = [numFailKinds]failClass{
	failNone:          {sched.OutcomeNeutral, false, 502, typeServer, "upstream_error", "upstream error"},
	failConnect:       {sched.OutcomeFault, true, 502, typeServer, "upstream_unreachable", "the selected worker could not be reached"},
	failTimeout:       {sched.OutcomeFault, true, 504, typeTimeout, "timeout", "the worker timed out (no answer before the deadline)"},
	failProtocol:      {sched.OutcomeFault, true, 502, typeServer, "upstream_protocol_error", "the worker sent an invalid response"},
	failStatus:        {sched.OutcomeFault, true, 502, typeServer, "upstream_error", "the worker failed"},
	failLocalConns:    {sched.OutcomeNeutral, true, 503, typeUnavailable, "router_connection_limit", "too many concurrent requests to the selected worker"},
	failBusy:          {sched.OutcomeNeutral, true, 429, typeRateLimit, "worker_busy", "the selected worker is at capacity"},
	failNoResponder:   {sched.OutcomeFault, true, 503, typeUnavailable, "worker_unavailable", "the selected worker is not serving requests"},
	failBroker:        {sched.OutcomeNeutral, true, 503, typeUnavailable, "broker_unavailable", "the message broker is unavailable"},
	failEngine:        {sched.OutcomeFault, true, 502, typeServer, "upstream_unreachable", "the worker could not reach its engine"},
	failTooLarge:      {sched.OutcomeNeutral, false, 413, typeInvalidRequest, "request_too_large", "the request is too large for the request transport"},
	failSpent:         {sched.OutcomeNeutral, false, 504, typeTimeout, "timeout", "the request deadline passed before a worker answered"},
	failWallClock:     {sched.OutcomeNeutral, false, 504, typeTimeout, "timeout", "the request timed out (its total time limit passed)"},
	failCanceled:      {sched.OutcomeNeutral, false, 499, typeInvalidRequest, "client_closed_request", "the client closed the request"},
	failBroken:        {sched.OutcomeFault, false, 502, typeServer, "upstream_error", "the worker's response stream broke"},
	failSlowReader:    {sched.OutcomeNeutral, false, 499, typeInvalidRequest, "client_too_slow", "the stream was cut: the client read it more slowly than the engine wrote it"},
	failUpstreamAuth:  {sched.OutcomeFault, true, 502, typeServer, "upstream_auth_error", "the upstream refused the gateway's credentials"},
	failEngineRefused: {sched.OutcomeNeutral, false, 400, typeInvalidRequest, "upstream_request_error", "the engine refused the request inside its stream"},
	failAnswerTooLarge: {sched.OutcomeNeutral, false, 502, typeServer, "upstream_answer_too_large",
		"the prefill answer exceeds the 8 MiB the router holds (what the request asked of it is too large)"},
}

// failure is a classified attempt failure. The message is safe to show a
// client: it never carries addresses or bytes from the engine. cause is for
// the (throttled) log only.
type failure struct {
	kind  failKind
	cause error
	// status overrides the class's status for failStatus (the worker's own).
	status int
}

func (f *failure) class() *failClass { return &failClasses[f.kind] }

func (f *failure) outcome() sched.Outcome { return failClasses[f.kind].outcome }

func (f *failure) retryable() bool { return failClasses[f.kind].retry }

// httpStatus is the status the client gets: for a failStatus (whose
// answer is relayed when it could be kept, relayStashed), 429 as the
// worker said, else 502: an error answer that could not be read whole (a
// 4xx cut short or stalled) is a broken answer, not the client's fault.
func (f *failure) httpStatus() int {
	if f.kind == failStatus && f.status == 429 {
		return 429
	}
	return failClasses[f.kind].status
}

func fail(kind failKind, cause error) *failure { return &failure{kind: kind, cause: cause} }

// Preallocated failures for the allocation-free paths.
var (
	failureCanceled = &failure{kind: failCanceled}
	failureSpent    = &failure{kind: failSpent}
)

// refusal reports whether f is the upstream's refusal of the request or
// its fault (a 5xx or 429 answer, unreachable, a timeout, an invalid
// answer, the gateway's key refused), as opposed to the client's doing
// (a 4xx answer, a client that left, the request's own deadline).
func (f *failure) refusal() bool {
	if f.kind == failStatus {
		return f.status >= 500 || f.status == 429
	}
	return f.outcome() == sched.OutcomeFault
}

// unreachable reports a failure to reach the engine at all: the
// connection could not be made or broke before a response head (over NATS,
// the worker could not reach its engine, failEngine). When every attempt
// failed so, the client gets 503 no_workers_reachable over either
// transport.
func (f *failure) unreachable() bool { return f.kind == failConnect || f.kind == failEngine }

// isTimeout reports whether err is a deadline that passed, whatever the
// transport: a socket deadline (HTTP) or the broker's wait for a reply
// message or its cap on the whole request (NATS).
func isTimeout(err error) bool {
	if errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, broker.ErrIdleTimeout) || errors.Is(err, broker.ErrMaxDuration) {
		return true
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
