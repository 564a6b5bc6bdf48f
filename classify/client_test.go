package classify

import (
	"crypto/x509"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/infera/infera/config"
	"github.com/infera/infera/internal/testsrv"
)

// serve starts srv on a free loopback port and returns its base URL.
func serve(t *testing.T, srv *http.Server) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return "http://" + ln.Addr().String()
}

func smartCfg(url string) *config.SmartModelSelection {
	return &config.SmartModelSelection{
		Enabled: true, ClassifierURL: url, TimeoutMS: 2000, FallbackTier: "L2", MaxTextBytes: 8192,
		Tiers: config.TierModels{L1: "small", L2: "medium", L3: "large"},
	}
}

func counter(name string) uint64 { return metrics.GetOrCreateCounter(name).Get() }

func TestClassifyWithTheReferenceServer(t *testing.T) {
	base := serve(t, NewServer(Heuristic{L2Bytes: 200, L3Bytes: 2000, Keywords: DefaultKeywords}, "ck", 0))
	cfg := smartCfg(base + ClassifyPath)
	cfg.ClassifierAPIKey = config.NewSecret("ck")
	var c Client
	defer c.Close()
	f := func(text string, want Tier, wantModel string) {
		t.Helper()
		r := c.Classify(cfg, []byte("auto"), []byte(text))
		if r.Outcome != OutcomeOK || r.Tier != want || r.Model != wantModel || r.Fallback() {
			t.Fatalf("Classify(%.30q) = %+v, want %v (%s) from the classifier", text, r, want, wantModel)
		}
	}
	okBefore := counter(`infera_classifier_requests_total{result="ok"}`)
	l3Before := counter(`infera_smart_selection_total{tier="L3",source="classifier"}`)
	f("What is 2+2?", TierL1, "small")
	f("Please refactor this function", TierL2, "medium")
	f(strings.Repeat("word ", 100), TierL2, "medium")
	f(strings.Repeat("word ", 1000), TierL3, "large")
	// Cut to max_text_bytes, the classifier still sees the full length.
	cfg.MaxTextBytes = 16
	f(strings.Repeat("word ", 1000), TierL3, "large")
	if d := counter(`infera_classifier_requests_total{result="ok"}`) - okBefore; d != 5 {
		t.Fatalf("ok counter moved by %d, want 5", d)
	}
	if d := counter(`infera_smart_selection_total{tier="L3",source="classifier"}`) - l3Before; d != 2 {
		t.Fatalf("L3 counter moved by %d, want 2", d)
	}
	// Without the key, the reference server refuses: fallback tier.
	cfg.ClassifierAPIKey = config.Secret{}
	if r := c.Classify(cfg, []byte("auto"), []byte("hi")); r.Outcome != OutcomeBadStatus || r.Tier != TierL2 || r.Model != "medium" {
		t.Fatalf("unauthenticated: %+v, want the fallback after a 401", r)
	}
}

// recorder is a classifier that records what it receives and answers what
// the test says.
type recorder struct {
	mu     sync.Mutex
	bodies []string
	auth   []string
	paths  []string
	status int
	answer string
	delay  time.Duration
}

func (rec *recorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	rec.mu.Lock()
	rec.bodies = append(rec.bodies, string(b))
	rec.auth = append(rec.auth, r.Header.Get("Authorization"))
	rec.paths = append(rec.paths, r.URL.RequestURI())
	status, answer, delay := rec.status, rec.answer, rec.delay
	rec.mu.Unlock()
	if delay > 0 {
		select {
		case <-time.After(delay):
		case <-r.Context().Done():
			return
		}
	}
	w.WriteHeader(status)
	io.WriteString(w, answer)
}

func (rec *recorder) set(status int, answer string, delay time.Duration) {
	rec.mu.Lock()
	rec.status, rec.answer, rec.delay = status, answer, delay
	rec.mu.Unlock()
}

