// Package h1 judges HTTP/1.1 response heads from engines: what the status
// line, the header section and the framing headers may be, and what makes
// an answer invalid (a malformed head, ambiguous framing, a protocol
// switch, endless interim answers, a head cut part-way). The router's own
// HTTP client (proxy/upstream.go) reads every engine answer with it, and
// the worker sidecar (broker) judges its engine's answers with it before
// net/http reads them, so a misbehaving engine is refused alike over HTTP
// and over NATS.
//
// It knows nothing of connections, pools or bodies: it reads one head from
// a bufio.Reader.
package h1
