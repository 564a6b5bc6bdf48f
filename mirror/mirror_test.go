package mirror

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/infera/infera/config"
	"github.com/infera/infera/internal/testsrv"
	"github.com/valyala/fasthttp"
)

// target is a real HTTP server on loopback playing the mirror target: it
// records every request it receives and answers as told.
type target struct {
	url string
	srv *http.Server

	mu   sync.Mutex
	reqs []received

	// answer writes the response; default: a JSON completion with usage.
	answer func(w http.ResponseWriter, r *http.Request)
	hits   atomic.Int64
}

type received struct {
	method, uri string
	header      http.Header
	body        []byte
	ctxErr      error // the request context's error after the answer (cancelled by the client?)
}

func startTarget(t testing.TB, answer func(w http.ResponseWriter, r *http.Request)) *target {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tg := &target{url: "http://" + ln.Addr().String(), answer: answer}
	if tg.answer == nil {
		tg.answer = func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, `{"id":"x","choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":11,"completion_tokens":7,"total_tokens":18}}`)
		}
	}
	tg.srv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		tg.answer(w, r)
		tg.mu.Lock()
		tg.reqs = append(tg.reqs, received{method: r.Method, uri: r.RequestURI, header: r.Header.Clone(), body: body, ctxErr: r.Context().Err()})
		tg.mu.Unlock()
		tg.hits.Add(1)
	})}
	go tg.srv.Serve(ln)
	t.Cleanup(func() { tg.srv.Close() })
	return tg
}

func (tg *target) received() []received {
	tg.mu.Lock()
	defer tg.mu.Unlock()
	return append([]received(nil), tg.reqs...)
}

func mirrorCfg(addr string) *config.Mirror {
	return &config.Mirror{Enabled: true, TargetAddress: addr, SamplingRatio: 100, TimeoutMS: 5000, QueueSize: 1024, Concurrency: 16}
}

