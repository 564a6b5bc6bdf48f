// Package broker holds all of infera's NATS code: the request transport
// (router-side Client, worker-side Server), the KV-event relay (engine ZMQ
// PUB -> NATS, worker side) and the fleet-wide KV-event subscription (router
// side).
//
// It knows nothing about HTTP routing, the scheduler's policies or the KV
// index: the proxy calls Client.Do, the KV manager receives events through a
// callback. All cgo (zmq4) lives in kvzmq.go.
//
// # Subjects
//
//	infera.req.<workerID>        requests to one worker instance
//	infera.cancel.<workerID>     cancel notices (data = request id)
//	infera.kv.events.<workerID>  KV events relayed from the engine
//
// # Request framing
//
// A request is one NATS message on infera.req.<workerID> whose reply subject
// is the router's inbox for that request. Data is the HTTP request body,
// untouched. Headers:
//
//	Infera-Id      request id (unique; used by cancel notices)
//	Infera-Method  HTTP method (default POST)
//	Infera-Path    HTTP path with query, e.g. /v1/chat/completions
//	Infera-Probe   "1": the router's inbox subscription is a wildcard over
//	               the reply subject's last token, so the worker may probe
//	               it (below)
//	Infera-Resend  "1": after a reused engine connection closed under the
//	               request, the worker may send it again on another one;
//	               without it (a PD leg, which may reach the engine once
//	               only, or a router older than the worker) it sends it
//	               again only if none of it was written
//	<other>        forwarded HTTP request headers (names starting with
//	               "Infera-" are reserved and never forwarded)
//
// The worker answers with a sequence of messages on the reply subject, each
// carrying Infera-Kind and Infera-Seq (0, 1, 2, ... so a dropped message is
// detected):
//
//	Infera-Kind: head   first message: Infera-Status is the engine's HTTP
//	                    status; other headers are the engine's response
//	                    headers (hop-by-hop ones removed; Content-Length is
//	                    kept when the body follows). Data may be empty.
//	                    With Infera-Last: 1, Data is the whole body and no
//	                    more messages follow (small fixed-length responses).
//	Infera-Kind: data   one body chunk, exactly as the engine wrote it.
//	Infera-Kind: end    end of body. If Infera-Error is set the engine
//	                    stream broke mid-way (the client sees an error).
//	Infera-Kind: error  instead of head: the request was not forwarded.
//	                    Infera-Status says why (429 = worker at
//	                    --nats-req-max-pending, 502 = engine failed),
//	                    Infera-Error has the reason; with 502,
//	                    Infera-Reason: protocol says the engine answered
//	                    something that is not HTTP (absent: it could not
//	                    be reached). An engine answer that breaks off after
//	                    its head is a head, the data that came, and an end
//	                    with Infera-Error.
//
// # A router that is gone
//
// A router that dies sends no cancel notice, so the worker watches for it.
// Each data message carries a reply subject of the worker's own: when the
// router's inbox has no subscriber, the NATS server answers there with a
// no-responders status, and the worker cancels the engine request at once
// (that chunk is lost anyway). Before the first data message (a prefill, a
// whole non-streaming answer) nothing goes out, so a request that carried
// Infera-Probe: 1 is probed every 2 s: an empty message to <reply subject
// without its last token>.probe, which the router ignores. Three probes
// in a row that find no subscriber (a router gone for 6-8 s) cancel
// the engine request; one or two (a route between NATS servers that
// dropped for a moment) do not. A requester without the header (an
// exact-subject inbox, `nats req`) is never probed.
//
// A router answers for a request it no longer has open (its cancel notice
// may have been lost, published while its broker connection was down): a
// data chunk for it, or a probe for it, gets a message with Infera-Kind:
// gone on the chunk's or probe's reply subject, and the worker cancels the
// engine request at once.
//
// The router watches its workers likewise: every 2 s, each worker it has
// requests open at gets an empty message on infera.cancel.<workerID> (a
// live worker ignores a cancel without a request id) with a reply subject
// of the router's inbox; three in a row answered no-responders fail that
// worker's open requests with ErrWorkerGone. The message also lists, in
// Infera-Open (space-separated), the requests open at the worker since the
// previous probe, with Infera-Round numbering the probe; the worker answers
// on the reply subject with Infera-Round, Infera-Known (the listed ids it
// serves) and Infera-Unknown (the others). A request some answer calls
// unknown and none calls known, two rounds in a row, fails with
// ErrWorkerGone: its worker was restarted under the same id. A worker that
// does not answer (an older one) fails nothing.
//
// # KV-event framing
//
// The relay publishes each ZMQ multipart frame [topic, seq(8 bytes,
// big-endian), payload] as one message on infera.kv.events.<workerID>: Data
// is the payload bytes as the engine produced them (never re-encoded),
// header Infera-Topic is the topic and Infera-Seq the sequence number in
// decimal. Header Infera-Instance is the relay's instance id, drawn once
// per relay (so once per sidecar process) and stamped on every frame it
// relays: 16 lowercase hex digits of a 64-bit number, the relay's start
// time in Unix milliseconds above 22 random bits, so a relay started
// later has the larger id. The subject names the worker, but nothing stops
// two processes from publishing on it (two sidecars or engines started
// with the same --id, a rollout's old and new Pod): the instance id tells
// their frames apart and which is newer, so the router can follow one and
// drop the other's (kv.Manager). A frame without the header (a relay older
// than the header) is instance 0; a header that is not 1-16 hex digits, or
// is zero, makes the frame malformed.
package broker
