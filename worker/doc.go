// Package worker is the `infera worker` sidecar that sits beside one engine.
//
// It optionally launches and supervises the engine command, waits for the
// engine's /health, registers the engine's worker record with the discovery
// backend (etcd lease + heartbeat, or its own Pod's annotation), serves the
// per-instance NATS request subject (--request-transport nats), relays the
// engine's ZMQ KV events to NATS (--kv-event-transport nats), and on SIGTERM
// drains: status DRAINING, wait for in-flight requests (up to
// --drain-timeout), deregister, stop the engine, exit.
//
// It knows nothing about routing; records, registration and transports come
// from sched, discovery and broker.
package worker
