package upstream

import (
	"math"
	"slices"
	"testing"

	"github.com/infera/infera/config"
)

func proxies(ps ...config.Proxy) *config.SplitProxy {
	return &config.SplitProxy{Enabled: true, Strategy: config.SplitWeight, Proxies: ps}
}

func TestPlanWeightChoosesByWeightThenFailoverInListOrder(t *testing.T) {
	sp := proxies(
		config.Proxy{Local: true, Weight: 1},
		config.Proxy{Name: "a", Address: "http://a", Weight: 3, Failover: true},
		config.Proxy{Name: "b", Address: "http://b", Weight: 0, Failover: true},
		config.Proxy{Name: "c", Address: "http://c", Weight: 2},
		config.Proxy{Name: "d", Address: "http://d", Weight: 5, Failover: true, Status: config.ProxyDisabled},
	)
	// Total active weight 6: local [0,1), a [1,4), c [4,6). r is a
	// fraction of 2^64.
	f := func(frac float64, want ...int) {
		t.Helper()
		r := uint64(math.MaxUint64) // float64(MaxUint64) does not convert back
		if frac < 1 {
			r = uint64(frac * (1 << 63) * 2)
		}
		if got := Plan(nil, sp, []byte("m"), r); !slices.Equal(got, want) {
			t.Fatalf("r=%v: plan %v, want %v", frac, got, want)
		}
	}
	f(0, 0, 1, 2)        // local, then failover a, b (d disabled)
	f(0.16, 0, 1, 2)     // 0.96 of 6
	f(0.17, 1, 2)        // a is primary: not repeated as failover
	f(0.66, 1, 2)        // 3.96
	f(0.67, 3, 1, 2)     // c, then a, b
	f(0.999999, 3, 1, 2) // the top of the range
	f(1, 3, 1, 2)        // MaxUint64
	f(0.5, 1, 2)         // 3.0 → a
	f(1.0/6-1e-9, 0, 1, 2)
}

// PlanDrawn leaves the down entries out of the draw, their share going to
// the others by weight; with every weighted entry down it draws as Plan.
// The failover targets are Plan's.
func TestPlanDrawnLeavesDownEntriesOutOfTheDraw(t *testing.T) {
	sp := proxies(
		config.Proxy{Local: true, Weight: 1},
		config.Proxy{Name: "a", Address: "http://a", Weight: 3, Failover: true},
		config.Proxy{Name: "c", Address: "http://c", Weight: 2},
	)
	f := func(frac float64, down uint64, want ...int) {
		t.Helper()
		r := uint64(frac * (1 << 63) * 2)
		if got := PlanDrawn(nil, sp, r, down); !slices.Equal(got, want) {
			t.Fatalf("r=%v down=%b: plan %v, want %v", frac, down, got, want)
		}
	}
	f(0.5, 0, 1)              // Plan's: 3.0 of 6 is a
	f(0.1, 1<<1, 0, 1)        // a down: local [0,1), c [1,3) of 3; 0.3 is local
	f(0.5, 1<<1, 2, 1)        // 1.5 is c; a stays a failover target
	f(0.9, 1<<1, 2, 1)        // 2.7 is c
	f(0.5, 1<<1|1<<2, 0, 1)   // a and c down: local alone
	f(0.5, 1<<0|1<<1|1<<2, 1) // all down: Plan's draw
	// The shares: with a down, 1:2 between local and c in any window.
	var s Splitter
	n := [3]int{}
	for i := 0; i < 300; i++ {
		n[PlanDrawn(nil, sp, s.Next(), 1<<1)[0]]++
	}
	if n[1] != 0 || n[0] < 97 || n[0] > 103 || n[2] < 197 || n[2] > 203 {
		t.Fatalf("shares %v of 300 with a down, want about 100/0/200", n)
	}
}

func TestPlanPrefixMatchesRulesInListOrderElseLocal(t *testing.T) {
	sp := &config.SplitProxy{Enabled: true, Strategy: config.SplitPrefix, Proxies: []config.Proxy{
		{Name: "gpt", Address: "http://a", ModelRules: []string{"gpt-4o", "o1*"}, Failover: true},
		{Local: true, ModelRules: []string{"qwen*"}},
		{Name: "claude", Address: "http://b", ModelRules: []string{"*claude*"}},
		{Name: "wide", Address: "http://c", ModelRules: []string{"q"}, Failover: true},
		{Name: "off", Address: "http://d", ModelRules: []string{"*"}, Status: config.ProxyDisabled},
	}}
	f := func(model string, want ...int) {
		t.Helper()
		if got := Plan(nil, sp, []byte(model), 12345); !slices.Equal(got, want) {
			t.Fatalf("model %q: plan %v, want %v", model, got, want)
		}
	}
	f("gpt-4o", 0, 3)         // rule without '*' is a prefix...
	f("GPT-4o-mini", 0, 3)    // ...case-insensitive
	f("o1-preview", 0, 3)     // wildcard
	f("qwen2.5-72b", 1, 0, 3) // the local service by rule, earlier than "q"
	f("anthropic/claude-3", 2, 0, 3)
	f("qx", 3, 0)       // "q" prefix: its own failover entry is not repeated
	f("llama", 1, 0, 3) // no rule matches: the local service
	f("", 1, 0, 3)
	// Local disabled and nothing matches: only the failover targets.
	sp.Proxies[1].Status = config.ProxyDisabled
	f("llama", 0, 3)
}

