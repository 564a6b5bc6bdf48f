package proxy

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

// Benchmarks and allocation bounds of the protocol front doors through the
// real router (client, router and upstream in this process, over
// loopback). The conversion's own cost is the difference between a
// /v1/messages (or /v1/responses) request and the same prompt sent as a
// chat completion, run side by side.

// sseChunks is a pooled streamed chat answer: one event per Read, so the
// router relays it in several reads, as it does an engine's stream.
type sseChunks struct {
	events [][]byte
	i      int
}

var sseChunksPool = sync.Pool{New: func() any { return &sseChunks{} }}

func (s *sseChunks) Read(p []byte) (int, error) {
	if s.i >= len(s.events) {
		return 0, io.EOF
	}
	n := copy(p, s.events[s.i])
	s.i++
	return n, nil
}

func (s *sseChunks) Close() error {
	s.i = 0
	sseChunksPool.Put(s)
	return nil
}

// benchStreamEvents is a chat stream of 10 text deltas, a finish chunk, a
// usage chunk and [DONE].
var benchStreamEvents = func() [][]byte {
	head := `data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"m",`
	var evs [][]byte
	evs = append(evs, []byte(head+`"choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}`+"\n\n"))
	for i := 0; i < 10; i++ {
		evs = append(evs, []byte(head+`"choices":[{"index":0,"delta":{"content":" word"},"finish_reason":null}]}`+"\n\n"))
	}
	evs = append(evs, []byte(head+`"choices":[{"index":0,"delta":{},"finish_reason":"length"}]}`+"\n\n"))
	evs = append(evs, []byte(head+`"choices":[],"usage":`+engineUsage+"}\n\n"))
	evs = append(evs, []byte("data: [DONE]\n\n"))
	return evs
}()

var (
	keyStreamTrue = []byte(`"stream":true`)
	answerJSON    = []byte(`{"id":"c1","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"` +
		strings.Repeat("word ", 100) + `"},"finish_reason":"length"}],"usage":` + engineUsage + `}`)
)

// benchEngine answers chat completions without allocating: a pooled
// chunked stream, or a fixed JSON answer.
func benchEngine(ctx *fasthttp.RequestCtx) {
	if bytes.Contains(ctx.PostBody(), keyStreamTrue) {
		s := sseChunksPool.Get().(*sseChunks)
		s.events, s.i = benchStreamEvents, 0
		ctx.SetContentType("text/event-stream")
		ctx.SetBodyStream(s, -1)
		return
	}
	ctx.SetContentType("application/json")
	ctx.SetBody(answerJSON)
}

// prompt1K is about 1 KB of user text.
var prompt1K = strings.Repeat("The router converts this prompt. ", 31)

// Bodies of one request with a 1 KB prompt, per front door.
var (
	bench1KChat      = `{"model":"m","max_tokens":128,"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"` + prompt1K + `"}]}`
	bench1KMessages  = `{"model":"m","max_tokens":128,"system":"Be brief.","messages":[{"role":"user","content":"` + prompt1K + `"}]}`
	bench1KResponses = `{"model":"m","max_output_tokens":128,"instructions":"Be brief.","input":"` + prompt1K + `"}`
)

func streamed(body string) string {
	return strings.Replace(body, `{"model":"m",`, `{"model":"m","stream":true,`, 1)
}

// protoClient prepares a request of body to path.
func protoClient(tb testing.TB, url, path, body string) (*fasthttp.HostClient, *fasthttp.Request) {
	hc, req := benchClient(tb, url, false)
	req.SetRequestURI(url + path)
	req.SetBodyString(body)
	return hc, req
}

type protoCase struct {
	name, path, body string
}

var protoCases = []protoCase{
	{"chat", "/v1/chat/completions", bench1KChat},
	{"messages", "/v1/messages", bench1KMessages},
	{"responses", "/v1/responses", bench1KResponses},
	{"chat-stream", "/v1/chat/completions", streamed(bench1KChat)},
	{"messages-stream", "/v1/messages", streamed(bench1KMessages)},
	{"responses-stream", "/v1/responses", streamed(bench1KResponses)},
}

