package proxy

import (
	"bytes"
	"strings"

	"github.com/infera/infera/internal/h1"
	"github.com/valyala/fasthttp"
)

// cors lets browser pages of the allowed origins call the API
// (--cors-allow-origins): a preflight (OPTIONS with
// Access-Control-Request-Method) from an allowed origin is answered 204
// without credentials, as browsers send none; every answer to an allowed
// origin names it in Access-Control-Allow-Origin, errors included, so the
// page can read the error. Credentials are Bearer headers, never cookies:
// Access-Control-Allow-Credentials is not sent.
type cors struct {
	any     bool
	origins [][]byte
}

func newCORS(origins []string) *cors {
	if len(origins) == 0 {
		return nil
	}
	c := &cors{}
	for _, o := range origins {
		if o == "*" {
			c.any = true
			continue
		}
		c.origins = append(c.origins, []byte(browserOrigin(o)))
	}
	return c
}

// browserOrigin is o as a browser sends it in Origin: scheme and host in
// lower case, no default port (https://App.Example.com:443 is sent as
// https://app.example.com). The flag took the other spellings, and no
// page's Origin ever matched them.
func browserOrigin(o string) string {
	o = strings.ToLower(o)
	switch {
	case strings.HasPrefix(o, "https://"):
		return strings.TrimSuffix(o, ":443")
	case strings.HasPrefix(o, "http://"):
		return strings.TrimSuffix(o, ":80")
	}
	return o
}

var (
	hdrOrigin          = []byte("Origin")
	hdrACRequestMethod = []byte("Access-Control-Request-Method")
	hdrACRequestHdrs   = []byte("Access-Control-Request-Headers")
	hdrACAllowOrigin   = []byte("Access-Control-Allow-Origin")
	hdrACAllowMethods  = []byte("Access-Control-Allow-Methods")
	hdrACAllowHeaders  = []byte("Access-Control-Allow-Headers")
	hdrACExposeHeaders = []byte("Access-Control-Expose-Headers")
	hdrACMaxAge        = []byte("Access-Control-Max-Age")
	hdrVary            = []byte("Vary")
	corsMethods        = []byte("GET, POST, OPTIONS")
	// What a page may read of an answer beyond the CORS-safelisted headers.
	corsExposed = []byte("X-Request-Id, Request-Id, Retry-After, Retry-After-Ms, X-Should-Retry, " +
		"X-Ratelimit-Limit-Requests, X-Ratelimit-Remaining-Requests, X-Ratelimit-Reset-Requests, " +
		"X-Ratelimit-Limit-Tokens, X-Ratelimit-Remaining-Tokens, X-Ratelimit-Reset-Tokens, " +
		"Anthropic-Ratelimit-Requests-Limit, Anthropic-Ratelimit-Requests-Remaining, Anthropic-Ratelimit-Requests-Reset, " +
		"Anthropic-Ratelimit-Tokens-Limit, Anthropic-Ratelimit-Tokens-Remaining, Anthropic-Ratelimit-Tokens-Reset")
	corsMaxAge = []byte("600")
	corsStar   = []byte("*")
	varyOrigin = []byte("Origin")
)

// allowed returns the Access-Control-Allow-Origin value for origin, or nil.
func (c *cors) allowed(origin []byte) []byte {
	if len(origin) == 0 {
		return nil
	}
	for _, o := range c.origins {
		if bytes.Equal(o, origin) {
			return origin
		}
	}
	if c.any {
		return corsStar
	}
	return nil
}

// preflight answers a CORS preflight and reports whether it did.
func (c *cors) preflight(ctx *fasthttp.RequestCtx) bool {
	h := &ctx.Request.Header
	if !h.IsOptions() || len(h.PeekBytes(hdrACRequestMethod)) == 0 {
		return false
	}
	allow := c.allowed(h.PeekBytes(hdrOrigin))
	if allow == nil {
		writeError(ctx, fasthttp.StatusForbidden, typePermission, "origin not allowed (--cors-allow-origins)", "", "cors_origin_not_allowed")
		return true
	}
	rh := &ctx.Response.Header
	ctx.SetStatusCode(fasthttp.StatusNoContent)
	rh.SetCanonical(hdrACAllowOrigin, allow)
	rh.SetCanonical(hdrACAllowMethods, corsMethods)
	if req := h.PeekBytes(hdrACRequestHdrs); len(req) > 0 && validHeaderList(req) {
		// The page's own headers (Authorization, Content-Type, the SDKs'
		// x-stainless-* and anthropic-* ones): credentials are checked on
		// the request itself.
		rh.SetCanonical(hdrACAllowHeaders, req)
	}
	rh.SetCanonical(hdrACMaxAge, corsMaxAge)
	rh.AddBytesKV(hdrVary, varyOrigin)
	return true
}

// decorate adds the CORS headers to an answer to an allowed origin. With
// origins listed, every answer depends on Origin and says so (Vary), so
// that a cache never hands an allowed page the copy made for another.
func (c *cors) decorate(ctx *fasthttp.RequestCtx) {
	rh := &ctx.Response.Header
	if len(c.origins) > 0 {
		rh.AddBytesKV(hdrVary, varyOrigin)
	}
	allow := c.allowed(ctx.Request.Header.PeekBytes(hdrOrigin))
	if allow == nil {
		return
	}
	rh.SetCanonical(hdrACAllowOrigin, allow)
	rh.SetCanonical(hdrACExposeHeaders, corsExposed)
}

// validHeaderList reports a comma-separated list of header names (what
// Access-Control-Request-Headers holds: RFC 9110 tokens, optional spaces or
// tabs around the commas); anything else is not echoed.
func validHeaderList(v []byte) bool {
	if len(v) > 2048 {
		return false
	}
	names := 0
	for len(v) > 0 {
		i := bytes.IndexByte(v, ',')
		if i < 0 {
			i = len(v)
		}
		name := bytes.Trim(v[:i], " \t")
		if len(name) > 0 && !h1.ValidName(name) {
			return false
		}
		if len(name) > 0 {
			names++
		}
		v = v[min(i+1, len(v)):]
	}
	return names > 0
}