// logBuf is a concurrency-safe log sink.
type logBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuf) lines(t testing.TB) []map[string]any {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []map[string]any
	for _, ln := range bytes.Split(bytes.TrimSpace(l.b.Bytes()), []byte("\n")) {
		if len(ln) == 0 {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal(ln, &m); err != nil {
			t.Fatalf("log line %q: %v", ln, err)
		}
		out = append(out, m)
	}
	return out
}

func (l *logBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func startMirror(t testing.TB) (*Mirror, *logBuf) {
	lb := &logBuf{}
	m := New(Options{Logger: slog.New(slog.NewJSONHandler(lb, nil))})
	t.Cleanup(m.Close)
	return m, lb
}

func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	for i := 0; i < 500; i++ {
		if cond() {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("timed out waiting for %s", what)
}

// The proxy calls Offer from a fasthttp handler with the request's path
// and body, which fasthttp reuses once the handler returns. Requests full
// of client credentials go through a real fasthttp front server; the
// target receives the exact bodies, only the mirror's token, and none of
// the client's identifying headers.
func TestMirrorForwardsCopiesWithItsTokenAndNoClientCredentials(t *testing.T) {
	tg := startTarget(t, nil)
	m, _ := startMirror(t)
	cfg := mirrorCfg(tg.url)
	cfg.AuthToken = config.NewSecret("mirror-token-123")

	front := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		// The request id the router gives Offer (here the client's).
		m.Offer(cfg, ctx.Path(), ctx.PostBody(), ctx.Request.Header.Peek("X-Request-Id"), false)
		ctx.SetBodyString("ok")
	}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go front.Serve(ln)
	defer front.Shutdown()

	clientSecrets := []string{"client-key-SECRET", "sess-SECRET", "cookie-SECRET", "org-SECRET", "proxy-SECRET", "ip-SECRET", "user-SECRET"}
	const n = 50
	hc := &fasthttp.Client{}
	for i := 0; i < n; i++ {
		req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
		req.SetRequestURI(fmt.Sprintf("http://%s/v1/chat/completions?api-key=q-SECRET", ln.Addr()))
		req.Header.SetMethod("POST")
		req.Header.Set("Authorization", "Bearer client-key-SECRET")
		req.Header.Set("X-Session-Id", "sess-SECRET")
		req.Header.Set("Cookie", "sid=cookie-SECRET")
		req.Header.Set("OpenAI-Organization", "org-SECRET")
		req.Header.Set("Proxy-Authorization", "Basic proxy-SECRET")
		req.Header.Set("X-Forwarded-For", "ip-SECRET")
		req.Header.Set("X-Api-Key", "client-key-SECRET")
		req.Header.Set("X-User", "user-SECRET")
		req.Header.Set("X-Request-Id", fmt.Sprintf("req-%d", i))
		req.SetBodyString(fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":"request %d"}]}`, i))
		if err := hc.Do(req, resp); err != nil || resp.StatusCode() != 200 {
			t.Fatalf("front: %v %d", err, resp.StatusCode())
		}
		fasthttp.ReleaseRequest(req)
		fasthttp.ReleaseResponse(resp)
	}
	eventually(t, "all mirrored", func() bool { return tg.hits.Load() == n })
	seen := map[string]bool{}
	for _, r := range tg.received() {
		if r.method != "POST" || r.uri != "/v1/chat/completions" {
			t.Fatalf("target got %s %s", r.method, r.uri)
		}
		if got := r.header.Get("Authorization"); got != "Bearer mirror-token-123" {
			t.Fatalf("target got Authorization %q, want the mirror's token", got)
		}
		for k, vs := range r.header {
			switch k {
			case "Authorization", "Content-Type", "Accept", "User-Agent", "X-Infera-Mirror", "Content-Length", "X-Request-Id":
			default:
				t.Fatalf("target got header %s: %v, outside the mirror's list", k, vs)
			}
			for _, v := range vs {
				for _, s := range clientSecrets {
					if strings.Contains(v, s) {
						t.Fatalf("client credential %q reached the target in %s", s, k)
					}
				}
			}
		}
		if strings.Contains(r.uri, "SECRET") {
			t.Fatalf("query string reached the target: %s", r.uri)
		}
		var body struct {
			Model    string `json:"model"`
			Messages []struct{ Content string }
		}
		if err := json.Unmarshal(r.body, &body); err != nil || body.Model != "m" || len(body.Messages) != 1 {
			t.Fatalf("target got body %q (%v)", r.body, err)
		}
		if want := "req-" + strings.TrimPrefix(body.Messages[0].Content, "request "); r.header.Get("X-Request-Id") != want {
			t.Fatalf("the copy of %q carried X-Request-Id %q, want %q", body.Messages[0].Content, r.header.Get("X-Request-Id"), want)
		}
		seen[body.Messages[0].Content] = true
	}
	for i := 0; i < n; i++ {
		if !seen[fmt.Sprintf("request %d", i)] {
			t.Fatalf("request %d never reached the target intact (got %d distinct)", i, len(seen))
		}
	}
	eventually(t, "the ok counter to reach n", func() bool { return m.m.ok.Get() == n })
}

func TestMirrorSubstitutesTheTargetModel(t *testing.T) {
	f := func(body, want string) {
		t.Helper()
		if got := string(replaceModel(nil, []byte(body), "canary-v2")); got != want {
			t.Fatalf("replaceModel(%s)\n got %s\nwant %s", body, got, want)
		}
	}
	f(`{"model":"m","stream":true}`, `{"model":"canary-v2","stream":true}`)
	f(`{ "stream" : true , "model" :  "m" ,"x":1}`, `{ "stream" : true , "model" :  "canary-v2" ,"x":1}`)
	f(`{"messages":[{"role":"user","content":"{\"model\":\"m\"}"}],"metadata":{"model":"keep"},"model":"m"}`,
		`{"messages":[{"role":"user","content":"{\"model\":\"m\"}"}],"metadata":{"model":"keep"},"model":"canary-v2"}`)
	f(`{"model":"a","model":"b"}`, `{"model":"canary-v2","model":"canary-v2"}`)
	f(`{"mod\u0065l":"a"}`, `{"mod\u0065l":"canary-v2"}`)
	f(`{"model":null}`, `{"model":"canary-v2"}`)
	f(`{"x":1}`, `{"x":1}`)
	f(`[1]`, `[1]`)
	f(`{"model":`, `{"model":`)
	if got := string(replaceModel(nil, []byte(`{"model":"m"}`), "a\"b")); got != `{"model":"a\"b"}` {
		t.Fatalf("model not escaped: %s", got)
	}

	tg := startTarget(t, nil)
	m, _ := startMirror(t)
	cfg := mirrorCfg(tg.url)
	cfg.TargetModel = "canary-v2"
	body := []byte(`{"model":"prod","messages":[{"role":"user","content":"hi"}]}`)
	m.Offer(cfg, []byte("/v1/chat/completions"), body, nil, false)
	eventually(t, "mirrored", func() bool { return tg.hits.Load() == 1 })
	if got := string(tg.received()[0].body); got != `{"model":"canary-v2","messages":[{"role":"user","content":"hi"}]}` {
		t.Fatalf("target got %s", got)
	}
	if string(body) != `{"model":"prod","messages":[{"role":"user","content":"hi"}]}` {
		t.Fatal("the client's body was modified")
	}
}

func TestMirrorSamplingRatio(t *testing.T) {
	m, _ := startMirror(t)
	m.send = func(*job) {}
	cfg := mirrorCfg("http://127.0.0.1:1")
	count := func(ratio float64, n int) int {
		c := *cfg
		c.SamplingRatio = ratio
		before := m.m.sampled.Get()
		for i := 0; i < n; i++ {
			m.Offer(&c, []byte("/v1/completions"), []byte(`{}`), nil, false)
		}
		// Sampled, whether queued or dropped for a full queue.
		return int(m.m.sampled.Get() - before)
	}
	if k := count(0, 1000); k != 0 {
		t.Fatalf("0%%: %d sampled", k)
	}
	if k := count(100, 500); k != 500 {
		t.Fatalf("100%%: %d of 500 sampled", k)
	}
	// 25% of 4000: mean 1000, sd 27; allow 6 sd.
	if k := count(25, 4000); k < 1000-165 || k > 1000+165 {
		t.Fatalf("25%%: %d of 4000 sampled", k)
	}
	if k := count(0.5, 4000); k < 2 || k > 60 {
		t.Fatalf("0.5%%: %d of 4000 sampled", k)
	}
	off := *cfg
	off.Enabled = false
	if m.Offer(&off, []byte("/v1/completions"), []byte(`{}`), nil, false) {
		t.Fatal("disabled mirror sampled")
	}
}

// A full queue drops (counted) at once instead of blocking the request.
func TestMirrorQueueFullDrops(t *testing.T) {
	release := make(chan struct{})
	tg := startTarget(t, func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
		w.WriteHeader(200)
	})
	defer close(release)
	m, _ := startMirror(t)
	cfg := mirrorCfg(tg.url)
	cfg.QueueSize = 3
	cfg.Concurrency = 1
	// One in flight, then the dispatcher holds one waiting for a slot,
	// then the queue holds 3: at most 5 accepted of 20.
	accepted := 0
	for i := 0; i < 20; i++ {
		if m.Offer(cfg, []byte("/v1/completions"), []byte(`{"model":"m"}`), nil, false) {
			accepted++
		}
		if i == 0 {
			eventually(t, "first request at the target", func() bool { return m.active.Load() == 1 })
		}
	}
	if accepted < 3 || accepted > 5 {
		t.Fatalf("accepted %d with queue_size 3 and concurrency 1, want 3..5", accepted)
	}
	if got := m.m.droppedFull.Get(); int(got) != 20-accepted {
		t.Fatalf("queue_full counter %d, want %d", got, 20-accepted)
	}
	if got := m.m.sampled.Get(); got != 20 {
		t.Fatalf("sampled counter %d, want 20", got)
	}
}

// The bytes held by request copies are bounded by max_buffer_bytes, and
// every byte is given back when the jobs end.
func TestMirrorByteBudgetDropsAndIsGivenBack(t *testing.T) {
	release := make(chan struct{})
	tg := startTarget(t, func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
		w.WriteHeader(200)
	})
	m, _ := startMirror(t)
	cfg := mirrorCfg(tg.url)
	body := []byte(`{"model":"m","prompt":"` + strings.Repeat("x", 1000) + `"}`)
	path := []byte("/v1/completions")
	per := int64(len(body) + len(path))
	cfg.MaxBufferBytes = 3*per + per/2 // room for 3 copies
	accepted := 0
	for i := 0; i < 10; i++ {
		if m.Offer(cfg, path, body, nil, false) {
			accepted++
		}
	}
	if accepted != 3 || m.m.droppedFull.Get() != 7 {
		t.Fatalf("accepted %d, dropped %d; want 3 and 7", accepted, m.m.droppedFull.Get())
	}
	if got := m.held.Load(); got != 3*per {
		t.Fatalf("held %d bytes, want %d", got, 3*per)
	}
	close(release)
	eventually(t, "the budget given back", func() bool { return m.held.Load() == 0 && m.m.ok.Get() == 3 })
	if !m.Offer(cfg, path, body, nil, false) {
		t.Fatal("offer refused once the budget was free")
	}
}

// The timeout covers queueing and sending: a slow target's request is
// cancelled, and jobs that expire while waiting for a sender are dropped
// without being sent.
func TestMirrorTimeoutDropsExpiredRequests(t *testing.T) {
	tg := startTarget(t, func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-time.After(5 * time.Second):
		case <-r.Context().Done():
		}
		w.WriteHeader(200)
	})
	m, lb := startMirror(t)
	cfg := mirrorCfg(tg.url)
	cfg.TimeoutMS = 100
	cfg.Concurrency = 1
	cfg.LogRecording = true
	for i := 0; i < 4; i++ {
		if !m.Offer(cfg, []byte("/v1/completions"), []byte(`{"model":"m"}`), nil, false) {
			t.Fatalf("offer %d refused", i)
		}
	}
	eventually(t, "all four accounted for", func() bool {
		return m.m.timeout.Get()+m.m.droppedExpired.Get() == 4
	})
	if m.m.timeout.Get() < 1 || m.m.droppedExpired.Get() < 1 {
		t.Fatalf("timeouts %d, expired in queue %d: want both", m.m.timeout.Get(), m.m.droppedExpired.Get())
	}
	// The target saw its request(s) cancelled, not answered after 5 s. On a
	// loaded machine a request can time out before it reaches the target:
	// wait past the handler's 5 s for the ones that did (an uncancelled
	// handler would end by then, with no context error).
	for deadline := time.Now().Add(6 * time.Second); tg.hits.Load() < int64(m.m.timeout.Get()) && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	if tg.hits.Load() > int64(m.m.timeout.Get()) {
		t.Fatalf("the target answered %d requests, %d were sent", tg.hits.Load(), m.m.timeout.Get())
	}
	for _, r := range tg.received() {
		if r.ctxErr == nil {
			t.Fatal("the timed-out request was not cancelled at the target")
		}
	}
	// The counter moves before the log line is written: wait for the lines.
	eventually(t, "one log line per sent request", func() bool { return len(lb.lines(t)) == int(m.m.timeout.Get()) })
	lines := lb.lines(t)
	if lines[0]["result"] != "timeout" {
		t.Fatalf("log line %v", lines[0])
	}
	if m.active.Load() != 0 {
		t.Fatal("a sender is still running")
	}
}

