package proxy

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime/debug"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/infera/infera/fleet"
	"github.com/infera/infera/internal/netpeek"
)

// The router's HTTP/1.1 client to engines (upstream.go), against engines
// that answer in legal but less common ways, over real sockets.

// urBreakersClosed fails the test when a worker's breaker is not closed:
// the engine's answers were not the worker's fault.
func urBreakersClosed(t *testing.T, r *testRouter) {
	t.Helper()
	for _, w := range r.fl.View().All {
		if st := fleet.BreakerStateName(w.Breaker.State()); st != "closed" {
			t.Errorf("%s breaker %s", w.ID, st)
		}
	}
}

// urChat is a chat completion request that closes the client connection.
func urChat(body string) string {
	return "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
		strconv.Itoa(len(body)) + "\r\nConnection: close\r\n\r\n" + body
}

func TestEveryTokenOfTheEnginesConnectionHeaderIsHopByHop(t *testing.T) {
	up := startRaw(t, func(n int, req string, c net.Conn) {
		c.Write([]byte("HTTP/1.1 200 OK\r\n" +
			"Connection: keep-alive, a, b, c, d, e, f, g, h, i, j, k, l, m, n, o, X-Hop\r\n" +
			"Connection: p, q, r, s, t, u, v, w, X-Hop-Two\r\n" +
			"X-Hop: secret\r\nX-Hop-Two: secret\r\nX-Kept: yes\r\n" +
			"Content-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"))
	})
	r := startRouter(t, nil, nil, up.url)
	for i := 0; i < 2; i++ { // the second response reuses the pooled connection's token spans
		resp := strings.ToLower(rawClient(t, r.url, urChat(chatBody), 2*time.Second))
		if strings.Contains(resp, "x-hop") || strings.Contains(resp, "secret") {
			t.Fatalf("a header the engine's Connection header names reached the client:\n%s", resp)
		}
		if !strings.HasPrefix(resp, "http/1.1 200") || !strings.Contains(resp, "x-kept: yes") {
			t.Fatalf("client got:\n%s", resp)
		}
	}
}

// urRaceEnabled reports whether the test binary runs under the race
// detector (which allocates on its own).
func urRaceEnabled() bool {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return false
	}
	for _, s := range bi.Settings {
		if s.Key == "-race" {
			return s.Value == "true"
		}
	}
	return false
}

func TestConnectionTokensBeyondEightAreKeptWithoutAllocating(t *testing.T) {
	var toks []string
	for i := 0; i < 40; i++ {
		toks = append(toks, fmt.Sprintf("X-T%d", i))
	}
	resp := []byte("HTTP/1.1 200 OK\r\nConnection: " + strings.Join(toks[:20], ", ") +
		"\r\nConnection: close," + strings.Join(toks[20:], ",") + "\r\nContent-Length: 0\r\n\r\n")
	rd := bytes.NewReader(resp)
	c := &upConn{br: bufio.NewReaderSize(rd, 4096)}
	parse := func() {
		rd.Reset(resp)
		c.br.Reset(rd)
		if err := c.readHead(); err != nil {
			t.Fatal(err)
		}
	}
	parse()
	for _, k := range toks {
		if !c.NamedByConnection([]byte(strings.ToLower(k))) {
			t.Fatalf("%s is named by Connection but not seen so", k)
		}
	}
	if c.NamedByConnection([]byte("X-T40")) || c.NamedByConnection([]byte("Content-Length")) {
		t.Fatal("a header Connection does not name is seen as named")
	}
	if !c.CloseAfter {
		t.Fatal("Connection: close among other tokens is not seen")
	}
	if urRaceEnabled() {
		return
	}
	if a := testing.AllocsPerRun(100, parse); a != 0 {
		t.Fatalf("parsing a response with 40 Connection tokens allocates %v times per response on a reused connection", a)
	}
	// A connection does not keep a hostile engine's long list.
	c.ConnTokens = make([][2]int, 0, upMaxConnTokens+1)
	c.resetResponse()
	if c.ConnTokens != nil {
		t.Fatalf("a connection keeps %d token spans between responses", cap(c.ConnTokens))
	}
}

func TestAnEarlyHintsAnswerIsSkipped(t *testing.T) {
	var hits atomic.Int64
	up := startRaw(t, func(n int, req string, c net.Conn) {
		hits.Add(1)
		c.Write([]byte("HTTP/1.1 103 Early Hints\r\nLink: </x>; rel=preload\r\n\r\n" +
			"HTTP/1.1 102 Processing\r\n\r\n" + jsonAnswer(okJSON)))
	})
	f := defaultFlags()
	f.RequestMaxRetries = 0
	r := startRouter(t, f, nil, up.url)
	for i := 0; i < 2; i++ {
		if code, b := post(t, r.url+"/v1/chat/completions", chatBody); code != 200 || b != okJSON {
			t.Fatalf("engine answered 103, 102, then 200; client got %d %s", code, trunc(b))
		}
	}
	if n := hits.Load(); n != 2 {
		t.Fatalf("the engine got %d requests for 2", n)
	}
	urBreakersClosed(t, r)
}

