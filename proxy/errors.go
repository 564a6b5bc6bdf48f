package proxy

import (
	"bytes"

	"github.com/infera/infera/protocol"
	"github.com/valyala/fasthttp"
)

// OpenAI error types.
const (
	typeInvalidRequest = "invalid_request_error"
	typeNotFound       = "not_found_error"
	typeRateLimit      = "rate_limit_error"
	typeServer         = "server_error"
	typeUnavailable    = "service_unavailable"
	typeTimeout        = "timeout_error"
	typeAuth           = "authentication_error"
	typePermission     = "permission_error"
)

// writeError writes an error answer of the router's own in the shape of
// the client's protocol: Anthropic's on /v1/messages paths
// ({"type":"error","error":{"type":...,"message":...}}, the type following
// from the status), else OpenAI's:
// {"error":{"message":...,"type":...,"param":...,"code":...}}.
func writeError(ctx *fasthttp.RequestCtx, status int, typ, msg, param, code string) {
	writeErrorAPI(ctx, apiOfPath(ctx.Path()), status, typ, msg, param, code) // protocols.go
}

// writeErrorAPI is writeError in api's shape.
func writeErrorAPI(ctx *fasthttp.RequestCtx, api protocol.API, status int, typ, msg, param, code string) {
	resetResponse(ctx)
	ctx.SetStatusCode(status)
	ctx.SetContentType("application/json")
	b := ctx.Response.BodyWriter()
	buf := make([]byte, 0, 96+len(msg))
	if api == protocol.Anthropic {
		b.Write(protocol.AppendError(buf, protocol.Anthropic, status, typ, param, msg))
		return
	}
	buf = append(buf, `{"error":{"message":`...)
	buf = appendJSONString(buf, msg)
	buf = append(buf, `,"type":`...)
	buf = appendJSONString(buf, typ)
	buf = append(buf, `,"param":`...)
	buf = appendNullable(buf, param)
	buf = append(buf, `,"code":`...)
	buf = appendNullable(buf, code)
	buf = append(buf, "}}"...)
	b.Write(buf)
}

// resetResponse clears the response for an answer of the router's own,
// keeping Connection: close when it was set (the rest of a request body
// left unread: the connection must not serve another request).
func resetResponse(ctx *fasthttp.RequestCtx) {
	cc := ctx.Response.ConnectionClose()
	ctx.Response.Reset()
	if cc {
		ctx.Response.SetConnectionClose()
	}
}

func appendNullable(b []byte, s string) []byte {
	if s == "" {
		return append(b, "null"...)
	}
	return appendJSONString(b, s)
}

// appendSSEError appends the event a stream ends with when it fails after
// the first byte; code is the error's code, as the answer before the first
// byte would have had it ("timeout", "upstream_error", ...).
func appendSSEError(b []byte, typ, msg, code string) []byte {
	b = append(b, `data: {"error":{"message":`...)
	b = appendJSONString(b, msg)
	b = append(b, `,"type":`...)
	b = appendJSONString(b, typ)
	b = append(b, `,"param":null,"code":`...)
	b = appendNullable(b, code)
	b = append(b, "}}\n\ndata: [DONE]\n\n"...)
	return b
}

// addAnthropicRequestID adds the request id to an Anthropic error body
// held whole, as Anthropic's API answers it ({"type":"error","error":{..},
// "request_id":".."}: its SDKs' ErrorResponse.request_id), unless the body
// has one (an engine's, relayed).
func addAnthropicRequestID(resp *fasthttp.Response, id []byte) {
	if resp.IsBodyStream() {
		return
	}
	b := resp.Body()
	if len(b) < 2 || b[len(b)-1] != '}' || !bytes.HasPrefix(b, anthropicErrorStart) || bytes.Contains(b, jsonKeyRequestID) {
		return
	}
	out := make([]byte, 0, len(b)+len(id)+16)
	out = append(out, b[:len(b)-1]...)
	out = append(out, `,"request_id":`...)
	out = appendJSONString(out, string(id))
	out = append(out, '}')
	resp.SetBodyRaw(out)
}

var (
	anthropicErrorStart = []byte(`{"type":"error",`)
	jsonKeyRequestID    = []byte(`"request_id"`)
)