// A copy whose timeout_ms ran out after a sender took it but before its
// request was handed to the connection (the wake-up that admitted it raced
// its expiry) never reaches the target: it is counted as dropped, reason
// "expired", like one that expired waiting for a sender, and not as a
// request that timed out in flight (result "timeout"), which the target saw.
func TestACopyExpiredBeforeItIsSentIsDroppedNotTimedOut(t *testing.T) {
	tg := startTarget(t, nil)
	m, lb := startMirror(t)
	// The sender runs the real send, once the job's budget has run out.
	m.send = func(j *job) {
		time.Sleep(time.Until(j.at.Add(millis(j.cfg.TimeoutMS))) + 5*time.Millisecond)
		m.sendJob(j)
	}
	cfg := mirrorCfg(tg.url)
	cfg.TimeoutMS = 20
	cfg.LogRecording = true
	if !m.Offer(cfg, []byte("/v1/completions"), []byte(`{"model":"m"}`), nil, false) {
		t.Fatal("offer refused")
	}
	eventually(t, "the copy accounted for", func() bool {
		return m.m.droppedExpired.Get()+m.m.timeout.Get()+m.m.ok.Get()+m.m.failed.Get() == 1
	})
	eventually(t, "the sender to finish", func() bool { return m.active.Load() == 0 && m.held.Load() == 0 })
	if m.m.droppedExpired.Get() != 1 || m.m.timeout.Get() != 0 {
		t.Fatalf("dropped as expired %d, timed out %d: want 1 and 0", m.m.droppedExpired.Get(), m.m.timeout.Get())
	}
	if tg.hits.Load() != 0 {
		t.Fatalf("the target got %d requests", tg.hits.Load())
	}
	if s := lb.String(); s != "" {
		t.Fatalf("a log line for a copy never sent: %s", s)
	}
}

// A mirrored stream is read to its end by the mirror; the log line has the
// status, the timings, the number of events and the usage of the last
// chunk, and nothing secret.
func TestMirrorConsumesStreamsToTheEndAndLogsThem(t *testing.T) {
	var wroteAll atomic.Bool
	const events = 40
	tg := startTarget(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fl := w.(http.Flusher)
		for i := 0; i < events; i++ {
			if _, err := fmt.Fprintf(w, "data: {\"choices\":[{\"delta\":{\"content\":\"tok%d\"}}]}\n\n", i); err != nil {
				return
			}
			fl.Flush()
			time.Sleep(time.Millisecond)
		}
		io.WriteString(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":21,\"completion_tokens\":40}}\n\n")
		// A long event: longer than the reader's buffer.
		fmt.Fprintf(w, "data: {\"pad\":%q}\n\n", strings.Repeat("p", 40000))
		io.WriteString(w, "data: [DONE]\n\n")
		fl.Flush()
		wroteAll.Store(true)
	})
	m, lb := startMirror(t)
	cfg := mirrorCfg(tg.url)
	cfg.LogRecording = true
	cfg.AuthToken = config.NewSecret("tok-SECRET")
	cfg.TargetModel = "v2"
	m.Offer(cfg, []byte("/v1/chat/completions"), []byte(`{"model":"m","stream":true,"stream_options":{"include_usage":true}}`), nil, true)
	eventually(t, "the log line", func() bool { return len(lb.lines(t)) == 1 })
	if !wroteAll.Load() {
		t.Fatal("the target could not write its whole stream")
	}
	l := lb.lines(t)[0]
	want := map[string]any{"msg": "mirror", "status": 200.0, "result": "ok", "stream": true, "events": float64(events + 3),
		"usage": true, "prompt_tokens": 21.0, "completion_tokens": 40.0, "path": "/v1/chat/completions", "target_model": "v2"}
	for k, v := range want {
		if l[k] != v {
			t.Fatalf("log %s = %v, want %v (line %v)", k, l[k], v, l)
		}
	}
	for _, k := range []string{"latency_ms", "first_event_ms", "queue_ms", "response_bytes", "id"} {
		if _, ok := l[k].(float64); !ok {
			t.Fatalf("log line lacks %s: %v", k, l)
		}
	}
	if l["first_event_ms"].(float64) > l["latency_ms"].(float64) || l["response_bytes"].(float64) < 40000 {
		t.Fatalf("timings or size wrong: %v", l)
	}
	if strings.Contains(lb.String(), "SECRET") {
		t.Fatalf("the token reached the log: %s", lb.String())
	}
	eventually(t, "the target's record", func() bool { return tg.hits.Load() == 1 })
	if got := tg.received()[0].header.Get("Accept"); got != "text/event-stream" {
		t.Fatalf("Accept %q", got)
	}
	if m.m.promptTokens.Get() != 21 || m.m.completionTokens.Get() != 40 {
		t.Fatalf("token counters %d %d", m.m.promptTokens.Get(), m.m.completionTokens.Get())
	}
}

// Non-streamed answers are logged with the usage; error statuses and an
// unreachable target are counted and logged without failing anything.
func TestMirrorRecordsErrorsAndFollowsReloads(t *testing.T) {
	a := startTarget(t, nil)
	b := startTarget(t, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(503)
		io.WriteString(w, `{"error":{"message":"overloaded"}}`)
	})
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	dead := "http://" + ln.Addr().String()
	ln.Close()

	m, lb := startMirror(t)
	offer := func(addr string) {
		cfg := mirrorCfg(addr) // a new snapshot per call, as reloads make
		cfg.LogRecording = true
		if !m.Offer(cfg, []byte("/v1/completions"), []byte(`{"model":"m","prompt":"x"}`), nil, false) {
			t.Fatal("offer refused")
		}
	}
	offer(a.url)
	offer(b.url + "/v1")
	offer(dead)
	eventually(t, "three log lines", func() bool { return len(lb.lines(t)) == 3 })
	byResult := map[string]map[string]any{}
	for _, l := range lb.lines(t) {
		byResult[l["result"].(string)] = l
	}
	if l := byResult["ok"]; l == nil || l["prompt_tokens"] != 11.0 || l["completion_tokens"] != 7.0 || l["status"] != 200.0 {
		t.Fatalf("ok line %v", l)
	}
	if l := byResult["http_error"]; l == nil || l["status"] != 503.0 || l["usage"] != false {
		t.Fatalf("http_error line %v", l)
	}
	if l := byResult["error"]; l == nil || !strings.Contains(l["err"].(string), "refused") || strings.Contains(l["err"].(string), "completions") {
		t.Fatalf("error line %v", l)
	}
	eventually(t, "each snapshot's target to get its request", func() bool { return a.hits.Load() == 1 && b.hits.Load() == 1 })
	if got := b.received()[0].uri; got != "/v1/completions" {
		t.Fatalf("base URL with /v1: target got %s", got)
	}
	eventually(t, "the counters", func() bool { return m.m.ok.Get()+m.m.httpError.Get()+m.m.failed.Get() == 3 })
	if m.m.ok.Get() != 1 || m.m.httpError.Get() != 1 || m.m.failed.Get() != 1 {
		t.Fatalf("counters ok %d http_error %d error %d", m.m.ok.Get(), m.m.httpError.Get(), m.m.failed.Get())
	}
}

