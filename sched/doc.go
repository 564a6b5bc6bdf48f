// Package sched decides which worker serves a request.
//
// It owns the fleet's routable view (Fleet, Worker), the per-worker atomic
// load counters, the per-worker circuit breaker and the scheduling policies.
// It knows nothing about HTTP, NATS or ZMQ: transports attach their client to
// Worker.Client through fleet hooks, and the KV index is reached through the
// KVIndex interface.
package sched
