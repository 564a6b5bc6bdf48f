package proxy

import (
	"bytes"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/VictoriaMetrics/metrics"
	"github.com/infera/infera/fleet"
	"github.com/valyala/fasthttp"
)

func modelCounter(model, suffix string) uint64 {
	return metrics.GetOrCreateCounter(`infera_model_` + suffix).Get()
}

// Requests are counted under the model the fleet served, by status class,
// with the engines' token usage, time to first byte and duration; a model
// the client made up makes no series; a model name that needs escaping
// gives a valid exposition.
func TestRequestsAreCountedPerServedModel(t *testing.T) {
	var fail atomic.Bool
	up := startUpstream(t, func(ctx *fasthttp.RequestCtx) {
		if fail.Load() {
			ctx.SetStatusCode(500)
			ctx.SetBodyString(`{"error":{"message":"boom"}}`)
			return
		}
		okHandler(ctx) // usage: prompt 7, completion 1, cached 3
	})
	f := defaultFlags()
	f.RequestMaxRetries = 0
	r := startRouter(t, f, nil, up.url)
	if err := r.fl.Upsert(fleet.Record{ID: "w9", URL: up.url, Models: []string{`odd"model`}}); err != nil {
		t.Fatal(err)
	}
	ok0 := modelCounter("m", `responses_total{model="m",class="2xx"}`)
	bad0 := modelCounter("m", `responses_total{model="m",class="5xx"}`)
	prompt0 := modelCounter("m", `tokens_total{model="m",kind="prompt"}`)
	cached0 := modelCounter("m", `tokens_total{model="m",kind="cached"}`)
	for i := 0; i < 2; i++ {
		if code, b := post(t, r.url+"/v1/chat/completions", chatBody); code != 200 {
			t.Fatalf("%d %s", code, b)
		}
	}
	fail.Store(true)
	if code, _ := post(t, r.url+"/v1/chat/completions", chatBody); code != 500 {
		t.Fatalf("failing engine: %d", code)
	}
	fail.Store(false)
	post(t, r.url+"/v1/chat/completions", strings.Replace(chatBody, `"m"`, `"made-up-model"`, 1))
	if code, b := post(t, r.url+"/v1/chat/completions", strings.Replace(chatBody, `"m"`, `"odd\"model"`, 1)); code != 200 {
		t.Fatalf("odd model: %d %s", code, b)
	}

	if d := modelCounter("m", `responses_total{model="m",class="2xx"}`) - ok0; d != 2 {
		t.Fatalf("2xx of m: %d, want 2", d)
	}
	if d := modelCounter("m", `responses_total{model="m",class="5xx"}`) - bad0; d != 1 {
		t.Fatalf("5xx of m: %d, want 1", d)
	}
	if d := modelCounter("m", `tokens_total{model="m",kind="prompt"}`) - prompt0; d != 14 {
		t.Fatalf("prompt tokens of m: %d, want 14", d)
	}
	if d := modelCounter("m", `tokens_total{model="m",kind="cached"}`) - cached0; d != 6 {
		t.Fatalf("cached tokens of m: %d, want 6", d)
	}
	var out bytes.Buffer
	metrics.WritePrometheus(&out, false)
	text := out.String()
	if strings.Contains(text, "made-up-model") {
		t.Fatal("a model the client made up has series")
	}
	if !strings.Contains(text, `infera_model_responses_total{model="odd\"model",class="2xx"} 1`) ||
		!strings.Contains(text, `infera_model_time_to_first_byte_seconds_bucket{model="m",le=`) ||
		!strings.Contains(text, `infera_model_request_duration_seconds_count{model="m"}`) {
		t.Fatalf("series missing or unescaped:\n%s", grepLines(text, "infera_model_"))
	}
}

// Beyond maxModelSeries models, the next ones share model="other".
func TestModelSeriesAreBounded(t *testing.T) {
	modelMu.Lock()
	created := modelCreated
	modelCreated = maxModelSeries - 2
	modelMu.Unlock()
	t.Cleanup(func() {
		modelMu.Lock()
		modelCreated = created
		modelMu.Unlock()
	})
	var names []string
	for i := 0; i < 5; i++ {
		names = append(names, "bounded-"+strconv.Itoa(i))
	}
	t.Cleanup(func() {
		for _, n := range names {
			modelSeries.Delete(n)
		}
	})
	var got []*modelMetrics
	for _, n := range names {
		got = append(got, forModel(n))
	}
	if got[0] == got[1] || got[2] != got[3] || got[3] != got[4] || forModel(names[0]) != got[0] {
		t.Fatal("the first two models have their own series and the rest share one")
	}
	var out bytes.Buffer
	metrics.WritePrometheus(&out, false)
	if strings.Contains(out.String(), "bounded-2") {
		t.Fatal("a model beyond the bound has its own series")
	}
}
