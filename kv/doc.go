// Package kv turns engine KV cache events into index updates.
//
// It owns the wire format vLLM and SGLang publish with
// --kv-events-config (ZMQ PUB multipart [topic, 8-byte big-endian seq,
// msgpack payload], legacy positional or map-tagged events), the router's
// own block hashing (HashBlocks, shared by event ingestion and prompt
// matching), per-worker subscription with sequence tracking and replay
// (Manager, a fleet.Hook), and, for events fed over NATS, the choice of
// one publisher per worker id when several publish under it
// (publisher.go). The publisher side of the wire format belongs to
// the simulated engine (engine/publisher.go); kv's tests run it against the
// subscriber.
//
// All cgo (github.com/pebbe/zmq4) lives in zmq.go; decoding, hashing and the
// manager's sequence logic build and test without cgo. kv writes to the
// radix index and reads fleet.Worker; it must not know about HTTP or the
// engine package.
package kv