// Close cancels what is in flight, drops what is queued, and refuses
// new offers.
func TestMirrorCloseCancelsAndRefuses(t *testing.T) {
	started := make(chan struct{}, 10)
	tg := startTarget(t, func(w http.ResponseWriter, r *http.Request) {
		started <- struct{}{}
		<-r.Context().Done()
	})
	m := New(Options{Logger: slog.New(slog.NewJSONHandler(io.Discard, nil))})
	cfg := mirrorCfg(tg.url)
	cfg.Concurrency = 1
	for i := 0; i < 3; i++ {
		m.Offer(cfg, []byte("/v1/completions"), []byte(`{}`), nil, false)
	}
	<-started
	done := make(chan struct{})
	go func() { m.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not return")
	}
	if m.Offer(cfg, []byte("/v1/completions"), []byte(`{}`), nil, false) {
		t.Fatal("offer accepted after Close")
	}
	if got := m.m.droppedClose.Get(); got != 2 {
		t.Fatalf("dropped at shutdown %d, want 2", got)
	}
	m.Close()
}

// rawTarget is a loopback target speaking HTTP/1.1 by hand: each
// connection answers one request (a JSON completion with usage, kept
// alive: no "Connection: close"), then the target closes it after a
// moment, as an engine's keep-alive timeout does.
type rawTarget struct {
	url         string
	reqs, conns atomic.Int64
	closeAfter  time.Duration
	ln          net.Listener
	wg          sync.WaitGroup
}

func startRawTarget(t *testing.T, closeAfter time.Duration) *rawTarget {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	rt := &rawTarget{url: "http://" + ln.Addr().String(), closeAfter: closeAfter, ln: ln}
	rt.wg.Add(1)
	go func() {
		defer rt.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			rt.conns.Add(1)
			rt.wg.Add(1)
			go func() {
				defer rt.wg.Done()
				defer c.Close()
				c.SetDeadline(time.Now().Add(5 * time.Second))
				req, err := http.ReadRequest(bufio.NewReader(c))
				if err != nil {
					return
				}
				io.Copy(io.Discard, req.Body)
				rt.reqs.Add(1)
				body := `{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":4}}`
				fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
				time.Sleep(rt.closeAfter)
			}()
		}
	}()
	t.Cleanup(func() { ln.Close(); rt.wg.Wait() })
	return rt
}

// A pooled connection the target closed while it was idle is noticed
// before the request is written on it: the request goes out once, on a
// new connection, and succeeds.
func TestMirrorRetriesAPooledConnectionTheTargetClosed(t *testing.T) {
	rt := startRawTarget(t, 20*time.Millisecond)
	m, lb := startMirror(t)
	cfg := mirrorCfg(rt.url)
	cfg.LogRecording = true
	for i := 1; i <= 3; i++ {
		if !m.Offer(cfg, []byte("/v1/completions"), []byte(`{"model":"m"}`), nil, false) {
			t.Fatal("offer refused")
		}
		eventually(t, "the log line", func() bool { return len(lb.lines(t)) == i })
		// Let the target close the connection the mirror keeps.
		time.Sleep(150 * time.Millisecond)
	}
	if m.m.ok.Get() != 3 || m.m.failed.Get() != 0 {
		t.Fatalf("ok %d, error %d: log %s", m.m.ok.Get(), m.m.failed.Get(), lb.String())
	}
	if got := rt.reqs.Load(); got != 3 {
		t.Fatalf("the target got %d requests, want 3 (none repeated)", got)
	}
	if got := rt.conns.Load(); got != 3 {
		t.Fatalf("the target saw %d connections, want 3 (the closed ones not reused)", got)
	}
	if l := lb.lines(t)[2]; l["prompt_tokens"] != 3.0 || l["completion_tokens"] != 4.0 {
		t.Fatalf("log line %v", l)
	}
}

// streamTarget streams one event every 10 ms for up to 5 s, and reports
// when its handler ended and whether the client went away first.
func streamTarget(t *testing.T) (tg *target, ended chan error) {
	ended = make(chan error, 1)
	tg = startTarget(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fl := w.(http.Flusher)
		for end := time.Now().Add(5 * time.Second); time.Now().Before(end); {
			if _, err := io.WriteString(w, "data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\n"); err != nil {
				break
			}
			fl.Flush()
			select {
			case <-r.Context().Done():
			case <-time.After(10 * time.Millisecond):
				continue
			}
			break
		}
		ended <- r.Context().Err()
	})
	return tg, ended
}

// The timeout cuts a stream in flight: the mirror stops reading, closes
// the connection (the target sees its client leave), and logs a timeout.
func TestMirrorTimeoutCancelsAStreamInFlight(t *testing.T) {
	tg, ended := streamTarget(t)
	m, lb := startMirror(t)
	cfg := mirrorCfg(tg.url)
	cfg.TimeoutMS = 300
	cfg.LogRecording = true
	start := time.Now()
	m.Offer(cfg, []byte("/v1/chat/completions"), []byte(`{"model":"m","stream":true}`), nil, true)
	select {
	case err := <-ended:
		if err == nil {
			t.Fatal("the target's stream ended without its client leaving")
		}
	case <-time.After(4 * time.Second):
		t.Fatal("the stream was not cancelled")
	}
	if d := time.Since(start); d < 300*time.Millisecond {
		t.Fatalf("cancelled after %v, before the 300 ms timeout", d)
	}
	eventually(t, "the log line", func() bool { return len(lb.lines(t)) == 1 })
	l := lb.lines(t)[0]
	if l["result"] != "timeout" || l["status"] != 200.0 || l["err"] != "timeout" || l["events"].(float64) < 1 {
		t.Fatalf("log line %v", l)
	}
	if m.m.timeout.Get() != 1 || m.conns.len() != 0 {
		t.Fatalf("timeouts %d, connections open %d", m.m.timeout.Get(), m.conns.len())
	}
}

// Close aborts a stream in flight at once.
func TestMirrorCloseCancelsAStreamInFlight(t *testing.T) {
	tg, ended := streamTarget(t)
	m := New(Options{Logger: slog.New(slog.NewJSONHandler(io.Discard, nil))})
	cfg := mirrorCfg(tg.url)
	m.Offer(cfg, []byte("/v1/chat/completions"), []byte(`{"model":"m","stream":true}`), nil, true)
	eventually(t, "the stream in flight", func() bool { return m.active.Load() == 1 && m.conns.len() == 1 })
	time.Sleep(50 * time.Millisecond)
	start := time.Now()
	m.Close()
	if d := time.Since(start); d > time.Second {
		t.Fatalf("Close took %v", d)
	}
	select {
	case err := <-ended:
		if err == nil {
			t.Fatal("the target's stream ended without its client leaving")
		}
	case <-time.After(4 * time.Second):
		t.Fatal("the stream was not cancelled")
	}
	if n := m.m.ok.Get() + m.m.failed.Get() + m.m.timeout.Get(); n != 0 {
		t.Fatalf("a request cut by shutdown was counted (%d)", n)
	}
}

