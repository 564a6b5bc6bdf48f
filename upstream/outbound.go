package upstream

import (
	"crypto/tls"
	"net"
	"time"

	"github.com/infera/infera/config"
	"github.com/valyala/fasthttp"
)

// ClientOptions configure the connection pool of one external upstream
// (a split proxy entry or a global scheduling member).
type ClientOptions struct {
	// MaxConns bounds connections; each live stream holds one. Default 4096.
	MaxConns int
	// ConnectTimeout bounds dialing. Default 3 s.
	ConnectTimeout time.Duration
	// Dial, when set, replaces the TCP dialer (a deadline-refreshing
	// connection for idle timeouts, an in-memory listener in tests).
	Dial fasthttp.DialFunc
}

// NewHostClient returns the keep-alive client for an external upstream,
// set up as the local workers' are (STYLE.md): ReadTimeout 0 (streams are
// bounded by the dispatch's own first-packet and idle timeouts),
// responses streamed when the caller sets StreamResponseBody per request,
// no path or header-name normalization, no retries of its own. Make one
// per upstream when a config is compiled; keep it while the address stays
// the same.
func NewHostClient(ep *Endpoint, o ClientOptions) *fasthttp.HostClient {
	if o.MaxConns <= 0 {
		o.MaxConns = 4096
	}
	if o.ConnectTimeout <= 0 {
		o.ConnectTimeout = 3 * time.Second
	}
	hc := &fasthttp.HostClient{
		Addr:                          ep.Addr,
		Name:                          "infera",
		IsTLS:                         ep.TLS,
		MaxConns:                      o.MaxConns,
		MaxConnWaitTimeout:            50 * time.Millisecond,
		MaxIdleConnDuration:           60 * time.Second,
		ReadTimeout:                   0,
		WriteTimeout:                  30 * time.Second,
		MaxResponseBodySize:           64 << 20,
		MaxIdemponentCallAttempts:     1,
		DisablePathNormalizing:        true,
		DisableHeaderNamesNormalizing: true,
		NoDefaultUserAgentHeader:      true,
		Dial:                          o.Dial,
	}
	if hc.Dial == nil {
		d := &net.Dialer{Timeout: o.ConnectTimeout, KeepAlive: 30 * time.Second}
		hc.Dial = func(addr string) (net.Conn, error) { return d.Dial("tcp", addr) }
	}
	if ep.TLS {
		h, _, err := net.SplitHostPort(ep.Addr)
		if err != nil {
			h = ep.Addr
		}
		hc.TLSConfig = &tls.Config{ServerName: h}
	}
	return hc
}

// forwardedHeaders are the client headers an external upstream receives;
// everything else (credentials, cookies, hop-by-hop headers, client
// addresses, the gateway's own routing headers) stays here.
var forwardedHeaders = [...]string{
	"Content-Type", "Accept", "User-Agent", "X-Request-Id",
	"OpenAI-Beta", "Anthropic-Version", "Anthropic-Beta",
}

// PrepareRequest fills out, a reset request, for an external
// OpenAI-compatible upstream: POST to the endpoint's prefix + path (the
// client's query string is dropped), Host the upstream's, the client's
// headers from a fixed list (Content-Type, Accept, User-Agent,
// X-Request-Id, OpenAI-Beta, Anthropic-Version, Anthropic-Beta) plus the
// extra names given (e.g. the session affinity header for a member
// gateway), "Authorization: Bearer <key>" when key is set (the client's
// Authorization never passes), HopHeader "1" when hop is true (global
// scheduling), and body. The client's Authorization, Cookie, API-key
// headers, Forwarded/X-Forwarded-*, and hop-by-hop headers never pass.
// It does not allocate once out's buffers have grown.
func PrepareRequest(out *fasthttp.Request, in *fasthttp.RequestHeader, ep *Endpoint, path, body []byte, key config.Secret, hop bool, extra ...string) {
	out.Header.SetMethod(fasthttp.MethodPost)
	var ub [256]byte
	out.Header.SetRequestURIBytes(ep.AppendPath(ub[:0], path))
	out.Header.SetHost(ep.Host)
	for _, h := range forwardedHeaders {
		if v := in.Peek(h); len(v) > 0 {
			out.Header.SetBytesV(h, v)
		}
	}
	for _, h := range extra {
		if isCredentialHeader(h) {
			continue
		}
		if v := in.Peek(h); len(v) > 0 {
			out.Header.SetBytesV(h, v)
		}
	}
	if key.IsSet() {
		var buf [512]byte
		out.Header.SetBytesV(fasthttp.HeaderAuthorization, key.AppendBearer(buf[:0]))
	}
	if hop {
		out.Header.Set(HopHeader, "1")
	}
	out.SetBodyRaw(body)
}

// isCredentialHeader reports the headers extra may not name.
func isCredentialHeader(h string) bool {
	for _, c := range [...]string{"Authorization", "Proxy-Authorization", "Cookie", "X-Api-Key", "Api-Key",
		"Connection", "Keep-Alive", "Transfer-Encoding", "Upgrade", "Te", "Trailer", "Host", "Content-Length",
		"Forwarded", "X-Forwarded-For", HopHeader} {
		if len(c) == len(h) && equalFold(c, []byte(h)) {
			return true
		}
	}
	return false
}
