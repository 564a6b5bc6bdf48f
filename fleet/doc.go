// Package fleet is the set of workers the router may dispatch to.
//
// It owns the worker record every discovery backend carries (Record), the
// live Worker values with their atomic load counters and circuit breaker,
// the Fleet registry with its immutable View swapped on every change, and
// the hooks transports and the KV manager attach to workers.
//
// Load counters and breakers are changed only through a Lease (sched/lease.go),
// which sched hands out for each dispatch attempt. fleet must not know
// about HTTP, NATS, scheduling policy or the KV index.
package fleet