// A redirect is an answer like any other: it is not followed (it could
// take the mirror's token elsewhere).
func TestMirrorDoesNotFollowRedirects(t *testing.T) {
	other := startTarget(t, nil)
	tg := startTarget(t, func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, other.url+"/v1/completions", http.StatusTemporaryRedirect)
	})
	m, lb := startMirror(t)
	cfg := mirrorCfg(tg.url)
	cfg.LogRecording = true
	cfg.AuthToken = config.NewSecret("tok")
	m.Offer(cfg, []byte("/v1/completions"), []byte(`{"model":"m"}`), nil, false)
	eventually(t, "the log line", func() bool { return len(lb.lines(t)) == 1 })
	if l := lb.lines(t)[0]; l["status"] != 307.0 || l["result"] != "http_error" {
		t.Fatalf("log line %v", l)
	}
	time.Sleep(50 * time.Millisecond)
	if other.hits.Load() != 0 {
		t.Fatal("the redirect was followed")
	}
}

// A non-streamed answer longer than MaxResponseBytes is still read to its
// end (and counted whole); only its first MaxResponseBytes are kept.
func TestMirrorReadsLongAnswersToTheEnd(t *testing.T) {
	pad := strings.Repeat("p", 100000)
	tg := startTarget(t, func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, `{"usage":{"prompt_tokens":1,"completion_tokens":2},"pad":%q}`, pad)
	})
	lb := &logBuf{}
	m := New(Options{Logger: slog.New(slog.NewJSONHandler(lb, nil)), MaxResponseBytes: 1000})
	t.Cleanup(m.Close)
	cfg := mirrorCfg(tg.url)
	cfg.LogRecording = true
	for i := 1; i <= 2; i++ {
		m.Offer(cfg, []byte("/v1/completions"), []byte(`{"model":"m"}`), nil, false)
		eventually(t, "the log line", func() bool { return len(lb.lines(t)) == i })
	}
	want := float64(len(`{"usage":{"prompt_tokens":1,"completion_tokens":2},"pad":""}`) + len(pad))
	for _, l := range lb.lines(t) {
		if l["result"] != "ok" || l["response_bytes"] != want || l["usage"] != false {
			t.Fatalf("log line %v (want %v bytes, no usage: the answer was cut at 1000 bytes)", l, want)
		}
	}
	if got := m.conns.len(); got != 1 {
		t.Fatalf("%d connections open, want 1 (read to the end, the connection is reused)", got)
	}
}

// Under concurrent offers, reloads between two targets (one slow) and
// timeouts, every sampled request is accounted for exactly once (sent,
// by result, or dropped, by reason), every byte of the budget is given
// back, the senders never outnumber the concurrency, and Close leaves no
// goroutine behind.
func TestMirrorAccountsForEverySampledRequestUnderLoad(t *testing.T) {
	fast := startTarget(t, nil)
	slow := startTarget(t, func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-time.After(80 * time.Millisecond): // beyond the 50 ms timeout
		case <-r.Context().Done():
		}
		io.WriteString(w, `{"usage":{"prompt_tokens":1,"completion_tokens":1}}`)
	})
	before := runtime.NumGoroutine()
	m := New(Options{Logger: slog.New(slog.NewJSONHandler(io.Discard, nil))})
	cfgs := []*config.Mirror{mirrorCfg(fast.url), mirrorCfg(slow.url)}
	for _, c := range cfgs {
		c.Concurrency, c.QueueSize, c.TimeoutMS = 4, 64, 50
	}
	var wg sync.WaitGroup
	var maxWorkers atomic.Int64
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 250; i++ {
				cfg := cfgs[0]
				if (g+i)%40 == 0 {
					cfg = cfgs[1]
				}
				m.Offer(cfg, []byte("/v1/completions"), []byte(`{"model":"m"}`), nil, i%3 == 0)
				if n := m.workers.Load(); n > maxWorkers.Load() {
					maxWorkers.Store(n)
				}
				if i%4 == 0 {
					time.Sleep(time.Millisecond)
				}
			}
		}()
	}
	wg.Wait()
	mm := &m.m
	eventually(t, "the mirror idle", func() bool { return len(m.q) == 0 && m.active.Load() == 0 })
	sent := mm.ok.Get() + mm.httpError.Get() + mm.failed.Get() + mm.timeout.Get()
	dropped := mm.droppedFull.Get() + mm.droppedExpired.Get()
	if mm.sampled.Get() != 2000 || sent+dropped != 2000 {
		t.Fatalf("sampled %d, sent %d (ok %d, http_error %d, error %d, timeout %d), dropped %d (full %d, expired %d)",
			mm.sampled.Get(), sent, mm.ok.Get(), mm.httpError.Get(), mm.failed.Get(), mm.timeout.Get(),
			dropped, mm.droppedFull.Get(), mm.droppedExpired.Get())
	}
	t.Logf("ok %d timeout %d full %d expired %d, max senders %d, targets %d+%d", mm.ok.Get(), mm.timeout.Get(), mm.droppedFull.Get(), mm.droppedExpired.Get(), maxWorkers.Load(), fast.hits.Load(), slow.hits.Load())
	if mm.ok.Get() == 0 || mm.failed.Get() != 0 || mm.httpError.Get() != 0 {
		t.Fatalf("ok %d, error %d, http_error %d", mm.ok.Get(), mm.failed.Get(), mm.httpError.Get())
	}
	if got := int64(fast.hits.Load() + slow.hits.Load()); got > int64(sent) {
		t.Fatalf("the targets got %d requests, %d were sent", got, sent)
	}
	if m.held.Load() != 0 {
		t.Fatalf("%d bytes still held", m.held.Load())
	}
	if maxWorkers.Load() > 4 {
		t.Fatalf("%d senders for a concurrency of 4", maxWorkers.Load())
	}
	m.Close()
	eventually(t, "the goroutines to end", func() bool { return runtime.NumGoroutine() <= before+2 })
}

// An https target gets the same requests over TLS (the certificate
// verified), on one connection reused from request to request.
func TestMirrorSendsOverTLSAndReusesTheConnection(t *testing.T) {
	var conns atomic.Int64
	var hits atomic.Int64
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		if r.Header.Get("Authorization") != "Bearer tls-token" || r.TLS == nil {
			w.WriteHeader(400)
			return
		}
		hits.Add(1)
		io.WriteString(w, `{"usage":{"prompt_tokens":5,"completion_tokens":6}}`)
	}))
	srv.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateNew {
			conns.Add(1)
		}
	}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	m, lb := startMirror(t)
	pool := x509.NewCertPool()
	pool.AddCert(srv.Certificate())
	m.tlsConfig = &tls.Config{RootCAs: pool}
	cfg := mirrorCfg(srv.URL)
	cfg.AuthToken = config.NewSecret("tls-token")
	cfg.LogRecording = true
	for i := 1; i <= 3; i++ {
		m.Offer(cfg, []byte("/v1/completions"), []byte(`{"model":"m"}`), nil, false)
		eventually(t, "the log line", func() bool { return len(lb.lines(t)) == i })
		time.Sleep(20 * time.Millisecond)
	}
	for _, l := range lb.lines(t) {
		if l["result"] != "ok" || l["prompt_tokens"] != 5.0 {
			t.Fatalf("log line %v", l)
		}
	}
	if hits.Load() != 3 || conns.Load() != 1 {
		t.Fatalf("the target got %d requests on %d connections, want 3 on 1", hits.Load(), conns.Load())
	}
}

