package proxy

import (
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/infera/infera/config"
	"github.com/valyala/fasthttp"
)

type healthAnswer struct {
	Status     string `json:"status"`
	Components map[string]struct {
		OK     bool   `json:"ok"`
		Detail string `json:"detail"`
	} `json:"components"`
}

func getHealth(t *testing.T, url string) healthAnswer {
	t.Helper()
	resp, err := http.Get(url + "/health")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var h healthAnswer
	if err := json.NewDecoder(resp.Body).Decode(&h); err != nil {
		t.Fatal(err)
	}
	return h
}

// A classifier that hangs costs timeout_ms to breaker_failure_threshold
// requests in a row, then none: its breaker opens and requests take the
// fallback tier at once, without asking it, for breaker_cooldown_ms, while
// /health says the classifier is down and the metrics say why; then one
// request probes it, and its answer closes the breaker. A reload that sets
// the threshold to 0 turns the breaker off. Every request used to wait for
// timeout_ms on such a classifier.
func TestAClassifierThatHangsIsSkippedUntilAProbeFindsItBack(t *testing.T) {
	var hang atomic.Bool
	hang.Store(true)
	release := make(chan struct{})
	cls := startUpstream(t, func(ctx *fasthttp.RequestCtx) {
		if hang.Load() {
			select {
			case <-release:
			case <-time.After(10 * time.Second):
			}
			return
		}
		ctx.SetBodyString(`{"tier":"L1"}`)
	})
	t.Cleanup(func() { close(release) }) // before the servers stop (LIFO)
	eng := startUpstream(t, okHandler)
	cfg := config.Default()
	cfg.Debug.DecisionHeader = true
	cfg.SmartModelSelection = config.SmartModelSelection{Enabled: true, ClassifierURL: cls.url + "/v1/classify",
		TimeoutMS: 400, FallbackTier: "L2", MatchModels: []string{"auto"},
		Tiers: config.TierModels{L1: "m", L2: "m", L3: "m"}, MaxTextBytes: 8192,
		BreakerFailureThreshold: 3, BreakerCooldownMS: 1000, BreakerMaxCooldownMS: 4000}
	r := startRouterWith(t, nil, cfg, nil, eng.url)
	auto := `{"model":"auto","messages":[{"role":"user","content":"hello"}],"max_tokens":4}`
	send := func() (tier string, took time.Duration) {
		t.Helper()
		start := time.Now()
		resp, err := http.Post(r.url+"/v1/chat/completions", "application/json", strings.NewReader(auto))
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("status %d", resp.StatusCode)
		}
		return resp.Header.Get("X-Infera-Tier"), time.Since(start)
	}

	// Counters are the process's: compare their moves.
	counters := []string{
		`infera_classifier_breaker_trips_total`,
		`infera_classifier_breaker_skipped_total`,
		`infera_classifier_requests_total{result="timeout"}`,
		`infera_smart_selection_total{tier="L2",source="fallback"}`,
	}
	before := map[string]float64{}
	num := func(series string) float64 {
		t.Helper()
		s := metricValue(t, r.url, series)
		if s == "" {
			return 0 // not registered yet
		}
		v, err := strconv.ParseFloat(s, 64)
		if err != nil {
			t.Fatalf("%s: %v", series, err)
		}
		return v
	}
	for _, series := range counters {
		before[series] = num(series)
	}
	for i := 0; i < 3; i++ {
		if tier, took := send(); tier != "L2" || took < 400*time.Millisecond {
			t.Fatalf("request %d on the hung classifier: tier %s in %v, want L2 after timeout_ms", i, tier, took)
		}
	}
	// Open: the fallback tier at once, the classifier not asked.
	for i := 0; i < 5; i++ {
		if tier, took := send(); tier != "L2" || took > 200*time.Millisecond {
			t.Fatalf("request %d with the breaker open: tier %s in %v, want L2 at once", i, tier, took)
		}
	}
	if n := cls.hits.Load(); n != 3 {
		t.Fatalf("the classifier was asked %d times, want 3", n)
	}
	h := getHealth(t, r.url)
	if c, ok := h.Components["classifier"]; h.Status != "degraded" || !ok || c.OK || !strings.Contains(c.Detail, "breaker open") {
		t.Fatalf("health with the breaker open: %+v", h)
	}
	if v := metricValue(t, r.url, `infera_classifier_breaker_state{classifier="`+cls.url+`/v1/classify"}`); v != "2" {
		t.Fatalf("breaker state with the breaker open %s", v)
	}
	for i, want := range []float64{1, 5, 3, 8} {
		if d := num(counters[i]) - before[counters[i]]; d != want {
			t.Fatalf("%s moved by %g, want %g", counters[i], d, want)
		}
	}

	// The classifier is back; after the cooldown one request probes it
	// and closes the breaker.
	hang.Store(false)
	time.Sleep(1100 * time.Millisecond)
	if tier, _ := send(); tier != "L1" {
		t.Fatalf("the probe: tier %s, want the classifier's L1", tier)
	}
	if tier, _ := send(); tier != "L1" {
		t.Fatalf("after the probe: tier %s, want L1", tier)
	}
	if h := getHealth(t, r.url); h.Status != "ok" || !h.Components["classifier"].OK {
		t.Fatalf("health after the probe: %+v", h)
	}
	if v := metricValue(t, r.url, `infera_classifier_breaker_state{classifier="`+cls.url+`/v1/classify"}`); v != "0" {
		t.Fatalf("breaker state after the probe %s", v)
	}

	// Hot reload: threshold 0 turns the breaker off; every request asks.
	hang.Store(true)
	c := *cfg
	c.SmartModelSelection.BreakerFailureThreshold = 0
	r.store.Set(&c)
	asked := cls.hits.Load()
	for i := 0; i < 4; i++ {
		if tier, took := send(); tier != "L2" || took < 400*time.Millisecond {
			t.Fatalf("request %d without a breaker: tier %s in %v", i, tier, took)
		}
	}
	if n := cls.hits.Load() - asked; n != 4 {
		t.Fatalf("without a breaker the classifier was asked %d times, want 4", n)
	}
}

