package proxy

import (
	"bytes"

	"github.com/infera/infera/internal/h1"
	"github.com/valyala/fasthttp"
)

// Headers consumed by the router and never forwarded.
const (
	hdrWorkerID  = "x-worker-instance-id"
	hdrPrefillID = "x-prefill-instance-id"
)

// isHopHeader reports the hop-by-hop headers of RFC 9110 section 7.6.1 (and
// their common relatives): meaningful for one connection only, so never
// forwarded in either direction. h1 tells them, as it reads an engine's
// head.
func isHopHeader(k []byte) bool { return h1.KindOf(k).Hop() }

// isFramingOrOwnHeader reports response headers the router writes itself,
// CORS's included, and those that speak for the engine's or provider's
// origin, which the client would take as the router's: Set-Cookie (an
// API's load balancer cookie, Cloudflare's __cf_bm), Strict-Transport-
// Security (its includeSubDomains would pin the router's domain) and
// Alt-Svc (an HTTP/3 endpoint of the provider's).
//
// That includes the router's decision headers: a member region or another
// gateway behind the split proxy writes its own, naming its internal
// workers, and only this router's (under debug.decision_header) may reach
// the client.
func isFramingOrOwnHeader(k []byte) bool {
	// The first byte tells most names from both prefixes without a call.
	if len(k) > len("Access-Control-") && k[0]|0x20 == 'a' && eqFold(k[:len("Access-Control-")], "Access-Control-") {
		// The router alone answers CORS (--cors-allow-origins): vLLM and
		// SGLang answer any Origin with Access-Control-Allow-Origin: *,
		// which let every page read the answers of a router with CORS off.
		return true
	}
	if len(k) > len("X-Infera-") && k[0]|0x20 == 'x' && eqFold(k[:len("X-Infera-")], "X-Infera-") {
		switch r := k[len("X-Infera-"):]; len(r) {
		case 4:
			return eqFold(r, "Tier")
		case 5:
			return eqFold(r, "Route")
		case 6:
			return eqFold(r, "Worker")
		case 8:
			return eqFold(r, "Upstream")
		case 13:
			return eqFold(r, "Prefill-Route")
		case 14:
			return eqFold(r, "Prefill-Worker")
		}
		return false
	}
	switch len(k) {
	case 4:
		return eqFold(k, "Date")
	case 6:
		return eqFold(k, "Server")
	case 7:
		return eqFold(k, "Alt-Svc")
	case 10:
		return eqFold(k, "Request-Id") || eqFold(k, "Set-Cookie") // Anthropic's request id: the router's on /v1/messages
	case 12:
		return eqFold(k, "Content-Type") || eqFold(k, hdrRequestID) // the router sets the request id
	case 14:
		return eqFold(k, "Content-Length")
	case 25:
		return eqFold(k, "Strict-Transport-Security")
	}
	return false
}

// isSecretHeader reports headers that carry credentials: never logged, and
// never forwarded when the router consumed them.
func isSecretHeader(k []byte) bool {
	switch len(k) {
	case 9:
		return eqFold(k, "x-api-key")
	case 13:
		return eqFold(k, "Authorization")
	case 19:
		return eqFold(k, "Proxy-Authorization")
	}
	return false
}

func eqFold(b []byte, s string) bool { return h1.EqFold(b, s) }

// droppedResponseHeader reports an engine's response header the client never
// gets by its name: hop-by-hop, framing, or the router's own.
func droppedResponseHeader(k []byte) bool { return isHopHeader(k) || isFramingOrOwnHeader(k) }

// underscoreAlias reports whether k, a header name with an underscore in
// it, reads as a name the router treats specially once each '_' is taken
// for '-' (Content_Length, Transfer_Encoding, X_Forwarded_For): on a
// request, a name forwardClassOf does not keep; on a response
// (response), a name droppedResponseHeader drops. Such a name is dropped
// where the name it reads as would be, in either direction: a server that
// takes '_' for '-' (CGI and WSGI environments name both
// HTTP_CONTENT_LENGTH; nginx drops such headers by default for this,
// underscores_in_headers) would read it as that header, a second
// Content-Length or a client-written X-Forwarded-For behind the router's
// back. Other names with underscores pass. Past 64 bytes only the first 64
// are read: no special name is that long, and the Access-Control- prefix
// is in them.
func underscoreAlias(k []byte, response bool) bool {
	if bytes.IndexByte(k, '_') < 0 {
		return false
	}
	var b [64]byte
	n := copy(b[:], k)
	for i, c := range b[:n] {
		if c == '_' {
			b[i] = '-'
		}
	}
	if response {
		return droppedResponseHeader(b[:n])
	}
	return forwardClassOf(b[:n]) != fwdKeep
}

