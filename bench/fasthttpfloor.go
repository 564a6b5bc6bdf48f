package bench

import (
	"bytes"
	"net"
	"strconv"
	"sync"

	"github.com/infera/infera/internal/sockio"
	"github.com/valyala/fasthttp"
)

// fasthttpFloor is the third reference of `infera bench naive-proxy
// --server-floor`: fasthttp's server in front of the goroutine floor's
// upstream side (infera's socket calls, the floors' framing, a pool of
// keep-alive connections). The client side is fasthttp's, as in infera:
// set beside the goroutine floor it measures what fasthttp's server costs
// by itself. The handler reads the engine's whole answer and sets it as the
// body (a chunked one decoded): it does not stream.
func fasthttpFloor(upstream string) *fasthttp.Server {
	p := &floorPool{addr: upstream}
	return &fasthttp.Server{
		NoDefaultServerHeader: true,
		NoDefaultContentType:  true,
		StreamRequestBody:     true,
		Handler:               p.handle,
	}
}

type floorPool struct {
	addr string
	mu   sync.Mutex
	idle []*floorConn
}

type floorConn struct {
	c    net.Conn
	body []byte
	req  []byte
	resp []byte
	buf  []byte
}

func (p *floorPool) get() (*floorConn, error) {
	p.mu.Lock()
	if n := len(p.idle); n > 0 {
		c := p.idle[n-1]
		p.idle = p.idle[:n-1]
		p.mu.Unlock()
		return c, nil
	}
	p.mu.Unlock()
	nc, err := net.Dial("tcp", p.addr)
	if err != nil {
		return nil, err
	}
	return &floorConn{c: sockio.Wrap(nc), buf: make([]byte, 64<<10)}, nil
}

func (p *floorPool) put(c *floorConn) {
	p.mu.Lock()
	p.idle = append(p.idle, c)
	p.mu.Unlock()
}

func (p *floorPool) handle(ctx *fasthttp.RequestCtx) {
	c, err := p.get()
	if err != nil {
		ctx.Error("upstream failed", fasthttp.StatusBadGateway)
		return
	}
	// The body is read from the stream, as infera reads it (PostBody on a
	// streamed request would log a warning per request).
	body := c.body[:0]
	if rs := ctx.RequestBodyStream(); rs != nil {
		for {
			if len(body) == cap(body) {
				body = append(body, 0)[:len(body)]
			}
			n, err := rs.Read(body[len(body):cap(body)])
			body = body[:len(body)+n]
			if err != nil {
				break
			}
		}
	}
	c.body = body
	r := append(c.req[:0], ctx.Method()...)
	r = append(r, ' ')
	r = append(r, ctx.RequestURI()...)
	r = append(r, " HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: "...)
	r = strconv.AppendInt(r, int64(len(body)), 10)
	r = append(r, "\r\n\r\n"...)
	r = append(r, body...)
	c.req = r
	if aw, ok := c.c.(interface{ WriteAwaitReply([]byte) (int, error) }); ok {
		_, err = aw.WriteAwaitReply(r)
	} else {
		_, err = c.c.Write(r)
	}
	if err != nil {
		c.c.Close()
		ctx.Error("upstream failed", fasthttp.StatusBadGateway)
		return
	}
	var fr frame
	resp := c.resp[:0]
	for done := false; !done; {
		n, err := c.c.Read(c.buf)
		if err != nil {
			c.c.Close()
			ctx.Error("upstream failed", fasthttp.StatusBadGateway)
			return
		}
		resp = append(resp, c.buf[:n]...)
		var ok bool
		if done, ok = fr.scan(c.buf[:n]); !ok {
			c.c.Close()
			ctx.Error("upstream failed", fasthttp.StatusBadGateway)
			return
		}
	}
	c.resp = resp
	h := bytes.Index(resp, crlfcrlf)
	head, b := resp[:h], resp[h+4:]
	if len(head) > 12 {
		ctx.SetStatusCode(int(head[9]-'0')*100 + int(head[10]-'0')*10 + int(head[11]-'0'))
	}
	if i := indexFold(head, ctypeKey); i >= 0 {
		v := head[i+len(ctypeKey):]
		if j := bytes.IndexByte(v, '\r'); j >= 0 {
			v = v[:j]
		}
		ctx.Response.Header.SetContentTypeBytes(bytes.TrimSpace(v))
	}
	if fr.clen < 0 {
		b = dechunk(b)
	}
	ctx.SetBody(b)
	p.put(c)
}

var ctypeKey = []byte("\ncontent-type:")

// dechunk decodes a whole chunked body in place.
func dechunk(b []byte) []byte {
	out := b[:0]
	for len(b) > 0 {
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			break
		}
		line := b[:i]
		if j := bytes.IndexAny(line, ";\r"); j >= 0 {
			line = line[:j]
		}
		n := 0
		for _, ch := range bytes.TrimSpace(line) {
			switch {
			case ch >= '0' && ch <= '9':
				n = n<<4 | int(ch-'0')
			case ch|0x20 >= 'a' && ch|0x20 <= 'f':
				n = n<<4 | int(ch|0x20-'a'+10)
			default:
				return out
			}
		}
		if n == 0 || len(b)-i-1 < n {
			break
		}
		out = append(out, b[i+1:i+1+n]...)
		b = b[i+1+n:]
		b = bytes.TrimPrefix(b, []byte("\r\n"))
	}
	return out
}

// sockioListener hands fasthttp connections that use infera's socket calls,
// as infera's own listener does.
type sockioListener struct{ net.Listener }

func (l sockioListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return sockio.Wrap(c), nil
}