func TestInterimAnswersAreSkippedWithinBounds(t *testing.T) {
	final := "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
	interim := func(n int, hdr string) string {
		return strings.Repeat("HTTP/1.1 103 Early Hints\r\n"+hdr+"\r\n", n)
	}
	ok := func(in string) {
		t.Helper()
		st, body, reuse, err := parseResponse([]byte(in))
		if err != nil || st != 200 || string(body) != "ok" || !reuse {
			t.Fatalf("%.80q: status %d body %q reuse %v err %v", in, st, body, reuse, err)
		}
	}
	refused := func(in string, want error) {
		t.Helper()
		if _, _, _, err := parseResponse([]byte(in)); !errors.Is(err, want) {
			t.Fatalf("%.80q: err %v, want %v", in, err, want)
		}
	}
	ok(interim(1, "Link: </a>; rel=preload\r\n") + final)
	ok("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 102 Processing\r\n\r\nHTTP/1.1 199 Misc\r\nX: 1\r\n\r\n" + final)
	ok(interim(upMaxInterim, "") + final)
	// The interim answer's headers are not the final answer's (valid ones:
	// net/http, the worker's engine client, fails an answer whose interim
	// head has two Content-Lengths or a coding but chunked, and so does h1).
	ok(interim(1, "Content-Length: 5\r\nConnection: close\r\n") + final)
	refused(interim(1, "Transfer-Encoding: gzip\r\n")+final, errUpMalformed)
	refused(interim(upMaxInterim+1, "")+final, errUpInterim)
	big := "Link: " + strings.Repeat("x", 3000) + "\r\n"
	refused(interim(5, strings.Repeat(big, 5))+final, errUpInterim) // 5 x 15 KB > 64 KB
	refused("HTTP/1.1 103 Early Hints\r\n\r\nHTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n", errUpUpgrade)
}

func TestATransferCodingOtherThanChunkedIsRefused(t *testing.T) {
	up := startRaw(t, func(n int, req string, c net.Conn) {
		gz := "\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff\xab\xae\x05\x00\x43\xbf\xa6\xa3\x02\x00\x00\x00" // gzip("{}")
		c.Write([]byte(fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: gzip, chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n", len(gz), gz)))
	})
	f := defaultFlags()
	f.RequestMaxRetries = 0
	r := startRouter(t, f, nil, up.url)
	code, b := post(t, r.url+"/v1/chat/completions", chatBody)
	if code != 502 {
		t.Fatalf("engine answered with Transfer-Encoding: gzip, chunked; client got %d %q", code, trunc(b))
	}

	bad := func(in string) {
		t.Helper()
		if _, _, _, err := parseResponse([]byte(in)); !errors.Is(err, errUpMalformed) {
			t.Fatalf("%q: err %v", in, err)
		}
	}
	body := "\r\n\r\n2\r\nok\r\n0\r\n\r\n"
	bad("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked" + body)
	bad("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, chunked" + body)
	bad("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\nTransfer-Encoding: chunked" + body)
	bad("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked" + body)
	bad("HTTP/1.1 200 OK\r\nTransfer-Encoding: identity" + body)
	bad("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked;q=1" + body)
	for _, te := range []string{"chunked", "Chunked", "CHUNKED"} {
		st, got, _, err := parseResponse([]byte("HTTP/1.1 200 OK\r\nTransfer-Encoding:  " + te + " " + body))
		if err != nil || st != 200 || string(got) != "ok" {
			t.Fatalf("Transfer-Encoding: %s: %d %q %v", te, st, got, err)
		}
	}
}

// urLimitedEngine is an engine with a body limit: it answers 413 to a
// request whose Content-Length is over limit as soon as it has read the
// head, and closes without reading the body (as body-limited servers do).
// With answer408OnReuse it answers 408 instead on a connection that served
// a request before (an idle close crossing the request).
type urLimitedEngine struct {
	url              string
	heads, conns     atomic.Int64
	answer408OnReuse bool
}

func startLimitedEngine(t *testing.T, limit int, answer408OnReuse bool) *urLimitedEngine {
	t.Helper()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	e := &urLimitedEngine{url: "http://" + ln.Addr().String(), answer408OnReuse: answer408OnReuse}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			e.conns.Add(1)
			go func() {
				defer c.Close()
				c.SetDeadline(time.Now().Add(10 * time.Second))
				br := bufio.NewReader(c)
				for served := 0; ; served++ {
					cl := 0
					for {
						line, err := br.ReadString('\n')
						if err != nil {
							return
						}
						if line == "\r\n" {
							break
						}
						if k, v, ok := strings.Cut(line, ":"); ok && strings.EqualFold(k, "Content-Length") {
							cl, _ = strconv.Atoi(strings.TrimSpace(v))
						}
					}
					e.heads.Add(1)
					if cl > limit {
						if e.answer408OnReuse && served > 0 {
							c.Write([]byte("HTTP/1.1 408 Request Timeout\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"))
							return
						}
						b := `{"error":{"message":"payload too large"}}`
						c.Write([]byte("HTTP/1.1 413 Payload Too Large\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: " + strconv.Itoa(len(b)) + "\r\n\r\n" + b))
						return // close with the body unread: the router's write is reset
					}
					if _, err := io.CopyN(io.Discard, br, int64(cl)); err != nil {
						return
					}
					c.Write([]byte(jsonAnswer(okJSON)))
				}
			}()
		}
	}()
	return e
}

