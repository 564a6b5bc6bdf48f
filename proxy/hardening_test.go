package proxy

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/infera/infera/config"
	"github.com/infera/infera/fleet"
	"github.com/infera/infera/tokenizer"
	"github.com/valyala/fasthttp"
)

// Attacks on the router with real sockets: each test reproduces one way a
// hostile client or a faulty engine used to break it.

// rawUpstream is a TCP server that answers each request with whatever the
// test scripts, byte for byte; it records requests and counts connections.
type rawUpstream struct {
	ln    net.Listener
	url   string
	conns atomic.Int64
}

func startRaw(t *testing.T, answer func(n int, req string, c net.Conn)) *rawUpstream {
	t.Helper()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u := &rawUpstream{ln: ln, url: "http://" + ln.Addr().String()}
	var n atomic.Int64
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			u.conns.Add(1)
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				for {
					req, err := readRawRequest(br)
					if err != nil {
						return
					}
					answer(int(n.Add(1)), req, c)
				}
			}()
		}
	}()
	t.Cleanup(func() { ln.Close() })
	return u
}

// readRawRequest reads one request with a Content-Length body.
func readRawRequest(br *bufio.Reader) (string, error) {
	var sb strings.Builder
	cl := 0
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			return "", err
		}
		sb.WriteString(line)
		if line == "\r\n" {
			break
		}
		if k, v, ok := strings.Cut(line, ":"); ok && strings.EqualFold(k, "Content-Length") {
			cl, _ = strconv.Atoi(strings.TrimSpace(v))
		}
	}
	body := make([]byte, cl)
	if _, err := io.ReadFull(br, body); err != nil {
		return "", err
	}
	sb.Write(body)
	return sb.String(), nil
}

func jsonAnswer(body string) string {
	return "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body
}

