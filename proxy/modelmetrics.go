package proxy

import (
	"strings"
	"sync"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/puzpuzpuz/xsync/v3"
)

// modelMetrics are the series of one served model: requests by status
// class, the engines' token usage, time to first byte and duration. The
// model is the one the fleet (or an external upstream) served, after
// aliases and routing, never a name a client made up: the series stay as
// many as the models configured, and at most maxModelSeries (the rest are
// counted under model="other").
type modelMetrics struct {
	resp                       [3]*metrics.Counter // 2xx, 4xx, 5xx
	prompt, completion, cached *metrics.Counter
	ttft, duration             *metrics.PrometheusHistogram
}

const maxModelSeries = 256

var (
	modelSeries  = xsync.NewMapOf[string, *modelMetrics]()
	modelMu      sync.Mutex // serializes creation (and its count)
	modelCreated int
	modelOther   *modelMetrics
)

// forModel returns the series of model, created on its first request.
func forModel(model string) *modelMetrics {
	if m, ok := modelSeries.Load(model); ok {
		return m
	}
	modelMu.Lock()
	defer modelMu.Unlock()
	if m, ok := modelSeries.Load(model); ok {
		return m
	}
	if modelCreated >= maxModelSeries {
		if modelOther == nil {
			modelOther = newModelMetrics("other")
		}
		return modelOther
	}
	modelCreated++
	m := newModelMetrics(model)
	modelSeries.Store(strings.Clone(model), m)
	return m
}

func newModelMetrics(model string) *modelMetrics {
	l := `{model="` + labelEscape(model) + `"`
	return &modelMetrics{
		resp: [3]*metrics.Counter{
			metrics.GetOrCreateCounter(`infera_model_responses_total` + l + `,class="2xx"}`),
			metrics.GetOrCreateCounter(`infera_model_responses_total` + l + `,class="4xx"}`),
			metrics.GetOrCreateCounter(`infera_model_responses_total` + l + `,class="5xx"}`),
		},
		prompt:     metrics.GetOrCreateCounter(`infera_model_tokens_total` + l + `,kind="prompt"}`),
		completion: metrics.GetOrCreateCounter(`infera_model_tokens_total` + l + `,kind="completion"}`),
		cached:     metrics.GetOrCreateCounter(`infera_model_tokens_total` + l + `,kind="cached"}`),
		ttft:       metrics.GetOrCreatePrometheusHistogramExt(`infera_model_time_to_first_byte_seconds`+l+`}`, latencyBuckets),
		duration:   metrics.GetOrCreatePrometheusHistogramExt(`infera_model_request_duration_seconds`+l+`}`, durationBuckets),
	}
}

// labelEscape escapes a Prometheus label value.
func labelEscape(s string) string {
	if !strings.ContainsAny(s, "\"\\\n") {
		return s
	}
	r := strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`)
	return r.Replace(s)
}

// countModel records an ended request under its served model (releaseState).
// Requests no worker or upstream took (refused, unknown model) have none.
func countModel(rs *reqState) {
	model := rs.lease.Decision.Model
	if model == "" || rs.acc.status == 0 {
		return
	}
	m := forModel(model)
	switch s := rs.acc.status; {
	case s >= 500:
		m.resp[2].Inc()
	case s >= 400:
		m.resp[1].Inc()
	default:
		m.resp[0].Inc()
	}
	if u := &rs.usage; u.known() {
		m.prompt.Add(u.prompt)
		m.completion.Add(u.completion)
		m.cached.Add(u.cached)
	}
	if rs.ttft > 0 {
		m.ttft.Update(rs.ttft.Seconds())
	}
	m.duration.Update(rs.duration().Seconds())
}

// duration is the request's duration: as the answer's end measured it, or
// until now.
func (rs *reqState) duration() time.Duration {
	if rs.dur > 0 {
		return rs.dur
	}
	return time.Since(rs.start)
}
