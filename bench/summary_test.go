package bench

import (
	"math"
	"regexp"
	"strings"
	"testing"
	"time"
)

func TestPercentile(t *testing.T) {
	f := func(vals []float64, q, want float64) {
		t.Helper()
		got := Percentile(vals, q)
		if math.Abs(got-want) > 1e-9 && !(math.IsNaN(want) && math.IsNaN(got)) {
			t.Fatalf("Percentile(%v, %v) = %v, want %v", vals, q, got, want)
		}
	}
	f(nil, 0.5, math.NaN())
	f([]float64{3}, 0.99, 3)
	f([]float64{1, 2, 3, 4}, 0.5, 2.5)
	f([]float64{1, 2, 3, 4, 5}, 0.5, 3)
	f([]float64{1, 2, 3, 4, 5}, 0.9, 4.6)
	f([]float64{1, 2, 3, 4, 5}, 0, 1)
	f([]float64{1, 2, 3, 4, 5}, 1, 5)
	var hundred []float64
	for i := 1; i <= 100; i++ {
		hundred = append(hundred, float64(i))
	}
	f(hundred, 0.99, 99.01)
}

func TestSummarize(t *testing.T) {
	msd := time.Millisecond
	res := []Result{
		// ttft 100, e2e 1000, 10 tokens -> tpot 100
		{Status: 200, TTFT: 100 * msd, E2E: 1000 * msd, OutputTokens: 10, PromptTokens: 1000, CachedTokens: 500, Worker: "a"},
		// ttft 300, e2e 500, 5 tokens -> tpot 50
		{Status: 200, TTFT: 300 * msd, E2E: 500 * msd, OutputTokens: 5, PromptTokens: 1000, CachedTokens: 0, Worker: "a"},
		// ttft 200, 1 token -> no tpot
		{Status: 200, TTFT: 200 * msd, E2E: 200 * msd, OutputTokens: 1, PromptTokens: 2000, CachedTokens: 1500, Worker: "b"},
		{Status: 503, Err: "http 503"},
		{Status: 0, Err: "dial refused"},
	}
	s := Summarize("x", res, nil, 2*time.Second, SLO{TTFT: 250 * msd, TPOT: 80 * msd}, 4)
	if s.OK != 3 || s.Errors != 2 || s.ErrorsByStatus["503"] != 1 || s.ErrorsByStatus["0"] != 1 {
		t.Fatalf("counts: %+v", s)
	}
	if s.TTFT.Mean != 200 || s.TTFT.P50 != 200 || s.TTFT.Max != 300 {
		t.Fatalf("ttft: %+v", s.TTFT)
	}
	if s.TPOT.N != 2 || s.TPOT.Mean != 75 {
		t.Fatalf("tpot: %+v", s.TPOT)
	}
	// SLO: first misses TPOT (100 > 80), second misses TTFT, third meets.
	if s.Goodput != 0.5 || math.Abs(s.GoodputFrac-0.2) > 1e-12 {
		t.Fatalf("goodput %v frac %v", s.Goodput, s.GoodputFrac)
	}
	if s.HitRate != 0.5 {
		t.Fatalf("hit rate %v, want 0.5", s.HitRate)
	}
	// 3 requests over 4 workers: mean 0.75, max 2.
	if math.Abs(s.Imbalance-2/0.75) > 1e-12 {
		t.Fatalf("imbalance %v", s.Imbalance)
	}
	if s.Throughput != 1.5 || s.OutputTokPerS != 8 {
		t.Fatalf("throughput %v tok/s %v", s.Throughput, s.OutputTokPerS)
	}
	var b strings.Builder
	if err := WriteTable(&b, []Summary{s, s}); err != nil || !strings.Contains(b.String(), "prefix hit rate") {
		t.Fatalf("table: %v\n%s", err, b.String())
	}
}

// An answer read whole (--no-stream) has no TPOT: it was counted as 0,
// meeting any --slo-tpot; the table shows "-" for what was not measured,
// and --slo-tpot without streaming is refused.
func TestAnswersReadWholeHaveNoTPOT(t *testing.T) {
	msd := time.Millisecond
	res := []Result{{Status: 200, TTFT: 900 * msd, E2E: 900 * msd, OutputTokens: 10, Whole: true}}
	s := Summarize("x", res, nil, time.Second, SLO{TPOT: time.Microsecond}, 1)
	if s.TPOT.N != 0 || s.GoodputFrac != 1 {
		t.Fatalf("tpot %+v, goodput %v", s.TPOT, s.GoodputFrac)
	}
	var b strings.Builder
	if err := WriteTable(&b, []Summary{s}); err != nil || !regexp.MustCompile(`TPOT p99 ms\s+-`).MatchString(b.String()) {
		t.Fatalf("table: %v\n%s", err, b.String())
	}
	l := LoadFlags{Stream: false, SloTPOT: time.Millisecond}
	if err := l.Validate(); err == nil {
		t.Fatal("--slo-tpot accepted with --no-stream")
	}
}

func TestImbalance(t *testing.T) {
	f := func(c map[string]int, n int, want float64) {
		t.Helper()
		if got := Imbalance(c, n); math.Abs(got-want) > 1e-12 {
			t.Fatalf("Imbalance(%v, %d) = %v, want %v", c, n, got, want)
		}
	}
	f(nil, 0, 0)
	f(map[string]int{"a": 5, "b": 5}, 0, 1)
	f(map[string]int{"a": 5, "b": 5}, 4, 2)
	f(map[string]int{"a": 9, "b": 1}, 2, 1.8)
}

func TestCeilingInTableAndChart(t *testing.T) {
	a := Summary{Name: "a", HitRate: 0.3, TTFTCDF: []float64{1, 2}}
	b := Summary{Name: "b", HitRate: 0.36, TTFTCDF: []float64{1, 3}}
	var plain strings.Builder
	if err := WriteTable(&plain, []Summary{a, b}); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(plain.String(), "ceiling") {
		t.Fatalf("ceiling rows without a ceiling:\n%s", plain.String())
	}
	a.SetCeiling(0.4)
	b.SetCeiling(0.4)
	if math.Abs(a.CeilingShare-0.75) > 1e-12 || math.Abs(b.CeilingShare-0.9) > 1e-12 {
		t.Fatalf("shares %v %v", a.CeilingShare, b.CeilingShare)
	}
	var tab, svg strings.Builder
	if err := WriteTable(&tab, []Summary{a, b}); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"pooled-cache ceiling", "0.400", "share of ceiling", "75.0%", "90.0%"} {
		if !strings.Contains(tab.String(), want) {
			t.Fatalf("table lacks %q:\n%s", want, tab.String())
		}
	}
	if err := WriteSVG(&svg, "t", []Summary{a, b}); err != nil || !strings.Contains(svg.String(), "pooled-cache ceiling 0.400") {
		t.Fatalf("chart: %v", err)
	}
	// A bar's value is written inside it, clear of the ceiling's label
	// just above the ceiling line (a bar near the ceiling hid it).
	if !strings.Contains(svg.String(), `fill="#fff">0.360</text>`) {
		t.Fatalf("the bar's value is not inside it:\n%s", svg.String())
	}
}