// The classifier's breaker series is labelled with its URL without the
// query (where a token may ride) and never with its API key, and follows
// the config in force as /health does: after a reload from a classifier
// whose breaker opened to one that answers, /metrics shows the new one's
// state and no longer the old one's (an alert on it would fire forever);
// disabling smart model selection removes the series; the series goes when
// the router shuts down. The gauge was process-wide: one unlabelled value,
// the state of whichever classifier was asked last, kept while the section
// was disabled.
func TestEachClassifierHasItsOwnBreakerStateSeries(t *testing.T) {
	bad := startUpstream(t, func(ctx *fasthttp.RequestCtx) { ctx.SetStatusCode(fasthttp.StatusInternalServerError) })
	good := startUpstream(t, func(ctx *fasthttp.RequestCtx) { ctx.SetBodyString(`{"tier":"L1"}`) })
	eng := startUpstream(t, okHandler)
	cfg := config.Default()
	cfg.Debug.DecisionHeader = true
	cfg.SmartModelSelection = config.SmartModelSelection{Enabled: true, ClassifierURL: bad.url + "/v1/classify?token=url-sekret",
		ClassifierAPIKey: config.NewSecret("key-sekret"),
		TimeoutMS:        2000, FallbackTier: "L2", MatchModels: []string{"auto"},
		Tiers: config.TierModels{L1: "m", L2: "m", L3: "m"}, MaxTextBytes: 8192,
		BreakerFailureThreshold: 1, BreakerCooldownMS: 60000, BreakerMaxCooldownMS: 60000}
	r := startRouterWith(t, nil, cfg, nil, eng.url)
	send := func(want string) {
		t.Helper()
		resp, err := http.Post(r.url+"/v1/chat/completions", "application/json",
			strings.NewReader(`{"model":"auto","messages":[{"role":"user","content":"hello"}],"max_tokens":4}`))
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if tier := resp.Header.Get("X-Infera-Tier"); resp.StatusCode != 200 || tier != want {
			t.Fatalf("status %d tier %q, want 200 %s", resp.StatusCode, tier, want)
		}
	}
	badSeries := `infera_classifier_breaker_state{classifier="` + bad.url + `/v1/classify"}`
	goodSeries := `infera_classifier_breaker_state{classifier="` + good.url + `/v1/classify"}`
	send("L2") // the classifier answers 500: its breaker opens
	if v := metricValue(t, r.url, badSeries); v != "2" {
		t.Fatalf("%s = %q, want 2 (open)", badSeries, v)
	}
	c := *cfg
	c.SmartModelSelection.ClassifierURL = good.url + "/v1/classify"
	r.store.Set(&c)
	send("L1")
	if v := metricValue(t, r.url, goodSeries); v != "0" {
		t.Fatalf("%s = %q, want 0 (closed)", goodSeries, v)
	}
	if v := metricValue(t, r.url, badSeries); v != "" {
		t.Fatalf("after the reload to another classifier, the old one's series is still there: %s %s", badSeries, v)
	}
	// Back to the first classifier, its breaker still open; then the
	// section disabled: no series.
	r.store.Set(cfg)
	if v := metricValue(t, r.url, badSeries); v != "2" {
		t.Fatalf("%s = %q after the reload back, want 2 (open)", badSeries, v)
	}
	off := *cfg
	off.SmartModelSelection.Enabled = false
	r.store.Set(&off)
	if v := metricValue(t, r.url, badSeries); v != "" {
		t.Fatalf("smart model selection disabled, yet %s %s", badSeries, v)
	}
	resp, err := http.Get(r.url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	all, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if strings.Contains(string(all), "sekret") {
		t.Fatal("/metrics shows the classifier's token or API key")
	}
	if err := r.srv.Shutdown(); err != nil {
		t.Fatal(err)
	}
	var buf strings.Builder
	metrics.WritePrometheus(&buf, false)
	if strings.Contains(buf.String(), badSeries) || strings.Contains(buf.String(), goodSeries) {
		t.Fatal("the classifiers' breaker series outlived the router")
	}
}
