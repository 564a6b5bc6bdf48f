package proxy

import (
	"strconv"
	"time"

	"github.com/infera/infera/govern"
	"github.com/infera/infera/protocol"
	"github.com/valyala/fasthttp"
)

// Rate limit headers (docs/governance.md#rate-limit-headers): every answer
// to a request of a user whose quota template has RPM or TPM tells the
// user's buckets as its admission left them, under the names the client's
// API uses: OpenAI's x-ratelimit-* (limit, remaining, reset as a duration
// like "6m0s") on the OpenAI endpoints, Anthropic's
// anthropic-ratelimit-{requests,tokens}-* (reset as an RFC 3339 time) on
// /v1/messages.
var (
	hdrXRLLimitReq  = []byte("X-Ratelimit-Limit-Requests")
	hdrXRLLimitTok  = []byte("X-Ratelimit-Limit-Tokens")
	hdrXRLLeftReq   = []byte("X-Ratelimit-Remaining-Requests")
	hdrXRLLeftTok   = []byte("X-Ratelimit-Remaining-Tokens")
	hdrXRLResetReq  = []byte("X-Ratelimit-Reset-Requests")
	hdrXRLResetTok  = []byte("X-Ratelimit-Reset-Tokens")
	hdrARLLimitReq  = []byte("Anthropic-Ratelimit-Requests-Limit")
	hdrARLLeftReq   = []byte("Anthropic-Ratelimit-Requests-Remaining")
	hdrARLResetReq  = []byte("Anthropic-Ratelimit-Requests-Reset")
	hdrARLLimitTok  = []byte("Anthropic-Ratelimit-Tokens-Limit")
	hdrARLLeftTok   = []byte("Anthropic-Ratelimit-Tokens-Remaining")
	hdrARLResetTok  = []byte("Anthropic-Ratelimit-Tokens-Reset")
	rateLimitHeader = [2][2][3][]byte{
		{{hdrXRLLimitReq, hdrXRLLeftReq, hdrXRLResetReq}, {hdrXRLLimitTok, hdrXRLLeftTok, hdrXRLResetTok}},
		{{hdrARLLimitReq, hdrARLLeftReq, hdrARLResetReq}, {hdrARLLimitTok, hdrARLLeftTok, hdrARLResetTok}},
	}
)

// setRateLimitHeaders sets the headers of l on ctx's answer; buf is
// scratch space, returned for reuse.
func setRateLimitHeaders(ctx *fasthttp.RequestCtx, l *govern.Limits, buf []byte) []byte {
	api := 0
	var now int64
	if apiOfPath(ctx.Path()) == protocol.Anthropic {
		api, now = 1, time.Now().UnixNano()
	}
	h := &ctx.Response.Header
	set := func(names *[3][]byte, limit, left, reset int64) {
		buf = strconv.AppendInt(buf[:0], limit, 10)
		h.SetCanonical(names[0], buf)
		buf = strconv.AppendInt(buf[:0], left, 10)
		h.SetCanonical(names[1], buf)
		if api == 0 {
			buf = appendResetDuration(buf[:0], reset)
		} else {
			// Whole seconds, rounded up: the bucket is full by then.
			buf = time.Unix((now+reset+1e9-1)/1e9, 0).UTC().AppendFormat(buf[:0], time.RFC3339)
		}
		h.SetCanonical(names[2], buf)
	}
	if l.RPM > 0 {
		set(&rateLimitHeader[api][0], l.RPM, l.Requests, l.RequestsReset)
	}
	if l.TPM > 0 {
		set(&rateLimitHeader[api][1], l.TPM, l.Tokens, l.TokensReset)
	}
	return buf
}

// appendResetDuration appends ns, rounded up to the millisecond, the way
// OpenAI writes its reset headers (Go's time.Duration format: "20ms",
// "1s", "1.5s", "6m0s", "1h2m3s").
func appendResetDuration(dst []byte, ns int64) []byte {
	ms := (max(ns, 0) + 999_999) / 1_000_000
	if ms < 1000 {
		if ms == 0 {
			return append(dst, "0s"...)
		}
		return append(strconv.AppendInt(dst, ms, 10), "ms"...)
	}
	h, m := ms/3_600_000, ms/60_000%60
	s, frac := ms/1000%60, ms%1000
	if h > 0 {
		dst = append(strconv.AppendInt(dst, h, 10), 'h')
	}
	if h > 0 || m > 0 {
		dst = append(strconv.AppendInt(dst, m, 10), 'm')
	}
	dst = strconv.AppendInt(dst, s, 10)
	if frac > 0 {
		dst = append(dst, '.')
		d := [3]byte{byte('0' + frac/100), byte('0' + frac/10%10), byte('0' + frac%10)}
		n := 3
		for d[n-1] == '0' {
			n--
		}
		dst = append(dst, d[:n]...)
	}
	return append(dst, 's')
}