// appendForwardHeaders appends the client's request headers that go to the
// engine, as "Name: value\r\n" lines. Left out: hop-by-hop headers and the
// headers the client's Connection header names; Host, Content-Length and
// Expect (the transport writes its own framing; the body is already read);
// the router's own x-worker-instance-id / x-prefill-instance-id; and the
// client's credentials when the router consumed them (stripAuth). A body
// the router wrote itself (a converted protocol: jsonBody) goes as JSON,
// whatever type the client's had. X-Forwarded-For goes as one line, with
// peer, the address the request came from, appended
// (appendXForwardedFor).
func appendForwardHeaders(dst []byte, h *fasthttp.RequestHeader, peer []byte, stripAuth, jsonBody bool) []byte {
	if jsonBody {
		dst = append(dst, "Content-Type: application/json\r\n"...)
	}
	start := len(dst)
	dst, xff, conn := appendForwardLines(dst, h, nil, stripAuth, jsonBody)
	if conn {
		// A Connection line names headers that may come before it: again,
		// with every Connection line's list (RFC 9110 reads them as one;
		// Peek gave the first only, and a header the second named reached
		// the engine). The lines All gave are the ones PeekAll gives,
		// fasthttp's "close" it keeps aside included.
		conns := h.PeekAll("Connection")
		dst, xff, _ = appendForwardLines(dst[:start], h, conns, stripAuth, jsonBody)
		if xff && namedInAny(conns, []byte(fasthttp.HeaderXForwardedFor)) {
			xff = false // hop-by-hop by the client's word: the engine gets the peer alone
		}
	}
	return appendXForwardedFor(dst, h, xff, peer)
}

// appendForwardLines appends the header lines appendForwardHeaders
// forwards, leaving out those conns (the Connection lines' values) name.
// xff: the client sent X-Forwarded-For; conn: it sent a Connection line.
func appendForwardLines(dst []byte, h *fasthttp.RequestHeader, conns [][]byte, stripAuth, jsonBody bool) (_ []byte, xff, conn bool) {
	for k, v := range h.All() {
		switch forwardClass(k) {
		case fwdXFF:
			xff = true
			continue
		case fwdConnection:
			conn = true
			continue
		case fwdDrop:
			continue
		case fwdContentType:
			if jsonBody {
				continue
			}
		case fwdSecret:
			if stripAuth {
				continue
			}
		}
		if namedInAny(conns, k) || !validHeaderValue(v) || !validHeaderName(k) {
			continue
		}
		dst = append(dst, k...)
		dst = append(dst, ": "...)
		dst = append(dst, v...)
		dst = append(dst, "\r\n"...)
	}
	return dst, xff, conn
}

// What appendForwardLines does with a request header (forwardClass).
const (
	fwdKeep        = iota
	fwdDrop        // hop-by-hop, framing, or the router's own
	fwdConnection  // Connection: hop-by-hop, and it names others
	fwdXFF         // X-Forwarded-For: joined with the peer's address
	fwdContentType // dropped when the router wrote the body
	fwdSecret      // credentials: dropped when the router consumed them
)

// forwardClass sorts a request header name for appendForwardLines. A name
// that reads as one of the names below once '_' is taken for '-'
// (Transfer_Encoding, X_Forwarded_For, x_api_key) is dropped
// (underscoreAlias).
func forwardClass(k []byte) int {
	c := forwardClassOf(k)
	if c == fwdKeep && underscoreAlias(k, false) {
		return fwdDrop
	}
	return c
}

