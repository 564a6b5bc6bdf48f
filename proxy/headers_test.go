package proxy

import (
	"bufio"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/infera/infera/internal/h1"
	"github.com/valyala/fasthttp"
)

// appendForwardHeadersOneRuleAtATime is appendForwardHeaders as one test
// per rule and header, with every Connection line's list read first: the
// reference the classified single pass must agree with.
func appendForwardHeadersOneRuleAtATime(dst []byte, h *fasthttp.RequestHeader, peer netip.Addr, stripAuth, jsonBody bool) []byte {
	conns := h.PeekAll("Connection")
	if jsonBody {
		dst = append(dst, "Content-Type: application/json\r\n"...)
	}
	xff := false
	for k, v := range h.All() {
		switch {
		case eqFold(k, fasthttp.HeaderXForwardedFor):
			xff = true
			continue
		case isHopHeader(k), eqFold(k, "Host"), eqFold(k, "Content-Length"), eqFold(k, "Expect"),
			eqFold(k, hdrWorkerID), eqFold(k, hdrPrefillID), eqFold(k, hdrRequestID):
			continue
		case jsonBody && eqFold(k, "Content-Type"):
			continue
		case stripAuth && isSecretHeader(k):
			continue
		case namedInAny(conns, k):
			continue
		}
		if !validHeaderValue(v) || !validHeaderName(k) {
			continue
		}
		dst = append(dst, k...)
		dst = append(dst, ": "...)
		dst = append(dst, v...)
		dst = append(dst, "\r\n"...)
	}
	if xff && namedInAny(conns, []byte(fasthttp.HeaderXForwardedFor)) {
		xff = false
	}
	// The X-Forwarded-For line, the peer's address formatted here.
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
	if peer.IsValid() {
		if len(dst) > n {
			dst = append(dst, ", "...)
		}
		dst = peer.Unmap().WithZone("").AppendTo(dst)
	}
	if len(dst) == n {
		return dst[:start]
	}
	return append(dst, "\r\n"...)
}

// TestTheForwardedHeadersAreThoseEachRuleLeaves: for requests with every
// kind of header the router drops or keeps (hop-by-hop ones, framing, its
// own, credentials, X-Forwarded-For, headers a Connection line names
// before or after it, "Connection: close"), the engine gets the lines the
// rules one at a time give, with and without a consumed key and a
// converted body, and with the peer's address (none, IPv4, IPv4-mapped,
// IPv6, with a zone) formatted as it always was.
func TestTheForwardedHeadersAreThoseEachRuleLeaves(t *testing.T) {
	lines := []string{
		"Content-Type: application/json",
		"User-Agent: test/1",
		"Accept: */*",
		"X-Custom: a",
		"Authorization: Bearer k",
		"X-Api-Key: k",
		"Proxy-Authorization: Basic x",
		"Te: trailers",
		"Upgrade: h2c",
		"Trailer: X-T",
		"Keep-Alive: timeout=5",
		"Proxy-Connection: keep-alive",
		"Expect: 100-continue",
		"X-Request-Id: rid-1",
		"X-Worker-Instance-Id: w0",
		"X-Prefill-Instance-Id: p0",
		"X-Forwarded-For: 10.0.0.1",
		"X-Forwarded-For: 10.0.0.2",
		"X-Session-Id: s1",
	}
	conns := []string{
		"",
		"Connection: close",
		"Connection: keep-alive",
		"Connection: X-Custom",
		"Connection: close, X-Custom",
		"Connection: X-Forwarded-For",
		"Connection: x-session-id, accept",
	}
	peers := []netip.Addr{{}, netip.MustParseAddr("192.0.2.7"), netip.MustParseAddr("::ffff:192.0.2.8"), netip.MustParseAddr("2001:db8::1"), netip.MustParseAddr("fe80::1%eth0")}
	n := 0
	for mask := 0; mask < 1<<len(lines); mask += 1 + mask/7 {
		for ci, conn := range conns {
			for _, connFirst := range []bool{false, true} {
				var sb strings.Builder
				sb.WriteString("POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nContent-Length: 2\r\n")
				if conn != "" && connFirst {
					sb.WriteString(conn + "\r\n")
				}
				for i, l := range lines {
					if mask&(1<<i) != 0 {
						sb.WriteString(l + "\r\n")
					}
				}
				if conn != "" && !connFirst {
					sb.WriteString(conn + "\r\n")
				}
				sb.WriteString("\r\n{}")
				var req fasthttp.Request
				if err := req.Read(bufio.NewReader(strings.NewReader(sb.String()))); err != nil {
					t.Fatal(err)
				}
				peer := peers[n%len(peers)]
				for _, stripAuth := range []bool{false, true} {
					for _, jsonBody := range []bool{false, true} {
						got := string(appendForwardHeaders([]byte("GET"), &req.Header, appendPeerText(nil, peer), stripAuth, jsonBody))
						want := string(appendForwardHeadersOneRuleAtATime([]byte("GET"), &req.Header, peer, stripAuth, jsonBody))
						if got != want {
							t.Fatalf("request\n%s\nstripAuth %v jsonBody %v: got\n%s\nwant\n%s", sb.String(), stripAuth, jsonBody, got, want)
						}
						n++
					}
				}
				_ = ci
			}
		}
	}
	if n < 1000 {
		t.Fatalf("only %d cases", n)
	}
	t.Log(fmt.Sprint(n, " cases"))
}