func TestClassifyFallsBackOnTimeoutErrorsAndMalformedAnswers(t *testing.T) {
	rec := &recorder{status: 200, answer: `{"tier":"L3"}`}
	base := serve(t, &http.Server{Handler: rec})
	cfg := smartCfg(base + "/classify?v=1")
	cfg.FallbackTier = "L1"
	cfg.ClassifierAPIKey = config.NewSecret("sekret")
	var c Client
	defer c.Close()
	r := c.Classify(cfg, []byte("gpt-4o"), []byte("line1\nline \"2\""))
	if r.Outcome != OutcomeOK || r.Tier != TierL3 || r.Model != "large" {
		t.Fatalf("%+v", r)
	}
	// The request follows the contract.
	rec.mu.Lock()
	var sent struct {
		Model     string `json:"model"`
		Text      string `json:"text"`
		TextBytes int    `json:"text_bytes"`
	}
	if err := json.Unmarshal([]byte(rec.bodies[0]), &sent); err != nil || sent.Model != "gpt-4o" || sent.Text != "line1\nline \"2\"" || sent.TextBytes != 14 {
		t.Fatalf("classifier received %q (%v)", rec.bodies[0], err)
	}
	if rec.auth[0] != "Bearer sekret" || rec.paths[0] != "/classify?v=1" {
		t.Fatalf("auth %q path %q", rec.auth[0], rec.paths[0])
	}
	rec.mu.Unlock()

	f := func(status int, answer string, want Outcome) {
		t.Helper()
		rec.set(status, answer, 0)
		r := c.Classify(cfg, []byte("m"), []byte("x"))
		if r.Outcome != want || r.Tier != TierL1 || r.Model != "small" || !r.Fallback() {
			t.Fatalf("answer %d %.40q: %+v, want the fallback L1 with outcome %v", status, answer, r, want)
		}
	}
	f(500, `{"tier":"L3"}`, OutcomeBadStatus)
	f(429, ``, OutcomeBadStatus)
	f(200, ``, OutcomeBadAnswer)
	f(200, `L3`, OutcomeBadAnswer)
	f(200, `{"tier":"L9"}`, OutcomeBadAnswer)
	f(200, `{"tier":3}`, OutcomeBadAnswer)
	f(200, `{"tier":"L3"`, OutcomeBadAnswer)
	f(200, `<html>oops</html>`, OutcomeBadAnswer)
	f(200, `{"tier":"L3","pad":"`+strings.Repeat("x", MaxAnswerBytes)+`"}`, OutcomeBadAnswer)

	// Timeout: the classifier answers after 500 ms, the router waits 50.
	before := counter(`infera_classifier_requests_total{result="timeout"}`)
	rec.set(200, `{"tier":"L3"}`, 500*time.Millisecond)
	cfg.TimeoutMS = 50
	start := time.Now()
	r = c.Classify(cfg, []byte("m"), []byte("x"))
	if r.Outcome != OutcomeTimeout || r.Tier != TierL1 || r.Model != "small" {
		t.Fatalf("slow classifier: %+v, want the fallback after a timeout", r)
	}
	if d := time.Since(start); d >= 450*time.Millisecond {
		t.Fatalf("timeout of 50 ms took %v (waited for the answer)", d)
	}
	if counter(`infera_classifier_requests_total{result="timeout"}`) != before+1 {
		t.Fatal("timeout not counted")
	}
	// And the next call works again on a fresh connection.
	rec.set(200, `{"tier":"L2"}`, 0)
	cfg.TimeoutMS = 2000
	if r := c.Classify(cfg, []byte("m"), []byte("x")); r.Outcome != OutcomeOK || r.Tier != TierL2 {
		t.Fatalf("after a timeout: %+v", r)
	}

	// Unreachable classifier (a closed port): fallback, outcome error.
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	dead := "http://" + ln.Addr().String() + "/c"
	ln.Close()
	cfg.ClassifierURL = dead
	if r := c.Classify(cfg, []byte("m"), []byte("x")); r.Outcome != OutcomeError || r.Tier != TierL1 {
		t.Fatalf("dead classifier: %+v", r)
	}
}

