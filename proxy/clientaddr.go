package proxy

import (
	"net"
	"net/netip"

	"github.com/infera/infera/internal/lockout"
	"github.com/valyala/fasthttp"
)

// A client's address is its TCP peer's, unless the peer is one of
// --trusted-proxies (internal/realip): then it is the rightmost address of
// the request's X-Forwarded-For that is not itself trusted. The wrong-key
// lockout counts it, the access log reports it, and the Responses
// affinity table keeps a client's ids under it.

// clientIP is the client's address (unmapped; invalid on a connection
// that is not TCP).
func (s *Server) clientIP(ctx *fasthttp.RequestCtx) netip.Addr {
	a, _ := netip.AddrFromSlice(ctx.RemoteIP())
	if s.trusted == nil {
		return a.Unmap()
	}
	return s.trusted.Client(a, ctx.Request.Header.PeekAll(fasthttp.HeaderXForwardedFor))
}

// peerIP is the TCP peer's address, unmapped (invalid on a connection
// that is not TCP): the address the router appends to X-Forwarded-For.
func peerIP(ctx *fasthttp.RequestCtx) netip.Addr {
	if t, ok := ctx.RemoteAddr().(*net.TCPAddr); ok {
		a, _ := netip.AddrFromSlice(t.IP)
		return a.Unmap()
	}
	return netip.Addr{}
}

// peerText is the text of peerIP: the connection's, formatted when it was
// accepted (clientConn.peer), or else appended to dst now. Empty when the
// connection is not TCP.
func peerText(dst []byte, ctx *fasthttp.RequestCtx) []byte {
	if c, ok := ctx.Conn().(*clientConn); ok {
		return c.peer[:c.npeer]
	}
	return appendPeerText(dst, peerIP(ctx))
}

// appendPeerText appends the text of a, unmapped and without a zone
// (nothing when a is invalid).
func appendPeerText(dst []byte, a netip.Addr) []byte {
	if !a.IsValid() {
		return dst
	}
	return a.Unmap().WithZone("").AppendTo(dst)
}

// lockoutKey is the address the wrong-key lockout counts the client as
// (lockout.Key: an IPv6 client's /64).
func (s *Server) lockoutKey(ctx *fasthttp.RequestCtx) netip.Addr {
	if s.trusted == nil {
		k, _ := lockout.KeyOf(ctx.RemoteAddr())
		return k
	}
	return lockout.Key(s.clientIP(ctx))
}