// The answers being read count in mirror.max_buffer_bytes with the request
// copies: a target that sends long answers (here 4 MiB each, a JSON body or
// one stream event, then keeps the connection open) to every sender does
// not make the mirror hold more than the budget. It used to keep up to
// Options.MaxResponseBytes (16 MiB) of every answer or stream line,
// whatever the budget: 32 MiB for 8 senders here, 1 GiB at the default
// concurrency.
func TestMirrorAnswersBeingReadCountInTheByteBudget(t *testing.T) {
	for _, stream := range []bool{false, true} {
		t.Run(fmt.Sprintf("stream=%v", stream), func(t *testing.T) { testAnswerBudget(t, stream) })
	}
}

func testAnswerBudget(t *testing.T, stream bool) {
	const answer = 4 << 20
	release := make(chan struct{})
	var sent atomic.Int64
	tg := startTarget(t, func(w http.ResponseWriter, r *http.Request) {
		head, tail := `"`, `"`
		if stream {
			head, tail = "data: ", "\n\ndata: [DONE]\n\n"
			w.Header().Set("Content-Type", "text/event-stream")
		} else {
			w.Header().Set("Content-Length", fmt.Sprint(len(head)+answer+len(tail)))
		}
		chunk := bytes.Repeat([]byte("x"), 64<<10)
		io.WriteString(w, head)
		for n := 0; n < answer; n += len(chunk) {
			w.Write(chunk)
		}
		w.(http.Flusher).Flush()
		sent.Add(1)
		select { // the answer's end waits: the sender holds what it read
		case <-release:
		case <-r.Context().Done():
		}
		io.WriteString(w, tail)
	})
	lb := &logBuf{}
	m := New(Options{Logger: slog.New(slog.NewJSONHandler(lb, nil))})
	t.Cleanup(m.Close)
	cfg := mirrorCfg(tg.url)
	cfg.Concurrency, cfg.MaxBufferBytes, cfg.TimeoutMS, cfg.LogRecording = 8, 1<<20, 30000, true
	var ms0, ms1 runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms0)
	for i := 0; i < 8; i++ {
		if !m.Offer(cfg, []byte("/v1/completions"), []byte(`{"model":"m"}`), nil, stream) {
			t.Fatalf("offer %d refused", i)
		}
	}
	eventually(t, "every answer sent but its end", func() bool { return sent.Load() == 8 })
	time.Sleep(200 * time.Millisecond) // the senders read what was sent
	runtime.GC()
	runtime.ReadMemStats(&ms1)
	close(release)
	grown := int64(ms1.HeapAlloc) - int64(ms0.HeapAlloc)
	if grown > 8<<20 || m.held.Load() > cfg.MaxBufferBytes {
		t.Fatalf("heap grew by %d MiB and the mirror counts %d bytes held while reading 8 answers of 4 MiB under a 1 MiB budget",
			grown>>20, m.held.Load())
	}
	eventually(t, "every answer read to its end", func() bool { return len(lb.lines(t)) == 8 })
	for _, l := range lb.lines(t) {
		if l["result"] != "ok" || l["response_bytes"].(float64) < answer || stream && l["events"] != float64(2) {
			t.Fatalf("log line %v", l)
		}
	}
	eventually(t, "the budget given back", func() bool { return m.held.Load() == 0 })
}

// A reload that lowers mirror.concurrency leaves more senders alive than
// it allows until they idle out; the jobs they take and hold waiting for
// a slot still count against queue_size.
func TestMirrorQueueSizeHoldsWhileSendersOutnumberALoweredConcurrency(t *testing.T) {
	var hold atomic.Bool
	hold.Store(true)
	release := make(chan struct{})
	defer close(release)
	tg := startTarget(t, func(w http.ResponseWriter, r *http.Request) {
		if hold.Load() {
			select {
			case <-release:
			case <-r.Context().Done():
			}
		}
		w.WriteHeader(200)
	})
	m, _ := startMirror(t)
	wide := mirrorCfg(tg.url)
	wide.Concurrency, wide.QueueSize, wide.TimeoutMS = 8, 100, 1000
	for i := 0; i < 8; i++ {
		m.Offer(wide, []byte("/v1/completions"), []byte(`{"model":"m"}`), nil, false)
		eventually(t, "a sender per job", func() bool { return m.active.Load() == int64(i+1) })
	}
	eventually(t, "the held jobs to time out", func() bool { return m.active.Load() == 0 })
	if n := m.workers.Load(); n != 8 {
		t.Fatalf("%d senders alive, want 8", n)
	}
	narrow := mirrorCfg(tg.url)
	narrow.Concurrency, narrow.QueueSize, narrow.TimeoutMS = 1, 2, 5000
	before := m.m.droppedFull.Get()
	accepted := 0
	for i := 0; i < 10; i++ {
		if m.Offer(narrow, []byte("/v1/completions"), []byte(`{"model":"m"}`), nil, false) {
			accepted++
		}
		time.Sleep(5 * time.Millisecond) // the idle senders take what is queued
	}
	// One sending, two waiting (in the queue or held by a sender).
	if accepted > 3 || int(m.m.droppedFull.Get()-before) != 10-accepted {
		t.Fatalf("accepted %d of 10 with concurrency 1 and queue_size 2 (dropped %d), want at most 3",
			accepted, m.m.droppedFull.Get()-before)
	}
	if q := m.queued(); q > 2 {
		t.Fatalf("queue length %d, want at most 2", q)
	}
}

// A TLS target that closes an idle keep-alive connection sends its
// close_notify record before the FIN: the record waiting on the pooled
// connection is no session ticket, and the next mirrored request goes on
// another connection (it failed, "connection closed early").
func TestAMirrorOverTLSRetriesAConnectionTheTargetClosedWhileIdle(t *testing.T) {
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		io.WriteString(w, `{"usage":{"prompt_tokens":5,"completion_tokens":6}}`)
	}))
	srv.Config.IdleTimeout = 50 * time.Millisecond
	srv.StartTLS()
	t.Cleanup(srv.Close)
	m, lb := startMirror(t)
	pool := x509.NewCertPool()
	pool.AddCert(srv.Certificate())
	m.tlsConfig = &tls.Config{RootCAs: pool}
	cfg := mirrorCfg(srv.URL)
	cfg.LogRecording = true
	for i := 1; i <= 4; i++ {
		m.Offer(cfg, []byte("/v1/completions"), []byte(`{"model":"m"}`), nil, false)
		eventually(t, "the log line", func() bool { return len(lb.lines(t)) == i })
		time.Sleep(200 * time.Millisecond) // the target closes the idle connection
	}
	if m.m.ok.Get() != 4 || m.m.failed.Get() != 0 {
		t.Fatalf("ok %d, error %d: log %s", m.m.ok.Get(), m.m.failed.Get(), lb.String())
	}
}

