package proxy

import (
	"bufio"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/infera/infera/internal/certs"
	"github.com/infera/infera/internal/testsrv"
	"github.com/valyala/fasthttp"
)

// tlsRouter starts a router serving TLS with a throwaway CA's certificate
// and returns it with a client configuration that trusts that CA.
func tlsRouter(t *testing.T, f func(*Options), urls ...string) (*testRouter, *tls.Config) {
	t.Helper()
	c := testsrv.GenCerts(t)
	r, err := certs.Load(c.ServerCert, c.ServerKey)
	if err != nil {
		t.Fatal(err)
	}
	pool := c.Pool(t)
	flags := defaultFlags()
	flags.HeaderTimeout = 500 * time.Millisecond
	tr := startRouterWith(t, flags, nil, func(o *Options) {
		o.TLS = r.Config()
		if f != nil {
			f(o)
		}
	}, urls...)
	tr.url = strings.Replace(tr.url, "http://", "https://", 1)
	return tr, &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"}
}

// --tls-cert-file: the front door speaks HTTPS (TLS 1.2 and up, HTTP/1.1),
// answers and streams as over plain HTTP, and refuses what is not a TLS
// client without stopping: an old TLS version, plain HTTP, a client that
// never says hello (cut at --header-timeout).
func TestTheFrontDoorServesTLS(t *testing.T) {
	sse := &sseUpstream{n: 3}
	up := startUpstream(t, func(ctx *fasthttp.RequestCtx) {
		if strings.Contains(string(ctx.PostBody()), `"stream":true`) {
			sse.handler(ctx)
			return
		}
		okHandler(ctx)
	})
	r, cc := tlsRouter(t, nil, up.url)
	alpn := cc.Clone()
	alpn.NextProtos = []string{"h2", "http/1.1"} // the router speaks HTTP/1.1 only
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: alpn}, Timeout: 10 * time.Second}
	post := func() {
		t.Helper()
		for _, body := range []string{chatBody, strings.Replace(chatBody, `"max_tokens"`, `"stream":true,"max_tokens"`, 1)} {
			resp, err := client.Post(r.url+"/v1/chat/completions", "application/json", strings.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 || resp.TLS == nil || resp.TLS.Version < tls.VersionTLS12 || resp.TLS.NegotiatedProtocol != "http/1.1" {
				t.Fatalf("%d %+v %s", resp.StatusCode, resp.TLS, b)
			}
			if strings.Contains(body, "stream") != strings.HasSuffix(string(b), "data: [DONE]\n\n") {
				t.Fatalf("answer %q", b)
			}
		}
	}
	post()

	addr := strings.TrimPrefix(r.url, "https://")
	old := cc.Clone()
	old.MaxVersion = tls.VersionTLS11
	if c, err := tls.Dial("tcp", addr, old); err == nil {
		c.Close()
		t.Fatal("a TLS 1.1 handshake succeeded")
	}
	plain, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	plain.Write([]byte("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}"))
	plain.SetReadDeadline(time.Now().Add(5 * time.Second))
	if line, _ := bufio.NewReader(plain).ReadString('\n'); strings.HasPrefix(line, "HTTP/") {
		t.Fatalf("plain HTTP on the TLS port was answered: %q", line)
	}
	plain.Close()
	silent, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	silent.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := silent.Read(make([]byte, 1)); err == nil || time.Since(start) > 3*time.Second {
		t.Fatalf("a client that never says hello: %v after %v", err, time.Since(start))
	}
	silent.Close()
	post() // still serving
}

// A TLS client that leaves while the engine has not answered yet: its
// close_notify arrives as data before its FIN, so a peek would see a
// client with something to say. The watchdog reads the socket's TCP
// state instead and the engine's request is cancelled (its connection
// closed) well before the engine would have answered.
func TestATLSClientLeavingBeforeTheFirstByteCancelsTheEngineRequest(t *testing.T) {
	closed := make(chan time.Duration, 1)
	got := make(chan struct{}, 1)
	eng := startRaw(t, func(n int, req string, c net.Conn) {
		got <- struct{}{}
		start := time.Now()
		c.SetReadDeadline(time.Now().Add(8 * time.Second))
		io.Copy(io.Discard, c) // until the router closes the connection (or 8 s)
		closed <- time.Since(start)
	})
	r, cc := tlsRouter(t, nil, eng.url)
	c, err := tls.Dial("tcp", strings.TrimPrefix(r.url, "https://"), cc)
	if err != nil {
		t.Fatal(err)
	}
	c.Write([]byte("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
		strconv.Itoa(len(chatBody)) + "\r\n\r\n" + chatBody))
	select {
	case <-got: // the request reached the engine
	case <-time.After(10 * time.Second):
		t.Fatal("the request never reached the engine")
	}
	c.Close() // close_notify, then FIN
	select {
	case d := <-closed:
		if d > 3*time.Second {
			t.Fatalf("the engine's request was cancelled only after %v", d)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the engine never saw its request end")
	}
}
