// Package proxy is infera's front door: the fasthttp server with the
// OpenAI-compatible API, the zero-allocation reverse proxy over per-worker
// HostClients, and the streaming SSE relay.
//
// It parses only what routing needs from a request body (model, stream flag,
// max_tokens, prompt text), asks sched for a worker, forwards the original
// bytes untouched, and relays the answer chunk by chunk while keeping the
// worker's load counters and the usage metrics up to date. It owns failover
// (retry on another worker before the first response byte), the request
// timeouts of the config snapshot, and the mapping of errors to
// OpenAI-shaped JSON bodies. It must not know how workers are discovered or
// how the KV index is fed.
package proxy