// With target_model set, the sender sends a second copy of the body (the
// model substituted): it counts in max_buffer_bytes while it is held, so a
// request sampled while the budget holds both copies of another is
// dropped. It was not counted: the mirror held up to twice the budget (the
// in-flight requests' substituted copies on top of every request copy).
func TestMirrorSubstitutedCopiesCountInTheByteBudget(t *testing.T) {
	got := make(chan struct{}, 4)
	release := make(chan struct{})
	tg := startTarget(t, func(w http.ResponseWriter, r *http.Request) {
		got <- struct{}{}
		select {
		case <-release:
		case <-r.Context().Done():
		}
		w.WriteHeader(200)
	})
	defer close(release)
	m, _ := startMirror(t)
	cfg := mirrorCfg(tg.url)
	cfg.TargetModel = "canary"
	body := []byte(`{"model":"m","prompt":"` + strings.Repeat("x", 1000) + `"}`)
	path := []byte("/v1/completions")
	per := int64(len(body) + len(path))
	cfg.MaxBufferBytes = 2*per + per/2 // two request copies, or one with its substituted copy
	if !m.Offer(cfg, path, body, nil, false) {
		t.Fatal("first offer refused")
	}
	select {
	case <-got:
	case <-time.After(5 * time.Second):
		t.Fatal("the target never got the first request")
	}
	if h := m.held.Load(); h < per+int64(len(body)) {
		t.Errorf("held %d bytes while a %d-byte request and its substituted copy are in flight", h, per)
	}
	if m.Offer(cfg, path, body, nil, false) {
		t.Fatalf("a second request was taken while the budget (%d) held both copies of the first (%d bytes counted)", cfg.MaxBufferBytes, m.held.Load())
	}
}

// A reload that raises mirror.concurrency applies to the jobs already
// sampled: they waited for a slot under the limit of the snapshot they
// were sampled under, so with concurrency 1 and a target holding one
// request, raising it to 8 left the queue (and the senders started for
// the jobs sampled after the reload, which took the old jobs first)
// waiting for that request to end or the old jobs to expire: through the
// real binary, the copies of requests made after the reload were sent
// about 10 s later, when the held one ended.
func TestARaisedMirrorConcurrencyAppliesToTheJobsAlreadyQueued(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	var held atomic.Bool
	tg := startTarget(t, func(w http.ResponseWriter, r *http.Request) {
		if held.CompareAndSwap(false, true) { // the first request is held
			select {
			case <-release:
			case <-r.Context().Done():
			}
		}
		w.WriteHeader(200)
	})
	m, _ := startMirror(t)
	narrow := mirrorCfg(tg.url)
	narrow.Concurrency, narrow.TimeoutMS = 1, 30_000
	m.Update(narrow)
	m.Offer(narrow, []byte("/v1/completions"), []byte(`{"model":"held"}`), nil, false)
	eventually(t, "the held job sent", func() bool { return held.Load() && m.active.Load() == 1 })
	for i := 0; i < 3; i++ {
		m.Offer(narrow, []byte("/v1/completions"), []byte(`{"model":"old"}`), nil, false)
	}
	time.Sleep(50 * time.Millisecond)
	if n := tg.hits.Load(); n != 0 {
		t.Fatalf("%d answered with concurrency 1 while one is held", n)
	}
	wide := mirrorCfg(tg.url)
	wide.Concurrency, wide.TimeoutMS = 8, 30_000
	m.Update(wide)
	for i := 0; i < 3; i++ {
		m.Offer(wide, []byte("/v1/completions"), []byte(`{"model":"new"}`), nil, false)
	}
	eventually(t, "the six others sent beside the held one", func() bool { return tg.hits.Load() == 6 })
	// Lowered again: the held request takes the only slot, so jobs
	// sampled under the wide snapshot wait too.
	m.Update(narrow)
	for i := 0; i < 2; i++ {
		m.Offer(wide, []byte("/v1/completions"), []byte(`{"model":"after"}`), nil, false)
	}
	time.Sleep(100 * time.Millisecond)
	if n := tg.hits.Load(); n != 6 {
		t.Fatalf("%d answered, want 6: a lowered concurrency let more through", n)
	}
}

// An https target that accepts the connection and never answers the TLS
// handshake costs a sender timeout_ms, not forever: the handshake ran
// without a read deadline, so each sender that met it stayed in flight
// (a live router with timeout_ms 1000 and concurrency 2 mirrored nothing
// more: 2 in flight and the rest queued, a minute later).
func TestATargetStuckInTheTLSHandshakeTimesOut(t *testing.T) {
	addr := testsrv.Silent(t) // never answers the handshake
	m, lb := startMirror(t)
	cfg := mirrorCfg("https://" + addr)
	cfg.TimeoutMS = 200
	cfg.Concurrency = 1
	cfg.LogRecording = true
	for i := 1; i <= 2; i++ {
		m.Offer(cfg, []byte("/v1/completions"), []byte(`{"model":"m"}`), nil, false)
		eventually(t, fmt.Sprintf("the log line of request %d", i), func() bool { return len(lb.lines(t)) == i })
	}
	for _, l := range lb.lines(t) {
		if l["result"] == "ok" {
			t.Fatalf("log line %v", l)
		}
	}
	if n := m.active.Load(); n != 0 {
		t.Fatalf("%d senders still in flight", n)
	}
}

// Switching mirroring off by a reload stops the copies sampled before it:
// those still queued, and those a sender took but that wait for a slot,
// are dropped (reason "disabled"), not sent for up to timeout_ms more to a
// target the operator has just turned away from. Switched on again, new
// copies go out.
func TestDisablingMirroringDropsTheCopiesNotSentYet(t *testing.T) {
	release := make(chan struct{})
	var arrived atomic.Int64
	tg := startTarget(t, func(w http.ResponseWriter, r *http.Request) {
		arrived.Add(1)
		if r.Header.Get("X-Infera-Mirror") != "" && arrived.Load() == 1 {
			select {
			case <-release:
			case <-r.Context().Done():
			}
		}
		w.WriteHeader(200)
	})
	m, _ := startMirror(t)
	on := mirrorCfg(tg.url)
	on.Concurrency, on.TimeoutMS = 1, 30_000
	m.Update(on)
	m.Offer(on, []byte("/v1/completions"), []byte(`{"model":"held"}`), nil, false)
	eventually(t, "the held copy in flight", func() bool { return arrived.Load() == 1 && m.active.Load() == 1 })
	// Senders beyond the one that is busy, idle, so that the next copies
	// are taken and wait for the only slot (the waiting path), besides
	// those left in the queue.
	m.spawn(3)
	m.spawn(3)
	for i := 0; i < 5; i++ {
		if !m.Offer(on, []byte("/v1/completions"), []byte(`{"model":"queued"}`), nil, false) {
			t.Fatal("a copy refused while mirroring is on")
		}
	}
	eventually(t, "copies waiting for the slot", func() bool { return m.waiting.Load() == 2 && m.queued() == 5 })
	off := *on
	off.Enabled = false
	m.Update(&off)
	eventually(t, "the queue emptied", func() bool { return m.queued() == 0 && m.m.droppedOff.Get() == 5 })
	close(release)
	eventually(t, "the held copy answered", func() bool { return m.active.Load() == 0 })
	time.Sleep(100 * time.Millisecond)
	if n := arrived.Load(); n != 1 {
		t.Fatalf("%d copies reached the target, want 1 (the one in flight before mirroring was switched off)", n)
	}
	m.Update(on)
	m.Offer(on, []byte("/v1/completions"), []byte(`{"model":"again"}`), nil, false)
	eventually(t, "a copy sent once mirroring is on again", func() bool { return arrived.Load() == 2 })
}

