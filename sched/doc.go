// Package sched decides which worker serves a request.
//
// It owns the scheduling pipeline of Scheduler.Pick over the workers of a
// fleet.Fleet:
//
//   - require-session check (ErrSessionRequired -> 400);
//   - router mode direct (x-worker-instance-id / x-prefill-instance-id);
//   - service canary and model routing (mappings, exact / fuzzy match,
//     default model) -> the candidate set (UnknownModelError -> 404);
//   - per-worker breakers, then the scheduling circuit breaker and wait
//     timeout around the three layers, first hit wins: session affinity
//     (affinity.go), prefix caching over the prefix index (prefix.go) or the
//     KV index (kv-aware policy, KVScorer), load balancing (balance.go);
//   - the dispatch is recorded in the session table and the prefix index.
//
// Every setting except --router-mode/--router-policy comes from the
// config.Config snapshot passed to Pick, so a reload applies to the next
// request. Derived state (compiled patterns, canary sequences) is cached
// per snapshot pointer.
//
// It knows nothing about HTTP, NATS or ZMQ: transports attach their client
// to fleet.Worker.Client through fleet hooks, and the KV cost function
// (package kvroute) is reached through the KVScorer interface.
package sched
