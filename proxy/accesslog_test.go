package proxy

import (
	"bufio"
	"encoding/json"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/infera/infera/config"
	"github.com/valyala/fasthttp"
)

// accessRouter starts a router whose access log is a file in a temporary
// directory; lines reads what was logged so far (it closes the log, so it
// is called once, when the requests are done).
func accessRouter(t *testing.T, key string, urls ...string) (r *testRouter, lines func() []map[string]any, path string) {
	t.Helper()
	path = filepath.Join(t.TempDir(), "access.log")
	l, err := OpenAccessLog(path)
	if err != nil {
		t.Fatal(err)
	}
	f := defaultFlags()
	f.APIKey = key
	r = startRouterWith(t, f, nil, func(o *Options) { o.AccessLog = l }, urls...)
	t.Cleanup(func() { l.Close() })
	return r, func() []map[string]any {
		t.Helper()
		r.srv.Shutdown() // every request is over and released
		l.Close()
		return readAccessLog(t, path)
	}, path
}

func readAccessLog(t *testing.T, path string) []map[string]any {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSuffix(string(b), "\n"), "\n") {
		if line == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("access log line is not JSON: %q: %v", line, err)
		}
		out = append(out, m)
	}
	return out
}

func byRequestID(lines []map[string]any) map[string]map[string]any {
	m := map[string]map[string]any{}
	for _, l := range lines {
		m[l["request_id"].(string)] = l
	}
	return m
}

