package proxy

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/infera/infera/config"
	"github.com/infera/infera/fleet"
	"github.com/valyala/fasthttp"
)

// blackholeAddr returns a loopback address whose listen queue is full: a
// connect to it hangs (SYNs are dropped) until the dialer gives up.
func blackholeAddr(t *testing.T) string {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Listen(fd, 0); err != nil {
		t.Fatal(err)
	}
	sa, _ := syscall.Getsockname(fd)
	addr := fmt.Sprintf("127.0.0.1:%d", sa.(*syscall.SockaddrInet4).Port)
	// Fill the accept queue (never accepted).
	for i := 0; i < 2; i++ {
		c, err := net.DialTimeout("tcp4", addr, 300*time.Millisecond)
		if err != nil {
			break
		}
		t.Cleanup(func() { c.Close() })
	}
	start := time.Now()
	if c, err := net.DialTimeout("tcp4", addr, 300*time.Millisecond); err == nil {
		c.Close()
		t.Fatalf("the listen queue is not full (connected after %v)", time.Since(start))
	}
	return addr
}

// A worker's 5xx answer is stashed and its connection goes back to the
// pool while the request's retry waits (here: a connect to the next worker
// that hangs). Another request takes the pooled connection; when the first
// client leaves, the liveness watchdog must abort only the first request's
// own attempt, never the connection the other request now streams on.
func TestAClientLeavingDuringARetryDoesNotCutAnotherRequestsStream(t *testing.T) {
	var answeredA atomic.Bool
	w1 := startRaw(t, func(n int, req string, c net.Conn) {
		if strings.Contains(req, "victimA") {
			body := `{"error":{"message":"overloaded"}}`
			c.Write([]byte("HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body))
			answeredA.Store(true)
			return
		}
		// B: a slow SSE stream.
		c.Write([]byte("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"))
		for i := 0; i < 15; i++ {
			ev := fmt.Sprintf("data: {\"i\":%d}\n\n", i)
			if _, err := fmt.Fprintf(c, "%x\r\n%s\r\n", len(ev), ev); err != nil {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
		ev := "data: [DONE]\n\n"
		fmt.Fprintf(c, "%x\r\n%s\r\n0\r\n\r\n", len(ev), ev)
	})
	w0 := blackholeAddr(t)
	f := defaultFlags()
	f.ConnectTimeout = 3 * time.Second
	f.RequestMaxRetries = 1
	r := startPDRouter(t, f, nil, []fleet.Record{
		{ID: "w0", URL: "http://" + w0, Models: []string{"m"}},
		{ID: "w1", URL: w1.url, Models: []string{"m", "b"}},
	}...)
	// A's first attempt goes to w1: round-robin takes the worker picked
	// least recently, and w0 counts as picked last.
	r.fl.View().ByID([]byte("w0")).Load.Picked.Store(1 << 62)
	addr := strings.TrimPrefix(r.url, "http://")

	// Client A: goes to w1 first (round-robin), gets 503 stashed, retries
	// to w0 whose connect hangs.
	bodyA := `{"model":"m","messages":[{"role":"user","content":"victimA"}]}`
	ca, err := net.Dial("tcp4", addr)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(ca, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(bodyA), bodyA)
	waitFor(t, answeredA.Load, "w1 answered A")
	time.Sleep(50 * time.Millisecond)

	// Client B: a stream on w1, on the pooled connection A used.
	bodyB := `{"model":"b","stream":true,"messages":[{"role":"user","content":"streamB"}]}`
	cb, err := net.Dial("tcp4", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer cb.Close()
	fmt.Fprintf(cb, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", len(bodyB), bodyB)
	cb.SetReadDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(cb)
	line, _ := br.ReadString('\n')
	if !strings.Contains(line, "200") {
		t.Fatalf("B: %q", line)
	}
	time.Sleep(300 * time.Millisecond) // B is streaming
	ca.Close()                         // client A leaves
	rest, _ := io.ReadAll(br)
	if w1.conns.Load() != 1 {
		t.Logf("note: w1 saw %d connections (B did not reuse A's connection)", w1.conns.Load())
	}
	if strings.Contains(string(rest), "client closed") || !strings.Contains(string(rest), `"i":14`) {
		t.Fatalf("B's stream was cut when client A left:\n%s", rest)
	}
}

// The same, when nobody took the pooled connection yet: a client leaving
// during its retry must not close the idle connection, whose descriptor
// number the next client's socket would reuse, so that the next request to
// reach the worker would get 499 "client closed request".
func TestAClientLeavingDuringARetryDoesNotPoisonAnIdleConnection(t *testing.T) {
	var answeredA atomic.Bool
	w1 := startRaw(t, func(n int, req string, c net.Conn) {
		if strings.Contains(req, "victimA") {
			body := `{"error":{"message":"overloaded"}}`
			c.Write([]byte("HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body))
			answeredA.Store(true)
			return
		}
		c.Write([]byte(jsonAnswer(okJSON)))
	})
	w0 := blackholeAddr(t)
	f := defaultFlags()
	f.ConnectTimeout = 3 * time.Second
	r := startPDRouter(t, f, nil, []fleet.Record{
		{ID: "w0", URL: "http://" + w0, Models: []string{"m"}},
		{ID: "w1", URL: w1.url, Models: []string{"m", "b"}},
	}...)
	// A's first attempt goes to w1: round-robin takes the worker picked
	// least recently, and w0 counts as picked last.
	r.fl.View().ByID([]byte("w0")).Load.Picked.Store(1 << 62)
	addr := strings.TrimPrefix(r.url, "http://")
	bodyA := `{"model":"m","messages":[{"role":"user","content":"victimA"}]}`
	ca, err := net.Dial("tcp4", addr)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(ca, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(bodyA), bodyA)
	waitFor(t, answeredA.Load, "w1 answered A")
	time.Sleep(50 * time.Millisecond)
	ca.Close()                         // client A leaves while its retry connects
	time.Sleep(500 * time.Millisecond) // the watchdog has run
	bodyC := `{"model":"b","messages":[{"role":"user","content":"innocentC"}]}`
	resp := rawClient(t, r.url, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: "+strconv.Itoa(len(bodyC))+"\r\nConnection: close\r\n\r\n"+bodyC, 3*time.Second)
	if !strings.HasPrefix(resp, "HTTP/1.1 200") {
		t.Fatalf("an unrelated client C got:\n%s", resp)
	}
}

// A client that pipelines requests and never reads the answers is
// disconnected after --client-write-timeout: answers written whole (here
// /metrics, which needs no key) are bounded too, not only relayed streams.
func TestAClientThatNeverReadsIsDisconnected(t *testing.T) {
	up := startUpstream(t, okHandler)
	f := defaultFlags()
	f.HeaderTimeout = time.Second
	f.ClientIdleTimeout = time.Second
	f.ClientWriteTimeout = time.Second
	r := startRouter(t, f, nil, up.url)
	c, err := net.Dial("tcp4", strings.TrimPrefix(r.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.(*net.TCPConn).SetReadBuffer(4096)
	req := []byte("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
	c.SetWriteDeadline(time.Now().Add(3 * time.Second))
	for i := 0; i < 2000; i++ {
		if _, err := c.Write(req); err != nil {
			break
		}
	}
	deadline := time.Now().Add(8 * time.Second)
	for r.srv.OpenConnections() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d client connection(s) still open 8 s after the client stopped reading (every client timeout is 1 s)", r.srv.OpenConnections())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// An HTTP/1.0 client cannot read a chunked answer, and streams and relayed
// bodies go out chunked: its inference request gets 426 in the right shape
// and the connection closes; its GET /health is still answered.
func TestAnHTTP10InferenceRequestGets426(t *testing.T) {
	up := startUpstream(t, okHandler)
	r := startRouter(t, nil, nil, up.url)
	for _, path := range []string{"/v1/chat/completions", "/v1/messages"} {
		req := "POST " + path + " HTTP/1.0\r\nHost: x\r\nContent-Length: " + strconv.Itoa(len(chatBody)) + "\r\n\r\n" + chatBody
		resp := rawClient(t, r.url, req, 3*time.Second)
		if !strings.HasPrefix(resp, "HTTP/1.1 426") || !strings.Contains(resp, "need HTTP/1.1") {
			t.Fatalf("%s over HTTP/1.0: %q", path, resp)
		}
		if strings.Contains(path, "messages") != strings.Contains(resp, `"type":"error"`) {
			t.Fatalf("%s: the error is not in the path's shape: %q", path, resp)
		}
	}
	if resp := rawClient(t, r.url, "GET /health HTTP/1.0\r\nHost: x\r\n\r\n", 3*time.Second); !strings.HasPrefix(resp, "HTTP/1.1 200") {
		t.Fatalf("GET /health over HTTP/1.0: %q", resp)
	}
}

// A client header whose name is not an HTTP token (fasthttp's server takes
// "X Y") is not forwarded to the engine.
func TestAHeaderNameThatIsNotATokenIsNotForwarded(t *testing.T) {
	got := make(chan string, 1)
	up := startRaw(t, func(n int, req string, c net.Conn) {
		got <- req
		c.Write([]byte(jsonAnswer(okJSON)))
	})
	r := startRouter(t, nil, nil, up.url)
	req := "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX Y: z\r\nX-Ok: 1\r\nContent-Length: " + strconv.Itoa(len(chatBody)) + "\r\nConnection: close\r\n\r\n" + chatBody
	if resp := rawClient(t, r.url, req, 3*time.Second); !strings.HasPrefix(resp, "HTTP/1.1 200") {
		t.Fatalf("%q", resp)
	}
	head, _, _ := strings.Cut(<-got, "\r\n\r\n")
	if strings.Contains(head, "X Y") || !strings.Contains(head, "X-Ok: 1") {
		t.Fatalf("the engine got:\n%s", head)
	}
}

// A client that half-closes its side after sending its request (shutdown
// of writes) is taken as gone, as nginx takes it: the engine request is
// aborted. It used to be answered "HTTP/1.1 499 Unknown Status Code" with
// an empty body, a status no HTTP client knows; now nothing is written and
// the connection is closed.
func TestAHalfClosedClientGetsNoAnswerAndItsEngineRequestIsAborted(t *testing.T) {
	aborted := make(chan struct{}, 1)
	w := startRaw(t, func(n int, req string, c net.Conn) {
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, err := c.Read(make([]byte, 1)); err != nil { // never answers; waits for the router to close
			aborted <- struct{}{}
		}
	})
	r := startPDRouter(t, defaultFlags(), nil, fleet.Record{ID: "w", URL: w.url, Models: []string{"m"}})
	c, err := net.Dial("tcp4", strings.TrimPrefix(r.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	body := `{"model":"m","messages":[{"role":"user","content":"hi"}]}`
	fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	time.Sleep(100 * time.Millisecond) // dispatched
	c.(*net.TCPConn).CloseWrite()
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	got, err := io.ReadAll(c)
	if err != nil || len(got) != 0 {
		t.Fatalf("a half-closed client read %q (%v), want nothing and EOF", got, err)
	}
	select {
	case <-aborted:
	case <-time.After(5 * time.Second):
		t.Fatal("the engine request was not aborted")
	}
}

// An engine that breaks off a non-streamed answer before its end (a body
// shorter than its Content-Length, then a close; a chunk size that is not
// one) used to cost the client its connection with nothing written on the
// chat endpoint, and the bad chunk was blamed on reaching the worker
// ("upstream_unreachable"). Such an answer fits the relay buffer, so it is
// read whole before the head is committed: the client gets a 502 in
// OpenAI's shape, an invalid response in both cases (nothing of it reached
// the client, so it may be retried). An answer split over several writes
// still arrives whole.
func TestABrokenNonStreamedAnswerGetsA502InTheErrorShape(t *testing.T) {
	w := startRaw(t, func(n int, req string, c net.Conn) {
		switch {
		case strings.Contains(req, "short"):
			c.Write([]byte("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: " + strconv.Itoa(len(okJSON)+100) + "\r\n\r\n" + okJSON))
			time.Sleep(50 * time.Millisecond)
			c.Close()
		case strings.Contains(req, "badchunk"):
			c.Write([]byte("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffffffffffffff\r\nabc"))
			time.Sleep(50 * time.Millisecond)
			c.Close()
		default: // split: head and half the body, then the rest
			a := jsonAnswer(okJSON)
			c.Write([]byte(a[:len(a)-40]))
			time.Sleep(30 * time.Millisecond)
			c.Write([]byte(a[len(a)-40:]))
		}
	})
	f := defaultFlags()
	f.RequestMaxRetries = 0
	r := startPDRouter(t, f, nil, fleet.Record{ID: "w", URL: w.url, Models: []string{"m"}})
	ask := func(content string) string {
		body := `{"model":"m","messages":[{"role":"user","content":"` + content + `"}]}`
		return rawClient(t, r.url, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: "+strconv.Itoa(len(body))+"\r\nConnection: close\r\n\r\n"+body, 5*time.Second)
	}
	for _, c := range []struct{ content, code string }{{"short", "upstream_protocol_error"}, {"badchunk", "upstream_protocol_error"}} {
		got := ask(c.content)
		if !strings.HasPrefix(got, "HTTP/1.1 502") || !strings.Contains(got, `"code":"`+c.code+`"`) || !strings.Contains(got, `"error":{`) {
			t.Errorf("%s: got\n%s\nwant a 502 with code %s", c.content, got, c.code)
		}
	}
	if got := ask("split"); !strings.HasPrefix(got, "HTTP/1.1 200") || !strings.HasSuffix(got, okJSON) {
		t.Fatalf("an answer split over two writes:\n%s", got)
	}
}

// A non-streamed answer that the request's own total cap
// (timeouts.non_stream_total_s) cuts after its first bytes is a 504 that
// does not blame the worker, as when the relay was already sending it; read
// whole before its head, it had become a 502 worker fault.
func TestANonStreamedAnswerCutByTheTotalCapIsA504ThatSparesTheWorker(t *testing.T) {
	w := startRaw(t, func(n int, req string, c net.Conn) {
		a := jsonAnswer(okJSON)
		c.Write([]byte(a[:len(a)-20]))
		time.Sleep(time.Second)
		c.Write([]byte(a[len(a)-20:]))
	})
	f := defaultFlags()
	f.RequestMaxRetries = 0
	f.BreakerFailureThreshold = 1 // one worker fault opens it
	cfg := config.Default()
	cfg.Timeouts.NonStreamTotalSeconds = 0.3
	r := startPDRouter(t, f, cfg, fleet.Record{ID: "w", URL: w.url, Models: []string{"m"}})
	body := `{"model":"m","messages":[{"role":"user","content":"hi"}]}`
	got := rawClient(t, r.url, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: "+strconv.Itoa(len(body))+"\r\nConnection: close\r\n\r\n"+body, 5*time.Second)
	if !strings.HasPrefix(got, "HTTP/1.1 504") || !strings.Contains(got, `"code":"timeout"`) {
		t.Fatalf("got\n%.400s\nwant a 504 timeout", got)
	}
	if st := r.fl.Get("w").Breaker.State(); st != fleet.BreakerClosed {
		t.Fatalf("the request's own cap opened the worker's breaker (state %d)", st)
	}
}

// The last attempt of a request that fails (no retry left) does not leave
// its worker recorded in the prefix index as holding the prompt: the next
// request with that prompt was a prefix hit on the worker that had just
// failed it, and failed again, while load balancing sends it elsewhere.
// Both ways a last attempt fails: an error answer relayed to the client,
// and an invalid answer (the client gets the router's 502).
func TestALastFailedAttemptLeavesNoPrefixRecord(t *testing.T) {
	var aServed atomic.Int32
	answer500 := startUpstream(t, func(ctx *fasthttp.RequestCtx) {
		aServed.Add(1)
		ctx.SetStatusCode(500)
		ctx.SetBodyString(`{"error":{"message":"boom"}}`)
	})
	cut := startRaw(t, func(n int, req string, c net.Conn) {
		aServed.Add(1)
		c.Write([]byte("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n"))
		c.Close()
	})
	for _, a := range []string{answer500.url, cut.url} {
		b := startUpstream(t, okHandler)
		f := defaultFlags()
		f.RequestMaxRetries = 0
		f.BreakerFailureThreshold = 100
		cfg := config.Default()
		cfg.PrefixCache.Enabled = true
		cfg.Debug.DecisionHeader = true
		r := startRouter(t, f, cfg, a, b.url)
		testLastFailedAttempt(t, r, &aServed)
	}
}

func testLastFailedAttempt(t *testing.T, r *testRouter, aServed *atomic.Int32) {
	t.Helper()
	long := strings.Repeat("a shared system prompt that spans many blocks. ", 40)
	for i := 0; i < 6; i++ {
		body := `{"model":"m","max_tokens":2,"messages":[{"role":"user","content":"` + long + strconv.Itoa(i) + `"}]}`
		before := aServed.Load()
		resp, out := postWith(t, r.url+"/v1/chat/completions", body, nil)
		if aServed.Load() == before {
			if resp.StatusCode != 200 {
				t.Fatalf("b: %d %s", resp.StatusCode, out)
			}
			continue
		}
		// a failed it: the same prompt again goes by load balancing (b
		// was picked less recently), not to a as a prefix hit.
		resp, out = postWith(t, r.url+"/v1/chat/completions", body, nil)
		if resp.StatusCode != 200 {
			t.Fatalf("the prompt a failed went back to it (%s): %d %s", resp.Header.Get("X-Infera-Route"), resp.StatusCode, out)
		}
		return
	}
	t.Fatal("no request went to a")
}

// Pooled connections the engine closed while idle are closed by the pool
// in the background, the oldest included: LIFO reuse only ever looked at
// the newest, so after a burst every other one sat in CLOSE_WAIT, holding
// a descriptor, for as long as traffic stayed light or stopped.
func TestIdleConnectionsTheEngineClosedAreReaped(t *testing.T) {
	old := upReapEvery
	upReapEvery = 50 * time.Millisecond
	defer func() { upReapEvery = old }()
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(20 * time.Millisecond) // the burst overlaps: one connection each
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, okJSON)
	}))
	srv.Config.IdleTimeout = 100 * time.Millisecond // as engines close idle keep-alives
	srv.Start()
	defer srv.Close()
	r := startRouter(t, nil, nil, srv.URL)
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			post(t, r.url+"/v1/chat/completions", chatBody)
		}()
	}
	wg.Wait()
	p := r.fl.View().All[0].Client.(*httpPool)
	open := func() int { p.mu.Lock(); defer p.mu.Unlock(); return p.open }
	if n := open(); n < 2 {
		t.Fatalf("the burst opened %d connections", n)
	}
	for end := time.Now().Add(3 * time.Second); open() > 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("%d connections the engine closed are still held", open())
		}
	}
}

// A stream request whose engine answers plain JSON is relayed as that
// answer, not as an event stream: one that breaks off is an invalid
// response like any non-streamed answer (502 upstream_protocol_error,
// tried elsewhere), where the client got a 200 application/json body
// holding an SSE error event, and the engine's bytes were dropped; a whole
// one arrives as it was sent.
func TestAStreamRequestAnsweredWithPlainJSONIsNotRelayedAsEvents(t *testing.T) {
	w := startRaw(t, func(n int, req string, c net.Conn) {
		if strings.Contains(req, "short") {
			c.Write([]byte("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 500\r\n\r\n{\"id\":\"chatcmpl-1\","))
			time.Sleep(30 * time.Millisecond)
			c.Close()
			return
		}
		c.Write([]byte(jsonAnswer(okJSON)))
	})
	f := defaultFlags()
	f.RequestMaxRetries = 0
	r := startPDRouter(t, f, nil, fleet.Record{ID: "w", URL: w.url, Models: []string{"m"}})
	ask := func(content string) string {
		body := `{"model":"m","stream":true,"messages":[{"role":"user","content":"` + content + `"}]}`
		return rawClient(t, r.url, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: "+strconv.Itoa(len(body))+"\r\nConnection: close\r\n\r\n"+body, 5*time.Second)
	}
	if got := ask("short"); !strings.HasPrefix(got, "HTTP/1.1 502") || !strings.Contains(got, `"code":"upstream_protocol_error"`) {
		t.Fatalf("a broken JSON answer to a stream request:\n%s", got)
	}
	if got := ask("whole"); !strings.HasPrefix(got, "HTTP/1.1 200") || !strings.Contains(got, okJSON) || strings.Contains(got, "data:") {
		t.Fatalf("a whole JSON answer to a stream request:\n%s", got)
	}
}

// A request naming a later HTTP/1.x (none exists yet) is served as HTTP/1.1,
// as RFC 9110 section 6.2 asks, streamed too; HTTP/2.0 on an HTTP/1
// connection is not.
func TestALaterHTTP1MinorVersionIsServedAsHTTP11(t *testing.T) {
	up := startUpstream(t, func(ctx *fasthttp.RequestCtx) {
		if !bytes.Contains(ctx.PostBody(), []byte(`"stream":true`)) {
			okHandler(ctx)
			return
		}
		ctx.SetContentType("text/event-stream")
		ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
			w.WriteString("data: {\"choices\":[]}\n\ndata: [DONE]\n\n")
		})
	})
	r := startRouter(t, nil, nil, up.url)
	for _, body := range []string{chatBody, strings.Replace(chatBody, `{`, `{"stream":true,`, 1)} {
		req := "POST /v1/chat/completions HTTP/1.2\r\nHost: x\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body
		resp := rawClient(t, r.url, req, 3*time.Second)
		if !strings.HasPrefix(resp, "HTTP/1.1 200") || !strings.Contains(resp, "Connection: close") {
			t.Fatalf("over HTTP/1.2: %q", resp)
		}
		if strings.Contains(body, "stream") && !strings.HasSuffix(resp, "data: [DONE]\n\n") && !strings.HasSuffix(resp, "data: [DONE]\n\n\r\n0\r\n\r\n") {
			t.Fatalf("the stream over HTTP/1.2 is not whole: %q", resp)
		}
	}
	req := "POST /v1/chat/completions HTTP/2.0\r\nHost: x\r\nContent-Length: " + strconv.Itoa(len(chatBody)) + "\r\n\r\n" + chatBody
	if resp := rawClient(t, r.url, req, 3*time.Second); strings.HasPrefix(resp, "HTTP/1.1 200") {
		t.Fatalf("over HTTP/2.0: %q", resp)
	}
}

// A request line naming an HTTP major version other than 1 (HTTP/2.0 or
// HTTP/3.0 written in HTTP/1 syntax, HTTP/0.9) gets 505 HTTP Version Not
// Supported, in its path's shape, and the connection closes, on every
// endpoint, as Go's net/http and nginx answer it. fasthttp reads any
// HTTP/d.d as HTTP/1.0: /health, /v1/models and /metrics answered it 200
// and an inference request got 426 "need HTTP/1.1" with Upgrade: HTTP/1.1.
func TestAnHTTPMajorVersionOtherThanOneGets505(t *testing.T) {
	up := startUpstream(t, okHandler)
	r := startRouter(t, nil, nil, up.url)
	for _, proto := range []string{"HTTP/2.0", "HTTP/3.0", "HTTP/0.9"} {
		for _, path := range []string{"/health", "/v1/models", "/metrics", "/v1/chat/completions", "/v1/messages"} {
			req := "GET " + path + " " + proto + "\r\nHost: x\r\n\r\n"
			if strings.HasPrefix(path, "/v1/") && path != "/v1/models" {
				req = "POST " + path + " " + proto + "\r\nHost: x\r\nContent-Length: " + strconv.Itoa(len(chatBody)) + "\r\n\r\n" + chatBody
			}
			resp := rawClient(t, r.url, req, 3*time.Second)
			if !strings.HasPrefix(resp, "HTTP/1.1 505") || !strings.Contains(resp, "Connection: close") || !strings.Contains(resp, "HTTP version not supported") {
				t.Fatalf("%s over %s: %q", path, proto, resp)
			}
			if strings.Contains(path, "messages") != strings.Contains(resp, `"type":"error"`) {
				t.Fatalf("%s over %s: the error is not in the path's shape: %q", path, proto, resp)
			}
		}
	}
	// HTTP/1.0 and HTTP/1.1 are still served.
	for _, proto := range []string{"HTTP/1.0", "HTTP/1.1"} {
		if resp := rawClient(t, r.url, "GET /health "+proto+"\r\nHost: x\r\nConnection: close\r\n\r\n", 3*time.Second); !strings.HasPrefix(resp, "HTTP/1.1 200") {
			t.Fatalf("GET /health over %s: %q", proto, resp)
		}
	}
}

// A converted stream request (Messages, Responses) whose engine answers
// with one plain JSON chat completion gets that answer as its protocol's
// whole stream: the client asked for events and its SDK reads nothing
// else. The converter took the JSON for stream bytes, and the client got
// a 200 stream of message_start and an "ended before the answer was
// complete" error event, the engine's answer dropped.
func TestAConvertedStreamAnsweredWithPlainJSONIsStreamedWhole(t *testing.T) {
	const answer = `{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant",` +
		`"reasoning_content":"hmm","content":"hi","tool_calls":[{"id":"call_1","type":"function","function":{"name":"f","arguments":{"a":"b\n"}}}]},` +
		`"finish_reason":"tool_calls"}],"usage":{"prompt_tokens":7,"completion_tokens":5,"total_tokens":12}}`
	w := startRaw(t, func(n int, req string, c net.Conn) { c.Write([]byte(jsonAnswer(answer))) })
	f := defaultFlags()
	f.RequestMaxRetries = 0
	r := startPDRouter(t, f, nil, fleet.Record{ID: "w", URL: w.url, Models: []string{"m"}})
	ask := func(path, body string) string {
		return rawClient(t, r.url, "POST "+path+" HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: "+
			strconv.Itoa(len(body))+"\r\nConnection: close\r\n\r\n"+body, 5*time.Second)
	}
	tools := `"tools":[{"name":"f","input_schema":{"type":"object"}}]`
	got := ask("/v1/messages", `{"model":"m","max_tokens":9,"stream":true,`+tools+`,"messages":[{"role":"user","content":"x"}]}`)
	_, body, _ := strings.Cut(got, "\r\n\r\n")
	if !strings.HasPrefix(got, "HTTP/1.1 200") || !strings.Contains(strings.ToLower(got), "content-type: text/event-stream") {
		t.Fatalf("Messages:\n%s", got)
	}
	var types []string
	for _, ev := range sseEvents(t, body) {
		types = append(types, ev[0])
	}
	want := "message_start content_block_start ping content_block_delta content_block_stop " +
		"content_block_start content_block_delta content_block_stop content_block_start content_block_delta content_block_stop " +
		"message_delta message_stop"
	if strings.Join(types, " ") != want {
		t.Fatalf("Messages events:\n got %s\nwant %s\n%s", strings.Join(types, " "), want, body)
	}
	for _, s := range []string{`"thinking":"hmm"`, `"text":"hi"`, `"partial_json":"{\"a\":\"b\\n\"}"`, `"stop_reason":"tool_use"`, `"output_tokens":5`} {
		if !strings.Contains(body, s) {
			t.Fatalf("Messages stream lacks %s:\n%s", s, body)
		}
	}
	got = ask("/v1/responses", `{"model":"m","stream":true,"input":"x","tools":[{"type":"function","name":"f"}]}`)
	_, body, _ = strings.Cut(got, "\r\n\r\n")
	if !strings.HasPrefix(got, "HTTP/1.1 200") || strings.Contains(body, "event: error") ||
		!strings.Contains(body, "event: response.completed") || !strings.Contains(body, `"arguments":"{\"a\":\"b\\n\"}"`) ||
		!strings.Contains(body, `"delta":"hi"`) {
		t.Fatalf("Responses:\n%s", got)
	}
}
