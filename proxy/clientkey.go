package proxy

import "github.com/valyala/fasthttp"

// clientKey returns the API key a client presented: the credentials of
// "Authorization: Bearer <key>" (the scheme compared case-insensitively,
// RFC 9110 11.1), else the x-api-key header, as Anthropic clients send
// it. nil when there is neither. This is the one place keys are read from
// a request: the global key check (authorized) and per-user keys use it.
// The result aliases the request header: compare it, never keep or log it.
func clientKey(h *fasthttp.RequestHeader) []byte {
	if auth := h.Peek(fasthttp.HeaderAuthorization); len(auth) > 7 && eqFold(auth[:7], "bearer ") {
		k := auth[7:]
		for len(k) > 0 && k[0] == ' ' {
			k = k[1:]
		}
		return k
	}
	if k := h.Peek("x-api-key"); len(k) > 0 {
		return k
	}
	return nil
}
