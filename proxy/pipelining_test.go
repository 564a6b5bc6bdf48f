package proxy

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

// rawChat is a chat request on a keep-alive connection.
func rawChat(path string) string {
	return "POST " + path + " HTTP/1.1\r\nHost: r\r\nContent-Type: application/json\r\nContent-Length: " +
		strconv.Itoa(len(chatBody)) + "\r\n\r\n" + chatBody
}

// readRawAnswer reads one answer off br within 5 s.
func readRawAnswer(t *testing.T, c net.Conn, br *bufio.Reader) (int, string) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("reading an answer: %v", err)
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatalf("reading an answer's body: %v", err)
	}
	return resp.StatusCode, string(b)
}

// Requests pipelined on one connection all get their answers, in order,
// whether they came in one write or one right behind another's answer.
func TestPipelinedRequestsAllGetTheirAnswersInOrder(t *testing.T) {
	up := startUpstream(t, okHandler)
	r := startRouter(t, nil, nil, up.url)
	c, err := net.Dial("tcp4", strings.TrimPrefix(r.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	br := bufio.NewReader(c)
	req := rawChat("/v1/chat/completions")
	if _, err := io.WriteString(c, req+req+req); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		if code, b := readRawAnswer(t, c, br); code != 200 || !strings.Contains(b, `"hi"`) {
			t.Fatalf("pipelined answer %d: %d %s", i, code, b)
		}
	}
	// A GET with a body the router does not read, with a slow request
	// right behind it: the first answer does not wait for the second.
	slow := startUpstream(t, func(ctx *fasthttp.RequestCtx) {
		time.Sleep(time.Second)
		okHandler(ctx)
	})
	r2 := startRouter(t, nil, nil, slow.url)
	c2, err := net.Dial("tcp4", strings.TrimPrefix(r2.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	br2 := bufio.NewReader(c2)
	if _, err := io.WriteString(c2, "GET /health HTTP/1.1\r\nHost: r\r\nContent-Length: 5\r\n\r\nhello"+rawChat("/v1/chat/completions")); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if code, b := readRawAnswer(t, c2, br2); code != 200 {
		t.Fatalf("health: %d %s", code, b)
	}
	if d := time.Since(start); d > 700*time.Millisecond {
		t.Fatalf("the first answer took %v: it waited for the slow request behind it", d)
	}
	if code, b := readRawAnswer(t, c2, br2); code != 200 || !strings.Contains(b, `"hi"`) {
		t.Fatalf("the slow request: %d %s", code, b)
	}
}

// A request pipelined while the one before it is still being answered
// (it reaches the socket after the router read the first, before the
// first's answer is written) is answered at once. An answer written
// together with the wait for the next request (sockio.WriteAwaitReply, as
// the upstream exchange does, to save the read(2) that finds nothing
// after most answers) left it unanswered until the idle timeout: the
// wait's readiness reset forgets bytes already in the socket.
func TestARequestPipelinedDuringTheLastAnswerIsAnsweredAtOnce(t *testing.T) {
	slow := startUpstream(t, func(ctx *fasthttp.RequestCtx) {
		time.Sleep(200 * time.Millisecond)
		okHandler(ctx)
	})
	r := startRouter(t, nil, nil, slow.url)
	c, err := net.Dial("tcp4", strings.TrimPrefix(r.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	br := bufio.NewReader(c)
	start := time.Now()
	io.WriteString(c, rawChat("/v1/chat/completions"))
	time.Sleep(50 * time.Millisecond)
	io.WriteString(c, rawChat("/v1/chat/completions"))
	for i := 0; i < 2; i++ {
		if code, b := readRawAnswer(t, c, br); code != 200 || !strings.Contains(b, `"hi"`) {
			t.Fatalf("answer %d: %d %s", i, code, b)
		}
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("two answers took %v", d)
	}
}
