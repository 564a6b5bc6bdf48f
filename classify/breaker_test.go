package classify

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/infera/infera/breaker"
	"github.com/infera/infera/config"
)

// The breaker's state machine: threshold failures in a row open it; the
// cooldown of the config in force (a reload included) lets one probe in;
// a failed probe doubles the cooldown up to the cap, a good one closes
// it; a success in between resets the count; threshold 0 closes it.
func TestClassifierBreakerOpensProbesAndFollowsReloads(t *testing.T) {
	cfg := &config.SmartModelSelection{BreakerFailureThreshold: 2, BreakerCooldownMS: 100, BreakerMaxCooldownMS: 250}
	var b breaker.Breaker
	ms := func(n int64) int64 { return n * int64(time.Millisecond) }
	admit := func(now int64, wantOK, wantProbe bool) {
		t.Helper()
		if ok, probe, _ := b.Admit(breakerSettings(cfg), now); ok != wantOK || probe != wantProbe {
			t.Fatalf("admit at %d ms: %v %v, want %v %v (state %s)", now/int64(time.Millisecond), ok, probe, wantOK, wantProbe, b.State())
		}
	}
	admit(0, true, false)
	record(&b, breakerSettings(cfg), 0, false, false)
	record(&b, breakerSettings(cfg), 0, true, false) // a success resets the count
	record(&b, breakerSettings(cfg), 0, false, false)
	admit(0, true, false)
	if !record(&b, breakerSettings(cfg), ms(10), false, false) {
		t.Fatal("the second failure in a row did not open it")
	}
	admit(ms(50), false, false)
	admit(ms(110), true, true)
	admit(ms(111), false, false) // the probe is in flight
	if !record(&b, breakerSettings(cfg), ms(120), false, true) {
		t.Fatal("a failed probe did not reopen it")
	}
	admit(ms(250), false, false) // 200 ms now
	admit(ms(320), true, true)
	record(&b, breakerSettings(cfg), ms(330), false, true) // 400 ms, capped at 250
	admit(ms(570), false, false)
	admit(ms(580), true, true)
	record(&b, breakerSettings(cfg), ms(590), false, true)
	// A reload shortens the cooldown of the open breaker.
	cfg.BreakerCooldownMS, cfg.BreakerMaxCooldownMS = 10, 10
	admit(ms(601), true, true)
	record(&b, breakerSettings(cfg), ms(610), true, true)
	if b.State() != BreakerClosed {
		t.Fatalf("a good probe left state %s", b.State())
	}
	// Threshold 0: closed, whatever happens.
	record(&b, breakerSettings(cfg), ms(700), false, false)
	record(&b, breakerSettings(cfg), ms(700), false, false)
	cfg.BreakerFailureThreshold = 0
	admit(ms(701), true, false)
	for i := 0; i < 10; i++ {
		record(&b, breakerSettings(cfg), ms(702), false, false)
	}
	admit(ms(703), true, false)
}

// Without Current, /metrics shows the breaker of the classifier last
// added, labelled with its URL without the query; after Close, nothing.
func TestTheBreakerSeriesOfAClientWithoutCurrentIsTheLastClassifiers(t *testing.T) {
	bad := serve(t, &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(500) })})
	var c Client
	series := func() string {
		var b strings.Builder
		metrics.WritePrometheus(&b, false)
		var out []string
		for _, l := range strings.Split(b.String(), "\n") {
			if strings.HasPrefix(l, "infera_classifier_breaker_state{") && strings.Contains(l, bad) {
				out = append(out, l)
			}
		}
		return strings.Join(out, "|")
	}
	cfg := smartCfg(bad + "/v1/classify?key=q-sekret")
	cfg.BreakerFailureThreshold, cfg.BreakerCooldownMS, cfg.BreakerMaxCooldownMS = 1, 60000, 60000
	c.Classify(cfg, []byte("auto"), []byte("hi"))
	want := `infera_classifier_breaker_state{classifier="` + bad + `/v1/classify"} 2`
	if got := series(); got != want {
		t.Fatalf("series %q, want %q", got, want)
	}
	c.Close()
	if got := series(); got != "" {
		t.Fatalf("after Close: %q", got)
	}
}