// A reload that changes the classifier URL takes effect on the next call.
func TestClassifyFollowsConfigReloads(t *testing.T) {
	a := &recorder{status: 200, answer: `{"tier":"L1"}`}
	b := &recorder{status: 200, answer: `{"tier":"L3"}`}
	ua, ub := serve(t, &http.Server{Handler: a}), serve(t, &http.Server{Handler: b})
	var c Client
	defer c.Close()
	cfgA, cfgB := smartCfg(ua+"/c"), smartCfg(ub+"/c")
	for i, want := range []Tier{TierL1, TierL3, TierL1, TierL3} {
		cfg := cfgA
		if i%2 == 1 {
			cfg = cfgB
		}
		if r := c.Classify(cfg, []byte("m"), []byte("x")); r.Tier != want || r.Outcome != OutcomeOK {
			t.Fatalf("call %d: %+v, want %v", i, r, want)
		}
	}
}

// Requests of two config snapshots in turn (the new classifier URL, and
// the old one for requests that loaded their snapshot before the reload)
// keep one pool each: the alternation opens no connection after the first
// one to each classifier. Each change of URL used to replace the pool and
// close the other's connections, so every call dialed again (and a TLS
// classifier's handshake ate into timeout_ms).
func TestClassifyAlternatingSnapshotsKeepTheirConnections(t *testing.T) {
	var dials [2]atomic.Int64
	urls := [2]string{}
	for i := range urls {
		urls[i] = serve(t, &http.Server{Handler: &recorder{status: 200, answer: `{"tier":"L1"}`},
			ConnState: func(_ net.Conn, st http.ConnState) {
				if st == http.StateNew {
					dials[i].Add(1)
				}
			}})
	}
	var c Client
	defer c.Close()
	cfgs := [2]*config.SmartModelSelection{smartCfg(urls[0] + "/c"), smartCfg(urls[1] + "/c")}
	for i := 0; i < 8; i++ {
		if r := c.Classify(cfgs[i%2], []byte("m"), []byte("x")); r.Outcome != OutcomeOK {
			t.Fatalf("call %d: %+v", i, r)
		}
	}
	if dials[0].Load() != 1 || dials[1].Load() != 1 {
		t.Fatalf("connections opened: %d and %d, want 1 each", dials[0].Load(), dials[1].Load())
	}
	// A third URL replaces the older pool; the newer one stays.
	urlC := serve(t, &http.Server{Handler: &recorder{status: 200, answer: `{"tier":"L3"}`}})
	for _, cfg := range []*config.SmartModelSelection{smartCfg(urlC + "/c"), cfgs[1]} {
		if r := c.Classify(cfg, []byte("m"), []byte("x")); r.Outcome != OutcomeOK {
			t.Fatalf("%s: %+v", cfg.ClassifierURL, r)
		}
	}
	if dials[1].Load() != 1 {
		t.Fatalf("connections opened to the newer pool: %d, want 1", dials[1].Load())
	}
}

func TestApplies(t *testing.T) {
	cfg := smartCfg("http://x")
	f := func(model string, want bool) {
		t.Helper()
		if got := Applies(cfg, []byte(model)); got != want {
			t.Fatalf("Applies(%v, %q) = %v", cfg.MatchModels, model, got)
		}
	}
	f("anything", true)
	cfg.MatchModels = []string{"auto", "smart-*"}
	f("auto", true)
	f("AUTO", true)
	f("smart-chat", true)
	f("gpt-4o", false)
	f("autox", false)
	// A name longer than any gateway serves is not classified (the
	// classifier got it whole: 200 KB from one request).
	f("smart-"+strings.Repeat("x", 1018), true)
	f("smart-"+strings.Repeat("x", 1019), false)
	cfg.Enabled = false
	f("auto", false)
}

func listen(tb testing.TB) net.Listener {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	return ln
}