func send(t *testing.T, method, url, key, reqID, body string) (*http.Response, string) {
	t.Helper()
	req, _ := http.NewRequest(method, url, strings.NewReader(body))
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	if reqID != "" {
		req.Header.Set("X-Request-Id", reqID)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var sb strings.Builder
	bufio.NewReader(resp.Body).WriteTo(&sb)
	return resp, sb.String()
}

// Every inference request gets one JSON line: status, endpoint, model,
// worker, usage, timings, the request id the client and the engine saw,
// whatever the outcome (200, streamed, 401, 404, 405); no line holds the
// key or the prompt.
func TestTheAccessLogHasOneLinePerRequestAndNoSecrets(t *testing.T) {
	var engineIDs sync.Map
	up := startUpstream(t, func(ctx *fasthttp.RequestCtx) {
		if ids := ctx.Request.Header.PeekAll("X-Request-Id"); len(ids) == 1 { // never the client's and the router's both
			engineIDs.Store(string(ids[0]), true)
		}
		ctx.Response.Header.Set("X-Request-Id", "engine-own-id") // replaced by the router's
		if strings.Contains(string(ctx.PostBody()), `"stream":true`) {
			(&sseUpstream{n: 3}).handler(ctx)
			return
		}
		ctx.SetContentType("application/json")
		ctx.SetBodyString(`{"choices":[{"message":{"content":"ok"}}],"usage":{"prompt_tokens":7,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":4}}}`)
	})
	const key = "sk-access-log-key-123"
	r, lines, _ := accessRouter(t, key, up.url)
	prompt := `{"model":"m","max_tokens":2,"messages":[{"role":"user","content":"a confidential prompt"}]}`

	resp, _ := send(t, "POST", r.url+"/v1/chat/completions", key, "client-id-1", prompt)
	if resp.StatusCode != 200 || resp.Header.Get("X-Request-Id") != "client-id-1" || len(resp.Header.Values("X-Request-Id")) != 1 {
		t.Fatalf("client id: %d %v", resp.StatusCode, resp.Header.Values("X-Request-Id"))
	}
	resp, _ = send(t, "POST", r.url+"/v1/chat/completions", key, "", strings.Replace(prompt, `"max_tokens"`, `"stream":true,"max_tokens"`, 1))
	streamID := resp.Header.Get("X-Request-Id")
	if resp.StatusCode != 200 || len(streamID) != 32 {
		t.Fatalf("generated id: %d %q", resp.StatusCode, streamID)
	}
	// Ids that are not 1-128 visible ASCII characters are replaced.
	for _, bad := range []string{"has space", strings.Repeat("x", 129)} {
		resp, _ = send(t, "POST", r.url+"/v1/chat/completions", key, bad, prompt)
		if got := resp.Header.Get("X-Request-Id"); got == bad || len(got) != 32 {
			t.Fatalf("id %q answered as %q", bad, got)
		}
	}
	resp, _ = send(t, "POST", r.url+"/v1/chat/completions", "wrong-key", "unauth-1", prompt)
	if resp.StatusCode != 401 {
		t.Fatalf("wrong key: %d", resp.StatusCode)
	}
	send(t, "POST", r.url+"/v1/chat/completions", key, "nomodel-1", strings.Replace(prompt, `"m"`, `"nope"`, 1))
	send(t, "GET", r.url+"/v1/chat/completions", key, "get-1", "")
	send(t, "POST", r.url+"/v1/messages", key, "anthropic-1", `{"model":"nope","max_tokens":2,"messages":[{"role":"user","content":"hi"}]}`)
	for _, id := range []string{"client-id-1", streamID} {
		if _, ok := engineIDs.Load(id); !ok {
			t.Fatalf("the engine did not get request id %q", id)
		}
	}

	got := lines()
	if len(got) != 8 {
		t.Fatalf("%d lines, want 8: %v", len(got), got)
	}
	all, _ := json.Marshal(got)
	for _, secret := range []string{key, "confidential", "wrong-key", "Bearer"} {
		if strings.Contains(string(all), secret) {
			t.Fatalf("the access log holds %q: %s", secret, all)
		}
	}
	ids := byRequestID(got)
	want := func(id string, fields map[string]any) {
		t.Helper()
		l := ids[id]
		if l == nil {
			t.Fatalf("no line for %s in %v", id, got)
		}
		for k, v := range fields {
			if l[k] != v {
				t.Fatalf("%s: %s = %v (%T), want %v: %v", id, k, l[k], l[k], v, l)
			}
		}
		if _, err := time.Parse(time.RFC3339Nano, l["time"].(string)); err != nil {
			t.Fatalf("%s: time %v", id, l["time"])
		}
		if l["client"] != "127.0.0.1" || l["duration_ms"].(float64) < 0 {
			t.Fatalf("%s: %v", id, l)
		}
	}
	want("client-id-1", map[string]any{"path": "/v1/chat/completions", "status": 200.0, "model": "m", "stream": false,
		"worker": "w0", "prompt_tokens": 7.0, "completion_tokens": 2.0, "cached_tokens": 4.0, "end": "complete"})
	if ids["client-id-1"]["ttft_ms"] == nil {
		t.Fatal("no ttft_ms for an answered request")
	}
	want(streamID, map[string]any{"status": 200.0, "stream": true, "worker": "w0", "prompt_tokens": 5.0, "completion_tokens": 3.0, "end": "complete"})
	want("unauth-1", map[string]any{"status": 401.0, "error": "invalid_api_key"})
	if l := ids["unauth-1"]; l["model"] != nil || l["worker"] != nil || l["ttft_ms"] != nil {
		t.Fatalf("a refused request's line says more than it knows: %v", l)
	}
	want("nomodel-1", map[string]any{"status": 404.0, "model": "nope", "error": "model_not_found"})
	want("get-1", map[string]any{"status": 405.0, "error": "method_not_allowed"})
	want("anthropic-1", map[string]any{"status": 404.0, "path": "/v1/messages", "error": "not_found_error"})
	if l := ids["client-id-1"]; l["error"] != nil || l["retries"] != nil {
		t.Fatalf("an answered request's line has an error or retries: %v", l)
	}
}

// A stream the client leaves, one the engine breaks, and a request whose
// client left before its answer (499) say so in "end".
func TestTheAccessLogTellsHowAStreamEnded(t *testing.T) {
	slow := &sseUpstream{n: 200, delay: 10 * time.Millisecond}
	var broken, slowJSON atomic.Bool
	up := startUpstream(t, func(ctx *fasthttp.RequestCtx) {
		if slowJSON.Load() { // the engine is still at work when the client leaves
			time.Sleep(300 * time.Millisecond)
			ctx.SetContentType("application/json")
			ctx.SetBodyString(`{"choices":[]}`)
			return
		}
		if broken.Load() {
			ctx.HijackSetNoResponse(true)
			ctx.Hijack(func(c net.Conn) { // the engine dies mid-stream
				c.Write([]byte("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n" +
					"10\r\ndata: {\"i\":0}\n\n\r\n"))
			})
			return
		}
		slow.handler(ctx)
	})
	r, lines, _ := accessRouter(t, "", up.url)
	streamBody := `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`

	// A client that leaves before any of the answer was written (499).
	slowJSON.Store(true)
	early, err := net.Dial("tcp", strings.TrimPrefix(r.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	plain := `{"model":"m","messages":[{"role":"user","content":"hi"}]}`
	early.Write([]byte("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Request-Id: early-leaver\r\nContent-Type: application/json\r\nContent-Length: " +
		strconv.Itoa(len(plain)) + "\r\n\r\n" + plain))
	time.Sleep(50 * time.Millisecond)
	early.Close()
	time.Sleep(400 * time.Millisecond)
	slowJSON.Store(false)

	conn, err := net.Dial("tcp", strings.TrimPrefix(r.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	conn.Write([]byte("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Request-Id: leaver\r\nContent-Type: application/json\r\nContent-Length: " +
		strconv.Itoa(len(streamBody)) + "\r\n\r\n" + streamBody))
	br := bufio.NewReader(conn)
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasPrefix(line, "data: ") {
			break
		}
	}
	conn.Close()
	waitUntil(t, "the engine sees the client leave", func() bool { return slow.writeErrs.Load() > 0 })

	broken.Store(true)
	if resp, b := send(t, "POST", r.url+"/v1/chat/completions", "", "broken", streamBody); resp.StatusCode != 200 || !strings.HasPrefix(b, "data: {\"i\":0}") {
		t.Fatalf("broken stream: %d %q", resp.StatusCode, b)
	}

	ids := byRequestID(lines())
	if l := ids["leaver"]; l == nil || l["end"] != "client_gone" || l["status"] != 200.0 {
		t.Fatalf("leaver: %v", l)
	}
	if l := ids["broken"]; l == nil || l["end"] != "upstream_error" {
		t.Fatalf("broken: %v", l)
	}
	if l := ids["early-leaver"]; l == nil || l["end"] != "client_gone" || l["status"] != 499.0 {
		t.Fatalf("a client that left before the answer: %v", l)
	}
}

// logrotate moves the file and sends SIGHUP: Reopen writes the next lines
// to a new file at the path.
func TestTheAccessLogReopensAfterRotation(t *testing.T) {
	up := startUpstream(t, okHandler)
	r, lines, path := accessRouter(t, "", up.url)
	send(t, "POST", r.url+"/v1/chat/completions", "", "before", chatBody)
	waitUntil(t, "the first line written", func() bool {
		b, _ := os.ReadFile(path)
		return strings.Contains(string(b), `"before"`)
	})
	if err := os.Rename(path, path+".1"); err != nil {
		t.Fatal(err)
	}
	if err := r.srv.access.Reopen(); err != nil {
		t.Fatal(err)
	}
	send(t, "POST", r.url+"/v1/chat/completions", "", "after", chatBody)
	now := lines()
	old := readAccessLog(t, path+".1")
	if len(old) != 1 || old[0]["request_id"] != "before" || len(now) != 1 || now[0]["request_id"] != "after" {
		t.Fatalf("rotated file %v, new file %v", old, now)
	}
}

// blockingWriter stands for a disk that stopped: writes wait for release.
type blockingWriter struct {
	release chan struct{}
	n       atomic.Int64
}

func (w *blockingWriter) Write(p []byte) (int, error) {
	<-w.release
	w.n.Add(int64(len(p)))
	return len(p), nil
}

// A writer that cannot keep up never holds a request: lines beyond
// maxPending bytes are dropped and counted.
func TestAStalledAccessLogDropsLinesInsteadOfBlocking(t *testing.T) {
	w := &blockingWriter{release: make(chan struct{})}
	l := NewAccessLog(w)
	line := []byte(strings.Repeat("x", 4095) + "\n")
	dropped := mAccessDropped.Get()
	done := make(chan struct{})
	go func() {
		for i := 0; i < 3*maxPending/len(line); i++ {
			l.add(line)
		}
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("adding lines blocked behind a stalled writer")
	}
	if n := mAccessDropped.Get() - dropped; n < uint64(maxPending/len(line)) {
		t.Fatalf("%d lines dropped", n)
	}
	close(w.release)
	l.Close()
	if n := w.n.Load(); n == 0 || n > 2*maxPending {
		t.Fatalf("%d bytes written", n)
	}
}

// Lines added while the log closes (a request ending during shutdown) are
// dropped; none panics on the closed wake-up channel.
func TestAddingLinesWhileTheAccessLogClosesIsSafe(t *testing.T) {
	for round := 0; round < 50; round++ {
		l := NewAccessLog(io.Discard)
		line := []byte(strings.Repeat("y", flushAt+1023) + "\n") // every line crosses flushAt: a wake-up per line
		var wg sync.WaitGroup
		stop := make(chan struct{})
		for g := 0; g < 4; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					select {
					case <-stop:
						return
					default:
						l.add(line)
					}
				}
			}()
		}
		time.Sleep(2 * time.Millisecond)
		l.Close()
		time.Sleep(time.Millisecond)
		close(stop)
		wg.Wait()
	}
}

// A request that failed over to another worker says how many it tried
// before the one that answered.
func TestTheAccessLogCountsRetries(t *testing.T) {
	up := startUpstream(t, okHandler)
	path := filepath.Join(t.TempDir(), "access.log")
	l, err := OpenAccessLog(path)
	if err != nil {
		t.Fatal(err)
	}
	f := defaultFlags()
	f.RouterPolicy = "round-robin"
	r := startRouterWith(t, f, nil, func(o *Options) { o.AccessLog = l }, deadURL(t), up.url)
	for i := 0; i < 4; i++ {
		if resp, _ := send(t, "POST", r.url+"/v1/chat/completions", "", "r"+strconv.Itoa(i), chatBody); resp.StatusCode != 200 {
			t.Fatalf("request %d: %d", i, resp.StatusCode)
		}
	}
	r.srv.Shutdown()
	l.Close()
	retried := 0
	for _, line := range readAccessLog(t, path) {
		if line["retries"] == 1.0 && line["worker"] == "w1" {
			retried++
		}
	}
	if retried == 0 {
		t.Fatal("no line says a request was retried past the dead worker")
	}
}

// An inference request answered 413 before its body (Expect: 100-continue
// with a Content-Length over --max-body-bytes, answered from fasthttp's
// hook) has its X-Request-Id and its access-log line, as every inference
// answer does: the handler never ran, and it had neither.
func TestAnAnswerBeforeTheBodyHasItsRequestIDAndAccessLogLine(t *testing.T) {
	up := startUpstream(t, okHandler)
	r, lines, _ := accessRouter(t, "", up.url)
	big := 2 << 20 // over defaultFlags' 1 MiB
	for _, tc := range []struct{ id, extra string }{{"over-expect", "Expect: 100-continue\r\n"}, {"over-plain", ""}} {
		req := "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Request-Id: " + tc.id + "\r\nContent-Type: application/json\r\n" + tc.extra +
			"Content-Length: " + strconv.Itoa(big) + "\r\n\r\n"
		if tc.extra == "" {
			req += strings.Repeat("a", 16<<10)
		}
		got := rawClient(t, r.url, req, 2*time.Second)
		if !strings.HasPrefix(got, "HTTP/1.1 413") {
			t.Fatalf("%s: %.200q", tc.id, got)
		}
		if !strings.Contains(got, "X-Request-Id: "+tc.id+"\r\n") {
			t.Errorf("%s: the 413 carries no X-Request-Id (\"every inference answer carries X-Request-Id\"): %q", tc.id, got)
		}
	}
	ids := byRequestID(lines())
	for _, id := range []string{"over-expect", "over-plain"} {
		if ids[id] == nil {
			t.Errorf("no access-log line for the 413 of request %s (lines: %v)", id, ids)
		}
	}
}

// A request every attempt of which failed names the last worker it tried,
// as operations.md says: when the retry found no other candidate (the one
// worker was dead) the line named none.
func TestTheAccessLogNamesTheLastWorkerTriedWhenEveryAttemptFailed(t *testing.T) {
	path := filepath.Join(t.TempDir(), "access.log")
	l, err := OpenAccessLog(path)
	if err != nil {
		t.Fatal(err)
	}
	r := startRouterWith(t, defaultFlags(), nil, func(o *Options) { o.AccessLog = l }, deadURL(t))
	if resp, body := send(t, "POST", r.url+"/v1/chat/completions", "", "dead-1", chatBody); resp.StatusCode < 500 {
		t.Fatalf("a dead worker answered %d: %s", resp.StatusCode, body)
	}
	r.srv.Shutdown()
	l.Close()
	got := readAccessLog(t, path)
	if len(got) != 1 || got[0]["worker"] != "w0" {
		t.Fatalf("want one line naming w0: %v", got)
	}
}

// An engine's error answer to a stream request (plain JSON, not an event
// stream) names its error code in the access log however it arrives: in
// one read, as over HTTP with a Content-Length, or in several, as a chunked
// body or NATS's head, body and end messages bring it. A stream request's
// error answer was committed on its first read and relayed, so a body that
// came in two reads left the line without its error (over NATS every
// stream request's engine error did).
func TestTheAccessLogNamesAStreamRequestsErrorAnswerThatArrivesInParts(t *testing.T) {
	up := startUpstream(t, func(ctx *fasthttp.RequestCtx) {
		ctx.HijackSetNoResponse(true)
		ctx.Hijack(func(c net.Conn) {
			c.Write([]byte("HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n" +
				"13\r\n{\"error\":{\"message\"\r\n"))
			time.Sleep(50 * time.Millisecond)
			c.Write([]byte("2f\r\n:\"busy\",\"type\":\"x\",\"code\":\"engine_overloaded\"}}\r\n0\r\n\r\n"))
			time.Sleep(50 * time.Millisecond)
			c.Close()
		})
	})
	path := filepath.Join(t.TempDir(), "access.log")
	l, err := OpenAccessLog(path)
	if err != nil {
		t.Fatal(err)
	}
	f := defaultFlags()
	f.RequestMaxRetries = 0 // the answer is relayed, not kept aside for another attempt
	r := startRouterWith(t, f, nil, func(o *Options) { o.AccessLog = l }, up.url)
	streamBody := `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`
	resp, b := send(t, "POST", r.url+"/v1/chat/completions", "", "err-in-parts", streamBody)
	if resp.StatusCode != 503 || b != `{"error":{"message":"busy","type":"x","code":"engine_overloaded"}}` {
		t.Fatalf("relayed: %d %q", resp.StatusCode, b)
	}
	r.srv.Shutdown()
	l.Close()
	got := byRequestID(readAccessLog(t, path))["err-in-parts"]
	if got == nil || got["status"] != 503.0 || got["error"] != "engine_overloaded" {
		t.Fatalf("want status 503 and error engine_overloaded: %v", got)
	}
}

// A count_tokens request the router answers itself (conversion mode)
// names the model the client asked for, as every line does; it had none.
func TestTheAccessLogNamesTheModelOfACountTokensRequest(t *testing.T) {
	up := startUpstream(t, okHandler)
	r, lines, _ := accessRouter(t, "", up.url)
	resp, b := send(t, "POST", r.url+"/v1/messages/count_tokens", "", "count-1",
		`{"model":"m","messages":[{"role":"user","content":"hello there"}]}`)
	if resp.StatusCode != 200 {
		t.Fatalf("count_tokens: %d %s", resp.StatusCode, b)
	}
	got := byRequestID(lines())["count-1"]
	if got == nil || got["path"] != "/v1/messages/count_tokens" || got["model"] != "m" {
		t.Fatalf("want the count_tokens line to name model m: %v", got)
	}
}

// A request smart model selection classified names its tier in the access
// log, and whether the classifier chose it or it is the fallback tier (the
// classifier failed): the line said "model":"auto" and nothing else of the
// choice, which only the decision header (off by default) showed.
func TestTheAccessLogNamesTheTierSmartSelectionChose(t *testing.T) {
	cls := startUpstream(t, func(ctx *fasthttp.RequestCtx) {
		if strings.Contains(string(ctx.PostBody()), "broken") {
			ctx.SetStatusCode(500)
			return
		}
		ctx.SetBodyString(`{"tier":"L3"}`)
	})
	up := startUpstream(t, okHandler)
	r, lines, _ := accessRouter(t, "", up.url)
	cfg := config.Default()
	cfg.SmartModelSelection = config.SmartModelSelection{Enabled: true, ClassifierURL: cls.url + "/v1/classify",
		TimeoutMS: 10000, FallbackTier: "L1", MatchModels: []string{"auto"},
		Tiers: config.TierModels{L1: "m", L2: "m", L3: "m"}, MaxTextBytes: 8192}
	r.store.Set(cfg)
	for id, body := range map[string]string{
		"classified": `{"model":"auto","messages":[{"role":"user","content":"hard"}]}`,
		"fallback":   `{"model":"auto","messages":[{"role":"user","content":"broken"}]}`,
		"asked-m":    `{"model":"m","messages":[{"role":"user","content":"hard"}]}`,
	} {
		if resp, b := send(t, "POST", r.url+"/v1/chat/completions", "", id, body); resp.StatusCode != 200 {
			t.Fatalf("%s: %d %s", id, resp.StatusCode, b)
		}
	}
	got := byRequestID(lines())
	for id, want := range map[string][3]any{
		"classified": {"auto", "L3", "classifier"},
		"fallback":   {"auto", "L1", "fallback"},
		"asked-m":    {"m", nil, nil}, // not classified: no tier
	} {
		l := got[id]
		if l == nil || l["model"] != want[0] || l["tier"] != want[1] || l["tier_source"] != want[2] {
			t.Fatalf("%s: line %v, want model %v, tier %v from %v", id, l, want[0], want[1], want[2])
		}
	}
}

// TestANewRequestIDIs32HexDigitsAfterWhatWasThere: appendRequestID writes
// 32 lower-case hex digits after dst's bytes, and two ids differ.
func TestANewRequestIDIs32HexDigitsAfterWhatWasThere(t *testing.T) {
	a := appendRequestID([]byte("id="))
	if len(a) != 3+32 || string(a[:3]) != "id=" {
		t.Fatalf("%q", a)
	}
	for _, c := range a[3:] {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			t.Fatalf("not a hex digit in %q", a)
		}
	}
	if b := appendRequestID(nil); len(b) != 32 || string(b) == string(a[3:]) {
		t.Fatalf("%q after %q", b, a)
	}
}

// TestNibblesAreWrittenAsHexDigitsLowestFirst: appendNibblesHex writes
// what a digit-by-digit loop writes (the request id's format).
func TestNibblesAreWrittenAsHexDigitsLowestFirst(t *testing.T) {
	ref := func(v uint64) string {
		var b []byte
		for j := 0; j < 16; j++ {
			b = append(b, "0123456789abcdef"[v&15])
			v >>= 4
		}
		return string(b)
	}
	vs := []uint64{0, 1, 9, 10, 15, 16, 0xffffffffffffffff, 0x0123456789abcdef, 0xfedcba9876543210, 0xa0a0a0a0a0a0a0a0, 0x9999999999999999}
	r := rand.New(rand.NewPCG(3, 4))
	for range 100000 {
		vs = append(vs, r.Uint64())
	}
	for _, v := range vs {
		if got, want := string(appendNibblesHex([]byte("x"), v)), "x"+ref(v); got != want {
			t.Fatalf("%#x: %s, want %s", v, got, want)
		}
	}
}