// BenchmarkProtocols1KPrompt sends one request with a 1 KB prompt through
// the router per op, per front door; the conversion's cost is the
// difference to "chat" (non-streaming) and "chat-stream" (streaming, 10
// deltas). cpu-ns/op is the process's CPU time per request (client, router
// and engine together; only the router's work differs between cases).
func BenchmarkProtocols1KPrompt(b *testing.B) {
	for _, policy := range []string{"round-robin", "kv-aware"} {
		up := startUpstream(b, benchEngine)
		f := defaultFlags()
		f.RouterPolicy = policy
		r := startRouter(b, f, nil, up.url)
		for _, c := range protoCases {
			b.Run(policy+"/"+c.name, func(b *testing.B) {
				hc, req := protoClient(b, r.url, c.path, c.body)
				resp := fasthttp.AcquireResponse()
				for i := 0; i < 100; i++ { // warm pools and connections
					hc.Do(req, resp)
				}
				b.ReportAllocs()
				b.ResetTimer()
				cpu := processCPU()
				for i := 0; i < b.N; i++ {
					if err := hc.Do(req, resp); err != nil || resp.StatusCode() != 200 {
						b.Fatal(err, resp.StatusCode(), string(resp.Body()))
					}
				}
				b.ReportMetric(float64(processCPU()-cpu)/float64(b.N), "cpu-ns/op")
			})
		}
	}
}

// BenchmarkChatStreamUsage measures a chat stream whose client did not ask
// for usage (the router asks the engine and filters the usage chunk out)
// next to one that asked (relayed as is).
func BenchmarkChatStreamUsage(b *testing.B) {
	up := startUpstream(b, benchEngine)
	r := startRouter(b, nil, nil, up.url)
	asked := strings.Replace(streamed(bench1KChat), `"stream":true`, `"stream":true,"stream_options":{"include_usage":true}`, 1)
	for _, c := range []protoCase{{"filtered", "/v1/chat/completions", streamed(bench1KChat)}, {"asked", "/v1/chat/completions", asked}} {
		b.Run(c.name, func(b *testing.B) {
			hc, req := protoClient(b, r.url, c.path, c.body)
			resp := fasthttp.AcquireResponse()
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if err := hc.Do(req, resp); err != nil || resp.StatusCode() != 200 {
					b.Fatal(err, resp.StatusCode())
				}
			}
		})
	}
}

// protoAllocs measures allocations per request of c through a router.
func protoAllocs(t *testing.T, r *testRouter, c protoCase, check func([]byte)) float64 {
	t.Helper()
	hc, req := protoClient(t, r.url, c.path, c.body)
	resp := fasthttp.AcquireResponse()
	do := func() {
		if err := hc.Do(req, resp); err != nil || resp.StatusCode() != 200 {
			t.Fatal(c.name, err, resp.StatusCode(), string(resp.Body()))
		}
	}
	for i := 0; i < 200; i++ { // warm pools and connections
		do()
	}
	check(resp.Body())
	return testing.AllocsPerRun(1000, do)
}

// benchConn sends one prepared HTTP/1.1 request at a time on a keep-alive
// connection and reads the answer with a fixed buffer, discarding the body:
// the same small, allocation-free cost whatever the answer's size, so that
// differences between front doors are the router's.
type benchConn struct {
	c   net.Conn
	br  *bufio.Reader
	req []byte
}

func newBenchConn(tb testing.TB, url, path, body string) *benchConn {
	addr := strings.TrimPrefix(url, "http://")
	c, err := net.Dial("tcp4", addr)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { c.Close() })
	req := fmt.Sprintf("POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", path, addr, len(body), body)
	return &benchConn{c: c, br: bufio.NewReaderSize(c, 64<<10), req: []byte(req)}
}

// hasPrefixFold reports whether b starts with the lower-case ASCII s,
// ignoring case.
func hasPrefixFold(b []byte, s string) bool {
	return len(b) >= len(s) && eqFold(b[:len(s)], s)
}