// forwardClassOf sorts a request header name by its length first: one
// comparison or two per header, not one per rule. The names are
// isHopHeader's, isSecretHeader's and the router's own.
func forwardClassOf(k []byte) int {
	switch len(k) {
	case 2:
		if eqFold(k, "TE") {
			return fwdDrop
		}
	case 4:
		if eqFold(k, "Host") {
			return fwdDrop
		}
	case 6:
		if eqFold(k, "Expect") {
			return fwdDrop
		}
	case 7:
		if eqFold(k, "Upgrade") || eqFold(k, "Trailer") {
			return fwdDrop
		}
	case 9:
		if eqFold(k, "x-api-key") {
			return fwdSecret
		}
	case 10:
		if eqFold(k, "Connection") {
			return fwdConnection
		}
		if eqFold(k, "Keep-Alive") {
			return fwdDrop
		}
	case 12:
		if eqFold(k, "Content-Type") {
			return fwdContentType
		}
		if eqFold(k, hdrRequestID) { // the router's request id follows
			return fwdDrop
		}
	case 13:
		if eqFold(k, "Authorization") {
			return fwdSecret
		}
	case 14:
		if eqFold(k, "Content-Length") {
			return fwdDrop
		}
	case 15:
		if eqFold(k, fasthttp.HeaderXForwardedFor) {
			return fwdXFF
		}
	case 16:
		if eqFold(k, "Proxy-Connection") {
			return fwdDrop
		}
	case 17:
		if eqFold(k, "Transfer-Encoding") {
			return fwdDrop
		}
	case 18:
		if eqFold(k, "Proxy-Authenticate") {
			return fwdDrop
		}
	case 19:
		if eqFold(k, "Proxy-Authorization") {
			return fwdDrop
		}
	case 20:
		if eqFold(k, hdrWorkerID) {
			return fwdDrop
		}
	case 21:
		if eqFold(k, hdrPrefillID) {
			return fwdDrop
		}
	}
	return fwdKeep
}

// appendXForwardedFor appends the X-Forwarded-For line the engine gets:
// the client's lines (when xff) joined as one list (RFC 9110 section 5.3),
// then peer, the text of the address the router received the request
// from (peerText), as
// nginx's $proxy_add_x_forwarded_for, Envoy and Go's
// httputil.ReverseProxy write it. An engine or router that trusts this one
// (uvicorn's --forwarded-allow-ips, --trusted-proxies) so finds the
// client in the rightmost address, which the client cannot write. Empty
// lines and lines with control bytes are left out; no line at all when
// nothing is left (a connection that is not TCP, without the header).
func appendXForwardedFor(dst []byte, h *fasthttp.RequestHeader, xff bool, peer []byte) []byte {
	start := len(dst)
	dst = append(dst, fasthttp.HeaderXForwardedFor+": "...)
	n := len(dst)
	if xff {
		for k, v := range h.All() {
			if !eqFold(k, fasthttp.HeaderXForwardedFor) {
				continue
			}
			if v = h1.TrimOWS(v); len(v) == 0 || !validHeaderValue(v) {
				continue
			}
			if len(dst) > n {
				dst = append(dst, ", "...)
			}
			dst = append(dst, v...)
		}
	}
	if len(peer) > 0 {
		if len(dst) > n {
			dst = append(dst, ", "...)
		}
		dst = append(dst, peer...)
	}
	if len(dst) == n {
		return dst[:start]
	}
	return append(dst, "\r\n"...)
}

// namedInAny reports whether k is named in one of the values vs.
func namedInAny(vs [][]byte, k []byte) bool {
	for _, v := range vs {
		if namedIn(v, k) {
			return true
		}
	}
	return false
}

// namedIn reports whether k is one of the comma-separated tokens of v.
func namedIn(v, k []byte) bool {
	for len(v) > 0 {
		i := 0
		for i < len(v) && v[i] != ',' {
			i++
		}
		if h1.EqFoldBytes(h1.TrimOWS(v[:i]), k) {
			return true
		}
		if i == len(v) {
			break
		}
		v = v[i+1:]
	}
	return false
}

// validHeaderValue refuses control characters (fasthttp already refuses
// bare CR/LF; this keeps NUL and friends from reaching engines).
// validHeaderName reports whether k is an RFC 9110 token: what an engine's
// HTTP parser takes as a field name (fasthttp's server lets some others
// through, such as names with spaces).
func validHeaderName(k []byte) bool { return h1.ValidName(k) }

// relayableHeader reports whether an engine's response header may reach
// the client: a name that is a token and a value without control bytes.
// Others are dropped, not relayed: HTTP clients that check field names
// (Go's net/http, h11 under httpx) fail the whole answer on one.
func relayableHeader(k, v []byte) bool { return validHeaderName(k) && validHeaderValue(v) }

func validHeaderValue(v []byte) bool { return h1.ValidValue(v) }