func TestAnEngineAnswerSentWhileTheBodyIsWrittenReachesTheClient(t *testing.T) {
	e0, e1 := startLimitedEngine(t, 1<<20, false), startLimitedEngine(t, 1<<20, false)
	f := defaultFlags()
	f.MaxBodyBytes = 32 << 20
	r := startRouter(t, f, nil, e0.url, e1.url)
	big := `{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("a", 8<<20) + `"}]}`
	for i := 0; i < 4; i++ {
		// Odd rounds go to a pooled connection (the even round's small
		// request left it there): the body is written on a reused one.
		if i%2 == 1 {
			for j := 0; j < 2; j++ {
				if code, b := post(t, r.url+"/v1/chat/completions", chatBody); code != 200 {
					t.Fatalf("small request: %d %s", code, trunc(b))
				}
			}
		}
		code, b := post(t, r.url+"/v1/chat/completions", big)
		if code != 413 || !strings.Contains(b, "payload too large") {
			t.Fatalf("big request %d: the engine answered 413; client got %d %s", i, code, trunc(b))
		}
	}
	urBreakersClosed(t, r)
	// 4 big requests, each sent once (no retry), and 4 small ones.
	if n := e0.heads.Load() + e1.heads.Load(); n != 8 {
		t.Fatalf("the engines got %d requests for 8: a 413 was retried", n)
	}
}

func TestAnEarly408OnAReusedConnectionIsAnIdleCloseNotAnAnswer(t *testing.T) {
	e := startLimitedEngine(t, 1<<20, true)
	f := defaultFlags()
	f.MaxBodyBytes = 32 << 20
	f.RequestMaxRetries = 0
	r := startRouter(t, f, nil, e.url)
	if code, b := post(t, r.url+"/v1/chat/completions", chatBody); code != 200 {
		t.Fatalf("small request: %d %s", code, trunc(b))
	}
	// On the pooled connection the engine says 408 and closes (an idle
	// close that crossed the request); on a fresh one it answers 413.
	big := `{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("a", 8<<20) + `"}]}`
	code, b := post(t, r.url+"/v1/chat/completions", big)
	if code != 413 {
		t.Fatalf("client got %d %s, want the fresh connection's 413", code, trunc(b))
	}
	if n := e.conns.Load(); n != 2 {
		t.Fatalf("engine saw %d connections, want 2", n)
	}
	urBreakersClosed(t, r)
}

func TestThePoolNeverHandsOutAConnectionAnAbortClosed(t *testing.T) {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { // echo
				defer c.Close()
				c.SetDeadline(time.Now().Add(10 * time.Second))
				io.Copy(c, c)
			}()
		}
	}()
	p := newHTTPPool(&fleet.Worker{Addr: ln.Addr().String()}, 0, time.Second)
	defer p.closeIdle(true)
	deadline := time.Now().Add(5 * time.Second)
	c, _, err := p.get(deadline)
	if err != nil {
		t.Fatal(err)
	}
	fd := c.fd
	if fd < 0 {
		t.Skip("no socket descriptor on this platform")
	}
	p.put(c)
	c.abort() // a stale abort slot closes the idle connection underneath the pool

	// The descriptor number is free: the next socket opened takes it (the
	// kernel hands out the lowest free number).
	var others []net.Conn
	defer func() {
		for _, o := range others {
			o.Close()
		}
	}()
	var thief net.Conn
	for i := 0; i < 20 && thief == nil; i++ {
		o, err := net.DialTimeout("tcp4", ln.Addr().String(), time.Second)
		if err != nil {
			t.Fatal(err)
		}
		others = append(others, o)
		if netpeek.SockFD(o) == fd {
			thief = o
		}
	}

	got, reused, err := p.get(deadline)
	if err != nil {
		t.Fatal(err)
	}
	defer got.closeConn()
	if reused || got.wasAborted() {
		t.Fatalf("the pool handed out the connection an abort closed (reused %v, aborted %v)", reused, got.wasAborted())
	}
	p.mu.Lock()
	open := p.open
	p.mu.Unlock()
	if open != 1 {
		t.Fatalf("pool counts %d open connections, want 1", open)
	}
	if thief == nil {
		t.Log("the descriptor was not reused by this test's socket; only the aborted flag was exercised")
		return
	}
	// The socket that took the descriptor number is untouched.
	thief.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := thief.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	var buf [4]byte
	if _, err := io.ReadFull(thief, buf[:]); err != nil || string(buf[:]) != "ping" {
		t.Fatalf("the socket that reused the descriptor: %q %v", buf, err)
	}
}