// atoiBase parses the digits at the start of b (after spaces) in base 10
// or 16.
func atoiBase(b []byte, base int) int {
	b = bytes.TrimSpace(b)
	n := 0
	for _, c := range b {
		var d int
		switch {
		case c >= '0' && c <= '9':
			d = int(c - '0')
		case base == 16 && c|0x20 >= 'a' && c|0x20 <= 'f':
			d = int(c|0x20-'a') + 10
		default:
			return n
		}
		n = n*base + d
	}
	return n
}

// do sends the request and reads the whole answer; it returns the status.
func (r *benchConn) do() (int, error) {
	if _, err := r.c.Write(r.req); err != nil {
		return 0, err
	}
	line, err := r.br.ReadSlice('\n')
	if err != nil || len(line) < 12 {
		return 0, fmt.Errorf("status line: %v", err)
	}
	status := int(line[9]-'0')*100 + int(line[10]-'0')*10 + int(line[11]-'0')
	clen, chunked := -1, false
	for {
		line, err = r.br.ReadSlice('\n')
		if err != nil {
			return 0, err
		}
		if len(line) <= 2 {
			break
		}
		switch {
		case hasPrefixFold(line, "content-length:"):
			clen = atoiBase(line[len("content-length:"):], 10)
		case hasPrefixFold(line, "transfer-encoding: chunked"):
			chunked = true
		}
	}
	if !chunked {
		_, err = r.br.Discard(clen)
		return status, err
	}
	for {
		line, err = r.br.ReadSlice('\n')
		if err != nil {
			return 0, err
		}
		n := atoiBase(line, 16)
		if _, err = r.br.Discard(n + 2); err != nil || n == 0 {
			return status, err
		}
	}
}

// BenchmarkConversionOverhead1K measures what converting costs through the
// router: blocks of 50 chat completions and 50 requests of the same 1 KB
// prompt through a protocol front door alternate in one run (so both see
// the same load on a shared machine), and the process CPU time of each
// kind is summed apart. added-cpu-ns/op is the conversion's cost per
// request (request, answer or stream, and the router's extra steps);
// allocs/op counts both requests of a pair. The client is benchConn, whose
// cost does not grow with the answer.
func BenchmarkConversionOverhead1K(b *testing.B) {
	up := startUpstream(b, benchEngine)
	r := startRouter(b, nil, nil, up.url)
	for _, p := range []struct {
		name       string
		base, conv protoCase
	}{
		{"messages", protoCases[0], protoCases[1]},
		{"responses", protoCases[0], protoCases[2]},
		{"messages-stream", protoCases[3], protoCases[4]},
		{"responses-stream", protoCases[3], protoCases[5]},
	} {
		b.Run(p.name, func(b *testing.B) {
			a := newBenchConn(b, r.url, p.base.path, p.base.body)
			c := newBenchConn(b, r.url, p.conv.path, p.conv.body)
			do := func(rc *benchConn) {
				if status, err := rc.do(); err != nil || status != 200 {
					b.Fatal(status, err)
				}
			}
			for i := 0; i < 100; i++ {
				do(a)
				do(c)
			}
			const block = 50
			var cpuA, cpuB time.Duration
			b.ReportAllocs()
			b.ResetTimer()
			for done := 0; done < b.N; {
				k := min(block, b.N-done)
				t0 := processCPU()
				for i := 0; i < k; i++ {
					do(a)
				}
				t1 := processCPU()
				for i := 0; i < k; i++ {
					do(c)
				}
				cpuA, cpuB = cpuA+t1-t0, cpuB+processCPU()-t1
				done += k
			}
			n := float64(b.N)
			b.ReportMetric(float64(cpuA)/n, "chat-cpu-ns/op")
			b.ReportMetric(float64(cpuB)/n, "conv-cpu-ns/op")
			b.ReportMetric(float64(cpuB-cpuA)/n, "added-cpu-ns/op")
		})
	}
}
