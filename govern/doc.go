// Package govern is traffic protection and user governance: it identifies
// users by API key, admits their requests against quota templates (allowed
// calling periods, periodic quotas, per-user concurrency, RPM/TPM token
// buckets) and hands out concurrency seats that protect the engines
// (request rate limiting: overall, prefill and decode concurrency per
// instance, service or the whole gateway).
//
// Counters live in the process or, with --state redis://..., in Redis,
// updated by Lua scripts (one round trip per admission) so that several
// routers enforce one limit. Everything a request takes is owned by one
// value with one idempotent Done: a Ticket (user admission) and a Seat
// (one dispatch attempt on one engine).
//
// The package reads config.Config snapshots (Apply) and knows nothing of
// HTTP, the scheduler or the proxy: callers pass keys, token counts and
// Targets, and map a *Rejection to their response. docs/governance.md is
// the reference.
package govern
