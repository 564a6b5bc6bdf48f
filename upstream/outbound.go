package upstream

import (
	"strconv"

	"github.com/infera/infera/config"
	"github.com/valyala/fasthttp"
)

// forwardedHeaders are the client headers an external upstream receives;
// everything else (credentials, cookies, hop-by-hop headers, client
// addresses, the gateway's own routing headers) stays here.
var forwardedHeaders = [...]string{
	"Content-Type", "Accept", "User-Agent",
	"OpenAI-Beta", "Anthropic-Version", "Anthropic-Beta",
}

// AppendHeaders appends the header block ("Name: value\r\n" lines) of a
// request to an external OpenAI-compatible upstream (a split proxy entry, a
// member gateway) and returns it. The request line, Host (the upstream's:
// Endpoint.Host) and Content-Length are the transport's. The block holds:
//
//   - the client's headers from a fixed list (Content-Type, Accept,
//     User-Agent, OpenAI-Beta, Anthropic-Version, Anthropic-Beta), the
//     request's id as X-Request-Id (requestID: the gateway's, which is the
//     client's when it sent a usable one), and the header named by extra when it is not a
//     credential, hop-by-hop or framing header (e.g. the session affinity
//     header for a member gateway); "Content-Type: application/json" when
//     the client sent none (the body is JSON), or in place of the client's
//     when jsonBody is true (the gateway wrote the body: a converted
//     Anthropic Messages or Responses request, whatever type the client's
//     own body was sent as);
//   - "Authorization: Bearer <key>" when key is set;
//   - HopHeader "1" when hop is true (global scheduling);
//   - ForwardsHeader, the count the request arrived with plus one.
//
// The client's Authorization, Cookie, API-key headers,
// Forwarded/X-Forwarded-*, hop-by-hop headers and everything else never
// pass. A value holding a control character is left out. It does not
// allocate when dst has room.
func AppendHeaders(dst []byte, in *fasthttp.RequestHeader, key config.Secret, hop, jsonBody bool, extra string, requestID []byte) []byte {
	for _, h := range forwardedHeaders {
		v := in.Peek(h)
		if h == "Content-Type" && (len(v) == 0 || jsonBody) {
			v = jsonType
		}
		dst = appendHeader(dst, h, v)
	}
	dst = appendHeader(dst, "X-Request-Id", requestID)
	if extra != "" && !isCredentialHeader(extra) && !isForwarded(extra) {
		dst = appendHeader(dst, extra, in.Peek(extra))
	}
	if key.IsSet() {
		dst = append(dst, "Authorization: "...)
		dst = key.AppendBearer(dst)
		dst = append(dst, "\r\n"...)
	}
	if hop {
		dst = append(dst, HopHeader+": 1\r\n"...)
	}
	dst = append(dst, ForwardsHeader+": "...)
	dst = strconv.AppendInt(dst, int64(Forwards(in)+1), 10)
	return append(dst, "\r\n"...)
}

// Forwards is the ForwardsHeader count a request arrived with: 0 without
// the header, at most MaxForwards (a value that is not a count, MaxForwards:
// only a gateway or a client opting out sends the header).
func Forwards(in *fasthttp.RequestHeader) int {
	v := in.Peek(ForwardsHeader)
	if len(v) == 0 {
		return 0
	}
	n := 0
	for _, c := range v {
		if c < '0' || c > '9' || n >= MaxForwards {
			return MaxForwards
		}
		n = n*10 + int(c-'0')
	}
	return min(n, MaxForwards)
}

var jsonType = []byte("application/json")

func appendHeader(dst []byte, name string, v []byte) []byte {
	if len(v) == 0 || !validHeaderName(name) {
		return dst
	}
	for _, c := range v {
		if c < ' ' && c != '\t' || c == 0x7f {
			return dst
		}
	}
	dst = append(dst, name...)
	dst = append(dst, ": "...)
	dst = append(dst, v...)
	return append(dst, "\r\n"...)
}

// validHeaderName reports an RFC 9110 token.
func validHeaderName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c <= ' ' || c >= 0x7f || c == ':' || c == '(' || c == ')' || c == ',' || c == '/' || c == ';' ||
			c == '<' || c == '=' || c == '>' || c == '?' || c == '@' || c == '[' || c == '\\' || c == ']' ||
			c == '{' || c == '}' || c == '"' {
			return false
		}
	}
	return true
}

// isForwarded reports the fixed-list names (already appended).
func isForwarded(h string) bool {
	for _, f := range forwardedHeaders {
		if equalFoldString(f, h) {
			return true
		}
	}
	return false
}

// isCredentialHeader reports the headers extra may not name.
func isCredentialHeader(h string) bool {
	for _, c := range [...]string{"Authorization", "Proxy-Authorization", "Cookie", "X-Api-Key", "Api-Key",
		"Connection", "Keep-Alive", "Transfer-Encoding", "Upgrade", "Te", "Trailer", "Host", "Content-Length",
		"Expect", "Proxy-Connection", "Forwarded", "X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto",
		"X-Real-Ip", HopHeader, ForwardsHeader} {
		if equalFoldString(c, h) {
			return true
		}
	}
	return false
}

func equalFoldString(a, b string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := 0; i < len(a); i++ {
		if lower(a[i]) != lower(b[i]) {
			return false
		}
	}
	return true
}