// A copy sent to the Anthropic Messages or OpenAI Responses path (the
// protocol passthrough modes) has its token counts taken from those APIs'
// usage: input_tokens and output_tokens, in a Messages answer, its
// message_start and message_delta events, a Responses answer and its
// response.completed event.
func TestMirrorTakesTheUsageOfMessagesAndResponsesAnswers(t *testing.T) {
	tg := startTarget(t, func(w http.ResponseWriter, r *http.Request) {
		stream := r.Header.Get("Accept") == "text/event-stream"
		if stream {
			w.Header().Set("Content-Type", "text/event-stream")
		} else {
			w.Header().Set("Content-Type", "application/json")
		}
		switch {
		case r.URL.Path == "/v1/messages" && stream:
			io.WriteString(w, "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"model\":\"m\",\"stop_reason\":null,\"usage\":{\"input_tokens\":25,\"output_tokens\":1}}}\n\n"+
				"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"hi\"}}\n\n"+
				"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":15}}\n\n"+
				"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n")
		case r.URL.Path == "/v1/messages":
			io.WriteString(w, `{"id":"msg_2","type":"message","role":"assistant","content":[{"type":"text","text":"hi"}],"stop_reason":"end_turn","usage":{"input_tokens":12,"cache_read_input_tokens":0,"output_tokens":6}}`)
		case stream:
			io.WriteString(w, "event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"id\":\"resp_1\",\"status\":\"in_progress\",\"usage\":null}}\n\n"+
				"event: response.completed\ndata: {\"type\":\"response.completed\",\"sequence_number\":5,\"response\":{\"id\":\"resp_1\",\"status\":\"completed\",\"output\":[{\"type\":\"message\",\"content\":[{\"type\":\"output_text\",\"text\":\"hi\"}]}],\"usage\":{\"input_tokens\":33,\"input_tokens_details\":{\"cached_tokens\":0},\"output_tokens\":9,\"output_tokens_details\":{\"reasoning_tokens\":0},\"total_tokens\":42}}}\n\n")
		default:
			io.WriteString(w, `{"id":"resp_2","object":"response","status":"completed","output":[],"usage":{"input_tokens":7,"input_tokens_details":{"cached_tokens":0},"output_tokens":3,"total_tokens":10}}`)
		}
	})
	m, lb := startMirror(t)
	cfg := mirrorCfg(tg.url)
	cfg.LogRecording = true
	cfg.Concurrency = 1 // one at a time: the log lines in order
	cases := []struct {
		path          string
		stream        bool
		prompt, compl float64
	}{
		{"/v1/messages", true, 25, 15},
		{"/v1/messages", false, 12, 6},
		{"/v1/responses", true, 33, 9},
		{"/v1/responses", false, 7, 3},
	}
	for i, c := range cases {
		m.Offer(cfg, []byte(c.path), []byte(`{"model":"m","max_tokens":8}`), nil, c.stream)
		eventually(t, "the log line", func() bool { return len(lb.lines(t)) == i+1 })
		l := lb.lines(t)[i]
		if l["usage"] != true || l["prompt_tokens"] != c.prompt || l["completion_tokens"] != c.compl || l["path"] != c.path {
			t.Fatalf("%s stream=%v: usage %v, tokens %v %v, want %v %v (line %v)", c.path, c.stream, l["usage"], l["prompt_tokens"], l["completion_tokens"], c.prompt, c.compl, l)
		}
	}
	if m.m.promptTokens.Get() != 25+12+33+7 || m.m.completionTokens.Get() != 15+6+9+3 {
		t.Fatalf("token counters %d %d", m.m.promptTokens.Get(), m.m.completionTokens.Get())
	}
}

// A copy sent to /v1/messages counts Anthropic's total input as its prompt
// tokens: input_tokens plus cache_creation_input_tokens plus
// cache_read_input_tokens (Anthropic counts the tokens written to and read
// from its prompt cache apart from input_tokens), from a whole answer and
// from a stream's message_start and message_delta (whose input counts,
// cumulative, replace message_start's when not null). A Responses answer's
// input_tokens already includes its cached tokens.
func TestMirrorCountsAnthropicCacheTokensAsPromptTokens(t *testing.T) {
	tg := startTarget(t, func(w http.ResponseWriter, r *http.Request) {
		stream := r.Header.Get("Accept") == "text/event-stream"
		if stream {
			w.Header().Set("Content-Type", "text/event-stream")
		} else {
			w.Header().Set("Content-Type", "application/json")
		}
		switch {
		case r.URL.Path == "/v1/messages" && stream && r.URL.RawQuery == "":
			// message_delta with its output only.
			io.WriteString(w, "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"model\":\"m\",\"stop_reason\":null,\"usage\":{\"input_tokens\":4,\"cache_creation_input_tokens\":900,\"cache_read_input_tokens\":40,\"cache_creation\":{\"ephemeral_5m_input_tokens\":900,\"ephemeral_1h_input_tokens\":0},\"output_tokens\":1}}}\n\n"+
				"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"hi\"}}\n\n"+
				"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":15}}\n\n"+
				"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n")
		case r.URL.Path == "/v1/messages" && stream:
			// message_delta with cumulative input counts, as Anthropic
			// sends them now.
			io.WriteString(w, "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_2\",\"usage\":{\"input_tokens\":4,\"cache_creation_input_tokens\":0,\"cache_read_input_tokens\":0,\"output_tokens\":1}}}\n\n"+
				"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"input_tokens\":4,\"cache_creation_input_tokens\":30,\"cache_read_input_tokens\":70,\"output_tokens\":8}}\n\n"+
				"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n")
		case r.URL.Path == "/v1/messages":
			io.WriteString(w, `{"id":"msg_3","type":"message","role":"assistant","content":[{"type":"text","text":"hi"}],"stop_reason":"end_turn","usage":{"input_tokens":12,"cache_creation_input_tokens":100,"cache_read_input_tokens":300,"output_tokens":6}}`)
		default:
			io.WriteString(w, `{"id":"resp_1","object":"response","status":"completed","output":[],"usage":{"input_tokens":50,"input_tokens_details":{"cached_tokens":20},"output_tokens":3,"total_tokens":53}}`)
		}
	})
	m, lb := startMirror(t)
	cfg := mirrorCfg(tg.url)
	cfg.LogRecording = true
	cfg.Concurrency = 1 // one at a time: the log lines in order
	cases := []struct {
		path          string
		stream        bool
		prompt, compl float64
	}{
		{"/v1/messages", true, 4 + 900 + 40, 15},
		{"/v1/messages?delta", true, 4 + 30 + 70, 8},
		{"/v1/messages", false, 12 + 100 + 300, 6},
		{"/v1/responses", false, 50, 3},
	}
	for i, c := range cases {
		m.Offer(cfg, []byte(c.path), []byte(`{"model":"m","max_tokens":8}`), nil, c.stream)
		eventually(t, "the log line", func() bool { return len(lb.lines(t)) == i+1 })
		l := lb.lines(t)[i]
		if l["usage"] != true || l["prompt_tokens"] != c.prompt || l["completion_tokens"] != c.compl {
			t.Fatalf("%s stream=%v: usage %v, tokens %v %v, want %v %v (line %v)", c.path, c.stream, l["usage"], l["prompt_tokens"], l["completion_tokens"], c.prompt, c.compl, l)
		}
	}
	if got, want := m.m.promptTokens.Get(), uint64(944+104+412+50); got != want {
		t.Fatalf("prompt tokens counted %d, want %d", got, want)
	}
}
