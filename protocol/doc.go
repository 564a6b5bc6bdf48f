// Package protocol converts the Anthropic Messages API and the OpenAI
// Responses API to OpenAI chat completions and back, streaming included,
// and holds the chat-stream helpers every front door shares (asking the
// engine for usage, removing the usage chunk a client did not ask for,
// reasoning-effort mapping).
//
// It is pure: bytes in, bytes out, appended to caller-provided slices. It
// knows nothing of HTTP, routing or engines; the proxy calls it on the
// request path (see docs/protocols.md for the call sequence). Conversion
// walks bodies with a validating, non-allocating JSON scanner and copies
// strings in their escaped form; hostile input yields an *Error (HTTP 400),
// never a panic, with work and memory linear in the input.
package protocol
