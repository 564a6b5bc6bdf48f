package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// Stats summarises one latency distribution, in milliseconds.
type Stats struct {
	N    int     `json:"n"`
	Mean float64 `json:"mean_ms"`
	P50  float64 `json:"p50_ms"`
	P90  float64 `json:"p90_ms"`
	P99  float64 `json:"p99_ms"`
	Max  float64 `json:"max_ms"`
}

// Percentile returns the q-quantile (0..1) of sorted values by linear
// interpolation between closest ranks (NumPy's default); NaN when empty.
func Percentile(sorted []float64, q float64) float64 {
	n := len(sorted)
	if n == 0 {
		return math.NaN()
	}
	if q <= 0 {
		return sorted[0]
	}
	if q >= 1 {
		return sorted[n-1]
	}
	pos := q * float64(n-1)
	lo := int(pos)
	if lo+1 >= n {
		return sorted[n-1]
	}
	f := pos - float64(lo)
	return sorted[lo] + f*(sorted[lo+1]-sorted[lo])
}

// StatsOf summarises vals (milliseconds); it sorts vals in place.
func StatsOf(vals []float64) Stats {
	if len(vals) == 0 {
		return Stats{}
	}
	sort.Float64s(vals)
	sum := 0.0
	for _, v := range vals {
		sum += v
	}
	return Stats{N: len(vals), Mean: sum / float64(len(vals)), P50: Percentile(vals, 0.5),
		P90: Percentile(vals, 0.9), P99: Percentile(vals, 0.99), Max: vals[len(vals)-1]}
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// SLO is a per-request service-level objective; zero fields are not checked.
type SLO struct {
	TTFT time.Duration `json:"ttft_ns"`
	TPOT time.Duration `json:"tpot_ns"`
}

// Met reports whether a successful result meets the SLO.
func (s SLO) Met(r *Result) bool {
	if !r.OK() {
		return false
	}
	if s.TTFT > 0 && r.TTFT > s.TTFT {
		return false
	}
	if s.TPOT > 0 && !r.Whole && r.TPOT() > s.TPOT {
		return false
	}
	return true
}

// Summary is the summary of one run (one policy, one target).
type Summary struct {
	Name     string  `json:"name"`
	Requests int     `json:"requests"`
	OK       int     `json:"ok"`
	Errors   int     `json:"errors"`
	WallS    float64 `json:"wall_s"`
	// ErrorsByStatus counts failures by HTTP status ("0" = transport error,
	// "stream-error" = a 200 stream cut or ended by an error event, or a
	// 200 answer read whole with no choices,
	// "overload" = an open-loop arrival refused by --max-in-flight, never
	// sent).
	ErrorsByStatus map[string]int `json:"errors_by_status,omitempty"`
	// Throughput is successful requests per second of wall time.
	Throughput float64 `json:"throughput_rps"`
	// OutputTokPerS is generated tokens per second of wall time.
	OutputTokPerS float64 `json:"output_tok_per_s"`
	TTFT          Stats   `json:"ttft"`
	TPOT          Stats   `json:"tpot"`
	ITL           Stats   `json:"itl"`
	E2E           Stats   `json:"e2e"`
	// SLO, Goodput (requests/s meeting it) and GoodputFrac (of all requests).
	SLO         SLO     `json:"slo"`
	Goodput     float64 `json:"goodput_rps"`
	GoodputFrac float64 `json:"goodput_frac"`
	// PromptTokens, CachedTokens and HitRate: prefix cache reuse as reported
	// by the engines' usage.
	PromptTokens int64   `json:"prompt_tokens"`
	CachedTokens int64   `json:"cached_tokens"`
	HitRate      float64 `json:"hit_rate"`
	// CeilingHitRate is the workload's pooled-cache ceiling for the fleet
	// (see Ceiling) and CeilingShare is HitRate / CeilingHitRate; both 0
	// when not computed.
	CeilingHitRate float64 `json:"ceiling_hit_rate,omitempty"`
	CeilingShare   float64 `json:"ceiling_share,omitempty"`
	// PerWorker counts successful requests per worker; Imbalance is max/mean
	// over Workers workers (those that served nothing count as 0): the
	// fleet size given, else (or when more) the number of workers seen.
	PerWorker map[string]int `json:"per_worker,omitempty"`
	Workers   int            `json:"workers"`
	Imbalance float64        `json:"imbalance"`
	// Layers counts the router's decisions by scheduling layer (kv, prefix,
	// lb, affinity, fallback), from its /metrics or the simulator.
	Layers map[string]int `json:"layers,omitempty"`
	// TTFTCDF holds sorted TTFTs in ms (for charts; omitted from JSON).
	TTFTCDF []float64 `json:"-"`
}

// Summarize computes a Summary. itls are all inter-token gaps (may be nil:
// the ITL stats then use each request's mean gap). workers is the fleet
// size for the imbalance (0: the number of distinct workers seen).
func Summarize(name string, results []Result, itls []time.Duration, wall time.Duration, slo SLO, workers int) Summary {
	s := Summary{Name: name, Requests: len(results), WallS: wall.Seconds(), SLO: slo, PerWorker: map[string]int{}}
	var ttft, tpot, e2e, itl []float64
	var outTok int64
	met := 0
	for i := range results {
		r := &results[i]
		if !r.OK() {
			s.Errors++
			if s.ErrorsByStatus == nil {
				s.ErrorsByStatus = map[string]int{}
			}
			key := strconv.Itoa(r.Status)
			switch {
			case r.Status == 200:
				key = "stream-error" // 200 OK, then an error event, a cut stream or no choices
			case r.Err == errOverload:
				key = "overload"
			}
			s.ErrorsByStatus[key]++
			continue
		}
		s.OK++
		ttft = append(ttft, ms(r.TTFT))
		e2e = append(e2e, ms(r.E2E))
		if r.OutputTokens > 1 && !r.Whole {
			tpot = append(tpot, ms(r.TPOT()))
		}
		if itls == nil && r.ITLCount > 0 {
			itl = append(itl, ms(r.ITLSum/time.Duration(r.ITLCount)))
		}
		outTok += int64(r.OutputTokens)
		s.PromptTokens += int64(r.PromptTokens)
		s.CachedTokens += int64(r.CachedTokens)
		if r.Worker != "" {
			s.PerWorker[r.Worker]++
		}
		if slo.Met(r) {
			met++
		}
	}
	for _, d := range itls {
		itl = append(itl, ms(d))
	}
	s.TTFT, s.TPOT, s.E2E, s.ITL = StatsOf(ttft), StatsOf(tpot), StatsOf(e2e), StatsOf(itl)
	s.TTFTCDF = ttft // sorted by StatsOf
	if wall > 0 {
		sec := wall.Seconds()
		s.Throughput = float64(s.OK) / sec
		s.OutputTokPerS = float64(outTok) / sec
		s.Goodput = float64(met) / sec
	}
	if s.Requests > 0 {
		s.GoodputFrac = float64(met) / float64(s.Requests)
	}
	if s.PromptTokens > 0 {
		s.HitRate = float64(s.CachedTokens) / float64(s.PromptTokens)
	}
	// The fleet size given, else the workers seen; never fewer than seen
	// (a max/mean over fewer workers than served is below 1, an even
	// spread's figure, however uneven the load).
	workers = max(workers, len(s.PerWorker))
	s.Workers = workers
	s.Imbalance = Imbalance(s.PerWorker, workers)
	return s
}

// SetCeiling records the pooled-cache ceiling hit rate c and s's share of it.
func (s *Summary) SetCeiling(c float64) {
	s.CeilingHitRate = c
	s.CeilingShare = 0
	if c > 0 {
		s.CeilingShare = s.HitRate / c
	}
}

// Imbalance returns max/mean of per-worker request counts over n workers
// (n <= 0: the workers present in counts). 1 is perfectly even; 0 when
// nothing was served.
func Imbalance(counts map[string]int, n int) float64 {
	if n <= 0 {
		n = len(counts)
	}
	if n == 0 {
		return 0
	}
	total, mx := 0, 0
	for _, c := range counts {
		total += c
		mx = max(mx, c)
	}
	if total == 0 {
		return 0
	}
	return float64(mx) / (float64(total) / float64(n))
}

// WriteTable prints summaries side by side as an aligned text table.
func WriteTable(w io.Writer, sums []Summary) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	row := func(label string, f func(s *Summary) string) {
		fmt.Fprintf(tw, "%s\t", label)
		for i := range sums {
			fmt.Fprintf(tw, "%s\t", f(&sums[i]))
		}
		fmt.Fprintln(tw)
	}
	f1 := func(v float64) string {
		if math.IsNaN(v) {
			return "-"
		}
		return strconv.FormatFloat(v, 'f', 1, 64)
	}
	row("", func(s *Summary) string { return s.Name })
	row("requests ok/total", func(s *Summary) string { return fmt.Sprintf("%d/%d", s.OK, s.Requests) })
	row("errors", func(s *Summary) string { return errString(s) })
	row("throughput req/s", func(s *Summary) string { return strconv.FormatFloat(s.Throughput, 'f', 2, 64) })
	row("output tok/s", func(s *Summary) string { return f1(s.OutputTokPerS) })
	for _, m := range []struct {
		name string
		get  func(s *Summary) *Stats
	}{{"TTFT", func(s *Summary) *Stats { return &s.TTFT }}, {"TPOT", func(s *Summary) *Stats { return &s.TPOT }},
		{"ITL", func(s *Summary) *Stats { return &s.ITL }}, {"E2E", func(s *Summary) *Stats { return &s.E2E }}} {
		// "-": nothing measured (answers read whole have no TPOT or ITL).
		stat := func(v func(st *Stats) float64) func(s *Summary) string {
			return func(s *Summary) string {
				if st := m.get(s); st.N > 0 {
					return f1(v(st))
				}
				return "-"
			}
		}
		row(m.name+" mean ms", stat(func(st *Stats) float64 { return st.Mean }))
		row(m.name+" p50 ms", stat(func(st *Stats) float64 { return st.P50 }))
		row(m.name+" p90 ms", stat(func(st *Stats) float64 { return st.P90 }))
		row(m.name+" p99 ms", stat(func(st *Stats) float64 { return st.P99 }))
	}
	row("goodput req/s", func(s *Summary) string { return strconv.FormatFloat(s.Goodput, 'f', 2, 64) })
	row("goodput fraction", func(s *Summary) string { return strconv.FormatFloat(s.GoodputFrac, 'f', 3, 64) })
	row("prefix hit rate", func(s *Summary) string { return strconv.FormatFloat(s.HitRate, 'f', 3, 64) })
	if slices.ContainsFunc(sums, func(s Summary) bool { return s.CeilingHitRate > 0 }) {
		row("pooled-cache ceiling", func(s *Summary) string {
			if s.CeilingHitRate <= 0 {
				return "-"
			}
			return strconv.FormatFloat(s.CeilingHitRate, 'f', 3, 64)
		})
		row("share of ceiling", func(s *Summary) string {
			if s.CeilingHitRate <= 0 {
				return "-"
			}
			return strconv.FormatFloat(100*s.CeilingShare, 'f', 1, 64) + "%"
		})
	}
	row("imbalance max/mean", func(s *Summary) string { return strconv.FormatFloat(s.Imbalance, 'f', 2, 64) })
	row("routed kv/prefix/lb", func(s *Summary) string {
		if s.Layers == nil {
			return "-"
		}
		return fmt.Sprintf("%d/%d/%d", s.Layers["kv"], s.Layers["prefix"], s.Layers["lb"])
	})
	return tw.Flush()
}

func errString(s *Summary) string {
	if s.Errors == 0 {
		return "0"
	}
	keys := make([]string, 0, len(s.ErrorsByStatus))
	for k := range s.ErrorsByStatus {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var b strings.Builder
	for i, k := range keys {
		if i > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "%s:%d", k, s.ErrorsByStatus[k])
	}
	return b.String()
}

// WriteJSON writes v as indented JSON.
func WriteJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return fmt.Errorf("cannot encode results: %w", err)
	}
	return nil
}