// The reference classifier takes one JSON object per request: data after
// it, even a stray brace, is a 400 (json.Decoder.More is false before '}').
func TestTheReferenceServerRefusesDataAfterTheBody(t *testing.T) {
	base := serve(t, NewServer(Heuristic{L2Bytes: 200, L3Bytes: 2000, Keywords: DefaultKeywords}, "", 0))
	post := func(body string) int {
		t.Helper()
		res, err := http.Post(base+ClassifyPath, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		return res.StatusCode
	}
	in := `{"model":"auto","text":"hi","text_bytes":2}`
	if s := post(in + "\n"); s != 200 {
		t.Fatalf("one object: %d", s)
	}
	for _, tail := range []string{"}", "]", "{}", "x"} {
		if s := post(in + tail); s != 400 {
			t.Errorf("object + %q: %d, want 400", tail, s)
		}
	}
}

// A classifier whose keep-alive idle timeout is shorter than the client's
// (uvicorn's and Node's is 5 s) closes the pooled connection while it
// idles; the next call found it dead and took the fallback tier, every
// other request under sparse traffic, although the classifier was up.
func TestAClassifierThatClosedAnIdleConnectionStillClassifies(t *testing.T) {
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			io.Copy(io.Discard, r.Body)
			w.Header().Set("Content-Type", "application/json")
			w.Write([]byte(`{"tier":"L3"}`))
		}),
		IdleTimeout: 100 * time.Millisecond, // the classifier's keep-alive timeout
	}
	base := serve(t, srv)
	cfg := smartCfg(base + ClassifyPath)
	var c Client
	defer c.Close()
	bad := 0
	for i := 0; i < 5; i++ {
		r := c.Classify(cfg, []byte("auto"), []byte("hello"))
		if r.Outcome != OutcomeOK || r.Tier != TierL3 {
			bad++
			t.Logf("call %d: %+v (outcome %s)", i, r, r.Outcome)
		}
		time.Sleep(300 * time.Millisecond) // longer than the classifier's idle timeout
	}
	if bad > 0 {
		t.Fatalf("%d of 5 calls to a healthy classifier got the fallback tier", bad)
	}
}

// An https classifier_url is classified over TLS: the request carried no
// scheme, so the TLS pool refused every call before sending it and each
// request took the fallback tier (outcome error).
func TestAnHTTPSClassifierClassifies(t *testing.T) {
	var gotAuth atomic.Value
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		gotAuth.Store(r.Header.Get("Authorization") + " " + r.Host + " " + r.URL.RequestURI())
		io.Copy(io.Discard, r.Body)
		w.Write([]byte(`{"tier":"L3"}`))
	}))
	defer srv.Close()
	cfg := smartCfg(srv.URL + "/v1/classify?x=1")
	cfg.ClassifierAPIKey = config.NewSecret("ck-tls")
	var c Client
	defer c.Close()
	tg, err := c.target(cfg.ClassifierURL)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(srv.Certificate())
	tg.hc.TLSConfig.RootCAs = roots // the test server's certificate, instead of the system's CAs
	for i := 0; i < 3; i++ {
		r := c.Classify(cfg, []byte("auto"), []byte("hi"))
		if r.Outcome != OutcomeOK || r.Tier != TierL3 || r.Model != "large" {
			t.Fatalf("call %d over https: %+v, want L3 from the classifier", i, r)
		}
	}
	host := strings.TrimPrefix(srv.URL, "https://")
	if got, want := gotAuth.Load(), "Bearer ck-tls "+host+" /v1/classify?x=1"; got != want {
		t.Fatalf("classifier received %q, want %q", got, want)
	}
}

// An https classifier that accepts the connection and never answers the TLS
// handshake gives the fallback tier after timeout_ms: the handshake ran
// without a read deadline, so the request waited forever (a live router's
// request was still waiting after 10 minutes, with timeout_ms 300).
func TestAClassifierStuckInTheTLSHandshakeTimesOut(t *testing.T) {
	addr := testsrv.Silent(t) // never answers the handshake
	cfg := smartCfg("https://" + addr + "/v1/classify")
	cfg.TimeoutMS = 200
	cfg.FallbackTier = "L1"
	var c Client
	defer c.Close()
	done := make(chan Result, 1)
	start := time.Now()
	go func() { done <- c.Classify(cfg, []byte("auto"), []byte("hi")) }()
	select {
	case r := <-done:
		if r.Outcome != OutcomeTimeout || r.Tier != TierL1 {
			t.Fatalf("%+v, want the fallback L1 after a timeout", r)
		}
		if d := time.Since(start); d > time.Second {
			t.Fatalf("took %v with timeout_ms 200", d)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Classify still waiting after 5 s with timeout_ms 200 (the TLS handshake has no deadline)")
	}
}