// rawClient sends raw bytes to the router and returns what it answered
// before closing or the deadline.
func rawClient(t *testing.T, url, req string, wait time.Duration) string {
	t.Helper()
	c, err := net.Dial("tcp4", strings.TrimPrefix(url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	end := time.Now().Add(wait)
	c.SetDeadline(end)
	if _, err := c.Write([]byte(req)); err != nil {
		t.Fatal(err)
	}
	// Everything the router sends until it closes the connection or wait
	// ends; or, once what was read holds one whole response framed by its
	// length and a kept-alive connection then stays quiet for
	// rawClientQuiet, that (anything written after it in the same go
	// arrives meanwhile).
	var b []byte
	buf := make([]byte, 64<<10)
	for {
		n, err := c.Read(buf)
		b = append(b, buf[:n]...)
		if err != nil {
			return string(b)
		}
		if quiet := time.Now().Add(rawClientQuiet); wholeResponse(b) && quiet.Before(end) {
			c.SetReadDeadline(quiet)
		}
	}
}

// rawClientQuiet is how long rawClient waits for more bytes after a whole
// response.
const rawClientQuiet = 300 * time.Millisecond

// wholeResponse tells whether b begins with one whole HTTP response whose
// body is framed by Content-Length or chunked (or has none): one whose
// body ends with the connection is never whole.
func wholeResponse(b []byte) bool {
	resp, err := http.ReadResponse(bufio.NewReader(bytes.NewReader(b)), nil)
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	if resp.ContentLength < 0 && len(resp.TransferEncoding) == 0 && resp.StatusCode >= 200 && resp.StatusCode != 204 && resp.StatusCode != 304 {
		return false
	}
	_, err = io.Copy(io.Discard, resp.Body)
	return err == nil
}

// captureLogs routes slog to a buffer for the test.
func captureLogs(t *testing.T) *syncBuffer {
	t.Helper()
	var buf syncBuffer
	old := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})))
	t.Cleanup(func() { slog.SetDefault(old) })
	return &buf
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// 1. Running out of file descriptors must not stop the server: Accept
// errors are retried, and the server serves again once descriptors free up.
func TestAcceptSurvivesFileDescriptorExhaustion(t *testing.T) {
	up := startUpstream(t, okHandler)
	r := startRouter(t, nil, nil, up.url)
	post(t, r.url+"/v1/chat/completions", chatBody) // warm: upstream connection open
	var old syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &old); err != nil {
		t.Skip(err)
	}
	// Allow only a few more descriptors than are open now.
	open := countFDs(t)
	lim := old
	lim.Cur = uint64(open + 24)
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Skip(err)
	}
	restored := false
	restore := func() {
		if !restored {
			restored = true
			syscall.Setrlimit(syscall.RLIMIT_NOFILE, &old)
		}
	}
	defer restore()
	// Each idle client connection costs the process two descriptors (the
	// client's and the accepted one) until the limit is hit; accept then
	// fails with EMFILE while the kernel keeps queueing connections.
	var conns []net.Conn
	for i := 0; i < 40; i++ {
		c, err := net.DialTimeout("tcp4", strings.TrimPrefix(r.url, "http://"), time.Second)
		if err != nil {
			break
		}
		conns = append(conns, c)
	}
	time.Sleep(200 * time.Millisecond)
	for _, c := range conns {
		c.Close()
	}
	restore()
	// The server is still serving.
	deadline := time.Now().Add(5 * time.Second)
	for {
		resp, err := http.Post(r.url+"/v1/chat/completions", "application/json", strings.NewReader(chatBody))
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("server does not serve after descriptors freed up: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func countFDs(t *testing.T) int {
	t.Helper()
	ents, err := readDirNames("/proc/self/fd")
	if err != nil {
		t.Skip("no /proc/self/fd")
	}
	return len(ents)
}

// 1. --max-conns caps concurrent client connections; connections beyond it
// are refused at once, and slowloris clients are cut at --header-timeout.
func TestMaxConnsAndSlowHeadersAreBounded(t *testing.T) {
	up := startUpstream(t, okHandler)
	f := defaultFlags()
	f.MaxConns = 4
	f.HeaderTimeout = 300 * time.Millisecond
	r := startRouter(t, f, nil, up.url)
	addr := strings.TrimPrefix(r.url, "http://")
	// Four slowloris connections: half a header line each.
	var slow []net.Conn
	for i := 0; i < 4; i++ {
		c, err := net.Dial("tcp4", addr)
		if err != nil {
			t.Fatal(err)
		}
		c.Write([]byte("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Slow: "))
		slow = append(slow, c)
	}
	time.Sleep(100 * time.Millisecond)
	// A fifth connection is over the cap: answered 503 in OpenAI's error
	// shape (it was fasthttp's plain-text message) and closed.
	if got := rawClient(t, r.url, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n", 2*time.Second); !strings.HasPrefix(got, "HTTP/1.1 503") ||
		!strings.Contains(got, "application/json") || !strings.Contains(got, `{"error":{"message":"too many open connections`) || !strings.Contains(got, `"code":"too_many_connections"`) {
		t.Fatalf("connection over --max-conns: %q, want a 503 in the error shape", got)
	}
	// The slow clients are cut at the header timeout, freeing their slots.
	start := time.Now()
	for _, c := range slow {
		c.SetReadDeadline(time.Now().Add(3 * time.Second))
		io.ReadAll(c)
		c.Close()
	}
	if el := time.Since(start); el > 2*time.Second {
		t.Fatalf("slowloris connections held for %v; --header-timeout is 300ms", el)
	}
	if code, b := post(t, r.url+"/v1/chat/completions", chatBody); code != 200 {
		t.Fatalf("after the slow clients were cut: %d %s", code, b)
	}
	// Every closed connection gives its slot back.
	for i := 0; i < 20; i++ {
		if got := rawClient(t, r.url, "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", 2*time.Second); !strings.HasPrefix(got, "HTTP/1.1 200") {
			t.Fatalf("connection %d after the cap was reached once: %.200q", i, got)
		}
	}
}

// 2. A large announced Content-Length is not allocated: unauthenticated
// clients that announce 32 MB and send one byte hold almost no memory, and
// authenticated bodies are bounded by --max-inflight-body-bytes.
func TestAnnouncedBodiesAreNotAllocated(t *testing.T) {
	up := startUpstream(t, okHandler)
	f := defaultFlags()
	f.APIKey = "sk-test-key"
	f.MaxBodyBytes = 64 << 20
	f.HeaderTimeout = 2 * time.Second
	r := startRouter(t, f, nil, up.url)
	addr := strings.TrimPrefix(r.url, "http://")
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	var conns []net.Conn
	for i := 0; i < 10; i++ {
		c, err := net.Dial("tcp4", addr)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n{", 32<<20)
		conns = append(conns, c)
	}
	time.Sleep(300 * time.Millisecond)
	var during runtime.MemStats
	runtime.ReadMemStats(&during)
	for _, c := range conns {
		c.Close()
	}
	if grew := int64(during.HeapAlloc) - int64(before.HeapAlloc); grew > 8<<20 {
		t.Fatalf("10 connections announcing 32 MB grew the heap by %d MB", grew>>20)
	}
	// Unauthenticated with a body: 401 without reading it.
	got := rawClient(t, r.url, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}", 3*time.Second)
	if !strings.HasPrefix(got, "HTTP/1.1 401") {
		t.Fatalf("unauthenticated: %q", trunc(got))
	}
}

func TestInflightBodyBudgetRefusesWhenExhausted(t *testing.T) {
	up := startUpstream(t, okHandler)
	f := defaultFlags()
	f.MaxInflightBodyBytes = 256 << 10
	f.MaxBodyBytes = 8 << 20
	r := startRouter(t, f, nil, up.url)
	addr := strings.TrimPrefix(r.url, "http://")
	// Four authenticated clients each send 200 KB of a 1 MB body, then stall.
	var conns []net.Conn
	for i := 0; i < 4; i++ {
		c, err := net.Dial("tcp4", addr)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n", 1<<20)
		c.Write(bytes.Repeat([]byte(" "), 200<<10))
		conns = append(conns, c)
	}
	refused := 0
	for _, c := range conns {
		c.SetReadDeadline(time.Now().Add(2 * time.Second))
		b, _ := io.ReadAll(c)
		if bytes.Contains(b, []byte(" 503 ")) && bytes.Contains(b, []byte("overloaded")) {
			refused++
		}
		c.Close()
	}
	if refused == 0 {
		t.Fatal("no client was refused although their bodies exceed the in-flight budget")
	}
	if code, b := post(t, r.url+"/v1/chat/completions", chatBody); code != 200 {
		t.Fatalf("budget not released after the clients left: %d %s", code, b)
	}
	// The handlers of the clients that left return as their reads fail.
	waitFor(t, func() bool { return r.srv.bodies.used.Load() == 0 }, "body budget released")
}

// 3. Secrets never reach logs or error bodies, whatever the client sends.
func TestSecretsNeverLoggedOrEchoed(t *testing.T) {
	logs := captureLogs(t)
	const secret = "sk-SECRET-0123456789abcdef"
	up := startRaw(t, func(n int, req string, c net.Conn) {
		c.Write([]byte("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nbroken-extra-bytes")) // malformed for the router
	})
	f := defaultFlags()
	f.APIKey = secret
	r := startRouter(t, f, nil, up.url)
	cases := []string{
		"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + secret + "\r\nContent-Length: nope\r\n\r\n",
		"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + secret + "\r\nTransfer-Encoding: gzip\r\n\r\n",
		"GARBAGE /\x00 HTTP/9\r\nAuthorization: Bearer " + secret + "\r\n\r\n",
		"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + secret + "x\r\nContent-Length: 2\r\n\r\n{}",
		"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nx-api-key: " + secret + "\r\nContent-Length: 1\r\n\r\n{",
		"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + secret + "\r\nContent-Length: " + strconv.Itoa(len(chatBody)) + "\r\n\r\n" + chatBody,
	}
	for _, req := range cases {
		got := rawClient(t, r.url, req, 3*time.Second)
		if strings.Contains(got, secret) || strings.Contains(got, "SECRET") {
			t.Fatalf("response echoes the secret: %q", got)
		}
	}
	// Every request's state is released (its log lines written) before
	// the logs are read: a fixed sleep could read them too early on a
	// loaded machine and pass whatever they held.
	waitFor(t, func() bool { return r.srv.states.n.Load() == 0 }, "requests ended")
	if l := logs.String(); strings.Contains(l, "SECRET") {
		t.Fatalf("logs contain the secret:\n%s", l)
	}
}

// 5. Hop-by-hop headers (RFC 9110 7.6.1) and the headers the client's
// Connection header names (in any of its lines) never reach the engine; the same holds for the
// engine's response; the engine's Host is always its own.
func TestHopByHopHeadersStrippedBothWays(t *testing.T) {
	var got atomic.Pointer[string]
	up := startRaw(t, func(n int, req string, c net.Conn) {
		got.Store(&req)
		body := okJSON
		c.Write([]byte("HTTP/1.1 200 OK\r\nConnection: X-Engine-Private\r\nX-Engine-Private: 1\r\nKeep-Alive: timeout=5\r\nProxy-Authenticate: Basic\r\nTrailer: X-T\r\nX-Kept: yes\r\nContent-Type: application/json\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body))
	})
	r := startRouter(t, nil, nil, up.url)
	// Two Connection lines are one list (RFC 9110 5.3): the second's names go too.
	req := "POST /v1/chat/completions HTTP/1.1\r\nHost: client.example\r\nConnection: keep-alive, X-Client-Private\r\nX-Client-Private: 1\r\n" +
		"X-Client-Second: 2\r\nConnection: X-Client-Second\r\n" +
		"Keep-Alive: 300\r\nUpgrade: websocket\r\nTE: trailers\r\nTrailer: X-T\r\nProxy-Authorization: Basic Zm9vOmJhcg==\r\nProxy-Connection: keep-alive\r\n" +
		"X-Worker-Instance-Id: w9\r\nX-Forwarded-Keep: yes\r\nContent-Length: " + strconv.Itoa(len(chatBody)) + "\r\n\r\n" + chatBody
	resp := rawClient(t, r.url, req, 2*time.Second)
	seen := got.Load()
	if seen == nil {
		t.Fatalf("engine never got the request; client saw %q", resp)
	}
	head, _, _ := strings.Cut(*seen, "\r\n\r\n")
	for _, h := range []string{"x-client-private", "x-client-second", "keep-alive:", "upgrade", "te:", "trailer", "proxy-authorization", "proxy-connection", "x-worker-instance-id", "client.example"} {
		if strings.Contains(strings.ToLower(head), h) {
			t.Fatalf("engine received %q:\n%s", h, head)
		}
	}
	if !strings.Contains(head, "Host: "+strings.TrimPrefix(up.url, "http://")) || !strings.Contains(head, "X-Forwarded-Keep: yes") {
		t.Fatalf("engine's Host or an end-to-end header is wrong:\n%s", head)
	}
	rhead, _, _ := strings.Cut(resp, "\r\n\r\n")
	for _, h := range []string{"x-engine-private", "keep-alive:", "proxy-authenticate", "trailer"} {
		if strings.Contains(strings.ToLower(rhead), h) {
			t.Fatalf("client received %q:\n%s", h, rhead)
		}
	}
	if !strings.Contains(rhead, "X-Kept: yes") {
		t.Fatalf("end-to-end response header dropped:\n%s", rhead)
	}
}

// A header name that reads as a framing, hop-by-hop, credential or router
// header once '_' is taken for '-' (as CGI and WSGI environments and nginx
// with underscores_in_headers take it) is dropped both ways, as the name it
// reads as would be; other names with underscores pass.
func TestUnderscoreSpellingsOfSpecialHeadersAreDroppedBothWays(t *testing.T) {
	var got atomic.Pointer[string]
	up := startRaw(t, func(n int, req string, c net.Conn) {
		got.Store(&req)
		body := okJSON
		c.Write([]byte("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n" +
			"Content_Length: 9999\r\nTransfer_Encoding: chunked\r\nKeep_Alive: timeout=1\r\nSet_Cookie: a=b\r\n" +
			"X_Infera_Worker: w-evil\r\nAccess_Control_Allow_Origin: *\r\nX_Request_Id: rid-evil\r\nX_Engine_Kept: yes\r\n" +
			"Content-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body))
	})
	r := startRouter(t, nil, nil, up.url)
	req := "POST /v1/chat/completions HTTP/1.1\r\nHost: client.example\r\n" +
		"Content_Length: 9999\r\nTransfer_Encoding: chunked\r\nX_Forwarded_For: 6.6.6.6\r\nProxy_Authorization: Basic Zm9vOmJhcg==\r\n" +
		"X_Worker_Instance_Id: w9\r\nX_Request_Id: rid-evil\r\nContent_Type: text/evil\r\nX_Client_Kept: yes\r\n" +
		"Content-Length: " + strconv.Itoa(len(chatBody)) + "\r\n\r\n" + chatBody
	resp := rawClient(t, r.url, req, 2*time.Second)
	seen := got.Load()
	if seen == nil {
		t.Fatalf("engine never got the request; client saw %q", resp)
	}
	head, _, _ := strings.Cut(*seen, "\r\n\r\n")
	for _, h := range []string{"content_length", "transfer_encoding", "x_forwarded_for", "6.6.6.6", "proxy_authorization", "x_worker_instance_id", "rid-evil", "text/evil"} {
		if strings.Contains(strings.ToLower(head), h) {
			t.Fatalf("engine received %q:\n%s", h, head)
		}
	}
	if !strings.Contains(strings.ToLower(head), "x_client_kept: yes") { // fasthttp writes it X_client_kept
		t.Fatalf("a header with an underscore that is no special name was dropped:\n%s", head)
	}
	rhead, _, _ := strings.Cut(resp, "\r\n\r\n")
	if !strings.HasPrefix(rhead, "HTTP/1.1 200") {
		t.Fatalf("client got:\n%s", resp)
	}
	for _, h := range []string{"content_length", "transfer_encoding", "keep_alive", "set_cookie", "w-evil", "access_control", "rid-evil"} {
		if strings.Contains(strings.ToLower(rhead), h) {
			t.Fatalf("client received %q:\n%s", h, rhead)
		}
	}
	if !strings.Contains(strings.ToLower(rhead), "x_engine_kept: yes") {
		t.Fatalf("a response header with an underscore that is no special name was dropped:\n%s", rhead)
	}
}

// 5. An engine that honours Upgrade and answers 101 does not get its
// tunnel pooled: the client gets 502 and the next request goes out on a
// fresh connection.
func TestUpgradeAnswerIsRefusedAndNotPooled(t *testing.T) {
	up := startRaw(t, func(n int, req string, c net.Conn) {
		if n == 1 {
			c.Write([]byte("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n"))
			return
		}
		c.Write([]byte(jsonAnswer(okJSON)))
	})
	f := defaultFlags()
	f.RequestMaxRetries = 0
	r := startRouter(t, f, nil, up.url)
	code, b := post(t, r.url+"/v1/chat/completions", chatBody)
	if code != 502 {
		t.Fatalf("101 from the engine: %d %s", code, b)
	}
	checkOpenAIError(t, b)
	if code, b := post(t, r.url+"/v1/chat/completions", chatBody); code != 200 || !strings.Contains(b, `"hi"`) {
		t.Fatalf("next request: %d %s", code, b)
	}
	if n := up.conns.Load(); n != 2 {
		t.Fatalf("upstream connections: %d, want 2 (the upgraded one must not be reused)", n)
	}
}

// 6. An unsolicited extra response, sent with the answer or later while the
// connection idles in the pool, never reaches the next client.
func TestUnsolicitedResponseNeverReachesNextClient(t *testing.T) {
	for _, late := range []bool{false, true} {
		t.Run(fmt.Sprintf("late=%v", late), func(t *testing.T) {
			evil := jsonAnswer(`{"evil":true}`)
			up := startRaw(t, func(n int, req string, c net.Conn) {
				c.Write([]byte(jsonAnswer(okJSON)))
				if n == 1 {
					if late {
						time.Sleep(100 * time.Millisecond)
					}
					c.Write([]byte(evil))
				}
			})
			r := startRouter(t, nil, nil, up.url)
			if code, b := post(t, r.url+"/v1/chat/completions", chatBody); code != 200 || strings.Contains(b, "evil") {
				t.Fatalf("first: %d %s", code, b)
			}
			time.Sleep(200 * time.Millisecond)
			for i := 0; i < 3; i++ {
				if code, b := post(t, r.url+"/v1/chat/completions", chatBody); code != 200 || strings.Contains(b, "evil") {
					t.Fatalf("request %d got the unsolicited answer: %d %s", i, code, b)
				}
			}
		})
	}
}

// 7. The router reads the fields the engine reads: keys are compared
// decoded, routing keys may not repeat, and the model may not be empty. A
// key that is a routing key in another case ("Model", "MAX_TOKENS", the
// Kelvin sign for k, which Go's encoding/json folds to k) is refused: an
// engine matching keys regardless of case (infera engine, any engine on
// encoding/json) read it, the router did not (another model than the
// user may call, more tokens than the quota was charged).
func TestRouterAndEngineReadTheSameFields(t *testing.T) {
	up := startUpstream(t, okHandler)
	r := startRouter(t, nil, nil, up.url)
	for _, body := range []string{
		`{"model":"m","Model":"x","messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"m","max_tokens":1,"MAX_TOKENS":500,"messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"m","max_tokens":1,"max_to\u212aens":500,"messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"m","STREAM":true,"messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"m","stream":true,"Stream_Options":{"include_usage":false},"messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"m","stream":true,"stream_options":{"include_usage":false,"Include_Usage":false},"messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"m","N":4,"messages":[{"role":"user","content":"hi"}]}`,
		`{"Model":"m","messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"m","mod\u0065l":"x","messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"m","stream":false,"str\u0065am":true,"messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"m","max_tokens":1,"max_tok\u0065ns":100000,"messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"m","messages":[{"role":"user","content":"hi"}],"messages":[]}`,
		`{"model":"","messages":[{"role":"user","content":"hi"}]}`,
	} {
		code, b := post(t, r.url+"/v1/chat/completions", body)
		if code != 400 {
			t.Fatalf("%s: %d %s, want 400", body, code, b)
		}
		checkOpenAIError(t, b)
	}
	// An escaped key that is unique is read as its decoded name; other
	// keys in other cases pass.
	if code, b := post(t, r.url+"/v1/chat/completions", `{"mod\u0065l":"m","messages":[{"role":"user","content":"hi"}]}`); code != 200 {
		t.Fatalf("escaped model key: %d %s", code, b)
	}
	if code, b := post(t, r.url+"/v1/chat/completions", `{"model":"m","Temperature":0,"messages":[{"role":"user","content":"hi"}]}`); code != 200 {
		t.Fatalf("a key the router does not read, in another case: %d %s", code, b)
	}
	code, b := post(t, r.url+"/v1/completions", `{"model":"m","prompt":"hi","PROMPT":"x"}`)
	if code != 400 || !strings.Contains(b, `"param":"prompt"`) {
		t.Fatalf("completions: %d %s", code, b)
	}
}

// 8. A client that stops reading is not the worker's fault: the idle
// timeout measures the engine, not time spent blocked writing to the
// client; a client that stalls past --client-write-timeout is cut, and the
// worker's breaker records nothing.
func TestSlowClientIsNotBlamedOnWorker(t *testing.T) {
	event := "data: " + strings.Repeat("x", 16<<10) + "\n\n"
	up := startUpstream(t, func(ctx *fasthttp.RequestCtx) {
		ctx.SetContentType("text/event-stream")
		ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
			for i := 0; i < 1024; i++ { // 16 MB, more than the socket buffers hold
				w.WriteString(event)
				if w.Flush() != nil {
					return
				}
			}
			w.WriteString("data: [DONE]\n\n")
			w.Flush()
		})
	})
	cfg := config.Default()
	cfg.Timeouts.StreamIdleSeconds = 0.3
	f := defaultFlags()
	f.BreakerFailureThreshold = 1
	f.ClientWriteTimeout = 10 * time.Second
	r := startRouter(t, f, cfg, up.url)
	w := r.fl.Get("w0")
	readPaused := func(pause time.Duration) (string, error) {
		c, err := net.Dial("tcp4", strings.TrimPrefix(r.url, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s", len(streamBody), streamBody)
		head := make([]byte, 512)
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		n, err := c.Read(head)
		if err != nil {
			return "", err
		}
		time.Sleep(pause) // the router's writes block on us meanwhile
		c.SetReadDeadline(time.Now().Add(20 * time.Second))
		rest, err := io.ReadAll(c)
		return string(head[:n]) + string(rest), err
	}
	t0 := time.Now()
	got, _ := readPaused(1500 * time.Millisecond) // 5x the idle timeout
	t.Logf("paused read took %v", time.Since(t0))
	if !strings.Contains(got, "data: [DONE]") || strings.Contains(got, `"error"`) {
		t.Fatalf("paused client got a broken stream (%d bytes, tail %q)", len(got), got[max(0, len(got)-200):])
	}
	if w.Breaker.State() != fleet.BreakerClosed {
		t.Fatal("a slow client tripped the worker's breaker")
	}
	// Past the client's own write timeout: the client is cut, the worker is fine.
	f2 := defaultFlags()
	f2.BreakerFailureThreshold = 1
	f2.ClientWriteTimeout = 300 * time.Millisecond
	r2 := startRouter(t, f2, cfg, up.url)
	r = r2
	t0 = time.Now()
	got, _ = readPaused(2 * time.Second)
	t.Logf("stalled read took %v", time.Since(t0))
	if strings.Contains(got, "data: [DONE]") {
		t.Fatal("a client stalled past --client-write-timeout was not cut")
	}
	if st := r2.fl.Get("w0").Breaker.State(); st != fleet.BreakerClosed {
		t.Fatalf("client write timeout tripped the worker's breaker: state %d", st)
	}
}

// 9. A stream that breaks inside an event ends with the router's error
// event alone: the half event is dropped. It used to be terminated and
// sent (the error event on its own line after it), and an SSE parser then
// dispatched it as an event of broken JSON: both official SDKs threw a
// SyntaxError on it and never saw the error event. Relayed streams (the
// client asked for usage) and usage-filtered ones (it did not) alike.
func TestAStreamBrokenInsideAnEventEndsWithTheErrorEventAlone(t *testing.T) {
	up := startRaw(t, func(n int, req string, c net.Conn) {
		c.Write([]byte("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"))
		part := "data: {\"i\":0}\n\ndata: {\"partial"
		fmt.Fprintf(c, "%x\r\n%s\r\n", len(part), part)
		time.Sleep(50 * time.Millisecond)
		c.(*net.TCPConn).SetLinger(0)
		c.Close() // dies mid-event
	})
	r := startRouter(t, nil, nil, up.url)
	relayed := `{"model":"m","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}`
	for _, body := range []string{streamBody, relayed} {
		code, b := post(t, r.url+"/v1/chat/completions", body)
		want := "data: {\"i\":0}\n\ndata: {\"error\":{\"message\":\"the worker's response stream broke\""
		if code != 200 || !strings.HasPrefix(b, want) || strings.Contains(b, "partial") || !strings.HasSuffix(b, "data: [DONE]\n\n") {
			t.Fatalf("%s: %d %q", body, code, b)
		}
	}
}

// An event cut by the end of a read is held until its end arrives, so the
// events reach the client whole, whatever the engine's writes were; an
// unterminated last event before the end of the body is relayed as sent.
func TestARelayedStreamSendsWholeEvents(t *testing.T) {
	up := startRaw(t, func(n int, req string, c net.Conn) {
		c.Write([]byte("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"))
		for _, part := range []string{"data: {\"a\":", "1}\n", "\ndata: {\"b\":2}\r\n\r\ndata: {\"c\"", ":3}\n\ndata: [DONE]"} {
			fmt.Fprintf(c, "%x\r\n%s\r\n", len(part), part)
			time.Sleep(20 * time.Millisecond)
		}
		c.Write([]byte("0\r\n\r\n"))
	})
	r := startRouter(t, nil, nil, up.url)
	relayed := `{"model":"m","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}`
	resp := rawClient(t, r.url, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: "+strconv.Itoa(len(relayed))+"\r\nConnection: close\r\n\r\n"+relayed, 5*time.Second)
	_, chunked, _ := strings.Cut(resp, "\r\n\r\n")
	var chunks []string
	for chunked != "" {
		size, rest, _ := strings.Cut(chunked, "\r\n")
		n, err := strconv.ParseInt(size, 16, 64)
		if err != nil || n == 0 {
			break
		}
		chunks = append(chunks, rest[:n])
		chunked = rest[n+2:]
	}
	want := "data: {\"a\":1}\n\ndata: {\"b\":2}\r\n\r\ndata: {\"c\":3}\n\ndata: [DONE]"
	if strings.Join(chunks, "") != want {
		t.Fatalf("client got %q, want %q", strings.Join(chunks, ""), want)
	}
	for i, c := range chunks[:len(chunks)-1] {
		if !strings.HasSuffix(c, "\n\n") && !strings.HasSuffix(c, "\r\n\r\n") {
			t.Fatalf("client chunk %d ends inside an event: %q (all: %q)", i, c, chunks)
		}
	}
}

// 10. An absolute-form request target neither sets the engine's Host nor
// reaches it: the engine sees the canonical path and its own Host.
func TestAbsoluteFormTargetDoesNotReachTheEngine(t *testing.T) {
	var got atomic.Pointer[string]
	up := startRaw(t, func(n int, req string, c net.Conn) {
		got.Store(&req)
		c.Write([]byte(jsonAnswer(okJSON)))
	})
	r := startRouter(t, nil, nil, up.url)
	resp := rawClient(t, r.url, "POST http://evil.example/v1/chat/completions?x=1 HTTP/1.1\r\nHost: evil.example\r\nContent-Length: "+
		strconv.Itoa(len(chatBody))+"\r\nConnection: close\r\n\r\n"+chatBody, 2*time.Second)
	if !strings.HasPrefix(resp, "HTTP/1.1 200") {
		t.Fatalf("%q", trunc(resp))
	}
	seen := got.Load()
	if seen == nil || !strings.HasPrefix(*seen, "POST /v1/chat/completions?x=1 HTTP/1.1\r\n") ||
		strings.Contains(*seen, "evil") || !strings.Contains(*seen, "Host: "+strings.TrimPrefix(up.url, "http://")) {
		t.Fatalf("engine saw:\n%v", *seen)
	}
}

// 11. Worker faults are counted in infera_router_worker_failures_total.
func TestWorkerFailuresAreCounted(t *testing.T) {
	f := defaultFlags()
	f.RequestMaxRetries = 0
	r := startRouter(t, f, nil, deadURL(t))
	for i := 0; i < 2; i++ {
		post(t, r.url+"/v1/chat/completions", chatBody)
	}
	var buf bytes.Buffer
	metrics.WritePrometheus(&buf, false)
	if !regexpMatch(`infera_router_worker_failures_total\{worker="w0"\} [1-9]`, buf.String()) {
		t.Fatalf("failures not counted:\n%s", grepLines(buf.String(), "worker_failures"))
	}
}

// 12. Every worker down: 503 and /health says so; error messages carry no
// internal address.
func TestFleetDownAnswers503WithoutAddresses(t *testing.T) {
	f := defaultFlags()
	f.BreakerFailureThreshold = 1
	dead1, dead2 := deadURL(t), deadURL(t)
	r := startRouter(t, f, nil, dead1, dead2)
	for i := 0; i < 3; i++ {
		code, b := post(t, r.url+"/v1/chat/completions", chatBody)
		if code != 503 {
			t.Fatalf("request %d with every worker down: %d %s", i, code, b)
		}
		if strings.Contains(b, "127.0.0.1") || strings.Contains(b, strings.TrimPrefix(dead1, "http://")) {
			t.Fatalf("error names an internal address: %s", b)
		}
	}
	resp, err := http.Get(r.url + "/health")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(b), `"status":"degraded"`) {
		t.Fatalf("/health with every breaker open: %d %s", resp.StatusCode, b)
	}
}

// 12. A non-streaming client that leaves cancels the engine request.
func TestNonStreamingClientLeavingCancelsEngine(t *testing.T) {
	closed := make(chan time.Time, 1)
	up := startRaw(t, func(n int, req string, c net.Conn) {
		// Never answer; notice when the router closes the connection.
		b := make([]byte, 1)
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, err := c.Read(b); err != nil {
			closed <- time.Now()
		}
	})
	r := startRouter(t, nil, nil, up.url)
	c, err := net.Dial("tcp4", strings.TrimPrefix(r.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s", len(chatBody), chatBody)
	time.Sleep(300 * time.Millisecond)
	left := time.Now()
	c.Close()
	select {
	case at := <-closed:
		if d := at.Sub(left); d > 2*time.Second {
			t.Fatalf("engine connection closed %v after the client left", d)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the engine request was not cancelled when the client left")
	}
	waitFor(t, func() bool { return r.fl.Get("w0").Load.Requests.Load() == 0 }, "load released")
	if st := r.fl.Get("w0").Breaker.State(); st != fleet.BreakerClosed {
		t.Fatal("a leaving client was blamed on the worker")
	}
}

// 12. Large non-streaming answers are streamed through, not buffered whole.
func TestLargeNonStreamingAnswerIsNotBuffered(t *testing.T) {
	const size = 48 << 20
	chunk := bytes.Repeat([]byte("a"), 64<<10)
	up := startUpstream(t, func(ctx *fasthttp.RequestCtx) {
		ctx.SetContentType("application/json")
		ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
			for n := 0; n < size; n += len(chunk) {
				w.Write(chunk)
				w.Flush()
			}
		})
	})
	r := startRouter(t, nil, nil, up.url)
	runtime.GC()
	var peak atomic.Uint64
	stop := make(chan struct{})
	go func() {
		var ms runtime.MemStats
		for {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
			runtime.ReadMemStats(&ms)
			if ms.HeapAlloc > peak.Load() {
				peak.Store(ms.HeapAlloc)
			}
		}
	}()
	var base runtime.MemStats
	runtime.ReadMemStats(&base)
	var wg sync.WaitGroup
	for i := 0; i < 3; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := http.Post(r.url+"/v1/chat/completions", "application/json", strings.NewReader(chatBody))
			if err != nil {
				t.Error(err)
				return
			}
			n, _ := io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if n != size {
				t.Errorf("got %d bytes, want %d", n, size)
			}
		}()
	}
	wg.Wait()
	close(stop)
	if grew := int64(peak.Load()) - int64(base.HeapAlloc); grew > 40<<20 {
		t.Fatalf("three 48 MB answers grew the heap by %d MB: buffered, not streamed", grew>>20)
	}
}

func readDirNames(dir string) ([]string, error) {
	f, err := os.Open(dir)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return f.Readdirnames(-1)
}

func regexpMatch(pat, s string) bool { return regexp.MustCompile(pat).MatchString(s) }

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// The engines' reported usage gives each worker its cache hit rate (the
// admin fleet view and infera_router_worker_prefix_hit_rate show it).
func TestWorkerHitRateFromReportedUsage(t *testing.T) {
	up := startUpstream(t, okHandler) // usage: 7 prompt tokens, 3 cached
	r := startRouter(t, nil, nil, up.url)
	w := r.fl.Get("w0")
	if w.HitRate() != -1 {
		t.Fatalf("hit rate before any answer: %v", w.HitRate())
	}
	for i := 0; i < 3; i++ {
		post(t, r.url+"/v1/chat/completions", chatBody)
	}
	if got := w.HitRate(); got < 0.428 || got > 0.429 {
		t.Fatalf("hit rate %v, want 3/7", got)
	}
	if req, fail := w.Counts(); req != 3 || fail != 0 {
		t.Fatalf("counts %d %d", req, fail)
	}
}

// 13. An engine whose connection breaks after its stream ended (data:
// [DONE] sent, then a reset instead of the chunked body's last chunk)
// gives the client one complete stream: no error event and no second
// [DONE] after it, in every relay (passthrough with or without the
// optional space, usage-filtered, converted to Anthropic's events); the
// worker is not blamed and the broken connection is not reused.
func TestStreamBrokenAfterItsEndGetsNoErrorEvent(t *testing.T) {
	for _, tc := range []struct {
		name, path, body, done string
		stop                   string // the client protocol's end, once
	}{
		{"passthrough", "/v1/chat/completions", streamBody, "data: [DONE]\n\n", "data: [DONE]"},
		{"no space", "/v1/chat/completions", streamBody, "data:[DONE]\n\n", "data:[DONE]"},
		{"usage filtered", "/v1/chat/completions", strings.Replace(streamBody, `"stream":true`, `"stream":true,"stream_options":{"include_usage":false}`, 1), "data: [DONE]\n\n", "data: [DONE]"},
		{"anthropic", "/v1/messages", strings.Replace(anthropicBody, `"max_tokens"`, `"stream":true,"max_tokens"`, 1), "data: [DONE]\n\n", "event: message_stop"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up := startRaw(t, func(n int, req string, c net.Conn) {
				c.Write([]byte("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"))
				ev := `data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":"hi"},"finish_reason":null}]}` + "\n\n" +
					`data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}` + "\n\n" + tc.done
				fmt.Fprintf(c, "%x\r\n%s\r\n", len(ev), ev)
				time.Sleep(50 * time.Millisecond)
				c.(*net.TCPConn).SetLinger(0)
				c.Close() // a reset where the last chunk belongs
			})
			f := defaultFlags()
			f.RequestMaxRetries = 0
			r := startRouter(t, f, nil, up.url)
			before := midStreamErrors()
			for i := 1; i <= 2; i++ {
				code, b := post(t, r.url+tc.path, tc.body)
				if code != 200 || strings.Count(b, tc.stop) != 1 || !strings.HasSuffix(strings.TrimRight(b, "\n"), strings.TrimRight(tc.done, "\n")) && tc.path != "/v1/messages" ||
					strings.Contains(b, "error") || !strings.Contains(b, "hi") {
					t.Fatalf("request %d: %d %q", i, code, b)
				}
				if n := up.conns.Load(); n != int64(i) {
					t.Fatalf("request %d went over %d engine connections, want %d (a broken one is never reused)", i, n, i)
				}
			}
			if st := r.fl.Get("w0").Breaker.State(); st != fleet.BreakerClosed || midStreamErrors() != before {
				t.Fatalf("breaker %d, mid-stream errors %v -> %v", st, before, midStreamErrors())
			}
		})
	}
}

// midStreamErrors reads infera_stream_errors_total{phase="mid_stream"}.
func midStreamErrors() uint64 { return mMidStreamErr.Get() }

// 14. A stream whose body ends only when the engine closes its connection
// (HTTP/1.0, or Connection: close with neither Content-Length nor chunked
// framing) and that closes before its protocol's end (data: [DONE], or the
// converted stream's message_stop) is a broken stream, as a chunked one
// cut the same way is: the client gets the error event and the worker is
// blamed. It used to be relayed as complete. The same stream ending in
// [DONE] is complete; both the engine's close right after its last event
// (often one read with the end of the body) and after a pause are checked.
// A converted stream left without its finish is the worker's fault however
// it was framed (sized here, read whole with the head).
func TestACloseDelimitedStreamCutBeforeItsEndIsBroken(t *testing.T) {
	const chunk = `data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":"hi"},"finish_reason":null}]}` + "\n\n"
	anthropic := strings.Replace(anthropicBody, `"max_tokens"`, `"stream":true,"max_tokens"`, 1)
	filtered := strings.Replace(streamBody, `"stream":true`, `"stream":true,"stream_options":{"include_usage":false}`, 1)
	const http10 = "HTTP/1.0 200 OK\r\nContent-Type: text/event-stream\r\n\r\n"
	for _, tc := range []struct {
		name, head, path, body string
		pause, done            bool
		end                    string // the engine's last bytes when done ("data: [DONE]\n\n" if empty)
	}{
		{"filtered complete, [DONE] unterminated", http10, "/v1/chat/completions", filtered, true, true, "data: [DONE]"},
		{"passthrough complete, [DONE] unterminated", http10, "/v1/chat/completions", streamBody, true, true, "data: [DONE]"},
		{"passthrough complete, [DONE] with a trailing space", http10, "/v1/chat/completions", streamBody, true, true, "data: [DONE] \n\n"},
		{"filtered cut", http10, "/v1/chat/completions", filtered, true, false, ""},
		{"anthropic complete", http10, "/v1/messages", anthropic, true, true, `data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}` + "\n\ndata: [DONE]"},
		{"http/1.0 cut", "HTTP/1.0 200 OK\r\nContent-Type: text/event-stream\r\n\r\n", "/v1/chat/completions", streamBody, false, false, ""},
		{"connection close cut after a pause", "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n", "/v1/chat/completions", streamBody, true, false, ""},
		{"anthropic cut", "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n", "/v1/messages", anthropic, true, false, ""},
		{"anthropic sized, no finish", "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: %d\r\n\r\n", "/v1/messages", anthropic, true, false, ""},
		{"http/1.0 complete", "HTTP/1.0 200 OK\r\nContent-Type: text/event-stream\r\n\r\n", "/v1/chat/completions", streamBody, false, true, ""},
		{"connection close complete after a pause", "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n", "/v1/chat/completions", streamBody, true, true, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up := startRaw(t, func(n int, req string, c net.Conn) {
				out := chunk
				if tc.done {
					if tc.end == "" {
						tc.end = "data: [DONE]\n\n"
					}
					out += tc.end
				}
				if strings.Contains(tc.head, "%d") {
					out = fmt.Sprintf(tc.head, len(out)) + out
				} else {
					out = tc.head + out
				}
				if tc.pause {
					c.Write([]byte(out))
					time.Sleep(50 * time.Millisecond)
				} else {
					c.Write([]byte(out))
				}
				c.Close()
			})
			f := defaultFlags()
			f.RequestMaxRetries = 0
			f.BreakerFailureThreshold = 1
			r := startRouter(t, f, nil, up.url)
			before := midStreamErrors()
			code, b := post(t, r.url+tc.path, tc.body)
			st := r.fl.Get("w0").Breaker.State()
			if tc.done {
				ending := chunk + "data: [DONE]"
				if tc.path == "/v1/messages" {
					ending = "event: message_stop\ndata: {\"type\":\"message_stop\"}"
				}
				if code != 200 || strings.Contains(b, "error") || !strings.HasSuffix(strings.TrimRight(b, " \n"), ending) || st != fleet.BreakerClosed || midStreamErrors() != before {
					t.Fatalf("a complete stream: %d %q, breaker %d", code, b, st)
				}
				return
			}
			want := "the worker's response stream broke"
			if tc.path == "/v1/messages" {
				want = "the engine's stream ended before the answer was complete" // the converter's own
			}
			if code != 200 || !strings.Contains(b, want) || strings.Count(b, want) != 1 || strings.Contains(b, "message_stop") {
				t.Fatalf("a cut stream reached the client as %d %q", code, b)
			}
			if tc.path == "/v1/messages" && !strings.Contains(b, "event: error") {
				t.Fatalf("no Anthropic error event: %q", b)
			}
			if st == fleet.BreakerClosed || midStreamErrors() == before {
				t.Fatalf("the worker was not blamed: breaker %d, mid-stream errors %v -> %v", st, before, midStreamErrors())
			}
		})
	}
}

// 16. A stream commits to the client on its first whole event, not on its
// first bytes: an engine that sends a keep-alive comment (or half an
// event) and then dies, or stalls past stream_first_packet_s, is retried
// on another worker and the client gets one clean stream. Before, the
// comment committed the answer, and the client got the error event.
func TestAStreamCommitsOnItsFirstEventNotAComment(t *testing.T) {
	good := startRaw(t, func(n int, req string, c net.Conn) {
		ev := "data: {\"i\":0}\n\ndata: [DONE]\n\n"
		fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: %d\r\n\r\n%s", len(ev), ev)
	})
	for _, tc := range []struct {
		name  string
		first string
		stall bool
		// http10: the stream is close-delimited, so the engine's close
		// looks like an end, not a cut.
		http10 bool
	}{
		{"comment then a crash", ": keep-alive\n\n", false, false},
		{"half an event then a crash", "data: {\"i\"", false, false},
		{"comment then a stall", ": keep-alive\n\n", true, false},
		{"http/1.0: comment then a close", ": keep-alive\n\n", false, true},
		{"http/1.0: half an event then a close", "data: {\"i\"", false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			release := make(chan struct{})
			defer close(release)
			bad := startRaw(t, func(n int, req string, c net.Conn) {
				if tc.http10 {
					c.Write([]byte("HTTP/1.0 200 OK\r\nContent-Type: text/event-stream\r\n\r\n" + tc.first))
				} else {
					c.Write([]byte("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"))
					fmt.Fprintf(c, "%x\r\n%s\r\n", len(tc.first), tc.first)
				}
				if tc.stall {
					select {
					case <-release:
					case <-time.After(3 * time.Second):
					}
				} else {
					time.Sleep(30 * time.Millisecond)
				}
				if !tc.http10 { // (a close-delimited body ends at a clean close)
					c.(*net.TCPConn).SetLinger(0)
				}
				c.Close()
			})
			cfg := config.Default()
			cfg.Timeouts.StreamFirstPacketSeconds = 0.3
			f := defaultFlags()
			f.RequestMaxRetries = 1
			r := startRouter(t, f, cfg, bad.url, good.url)
			for i := 0; i < 2; i++ {
				t0 := time.Now()
				code, b := post(t, r.url+"/v1/chat/completions", streamBody)
				if code != 200 || b != "data: {\"i\":0}\n\ndata: [DONE]\n\n" {
					t.Fatalf("request %d: %d %q after %v", i, code, b, time.Since(t0))
				}
			}
			if bad.conns.Load() == 0 {
				t.Fatal("the misbehaving worker was never tried")
			}
		})
	}
}

// A close-delimited answer whose end says nothing about completeness is
// not judged cut at the engine's close: a plain JSON answer to a stream
// request with no Content-Type, a gzip-encoded event stream (its tail
// shows no data: [DONE]). Both reach the client whole, and the worker is
// not blamed.
func TestACloseDelimitedAnswerThatIsNotAPlainEventStreamEndsAtTheClose(t *testing.T) {
	const chunk = "data: {\"i\":0}\n\ndata: [DONE]\n\n"
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write([]byte(chunk))
	zw.Close()
	const json = `{"id":"c","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}]}`
	for _, tc := range []struct {
		name, head, body, want string
	}{
		{"json without a content-type", "HTTP/1.0 200 OK\r\n\r\n", json, json},
		{"gzip-encoded event stream", "HTTP/1.0 200 OK\r\nContent-Type: text/event-stream\r\nContent-Encoding: gzip\r\n\r\n", gz.String(), chunk},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up := startRaw(t, func(n int, req string, c net.Conn) {
				c.Write([]byte(tc.head + tc.body))
				c.Close()
			})
			f := defaultFlags()
			f.RequestMaxRetries = 0
			f.BreakerFailureThreshold = 1
			r := startRouter(t, f, nil, up.url)
			before := midStreamErrors()
			code, b := post(t, r.url+"/v1/chat/completions", streamBody)
			if code != 200 || b != tc.want || midStreamErrors() != before {
				t.Fatalf("a whole answer became %d %q", code, b)
			}
			if st := r.fl.Get("w0").Breaker.State(); st != fleet.BreakerClosed {
				t.Fatalf("the worker was blamed: breaker %d", st)
			}
		})
	}
}

// 15. A non-streamed answer larger than the relay's buffer that the engine
// cuts mid-body (it promised more bytes than it sent) is the worker's
// fault: it is counted and blamed as a broken answer, and the client sees
// a short body on a closed connection, never a complete-looking one. It
// used to be taken for a client that left (the relay's returned error came
// back as the client's), so the engine was never blamed.
func TestAPlainAnswerCutMidBodyBlamesTheWorker(t *testing.T) {
	const promised, sent = 100000, 50000
	up := startRaw(t, func(n int, req string, c net.Conn) {
		fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", promised)
		c.Write(bytes.Repeat([]byte("x"), sent))
		time.Sleep(50 * time.Millisecond)
		c.Close()
	})
	f := defaultFlags()
	f.RequestMaxRetries = 0
	f.BreakerFailureThreshold = 1
	r := startRouter(t, f, nil, up.url)
	gone := mClientGone.Get()
	before := midStreamErrors()
	resp, err := http.Post(r.url+"/v1/chat/completions", "application/json", strings.NewReader(chatBody))
	if err != nil {
		t.Fatal(err)
	}
	b, rerr := io.ReadAll(resp.Body)
	resp.Body.Close()
	if rerr == nil || len(b) >= promised {
		t.Fatalf("the client read %d bytes (err %v): a cut answer looked complete", len(b), rerr)
	}
	if st := r.fl.Get("w0").Breaker.State(); st == fleet.BreakerClosed || midStreamErrors() == before {
		t.Fatalf("the worker was not blamed: breaker %d, mid-stream errors %v -> %v", st, before, midStreamErrors())
	}
	if mClientGone.Get() != gone {
		t.Fatal("the engine's cut was counted as a client that left")
	}
}

// A prompt the tokenizer is slow on (one 3 MB word: BPE costs about 1 us a
// byte where its caches do not help) is tokenized only up to
// --router-tokenize-max-bytes, cut where the tokens of the part are those
// of the whole; it is still routed and answered, and its token count is
// extrapolated. A chat of 100000 messages renders only its leading ones,
// and tools larger than the bound are not tokenized at all.
func TestHugePromptIsTokenizedOnlyUpToTheLimit(t *testing.T) {
	dir := qwen3Dir(t)
	up := startUpstream(t, okHandler)
	f := defaultFlags()
	f.MaxBodyBytes = 8 << 20
	f.RouterPolicy, f.RouterTokenizerPath, f.RouterTokenizeMaxBytes = "kv-aware", dir, 64<<10
	r := startRouter(t, f, nil, up.url)
	tok, err := tokenizer.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	cuts := mTokenizeCut.Get()

	word := strings.Repeat("x", 3<<20)
	if code, b := post(t, r.url+"/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"`+word+`"}]}`); code != 200 {
		t.Fatalf("huge one-word prompt: %d %s", code, b)
	}
	if got := mTokenizeCut.Get() - cuts; got != 1 {
		t.Fatalf("%d prompts cut, want 1", got)
	}

	// Prose: /tokenize shows what the router encodes, the leading tokens of
	// the whole rendered prompt.
	prose := strings.Repeat("The quick brown fox jumps over the lazy dog. ", 4000) // 180 KB
	body := `{"model":"m","messages":[{"role":"user","content":"` + prose + `"}]}`
	code, b := post(t, r.url+"/tokenize", body)
	if code != 200 {
		t.Fatalf("/tokenize: %d %s", code, b)
	}
	var got struct {
		Tokens []uint32 `json:"tokens"`
		Count  int      `json:"count"`
	}
	if err := json.Unmarshal([]byte(b), &got); err != nil {
		t.Fatal(err)
	}
	render, err := tok.RenderChat(nil, []tokenizer.Message{{Role: "user", Content: prose}}, nil, true)
	if err != nil {
		t.Fatal(err)
	}
	full := tok.Encode(nil, render)
	if got.Count != len(got.Tokens) || len(got.Tokens) == 0 || len(got.Tokens) >= len(full) {
		t.Fatalf("router encoded %d (count %d) of the prompt's %d tokens", len(got.Tokens), got.Count, len(full))
	}
	if !slices.Equal(got.Tokens, full[:len(got.Tokens)]) {
		t.Fatal("the router's tokens of the cut prompt are not the leading tokens of the whole")
	}
	if enc := tok.Encode(nil, render[:64<<10]); len(got.Tokens) > len(enc)+1 {
		t.Fatalf("router encoded %d tokens, more than the %d of the first 64 KiB", len(got.Tokens), len(enc))
	}

	// Many small messages (a template costs 15-20 us each): only the first
	// maxRouteMessages are rendered, and their tokens lead the whole's.
	var chat strings.Builder
	var msgs []tokenizer.Message
	chat.WriteString(`{"model":"m","messages":[`)
	for i := 0; i < 3000; i++ {
		role := [2]string{"user", "assistant"}[i%2]
		content := "message " + strconv.Itoa(i)
		if i > 0 {
			chat.WriteByte(',')
		}
		chat.WriteString(`{"role":"` + role + `","content":"` + content + `"}`)
		msgs = append(msgs, tokenizer.Message{Role: role, Content: content})
	}
	chat.WriteString(`]}`)
	code, b = post(t, r.url+"/tokenize", chat.String())
	if code != 200 {
		t.Fatalf("/tokenize: %d %s", code, b)
	}
	if err := json.Unmarshal([]byte(b), &got); err != nil {
		t.Fatal(err)
	}
	if render, err = tok.RenderChat(nil, msgs, nil, true); err != nil {
		t.Fatal(err)
	}
	full = tok.Encode(nil, render)
	// The part ends on the last user message among the first maxRouteMessages.
	part, err := tok.RenderChat(nil, msgs[:maxRouteMessages-1], nil, false)
	if err != nil {
		t.Fatal(err)
	}
	if want := tok.Encode(nil, part); !slices.Equal(got.Tokens, want) || !slices.Equal(want, full[:len(want)]) {
		t.Fatalf("router encoded %d tokens of 3000 messages, want the %d of the first %d, leading the whole's %d",
			len(got.Tokens), len(want), maxRouteMessages-1, len(full))
	}
	cuts = mTokenizeCut.Get()
	var many strings.Builder
	many.WriteString(`{"model":"m","messages":[`)
	for i := 0; i < 100000; i++ { // 3 MB: under the test upstream's 4 MB body limit
		if i > 0 {
			many.WriteByte(',')
		}
		many.WriteString(`{"role":"user","content":"hi"}`)
	}
	many.WriteString(`]}`)
	if code, b := post(t, r.url+"/v1/chat/completions", many.String()); code != 200 {
		t.Fatalf("100000 messages: %d %s", code, b)
	}
	// Tools the router may not tokenize: routed without block hashes.
	tools := `[{"type":"function","function":{"name":"f","description":"` + strings.Repeat("d ", 40<<10) + `"}}]`
	if code, b := post(t, r.url+"/v1/chat/completions", `{"model":"m","tools":`+tools+`,"messages":[{"role":"user","content":"hi"}]}`); code != 200 {
		t.Fatalf("huge tools: %d %s", code, b)
	}
	if got := mTokenizeCut.Get() - cuts; got != 2 {
		t.Fatalf("%d prompts cut, want 2", got)
	}
}

// A large body is read into a buffer that doubles, not one grown by fixed
// steps: a 3.5 MB body used to allocate (and copy) about 190 MB on its way
// in, a 31 MB one cost 8 CPU-seconds.
func TestLargeBodyIsReadWithoutQuadraticCopying(t *testing.T) {
	up := startUpstream(t, okHandler)
	f := defaultFlags()
	f.MaxBodyBytes = 8 << 20
	r := startRouter(t, f, nil, up.url)
	body := `{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("hello world ", 300000) + `"}]}`
	post(t, r.url+"/v1/chat/completions", body) // warm the pools
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	if code, b := post(t, r.url+"/v1/chat/completions", body); code != 200 {
		t.Fatalf("%d %s", code, b)
	}
	runtime.ReadMemStats(&after)
	// The client, the router and the upstream all run in this process: a
	// few copies of the body each, against ~190 MB when growing by steps.
	if got := after.TotalAlloc - before.TotalAlloc; got > 16*uint64(len(body)) {
		t.Fatalf("a %d-byte request allocated %d bytes", len(body), got)
	}
}

// The request head was capped at fasthttp's default 4 KiB read buffer and a
// larger one answered 400 "malformed HTTP request" (or a reset): a 5 KB JWT
// or a long tracing baggage header failed. Heads up to --max-header-bytes
// (16 KiB by default) are served; a larger one gets 431 in the error shape.
func TestLargeRequestHeadsAreServedUpToTheLimitAndGet431Beyond(t *testing.T) {
	up := startRaw(t, func(n int, req string, c net.Conn) { c.Write([]byte(jsonAnswer(okJSON))) })
	r := startRouter(t, defaultFlags(), nil, up.url)
	body := `{"model":"m","messages":[{"role":"user","content":"hi"}]}`
	req := func(extra int) string {
		return "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nBaggage: k=" + strings.Repeat("v", extra) +
			"\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\nConnection: close\r\n\r\n" + body
	}
	if got := rawClient(t, r.url, req(12<<10), 5*time.Second); !strings.HasPrefix(got, "HTTP/1.1 200") {
		t.Fatalf("a 12 KiB header:\n%.300s", got)
	}
	got := rawClient(t, r.url, req(20<<10), 5*time.Second)
	if !strings.HasPrefix(got, "HTTP/1.1 431") || !strings.Contains(got, `"code":"headers_too_large"`) || !strings.Contains(got, "--max-header-bytes") {
		t.Fatalf("a 20 KiB header:\n%.400s", got)
	}
	if got := rawClient(t, r.url, req(10), 5*time.Second); !strings.HasPrefix(got, "HTTP/1.1 200") {
		t.Fatalf("the router stopped serving:\n%.300s", got)
	}
}

// /v1/models, /health and /metrics answered 200 to any method (DELETE,
// TRACE, made up ones); no 405 carried the Allow header RFC 9110 requires;
// the debug endpoints' 405 had no code. Every 405 now has Allow and
// method_not_allowed.
func TestWrongMethodsGet405WithAllow(t *testing.T) {
	up := startRaw(t, func(n int, req string, c net.Conn) { c.Write([]byte(jsonAnswer(okJSON))) })
	r := startRouter(t, defaultFlags(), nil, up.url)
	for _, c := range []struct{ method, path, allow string }{
		{"DELETE", "/v1/models", "GET, HEAD"},
		{"TRACE", "/health", "GET, HEAD"},
		{"BREW", "/metrics", "GET, HEAD"},
		{"PUT", "/v1/models/m", "GET, HEAD"},
		{"GET", "/v1/chat/completions", "POST"},
		{"GET", "/tokenize", "POST"},
		{"GET", "/v1/messages", "POST"},
	} {
		got := rawClient(t, r.url, c.method+" "+c.path+" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", 3*time.Second)
		if !strings.HasPrefix(got, "HTTP/1.1 405") || !strings.Contains(got, "\r\nAllow: "+c.allow+"\r\n") {
			t.Errorf("%s %s:\n%.400s\nwant 405 with Allow: %s", c.method, c.path, got, c.allow)
		}
		if !strings.Contains(got, "method_not_allowed") && !strings.Contains(got, `"invalid_request_error"`) {
			t.Errorf("%s %s: no error code:\n%.400s", c.method, c.path, got)
		}
	}
	for _, m := range []string{"GET", "HEAD"} {
		if got := rawClient(t, r.url, m+" /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", 3*time.Second); !strings.HasPrefix(got, "HTTP/1.1 200") {
			t.Fatalf("%s /health:\n%.300s", m, got)
		}
	}
}

// A passthrough Responses stream that breaks ends with an error event that
// carries the sequence_number the Responses API requires (the next after
// the last event relayed); it had none.
func TestAPassthroughResponsesStreamErrorEventHasTheNextSequenceNumber(t *testing.T) {
	up := startRaw(t, func(n int, req string, c net.Conn) {
		c.Write([]byte("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"))
		part := "event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0}\n\n" +
			"event: response.in_progress\ndata: {\"type\":\"response.in_progress\",\"sequence_number\": 1}\n\nevent: response.output_item.added\ndata: {\"type\":\"respo"
		fmt.Fprintf(c, "%x\r\n%s\r\n", len(part), part)
		time.Sleep(50 * time.Millisecond)
		c.(*net.TCPConn).SetLinger(0)
		c.Close()
	})
	cfg := config.Default()
	cfg.Protocol.ResponsesPassthrough = true
	r := startRouter(t, nil, cfg, up.url)
	code, b := post(t, r.url+"/v1/responses", `{"model":"m","stream":true,"input":"hi"}`)
	want := "event: error\ndata: {\"type\":\"error\",\"sequence_number\":2,\"code\":\"server_error\""
	if code != 200 || !strings.Contains(b, "\"sequence_number\": 1}\n\n"+want) || strings.Contains(b, "respo\n") {
		t.Fatalf("%d %q", code, b)
	}
}

// When every worker tried answers 429 (or 5xx), the last answer is relayed
// after the retries; its Retry-After was dropped with its other headers.
// The client gets it, and Retry-After-Ms and X-Should-Retry, which the
// OpenAI and Anthropic SDKs read first (they were dropped still), chat and
// Messages alike, so SDKs wait (or not) as the engine asked.
func TestAnEngines429RelayedAfterRetriesKeepsItsRetryHeaders(t *testing.T) {
	busy := func(n int, req string, c net.Conn) {
		body := `{"error":{"message":"busy","type":"rate_limit_error"}}`
		c.Write([]byte("HTTP/1.1 429 Too Many Requests\r\nContent-Type: application/json\r\nRetry-After: 7\r\nretry-after-ms: 6500\r\nx-should-retry: false\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body))
	}
	// One worker: its 429 is stashed for a retry that finds no other
	// worker, then relayed (with two, the last one's is relayed directly).
	w0 := startRaw(t, busy)
	r := startRouter(t, nil, nil, w0.url)
	for _, c := range []struct{ path, body string }{
		{"/v1/chat/completions", chatBody},
		{"/v1/messages", `{"model":"m","max_tokens":4,"messages":[{"role":"user","content":"hi"}]}`},
	} {
		got := rawClient(t, r.url, "POST "+c.path+" HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: "+strconv.Itoa(len(c.body))+"\r\nConnection: close\r\n\r\n"+c.body, 5*time.Second)
		if !strings.HasPrefix(got, "HTTP/1.1 429") || !strings.Contains(got, "\r\nRetry-After: 7\r\n") ||
			!strings.Contains(got, "\r\nRetry-After-Ms: 6500\r\n") || !strings.Contains(got, "\r\nX-Should-Retry: false\r\n") {
			t.Errorf("%s:\n%.500s", c.path, got)
		}
	}
}

// /metrics carries # TYPE lines, so Prometheus stores counters as
// counters and gauges as gauges (it stored every series as untyped).
func TestMetricsCarryTheirTypes(t *testing.T) {
	up := startUpstream(t, okHandler)
	r := startRouter(t, nil, nil, up.url)
	postWith(t, r.url+"/v1/chat/completions", chatBody, nil)
	resp, body := send(t, "GET", r.url+"/metrics", "", "", "")
	if resp.StatusCode != 200 {
		t.Fatalf("%d", resp.StatusCode)
	}
	for _, want := range []string{"# TYPE infera_stream_client_disconnects_total counter", "# TYPE infera_router_worker_active_requests gauge",
		"# TYPE infera_session_affinity_evictions_total counter", "# TYPE infera_prefix_index_evictions_total counter",
		"# TYPE infera_session_affinity_entries gauge"} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	// An infera series named *_total is a counter (three were exposed as
	// gauges).
	for _, line := range strings.Split(body, "\n") {
		if f := strings.Fields(line); len(f) == 4 && f[1] == "TYPE" && strings.HasPrefix(f[2], "infera_") && strings.HasSuffix(f[2], "_total") && f[3] != "counter" {
			t.Errorf("%s", line)
		}
	}
}

// Every answer of the router's own is in infera_responses_total{class}:
// those written before dispatch (405, 401, a malformed body, one over
// --max-body-bytes, the in-flight body budget's 503) were left out, so
// the 5xx-share alert never saw a router shedding load.
func TestTheRoutersOwnEarlyAnswersAreCountedByClass(t *testing.T) {
	up := startUpstream(t, okHandler)
	f := defaultFlags()
	f.APIKey = "sk-count"
	f.MaxBodyBytes = 2000
	r := startRouter(t, f, nil, up.url)
	auth := map[string]string{"Authorization": "Bearer sk-count"}
	c4, c5 := mResp4xx.Get(), mResp5xx.Get()
	for _, c := range []struct {
		method, body string
		hdr          map[string]string
		want         int
	}{
		{"POST", `{bad`, auth, 400},
		{"POST", `{"messages":[]}`, auth, 400},
		{"GET", ``, auth, 405},
		{"POST", chatBody, nil, 401},
		{"POST", `{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("x", 3000) + `"}]}`, auth, 413},
	} {
		req, _ := http.NewRequest(c.method, r.url+"/v1/chat/completions", strings.NewReader(c.body))
		for k, v := range c.hdr {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != c.want {
			t.Fatalf("%s %s: %d, want %d", c.method, c.body, resp.StatusCode, c.want)
		}
	}
	if d4, d5 := mResp4xx.Get()-c4, mResp5xx.Get()-c5; d4 != 5 || d5 != 0 {
		t.Fatalf("4xx +%d, 5xx +%d; want +5, +0", d4, d5)
	}
	// The in-flight body budget's 503 (a converted body is swapped in).
	f2 := defaultFlags()
	f2.MaxInflightBodyBytes = 100
	r2 := startRouter(t, f2, nil, up.url)
	c5 = mResp5xx.Get()
	if code, b := post(t, r2.url+"/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"`+strings.Repeat("y", 300)+`"}]}`); code != 503 {
		t.Fatalf("budget: %d %s", code, b)
	}
	if d5 := mResp5xx.Get() - c5; d5 != 1 {
		t.Fatalf("5xx +%d for the budget's 503, want +1", d5)
	}
}

// A completions prompt of token ids is seen by the prefix layer (as the
// ids' bytes): the same prompt again goes where it went. It had no text
// to hash, so the prefix policy routed such prompts by load alone.
func TestATokenIDPromptIsRoutedByPrefix(t *testing.T) {
	a, b := startUpstream(t, okHandler), startUpstream(t, okHandler)
	cfg := config.Default()
	cfg.PrefixCache.Enabled = true
	cfg.Debug.DecisionHeader = true
	// What is checked is the layer, not the decision's time: on a loaded
	// machine the default 50 ms wait was once exceeded (sched-timeout).
	cfg.SchedTimeout.WaitTimeoutMS = 5000
	f := defaultFlags()
	f.RouterPolicy = "least-requests"
	r := startRouter(t, f, cfg, a.url, b.url)
	ids := make([]string, 600)
	for i := range ids {
		ids[i] = strconv.Itoa(1000 + i)
	}
	body := `{"model":"m","prompt":[` + strings.Join(ids, ",") + `],"max_tokens":2}`
	var routes []string
	for i := 0; i < 3; i++ {
		resp, b := postWith(t, r.url+"/v1/completions", body, nil)
		if resp.StatusCode != 200 {
			t.Fatalf("%d %s", resp.StatusCode, b)
		}
		routes = append(routes, resp.Header.Get("X-Infera-Route"))
	}
	if !strings.Contains(routes[0], "prefix-miss") || !strings.Contains(routes[1], "layer=prefix") || !strings.Contains(routes[2], "layer=prefix") {
		t.Fatalf("routes %q", routes)
	}
}

// A Transfer-Encoding other than chunked leaves a request's length
// unknown (RFC 9112 6.3): 400 and a close, never its body read as the next
// request on the connection, with or without a Content-Length, in the
// client's error shape.
func TestANonChunkedTransferEncodingIsRefusedAndCloses(t *testing.T) {
	up := startUpstream(t, okHandler)
	r := startRouter(t, nil, nil, up.url)
	smuggled := "GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n"
	cases := []struct{ name, req, shape string }{
		{"post without length", "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: identity\r\n\r\n" + smuggled, `"error":{"message"`},
		{"get without length", "GET /v1/models HTTP/1.1\r\nHost: x\r\ntransfer-encoding: IDENTITY\r\n\r\n" + smuggled, `"error":{"message"`},
		{"with a length", "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " + strconv.Itoa(len(chatBody)) + "\r\nTransfer-Encoding: identity\r\n\r\n" + chatBody, `"error":{"message"`},
		{"anthropic path", "POST /v1/messages HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: identity\r\n\r\n" + smuggled, `"type":"error"`},
	}
	for _, c := range cases {
		got := rawClient(t, r.url, c.req, 3*time.Second)
		if !strings.HasPrefix(got, "HTTP/1.1 400 ") || strings.Count(got, "HTTP/1.1 ") != 1 ||
			!strings.Contains(got, c.shape) || !strings.Contains(strings.ToLower(got), "connection: close") {
			t.Fatalf("%s: want one 400 in the client's shape and a close, got %q", c.name, got)
		}
	}
	if code, b := post(t, r.url+"/v1/chat/completions", chatBody); code != 200 {
		t.Fatalf("router not serving after the refusals: %d %s", code, b)
	}
}

// The refusal of a non-chunked Transfer-Encoding is an answer like any
// other: it carries the request id (the client's, on an inference
// endpoint; Anthropic's Request-Id and request_id on /v1/messages) and an
// access-log line. It carried none.
func TestANonChunkedTransferEncodingRefusalCarriesTheRequestID(t *testing.T) {
	up := startUpstream(t, okHandler)
	r, lines, _ := accessRouter(t, "", up.url)
	for _, tc := range []struct{ path, id, want string }{
		{"/v1/chat/completions", "te-chat", "\r\nX-Request-Id: te-chat\r\n"},
		{"/v1/messages", "te-msg", "\r\nRequest-Id: te-msg\r\n"},
		{"/v1/models", "te-models", "\r\nX-Request-Id: te-models\r\n"},
	} {
		got := rawClient(t, r.url, "POST "+tc.path+" HTTP/1.1\r\nHost: x\r\nX-Request-Id: "+tc.id+"\r\nTransfer-Encoding: identity\r\nContent-Length: 2\r\n\r\n{}", 3*time.Second)
		if !strings.HasPrefix(got, "HTTP/1.1 400 ") || !strings.Contains(got, tc.want) {
			t.Errorf("%s: want a 400 with %q, got %q", tc.path, tc.want, got)
		}
		if tc.path == "/v1/messages" && !strings.HasSuffix(got, `"request_id":"te-msg"}`) {
			t.Errorf("%s: the Anthropic error names no request_id: %q", tc.path, got)
		}
	}
	ids := byRequestID(lines())
	for _, id := range []string{"te-chat", "te-msg"} {
		if ids[id] == nil {
			t.Errorf("no access-log line for the 400 of request %s (lines: %v)", id, ids)
		}
	}
}

// A prompt of token ids is kept for routing only up to maxRouteIDs: a body
// of 16 M ids once took about 7x its size in copies (the ids, the tokens
// hashed, the prefix layer's bytes). The engine still gets every id, and
// the count is the whole prompt's.
func TestLongTokenIDPromptsAreRoutedOnTheirLeadingIDs(t *testing.T) {
	const n = 1 << 20
	var got atomic.Int64
	up := startUpstream(t, func(ctx *fasthttp.RequestCtx) {
		got.Store(int64(len(ctx.PostBody())))
		okHandler(ctx)
	})
	f := defaultFlags()
	f.RouterPolicy = "kv-aware"
	f.MaxBodyBytes, f.MaxInflightBodyBytes = 16<<20, 64<<20
	r := startRouter(t, f, nil, up.url)
	body := []byte(`{"model":"m","max_tokens":1,"prompt":[` + strings.Repeat("7,", n-1) + `7]}`)
	if code, b := post(t, r.url+"/v1/completions", string(body)); code != 200 { // warm
		t.Fatalf("%d %s", code, b)
	}
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	if code, b := post(t, r.url+"/v1/completions", string(body)); code != 200 {
		t.Fatalf("%d %s", code, b)
	}
	runtime.ReadMemStats(&after)
	if got.Load() != int64(len(body)) {
		t.Fatalf("the engine got %d body bytes, want %d", got.Load(), len(body))
	}
	// The test's own string copy, the client's request and the router's
	// body buffers are about 5x the body (11 MiB here); every id kept
	// and copied for routing made it 26x (55 MiB).
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 12*uint64(len(body)) {
		t.Fatalf("one request of %d ids (%d KiB) allocated %d KiB", n, len(body)>>10, grew>>10)
	}
}

// A request that expects 100 Continue with a Content-Length over
// --max-body-bytes gets its 413 at once, in the client's shape, and no 100
// Continue (which invited a body the router refused after 8 KiB); one
// within the limit is still granted.
func TestAnOversizedBodyThatExpectsContinueGets413BeforeIt(t *testing.T) {
	up := startUpstream(t, okHandler)
	f := defaultFlags()
	f.MaxBodyBytes = 1 << 20
	r := startRouter(t, f, nil, up.url)
	for path, shape := range map[string]string{"/v1/chat/completions": `"code":"request_too_large"`, "/v1/messages": `"type":"request_too_large"`} {
		got := rawClient(t, r.url, "POST "+path+" HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nExpect: 100-continue\r\nContent-Length: 99999999\r\n\r\n", 3*time.Second)
		if !strings.HasPrefix(got, "HTTP/1.1 413 ") || strings.Contains(got, "100 Continue") || !strings.Contains(got, shape) ||
			strings.Count(got, "HTTP/1.1 ") != 1 || !strings.Contains(strings.ToLower(got), "connection: close") {
			t.Fatalf("%s: want a 413 in the client's shape before any body, got %q", path, got)
		}
	}
	c, err := net.Dial("tcp4", strings.TrimPrefix(r.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(3 * time.Second))
	fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nExpect: 100-continue\r\nContent-Length: %d\r\n\r\n", len(chatBody))
	br := bufio.NewReader(c)
	line, err := br.ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "HTTP/1.1 100 ") {
		t.Fatalf("within the limit: want 100 Continue first, got %q %v", line, err)
	}
	br.ReadString('\n') // the blank line after it
	c.Write([]byte(chatBody))
	if line, err = br.ReadString('\n'); err != nil || !strings.HasPrefix(line, "HTTP/1.1 200 ") {
		t.Fatalf("within the limit: want 200 after the body, got %q %v", line, err)
	}
}

// A stream's first packet is a whole event with a field; comments, blank
// lines and a cut event are not, whatever the line endings.
func TestFirstPacketIsAWholeEventWithAField(t *testing.T) {
	for in, want := range map[string]bool{
		"":                               false,
		": ping\n\n":                     false,
		": ping\r\n\r\n:x\n\n":           false,
		"\n\n\n":                         false,
		"data: {\"a\"":                   false,
		": ping\n\ndata: {\"a\":1}":      false,
		"data: {}\n\n":                   true,
		": ping\r\n\r\ndata: {}\r\n\r\n": true,
		": ping\r\rdata: 1\r\r":          true,
		"event: ping\ndata: {}\n\n":      true,
		":c\ndata: x\n\n":                true,
	} {
		if got := hasEvent([]byte(in)); got != want {
			t.Errorf("hasEvent(%q) = %v, want %v", in, got, want)
		}
	}
}

func TestACommentThenAStallEndsOnTheIdleTimeoutWithoutAFirstPacketTimeout(t *testing.T) {
	for _, first := range []string{": keep-alive\n\n", "data: {\"i\""} {
		t.Run(strings.TrimSpace(first), func(t *testing.T) {
			release := make(chan struct{})
			defer close(release)
			up := startRaw(t, func(n int, req string, c net.Conn) {
				c.Write([]byte("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"))
				fmt.Fprintf(c, "%x\r\n%s\r\n", len(first), first)
				select { // stalls (bounded for the test)
				case <-release:
				case <-time.After(5 * time.Second):
				}
				c.Close()
			})
			cfg := config.Default()
			cfg.Timeouts.StreamFirstPacketSeconds = 0 // disabled
			cfg.Timeouts.StreamIdleSeconds = 0.3
			f := defaultFlags()
			f.RequestMaxRetries = 0
			r := startRouter(t, f, cfg, up.url)
			cl := &http.Client{Timeout: 2 * time.Second}
			t0 := time.Now()
			resp, err := cl.Post(r.url+"/v1/chat/completions", "application/json", strings.NewReader(streamBody))
			if err != nil {
				t.Fatalf("no answer %v after %v: the idle timeout (0.3s) never fired", err, time.Since(t0))
			}
			b, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil || !strings.Contains(string(b), "timed out") {
				t.Fatalf("after %v: %q %v", time.Since(t0), b, err)
			}
		})
	}
}

// A plain (not event-stream) answer to a stream request, relayed to a
// client that reads it slowly: the router's reads of the engine, blocked
// behind the client, come after stream_first_packet_s, which bounds only
// the wait before the commit. The worker is not blamed, and the client
// gets the whole answer.
//
// Only a committed answer tests that: under load the engine's first bytes
// may come after stream_first_packet_s, a timeout rightly blamed on the
// worker (the client has a 504), after which the test tries again with a
// fresh router and engine. The end is waited for (the request's state
// released, after the breaker was told), not slept for.
func TestASlowClientOfAPlainAnswerToAStreamRequestIsNotTheWorkersFault(t *testing.T) {
	// More than the sockets between the router and the client hold
	// (about 8 MiB on loopback here: with 8 MiB the router read the
	// whole answer before the client's pause ended, and the test passed
	// with the behaviour broken), so the router's reads of the engine
	// wait behind the slow client. The client's receive buffer is set
	// small so that its autotuning (tcp_rmem) cannot take it all.
	body := strings.Repeat("x", 16<<20)
	const firstPacket = time.Second
	const tries = 5
	for try := 1; ; try++ {
		up := startRaw(t, func(n int, req string, c net.Conn) {
			fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", len(body))
			c.Write([]byte(body))
		})
		cfg := config.Default()
		cfg.Timeouts.StreamFirstPacketSeconds = firstPacket.Seconds()
		f := defaultFlags()
		f.RequestMaxRetries = 0
		f.BreakerFailureThreshold = 1
		f.ClientWriteTimeout = 10 * time.Second
		r := startRouter(t, f, cfg, up.url)
		c, err := net.Dial("tcp4", strings.TrimPrefix(r.url, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.(*net.TCPConn).SetReadBuffer(64 << 10)
		fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s", len(streamBody), streamBody)
		c.SetReadDeadline(time.Now().Add(60 * time.Second)) // bounds the test only
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != 200 {
			// The engine's first bytes came later than
			// stream_first_packet_s (a loaded machine: more than 0.5 s
			// seen with -race and other test binaries running), a timeout
			// rightly blamed on the worker before anything was
			// committed: this try says nothing of a slow client. A
			// fresh router and engine try again.
			b, _ := io.ReadAll(resp.Body)
			if try == tries {
				t.Fatalf("no answer committed in %d tries: the last was %d %q", tries, resp.StatusCode, b)
			}
			t.Logf("try %d: %d %q before the commit; trying again", try, resp.StatusCode, b)
			continue
		}
		// A slow client, well within its write timeout: it reads
		// nothing more until a second past the first packet's deadline
		// (set before the head came), so the router's reads of the
		// engine (blocked behind the client's full socket) come after it.
		time.Sleep(firstPacket + time.Second)
		n, err := io.Copy(io.Discard, resp.Body)
		if err != nil || n != int64(len(body)) {
			t.Errorf("the slow client got %d of %d bytes (%v): the answer was cut", n, len(body), err)
		}
		// The request's end, after its outcome went to the breaker.
		for end := time.Now().Add(30 * time.Second); r.srv.states.n.Load() != 0; time.Sleep(10 * time.Millisecond) {
			if time.Now().After(end) {
				t.Fatal("the request did not end in 30 s after its answer was read")
			}
		}
		if st := r.fl.Get("w0").Breaker.State(); st != fleet.BreakerClosed {
			t.Fatalf("a slow client tripped the worker's breaker: state %d", st)
		}
		return
	}
}

// A gzip-encoded event stream (chunked; the client's Accept-Encoding is
// forwarded) shows no event in its compressed bytes: it commits on its
// first bytes. Before, readFirst looked for a whole SSE event in them, so
// a gzip stream whose end took longer than stream_first_packet_s was never
// committed: it timed out as "no first packet" and the worker was blamed.
func TestAGzipEventStreamCommitsOnItsFirstBytes(t *testing.T) {
	var first, rest bytes.Buffer
	zw := gzip.NewWriter(&first)
	zw.Write([]byte("data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"}}]}\n\n"))
	zw.Flush()
	n := first.Len()
	zw.Write([]byte("data: [DONE]\n\n"))
	zw.Close()
	rest.Write(first.Bytes()[n:])
	up := startRaw(t, func(_ int, req string, c net.Conn) {
		c.Write([]byte("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n"))
		fmt.Fprintf(c, "%x\r\n%s\r\n", n, first.Bytes()[:n])
		time.Sleep(1500 * time.Millisecond)
		fmt.Fprintf(c, "%x\r\n%s\r\n0\r\n\r\n", rest.Len(), rest.Bytes())
	})
	f := defaultFlags()
	f.RequestMaxRetries = 0
	cfg := config.Default()
	cfg.Timeouts.StreamFirstPacketSeconds = 0.5
	r := startRouter(t, f, cfg, up.url)
	req, _ := http.NewRequest("POST", r.url+"/v1/chat/completions", strings.NewReader(streamBody))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept-Encoding", "gzip")
	resp, err := (&http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableCompression: true}}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("%d %q: a gzip stream whose first event came at once was failed as having no first packet", resp.StatusCode, b)
	}
}

// A stream request (passthrough /v1/messages or /v1/responses) whose engine
// answers an error head and then stalls its body: stream_idle_s must bound
// the wait, as it does for the converted request and for an event stream.
// Before, with the default stream_total_s 0 nothing did: the client hung
// and the worker's load stayed taken until the engine closed (after the
// client left too: the relay was blocked in a read without a deadline).
func TestAStalledErrorBodyOfAStreamRequestIsBoundedByTheIdleTimeout(t *testing.T) {
	up := startRaw(t, func(n int, req string, c net.Conn) {
		c.Write([]byte("HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\nContent-Length: 200\r\n\r\n{\"type\":\"error\","))
		time.Sleep(6 * time.Second) // then the engine closes: the test ends
		c.Close()
	})
	for _, tc := range []struct{ path, body string }{
		{"/v1/messages", strings.Replace(anthropicBody, `"max_tokens"`, `"stream":true,"max_tokens"`, 1)},
		{"/v1/responses", `{"model":"m","input":"hi","stream":true}`},
	} {
		t.Run(tc.path, func(t *testing.T) {
			cfg := protoConfig(func(p *config.Protocol) { p.AnthropicPassthrough, p.ResponsesPassthrough = true, true })
			cfg.Timeouts.StreamIdleSeconds, cfg.Timeouts.StreamFirstPacketSeconds = 1, 1
			f := defaultFlags()
			f.RequestMaxRetries = 0
			r := startRouter(t, f, cfg, up.url)
			cl := &http.Client{Timeout: 3 * time.Second}
			start := time.Now()
			resp, err := cl.Post(r.url+tc.path, "application/json", strings.NewReader(tc.body))
			if err == nil {
				_, err = io.ReadAll(resp.Body)
				resp.Body.Close()
			}
			if took := time.Since(start); took > 2500*time.Millisecond {
				t.Fatalf("the answer was not bounded by stream_idle_s (1 s): still open after %v (%v)", took, err)
			}
			waitFor(t, func() bool { return r.fl.Get("w0").Load.Requests.Load() == 0 }, "load released")
		})
	}
}

// A chat stream whose usage chunk the filter removes (the client did not
// ask for usage) and whose engine ends with "data: [DONE]" and then breaks
// its connection before the event's blank line: the stream had ended, as
// the relay judges it when the client asked for usage (no filter). Before,
// with the filter the [DONE] it held was dropped, the client got an error
// event instead, and the worker was blamed.
func TestAFilteredStreamEndedByDoneThenCutIsComplete(t *testing.T) {
	chunk := func(s string) string { return fmt.Sprintf("%x\r\n%s\r\n", len(s), s) }
	up := startRaw(t, func(n int, req string, c net.Conn) {
		c.Write([]byte("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n" +
			chunk(`data: {"choices":[{"index":0,"delta":{"content":"Hi"},"finish_reason":"stop"}]}`+"\n\n") +
			chunk(`data: {"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":1}}`+"\n\n") +
			chunk("data: [DONE]\n")))
		time.Sleep(30 * time.Millisecond)
		c.(*net.TCPConn).SetLinger(0)
		c.Close()
	})
	f := defaultFlags()
	f.RequestMaxRetries = 0
	r := startRouter(t, f, nil, up.url)
	_, b := postH(t, r.url+"/v1/chat/completions", `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`, nil)
	// The request's end (its state released after the breaker is told),
	// not a fixed sleep, before the worker's failures are read.
	waitFor(t, func() bool { return r.srv.states.n.Load() == 0 }, "the request ended")
	if _, fails := r.fl.Get("w0").Counts(); strings.Contains(b, `"error"`) || !strings.Contains(b, "data: [DONE]") || fails != 0 {
		t.Fatalf("a stream ended by [DONE] got an error event or blamed the worker (failures %d):\n%q", fails, b)
	}
}

// An engine's response header whose name is not an HTTP token ("X@Y",
// "X(Y)", "X/Y") is dropped, the rest of the answer relayed: clients that
// check field names (Go's net/http, h11 under httpx) failed the whole
// exchange on it. (A value with a control byte makes the response invalid.)
func TestAnEngineHeaderClientsCannotParseIsDropped(t *testing.T) {
	up := startRaw(t, func(n int, req string, c net.Conn) {
		c.Write([]byte("HTTP/1.1 200 OK\r\nX@Engine: 1\r\nX(Y): 2\r\nX/Y: 3\r\nX-Engine-Ok: yes\r\n" +
			"Content-Type: application/json\r\nContent-Length: " + strconv.Itoa(len(okJSON)) + "\r\n\r\n" + okJSON))
	})
	r := startRouter(t, nil, nil, up.url)
	resp, err := http.Post(r.url+"/v1/chat/completions", "application/json", strings.NewReader(chatBody))
	if err != nil {
		t.Fatalf("the client could not read the router's answer: %v", err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(b) != okJSON || resp.Header.Get("X-Engine-Ok") != "yes" {
		t.Fatalf("%d %v %s", resp.StatusCode, resp.Header, b)
	}
}

// An empty completions prompt (an empty string, an empty batch, a batch
// holding an empty string or an empty token list) is refused with 400
// naming prompt, as an empty messages is: it was routed to a worker as if
// it were a prompt. A batch of non-empty prompts still goes through.
func TestAnEmptyCompletionsPromptIsRefused(t *testing.T) {
	var hits atomic.Int32
	up := startUpstream(t, func(ctx *fasthttp.RequestCtx) {
		hits.Add(1)
		okHandler(ctx)
	})
	r := startRouter(t, nil, nil, up.url)
	for _, body := range []string{
		`{"model":"m","prompt":[]}`,
		`{"model":"m","prompt":""}`,
		`{"model":"m","prompt":[[]]}`,
		`{"model":"m","prompt":["a",""]}`,
		`{"model":"m","prompt":[[1,2],[]]}`,
	} {
		code, b := post(t, r.url+"/v1/completions", body)
		if code != 400 || !strings.Contains(b, `"param":"prompt"`) {
			t.Errorf("%s: %d %s, want 400 naming prompt", body, code, trunc(b))
			continue
		}
		checkOpenAIError(t, b)
	}
	if hits.Load() != 0 {
		t.Fatalf("%d empty prompts reached the engine", hits.Load())
	}
	for _, body := range []string{`{"model":"m","prompt":["a","b"]}`, `{"model":"m","prompt":[[1,2],[3]]}`, `{"model":"m","prompt":[1,2]}`, `{"model":"m","prompt":" "}`} {
		if code, b := post(t, r.url+"/v1/completions", body); code != 200 {
			t.Errorf("%s: %d %s", body, code, trunc(b))
		}
	}
}

// A wrong key on /tokenize, /detokenize or /debug/route closes the
// connection without reading the body, as on the inference endpoints: the
// connection stayed open and up to 256 KiB of each body were read to serve
// the next request on it.
func TestAWrongKeyOnTheDebugEndpointsClosesWithoutReadingTheBody(t *testing.T) {
	up := startUpstream(t, okHandler)
	f := defaultFlags()
	f.APIKey = "sk-right"
	r := startRouter(t, f, nil, up.url)
	for _, path := range []string{"/tokenize", "/detokenize", "/debug/route"} {
		body := `{"model":"m","prompt":"` + strings.Repeat("a", 200<<10) + `"}`
		req := "POST " + path + " HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-wrong\r\nContent-Type: application/json\r\nContent-Length: " +
			strconv.Itoa(len(body)) + "\r\n\r\n" + body +
			"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-wrong\r\n\r\n"
		got := rawClient(t, r.url, req, 2*time.Second)
		if !strings.HasPrefix(got, "HTTP/1.1 401") {
			t.Fatalf("%s: %.200q", path, got)
		}
		if n := strings.Count(got, "HTTP/1.1 401"); n != 1 {
			t.Errorf("%s: the connection stayed open after a wrong key: the %d-byte body was read and the next request answered too (%d answers)", path, len(body), n)
		}
	}
}

// A chunked request's framing counts against --max-body-bytes: fasthttp
// skips chunk extensions without bound, so a body of a few bytes carried a
// GiB of extension past the limit to the engine (3.4 CPU-seconds of the
// router's, byte by byte), and fasthttp read all of it after a 404 too, to
// keep the connection. Its wire bytes may be at most twice the limit:
// beyond, 413 (the engine never sees it) or the connection closes; small
// chunks still pass.
func TestChunkExtensionsCannotCarryABodyPastTheLimit(t *testing.T) {
	up := startUpstream(t, okHandler)
	r := startRouter(t, nil, nil, up.url)
	extBytes := 32 * r.flags.MaxBodyBytes
	send := func(path string) (answer string, wrote error) {
		t.Helper()
		c, err := net.Dial("tcp4", strings.TrimPrefix(r.url, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(10 * time.Second))
		done := make(chan error, 1)
		go func() {
			w := bufio.NewWriter(c)
			fmt.Fprintf(w, "POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n%x;", path, len(chatBody))
			ext := bytes.Repeat([]byte("e"), 64<<10)
			for range extBytes / len(ext) {
				if _, err := w.Write(ext); err != nil {
					done <- err
					return
				}
			}
			fmt.Fprintf(w, "\r\n%s\r\n0\r\n\r\n", chatBody)
			done <- w.Flush()
		}()
		got, _ := io.ReadAll(c)
		return string(got), <-done
	}
	if got, _ := send("/v1/chat/completions"); !strings.HasPrefix(got, "HTTP/1.1 413 ") || up.hits.Load() != 0 {
		t.Fatalf("a %d-byte body behind %d MiB of chunk extension: engine hits %d, answer %.200q",
			len(chatBody), extBytes>>20, up.hits.Load(), got)
	}
	// (The 404 may be lost to the reset of a connection closed with the
	// client's bytes unread.)
	if got, wrote := send("/nope"); wrote == nil || got != "" && !strings.HasPrefix(got, "HTTP/1.1 404 ") {
		t.Fatalf("a 404's body behind %d MiB of chunk extension was read whole (answer %.100q)", extBytes>>20, got)
	}
	var small strings.Builder
	small.WriteString("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
	for i := range len(chatBody) {
		fmt.Fprintf(&small, "1;n=%d\r\n%c\r\n", i, chatBody[i])
	}
	small.WriteString("0\r\n\r\n")
	if got := rawClient(t, r.url, small.String()+"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", 3*time.Second); !strings.HasPrefix(got, "HTTP/1.1 200 ") ||
		strings.Count(got, "HTTP/1.1 200 ") != 2 || up.hits.Load() != 1 {
		t.Fatalf("a body in one-byte chunks, then a request on the connection: engine hits %d, answer %.300q", up.hits.Load(), got)
	}
}

// The wire bound of a chunked request (boundWire) ends with its answer: a
// chunked request that came within a few bytes of it, answered, leaves its
// keep-alive connection to serve the next request whole. The next request's
// head was read under what the chunked one left: 400 malformed HTTP request
// and a reset, for the chat the router served (readBody) and for the 404
// whose body fasthttp discarded.
func TestARequestAfterAChunkedOneNearItsWireBoundIsServed(t *testing.T) {
	up := startUpstream(t, okHandler)
	f := defaultFlags()
	f.MaxBodyBytes = 4096
	r := startRouter(t, f, nil, up.url)
	bound := 2*f.MaxBodyBytes + 64<<10
	for _, tc := range []struct{ path, status string }{{"/v1/chat/completions", "200"}, {"/nope", "404"}} {
		c, err := net.Dial("tcp4", strings.TrimPrefix(r.url, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(5 * time.Second))
		br := bufio.NewReader(c)
		fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n", tc.path)
		time.Sleep(100 * time.Millisecond) // the head alone: the bound counts every byte of the body
		head, tail := fmt.Sprintf("%x;", len(chatBody)), fmt.Sprintf("\r\n%s\r\n0\r\n\r\n", chatBody)
		io.WriteString(c, head+strings.Repeat("e", bound-16-len(head)-len(tail))+tail)
		res, err := http.ReadResponse(br, nil)
		if err != nil || !strings.HasPrefix(res.Status, tc.status) {
			t.Fatalf("%s: chunked request 16 bytes within its bound: %v %v", tc.path, res, err)
		}
		io.Copy(io.Discard, res.Body)
		time.Sleep(100 * time.Millisecond) // answered, the connection idle
		io.WriteString(c, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
		res, err = http.ReadResponse(br, nil)
		if err != nil || res.StatusCode != 200 {
			t.Fatalf("%s: the next request on the connection: %v %v", tc.path, res, err)
		}
		c.Close()
	}
}

// The answer to a connection over --max-conns has the error type of the
// router's other 503s (service_unavailable): it said
// service_unavailable_error, a type no other answer has.
func TestTheMaxConnsRefusalHasTheRoutersUnavailableType(t *testing.T) {
	if !bytes.Contains(tooManyConns, []byte(`"type":"`+typeUnavailable+`"`)) {
		t.Fatalf("--max-conns refusal %q, want the type %q", tooManyConns, typeUnavailable)
	}
}

// fasthttp's own answers to what it cannot read (431 for a head over
// --max-header-bytes, 400 for a malformed head or framing, 408 for a head
// not received within --header-timeout) carry an X-Request-Id as every
// other answer does; they had none. fasthttp resets the request before its
// error hook runs, so the path is not known: the shape is OpenAI's, on
// /v1/messages too (docs/protocols.md). A head it read whose URI it cannot
// parse was answered in OpenAI's shape without an id on /v1/messages too.
func TestFasthttpsOwnErrorAnswersCarryARequestID(t *testing.T) {
	up := startRaw(t, func(n int, req string, c net.Conn) { c.Write([]byte(jsonAnswer(okJSON))) })
	f := defaultFlags()
	f.HeaderTimeout = 300 * time.Millisecond
	r := startRouter(t, f, nil, up.url)
	ids := map[string]bool{}
	for _, tc := range []struct{ name, req, status string }{
		{"head too large", "POST /v1/messages HTTP/1.1\r\nHost: x\r\nX-Request-Id: mine\r\nBaggage: " + strings.Repeat("v", 20<<10) + "\r\n\r\n", "431"},
		{"malformed header line", "POST /v1/messages HTTP/1.1\r\nHost: x\r\nBad Header\r\nContent-Length: 2\r\n\r\n{}", "400"},
		{"two Content-Lengths", "POST /v1/messages/count_tokens HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}", "400"},
		{"head not received in time", "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n", "408"},
	} {
		got := rawClient(t, r.url, tc.req, 5*time.Second)
		head, body, _ := strings.Cut(got, "\r\n\r\n")
		if !strings.HasPrefix(head, "HTTP/1.1 "+tc.status) || !strings.HasPrefix(body, `{"error":{"message":`) {
			t.Fatalf("%s:\n%.400s", tc.name, got)
		}
		id := ""
		for _, l := range strings.Split(head, "\r\n") {
			if v, ok := strings.CutPrefix(l, "X-Request-Id: "); ok {
				id = v
			}
		}
		if len(id) != 32 || ids[id] {
			t.Fatalf("%s: X-Request-Id %q (seen: %v)\n%s", tc.name, id, ids, head)
		}
		ids[id] = true
	}
	// A head fasthttp read but whose Host is no URI it parses: the path is
	// known, and the answer is the endpoint's, with the client's id.
	got := rawClient(t, r.url, "POST /v1/messages?beta=true HTTP/1.1\r\nHost: [::1\r\nX-Request-Id: my-id-1\r\nContent-Length: 2\r\n\r\n{}", 5*time.Second)
	if !strings.HasPrefix(got, "HTTP/1.1 400") || !strings.Contains(got, "\r\nX-Request-Id: my-id-1\r\n") || !strings.Contains(got, "\r\nRequest-Id: my-id-1\r\n") ||
		!strings.HasSuffix(got, `{"type":"error","error":{"type":"invalid_request_error","message":"malformed HTTP request"},"request_id":"my-id-1"}`) {
		t.Fatalf("a bad Host on /v1/messages:\n%s", got)
	}
}

// Over NATS the sidecar relays the engine's headers as they came; the
// router drops the same ones it drops over HTTP, underscore spellings of
// them included.
func TestARelayedAnswersHeadersOverNATSAreFilteredAsOverHTTP(t *testing.T) {
	src := http.Header{}
	for _, kv := range [][2]string{
		{"Content_Length", "9999"}, {"Transfer_Encoding", "chunked"}, {"Keep_Alive", "timeout=1"}, {"Set_Cookie", "a=b"},
		{"X_Infera_Worker", "w-evil"}, {"Access_Control_Allow_Origin", "*"}, {"X_Request_Id", "rid-evil"},
		{"Keep-Alive", "timeout=1"}, {"Set-Cookie", "a=b"}, {"Connection", "X-Private"}, {"X-Private", "p"},
		{"X_Engine_Kept", "yes"}, {"X-Kept", "yes"},
	} {
		src[kv[0]] = []string{kv[1]}
	}
	var h fasthttp.ResponseHeader
	copyRelayedHeaders(&h, src)
	var got []string
	for k, v := range h.All() {
		if string(k) != "Content-Type" { // fasthttp's default
			got = append(got, string(k)+": "+string(v))
		}
	}
	slices.Sort(got)
	if want := []string{"X-Kept: yes", "X_engine_kept: yes"}; !slices.Equal(got, want) {
		t.Fatalf("client would get %q, want %q", got, want)
	}
}

// A completion given as vLLM's prompt_embeds (base64 tensors, with vLLM's
// --enable-prompt-embeds), with no prompt, is served under both policies,
// streamed or not, its body reaching the engine as written (a stream's
// with the usage request the router adds). It was refused with 400
// "prompt is required".
func TestACompletionGivenAsPromptEmbedsReachesTheEngine(t *testing.T) {
	const embeds = `"UEsDBAAACAgAAAAAAAAAAAAAAAAAAAAAAAAQABIAYXJjaGl2ZS9kYXRhLnBrbEZCDgBaWlpa"`
	var got atomic.Pointer[string]
	up := startUpstream(t, func(ctx *fasthttp.RequestCtx) {
		b := string(ctx.PostBody())
		got.Store(&b)
		if strings.Contains(b, `"stream":true`) {
			ctx.SetContentType("text/event-stream")
			ctx.SetBodyString(`data: {"id":"c","object":"text_completion","choices":[{"index":0,"text":"hi","finish_reason":"stop"}]}` + "\n\n" +
				`data: {"id":"c","object":"text_completion","choices":[],"usage":{"prompt_tokens":7,"completion_tokens":1,"total_tokens":8}}` + "\n\ndata: [DONE]\n\n")
			return
		}
		ctx.SetContentType("application/json")
		ctx.SetBodyString(`{"id":"c","object":"text_completion","choices":[{"index":0,"text":"hi","finish_reason":"stop"}],"usage":{"prompt_tokens":7,"completion_tokens":1,"total_tokens":8}}`)
	})
	for _, policy := range []string{"round-robin", "kv-aware"} {
		f := defaultFlags()
		f.RouterPolicy = policy
		r := startRouterGov(t, f, nil, nil, up.url)
		for _, body := range []string{
			`{"model":"m","prompt_embeds":` + embeds + `,"max_tokens":4}`,
			`{"model":"m","prompt_embeds":[` + embeds + `,` + embeds + `],"prompt":null,"max_tokens":4}`,
			`{"model":"m","prompt_embeds":` + embeds + `,"max_tokens":4,"stream":true}`,
		} {
			code, b := post(t, r.url+"/v1/completions", body)
			if code != 200 || !strings.Contains(b, `"hi"`) {
				t.Fatalf("%s: %s: %d %s", policy, body, code, trunc(b))
			}
			seen := got.Load()
			if seen == nil || !strings.Contains(*seen, embeds) {
				t.Fatalf("%s: the engine got %q", policy, *seen)
			}
			if !strings.Contains(body, `"stream":true`) && *seen != body {
				t.Fatalf("%s: the engine got %s, want the client's body %s", policy, *seen, body)
			}
		}
	}
}

// A request with Expect: 100-continue whose answer does not depend on its
// body (an unknown path, a method the endpoint does not take, a missing or
// wrong key, an HTTP version refused) is answered at once, with no 100
// Continue, and the connection closes without its body being read. A 404
// was preceded by a 100 Continue and the router waited for the body before
// answering; an HTTP/1.0 request waited for its body before its 426.
func TestARequestThatExpectsContinueIsAnsweredAtOnceWhenItsBodyCannotMatter(t *testing.T) {
	up := startUpstream(t, okHandler)
	f := defaultFlags()
	f.APIKey = "sk-expect"
	r := startRouter(t, f, nil, up.url)
	key := "Authorization: Bearer sk-expect\r\n"
	for _, tc := range []struct{ name, head, status, shape string }{
		{"unknown path", "POST /nope HTTP/1.1\r\nHost: x\r\n" + key, "404", `"code":"unknown_path"`},
		{"unknown Anthropic path", "POST /v1/messages/nope HTTP/1.1\r\nHost: x\r\n" + key, "404", `"type":"not_found_error"`},
		{"wrong method", "PUT /v1/chat/completions HTTP/1.1\r\nHost: x\r\n" + key, "405", `"code":"method_not_allowed"`},
		{"no key", "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n", "401", `"code":"invalid_api_key"`},
		{"wrong key", "POST /v1/messages HTTP/1.1\r\nHost: x\r\nx-api-key: wrong\r\n", "401", `"type":"authentication_error"`},
		{"wrong key on /tokenize", "POST /tokenize HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer wrong\r\n", "401", `"code":"invalid_api_key"`},
		// HTTP/1.0 has no 100 Continue (RFC 9110 10.1.1), but its client
		// may hold its body back for one: the 426 waited for the body.
		{"HTTP/1.0", "POST /v1/chat/completions HTTP/1.0\r\nHost: x\r\n" + key, "426", `"code":"http_version_not_supported"`},
		{"HTTP/1.0 with a query", "POST /v1/messages?beta=true HTTP/1.0\r\nHost: x\r\n" + key, "426", `"type":"invalid_request_error"`},
		{"HTTP/2.0", "POST /v1/chat/completions HTTP/2.0\r\nHost: x\r\n" + key, "505", `"code":"http_version_not_supported"`},
	} {
		c, err := net.Dial("tcp4", strings.TrimPrefix(r.url, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		c.SetDeadline(start.Add(time.Second))
		fmt.Fprintf(c, "%sContent-Type: application/json\r\nExpect: 100-continue\r\nContent-Length: %d\r\n\r\n", tc.head, len(chatBody))
		got, err := io.ReadAll(c) // the answer, then the close
		c.Close()
		if err != nil || !strings.HasPrefix(string(got), "HTTP/1.1 "+tc.status+" ") || strings.Contains(string(got), "100 Continue") ||
			!strings.Contains(string(got), tc.shape) || !strings.Contains(strings.ToLower(string(got)), "connection: close") {
			t.Errorf("%s: want %s at once, no 100 Continue, then a close; got after %v (%v):\n%s", tc.name, tc.status, time.Since(start), err, got)
		}
	}
	// A request whose answer depends on its body still gets the 100.
	c, err := net.Dial("tcp4", strings.TrimPrefix(r.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(3 * time.Second))
	fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n%sContent-Type: application/json\r\nExpect: 100-continue\r\nContent-Length: %d\r\n\r\n", key, len(chatBody))
	br := bufio.NewReader(c)
	if line, err := br.ReadString('\n'); err != nil || !strings.HasPrefix(line, "HTTP/1.1 100 ") {
		t.Fatalf("with the key: want 100 Continue first, got %q %v", line, err)
	}
	br.ReadString('\n')
	c.Write([]byte(chatBody))
	if line, err := br.ReadString('\n'); err != nil || !strings.HasPrefix(line, "HTTP/1.1 200 ") {
		t.Fatalf("with the key: want 200 after the body, got %q %v", line, err)
	}
}
