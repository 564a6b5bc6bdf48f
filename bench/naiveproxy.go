package bench

import (
	"fmt"
	"net"

	"github.com/valyala/fasthttp"
)

// NaiveProxyCmd is `infera bench naive-proxy` (hidden): the reference that
// `infera bench proxy --naive` measures beside nginx and infera, the
// thinnest fasthttp reverse proxy there is. Its handler sends the client's
// request as is with HostClient.Do, the response body streamed, and
// copies the answer back (flushing each chunk, so SSE streams); nothing
// else: no parsing, routing, limits, timeouts or header hygiene. It shows
// how much of infera's cost per request is fasthttp's and Go's, not
// infera's own.
type NaiveProxyCmd struct {
	Listen   string `help:"Address to listen on (host:port)." required:""`
	Upstream string `help:"Upstream address (host:port)." required:""`
	Loops    int    `help:"Relay with this many epoll event loops instead of fasthttp (Linux): the floor of a Go proxy without a goroutine per connection." default:"0"`
	Lean     bool   `help:"Relay with one goroutine per connection and no HTTP library: the floor of the goroutine-per-connection model."`
	Server   bool   `name:"server-floor" help:"fasthttp's server in front of the lean relay's upstream side: what fasthttp's server costs by itself (answers are buffered, not streamed)."`
}

// Run implements the command.
func (c *NaiveProxyCmd) Run() error {
	switch {
	case c.Loops > 0:
		return epollProxy(c.Listen, c.Upstream, c.Loops)
	case c.Lean:
		return leanProxy(c.Listen, c.Upstream)
	case c.Server:
		ln, err := net.Listen("tcp", c.Listen)
		if err != nil {
			return fmt.Errorf("cannot listen on %s: %w", c.Listen, err)
		}
		return fasthttpFloor(c.Upstream).Serve(sockioListener{ln})
	}
	ln, err := net.Listen("tcp", c.Listen)
	if err != nil {
		return fmt.Errorf("cannot listen on %s: %w", c.Listen, err)
	}
	return naiveProxy(c.Upstream).Serve(ln)
}

func naiveProxy(upstream string) *fasthttp.Server {
	hc := &fasthttp.HostClient{Addr: upstream, MaxConns: 1 << 14, StreamResponseBody: true}
	return &fasthttp.Server{
		NoDefaultServerHeader: true,
		NoDefaultContentType:  true,
		Handler: func(ctx *fasthttp.RequestCtx) {
			resp := fasthttp.AcquireResponse()
			if err := hc.Do(&ctx.Request, resp); err != nil {
				fasthttp.ReleaseResponse(resp)
				ctx.Error("upstream failed", fasthttp.StatusBadGateway)
				return
			}
			resp.Header.CopyTo(&ctx.Response.Header)
			ctx.Response.SetBodyStream(&releasingBody{resp: resp}, resp.Header.ContentLength())
		},
	}
}

// releasingBody is an upstream body stream that returns its response to
// the pool once fasthttp has copied it (Close).
type releasingBody struct{ resp *fasthttp.Response }

func (b *releasingBody) Read(p []byte) (int, error) { return b.resp.BodyStream().Read(p) }

func (b *releasingBody) Close() error {
	fasthttp.ReleaseResponse(b.resp)
	return nil
}