func TestPlanReusesDstAndAllowsEmpty(t *testing.T) {
	sp := proxies(config.Proxy{Local: true, Weight: 0}, config.Proxy{Name: "a", Address: "http://a", Status: config.ProxyDisabled, Weight: 1, Failover: true})
	buf := make([]int, 0, 4)
	if got := Plan(buf, sp, nil, 1); len(got) != 0 {
		t.Fatalf("plan %v, want empty (nothing enabled with weight)", got)
	}
	sp.Proxies[0].Weight = 1
	got := Plan(buf[:0], sp, nil, 1)
	if !slices.Equal(got, []int{0}) || &got[0] != &buf[:1][0] {
		t.Fatalf("plan %v did not reuse dst", got)
	}
}

// The splitter's sequence follows the weights closely over any window and
// interleaves the proxies instead of sending bursts.
func TestSplitterFollowsWeightsWithoutBursts(t *testing.T) {
	sp := proxies(
		config.Proxy{Local: true, Weight: 1},
		config.Proxy{Name: "a", Address: "http://a", Weight: 3},
		config.Proxy{Name: "b", Address: "http://b", Weight: 6},
	)
	var s Splitter
	const n = 10000
	counts := make([]int, 3)
	run, maxRun, last := 0, 0, -1
	var dst []int
	windows := make([]int, 3)
	for i := 1; i <= n; i++ {
		dst = Plan(dst[:0], sp, nil, s.Next())
		p := dst[0]
		counts[p]++
		windows[p]++
		if p == last {
			run++
		} else {
			run = 1
		}
		last = p
		maxRun = max(maxRun, run)
		if i%100 == 0 {
			// Every window of 100 requests: 10, 30, 60 within 3.
			for j, w := range []int{10, 30, 60} {
				if d := windows[j] - w; d < -3 || d > 3 {
					t.Fatalf("window ending at %d: proxy %d got %d, want %d±3", i, j, windows[j], w)
				}
			}
			clear(windows)
		}
	}
	for j, w := range []int{1000, 3000, 6000} {
		if d := counts[j] - w; d < -5 || d > 5 {
			t.Fatalf("proxy %d got %d of %d, want %d±5", j, counts[j], n, w)
		}
	}
	if maxRun > 4 {
		t.Fatalf("longest run to one proxy %d, want interleaving (at most 4 with weight 6/10)", maxRun)
	}
}

func TestMatchRuleAndGlob(t *testing.T) {
	f := func(rule, model string, want bool) {
		t.Helper()
		if got := MatchRule(rule, []byte(model)); got != want {
			t.Fatalf("MatchRule(%q, %q) = %v, want %v", rule, model, got, want)
		}
	}
	f("qwen", "Qwen2.5-72B", true)
	f("qwen", "qwe", false)
	f(" qwen ", "qwen3", true)
	f("qwen*", "QWEN", true)
	f("*-instruct", "llama-3-instruct", true)
	f("*-instruct", "llama-3-instruct-v2", false) // anchored
	f("a*b*c", "aXbYc", true)
	f("a*b*c", "aXbY", false)
	f("*", "", true)
	f("", "anything", true) // empty prefix (validation refuses empty rules)
	f("gpt-4o", "gpt-4", false)
	f("ÄB", "äb", false) // ASCII folding only
	g := func(p, s string, want bool) {
		t.Helper()
		if got := MatchGlob(p, []byte(s)); got != want {
			t.Fatalf("MatchGlob(%q, %q) = %v, want %v", p, s, got, want)
		}
	}
	g("qwen", "qwen2", false) // a glob without '*' is exact
	g("QWEN2", "qwen2", true)
	g("**", "x", true)
	g("*a", "bbba", true)
	g("*a*a*a*b", "aaaaaaaaaaaaaaaaaaaaaaaa", false)
}
