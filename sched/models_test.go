package sched

import (
	"errors"
	"fmt"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"github.com/infera/infera/config"
	"github.com/infera/infera/fleet"
)

func routeCfg(t *testing.T, f func(mr *config.ModelRouting)) *config.Config {
	return cfgWith(t, func(c *config.Config) {
		c.ModelRouting.Enabled = true
		if f != nil {
			f(&c.ModelRouting)
		}
	})
}

func modelFleet(t *testing.T) *Scheduler {
	s, _ := newTestSched(t,
		rec("q72", "qwen72", "Qwen2.5-72B-Instruct"),
		rec("q7", "qwen7", "Qwen/Qwen2.5-7B-Instruct"),
		rec("q7b", "qwen7-base", "Qwen2.5-7B"),
		rec("ll", "llama", "Llama-3.1-8B-Instruct"),
		rec("ds", "deepseek", "deepseek-v3"),
		rec("ds2", "deepseek-canary", "deepseek-v3.1"),
	)
	return s
}

func TestModelMatching(t *testing.T) {
	s := modelFleet(t)
	fuzzy := routeCfg(t, nil)
	strict := routeCfg(t, func(mr *config.ModelRouting) { mr.FuzzyMatch = false })
	f := func(cfg *config.Config, model, wantWorker, wantModel string) {
		t.Helper()
		d, err := s.Pick(cfg, &Request{Model: []byte(model)}, nil)
		if wantWorker == "" {
			if !errors.Is(err, ErrUnknownModel) {
				t.Fatalf("%q: want unknown model, got %v (%v)", model, err, d.Worker)
			}
			return
		}
		if err != nil {
			t.Fatalf("%q: %s", model, err)
		}
		if d.Worker.ID != wantWorker || d.Model != wantModel {
			t.Fatalf("%q: %s/%s, want %s/%s", model, d.Worker.ID, d.Model, wantWorker, wantModel)
		}
		if d.Rewrite != (wantModel != model) {
			t.Fatalf("%q: rewrite %v", model, d.Rewrite)
		}
	}
	// Exact.
	f(fuzzy, "Qwen2.5-72B-Instruct", "q72", "Qwen2.5-72B-Instruct")
	f(strict, "Qwen2.5-72B-Instruct", "q72", "Qwen2.5-72B-Instruct")
	// ① notation: case and separators (both modes), org prefix (fuzzy only).
	f(fuzzy, "qwen2.5_72b_instruct", "q72", "Qwen2.5-72B-Instruct")
	f(strict, "qwen2.5_72b_instruct", "q72", "Qwen2.5-72B-Instruct")
	f(fuzzy, "QWEN2.5 72B INSTRUCT", "q72", "Qwen2.5-72B-Instruct")
	f(fuzzy, "Qwen/Qwen2.5-72B-Instruct", "q72", "Qwen2.5-72B-Instruct")
	f(strict, "Qwen/Qwen2.5-72B-Instruct", "", "")
	f(fuzzy, "qwen2.5-7b-instruct", "q7", "Qwen/Qwen2.5-7B-Instruct")
	f(strict, "qwen/qwen2.5_7b_instruct", "q7", "Qwen/Qwen2.5-7B-Instruct")
	// ② abbreviation: a leading run of tokens; the shortest full name wins.
	f(fuzzy, "qwen2.5-72b", "q72", "Qwen2.5-72B-Instruct")
	f(strict, "qwen2.5-72b", "", "")
	f(fuzzy, "llama-3.1-8b", "ll", "Llama-3.1-8B-Instruct")
	f(fuzzy, "qwen2.5", "q7b", "Qwen2.5-7B") // Qwen2.5-7B (2 tokens) is the shortest
	f(fuzzy, "qwen2.5-7", "", "")            // not at a token boundary
	f(fuzzy, "llama-3.1-8b-instruct-extra", "", "")
	// ③ wildcard.
	f(fuzzy, "llama*", "ll", "Llama-3.1-8B-Instruct")
	f(fuzzy, "*72B*", "q72", "Qwen2.5-72B-Instruct")
	f(fuzzy, "deepseek-v3*", "ds", "deepseek-v3") // first in sort order
	f(strict, "llama*", "", "")
	f(fuzzy, "*mistral*", "", "")
	// Model routing disabled (the default): exact names only.
	f(config.Default(), "Qwen2.5-72B-Instruct", "q72", "Qwen2.5-72B-Instruct")
	f(config.Default(), "qwen2.5-72b", "", "")
}

func TestModelMappingOrderAndWildcards(t *testing.T) {
	s := modelFleet(t)
	cfg := routeCfg(t, func(mr *config.ModelRouting) {
		mr.Mappings = []config.ModelMapping{
			{Pattern: "gpt-4o", Services: []string{"qwen72"}},             // plain = exact
			{Pattern: "GPT-*-MINI", Services: []string{"qwen7"}},          // case-insensitive
			{Pattern: "gpt-*", Services: []string{"llama"}},               // after the more specific one
			{Pattern: "deepseek*", Services: []string{"deepseek-canary"}}, // mapping beats model match
			{Pattern: "empty", Services: []string{"nobody"}},
		}
	})
	f := func(model string, wantSvc string) {
		t.Helper()
		d, err := s.Pick(cfg, &Request{Model: []byte(model)}, nil)
		if err != nil {
			t.Fatalf("%q: %s", model, err)
		}
		if d.Worker.Service != wantSvc {
			t.Fatalf("%q -> %s, want %s", model, d.Worker.Service, wantSvc)
		}
	}
	f("gpt-4o", "qwen72")
	f("GPT-4O", "qwen72")
	f("gpt-4o-mini", "qwen7")
	f("gpt-4.1-mini", "qwen7")
	f("gpt-4.1", "llama")
	f("deepseek-v3", "deepseek-canary") // served by ds, but the mapping wins
	// Anchored: "xgpt-4o" and "gpt-4o2" do not match "gpt-4o" (the second
	// matches gpt-*).
	if _, err := s.Pick(cfg, &Request{Model: []byte("xgpt-4o")}, nil); !errors.Is(err, ErrUnknownModel) {
		t.Fatalf("xgpt-4o: %v", err)
	}
	f("gpt-4o2", "llama")
	// A mapping whose services have no workers: no fallback to model match.
	if _, err := s.Pick(cfg, &Request{Model: []byte("empty")}, nil); !errors.Is(err, ErrNoWorkers) {
		t.Fatalf("empty mapping: %v", err)
	}
	// Mapped models are listed.
	got := s.Models(cfg, s.Fleet.View())
	for _, want := range []string{"gpt-4o", "Qwen2.5-72B-Instruct"} {
		if !contains2(got, want) {
			t.Fatalf("Models %v lacks %s", got, want)
		}
	}
	if contains2(got, "gpt-*") || contains2(got, "empty") {
		t.Fatalf("Models %v lists a wildcard or a dead mapping", got)
	}
}

func contains2(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}

func TestDefaultModelAndCloseNames(t *testing.T) {
	s := modelFleet(t)
	cfg := routeCfg(t, func(mr *config.ModelRouting) { mr.DefaultModel = "llama-3.1-8b-instruct" })
	f := func(model, want string) {
		t.Helper()
		d, err := s.Pick(cfg, &Request{Model: []byte(model)}, nil)
		if err != nil {
			t.Fatalf("%q: %s", model, err)
		}
		if d.Model != want {
			t.Fatalf("%q -> %s want %s", model, d.Model, want)
		}
	}
	f("", "Llama-3.1-8B-Instruct")
	f("unknown-model", "Llama-3.1-8B-Instruct")
	f("qwen2.5-72b", "Qwen2.5-72B-Instruct")
	// Without a default model: 404 with close names.
	_, err := s.Pick(routeCfg(t, nil), &Request{Model: []byte("qwen2.5-72b-instrct")}, nil)
	var ue *UnknownModelError
	if !errors.As(err, &ue) || len(ue.Close) == 0 || ue.Close[0] != "Qwen2.5-72B-Instruct" {
		t.Fatalf("close names: %v", err)
	}
	if !strings.Contains(err.Error(), "Qwen2.5-72B-Instruct") {
		t.Fatalf("message lacks suggestion: %s", err)
	}
	_, err = s.Pick(routeCfg(t, nil), &Request{Model: []byte("zzzzzzzzzzzzzz")}, nil)
	if !errors.As(err, &ue) || len(ue.Close) != 0 {
		t.Fatalf("unrelated name got suggestions: %v", err)
	}
	// /v1/models includes the default model.
	if got := s.Models(cfg, s.Fleet.View()); !contains2(got, "llama-3.1-8b-instruct") || !contains2(got, "deepseek-v3") {
		t.Fatalf("Models %v", got)
	}
}

func TestCanarySplit(t *testing.T) {
	s := modelFleet(t)
	cfg := cfgWith(t, func(c *config.Config) {
		c.Canary.Enabled = true
		c.Canary.Rules = []config.CanaryRule{
			{Model: "deepseek-*", Targets: []config.CanaryTarget{{Service: "deepseek", Weight: 90}, {Service: "deepseek-canary", Weight: 10}}},
			{Model: "*", Targets: []config.CanaryTarget{{Service: "llama", Weight: 1}}},
		}
	})
	count := func(cfg *config.Config, model string, n int) map[string]int {
		got := map[string]int{}
		for i := 0; i < n; i++ {
			d, err := s.Pick(cfg, &Request{Model: []byte(model)}, nil)
			if err != nil {
				t.Fatal(err)
			}
			got[d.Worker.Service]++
			if d.Service != "" && d.Service != d.Worker.Service {
				t.Fatalf("Decision.Service %q", d.Service)
			}
		}
		return got
	}
	// Exact over every window of 10 (weights 90:10 reduce to 9:1).
	for _, n := range []int{10, 1000, 1230} {
		cfg2 := cfgWith(t, func(c *config.Config) { *c = *cfg }) // fresh state
		got := count(cfg2, "deepseek-v3", n)
		if got["deepseek"] != n*9/10 || got["deepseek-canary"] != n/10 {
			t.Fatalf("n=%d split %v", n, got)
		}
	}
	// Smooth: the canary never gets two requests in a row at 9:1.
	cfg3 := cfgWith(t, func(c *config.Config) { *c = *cfg })
	prev := ""
	for i := 0; i < 100; i++ {
		d, _ := s.Pick(cfg3, &Request{Model: []byte("deepseek-v3")}, nil)
		if d.Worker.Service == "deepseek-canary" && prev == "deepseek-canary" {
			t.Fatalf("burst at %d", i)
		}
		prev = d.Worker.Service
	}
	// First match wins: everything else goes to llama.
	if got := count(cfg, "Qwen2.5-72B-Instruct", 20); got["llama"] != 20 {
		t.Fatalf("catch-all %v", got)
	}
	// A reload changing the weights applies at once.
	cfg4 := cfgWith(t, func(c *config.Config) {
		*c = *cfg
		c.Canary.Rules = []config.CanaryRule{{Model: "deepseek-*", Targets: []config.CanaryTarget{{Service: "deepseek", Weight: 1}, {Service: "deepseek-canary", Weight: 1}}}}
	})
	if got := count(cfg4, "deepseek-v3", 100); got["deepseek"] != 50 || got["deepseek-canary"] != 50 {
		t.Fatalf("50/50 %v", got)
	}
	// Large weights use the locked smooth round-robin: still exact.
	cr := newCanaryRule(config.CanaryRule{Model: "*", Targets: []config.CanaryTarget{{Service: "a", Weight: 7001}, {Service: "b", Weight: 2999}}})
	if cr.seq != nil {
		t.Fatalf("expected no precomputed sequence")
	}
	ab := map[string]int{}
	for i := 0; i < 10000; i++ {
		ab[cr.services[cr.next()]]++
	}
	if ab["a"] != 7001 || ab["b"] != 2999 {
		t.Fatalf("large weights %v", ab)
	}
	// Disabled canary: model routing decides.
	if got := count(config.Default(), "deepseek-v3", 10); got["deepseek"] != 10 {
		t.Fatalf("disabled canary %v", got)
	}
}

func TestGlobMatch(t *testing.T) {
	f := func(p, s string, want bool) {
		t.Helper()
		if got := globMatch(lowerASCII(p), appendLower(nil, s)); got != want {
			t.Fatalf("%q ~ %q = %v", p, s, got)
		}
	}
	f("", "", true)
	f("*", "", true)
	f("*", "anything", true)
	f("abc", "ABC", true)
	f("abc", "abcd", false)
	f("a*c", "abbbc", true)
	f("a*c", "abbbcd", false)
	f("*a*b*", "xxaxxbxx", true)
	f("*a*b", "xxaxxbxxb", true)
	f("a**b", "ab", true)
	f("qwen-*", "Qwen-72B", true)
}

// FuzzModelMatch checks the glob matcher against a regexp on ASCII input
// and that resolving arbitrary names never panics.
func FuzzModelMatch(f *testing.F) {
	f.Add("qwen*", "Qwen2.5-72B-Instruct")
	f.Add("*-72b-*", "qwen2.5_72b_instruct")
	f.Add("a*b*c", "aXbYc")
	f.Add("", "x")
	f.Add("**", "")
	s := &Scheduler{}
	v := &fleet.View{Models: []string{"Qwen2.5-72B-Instruct", "Qwen/Qwen2.5-7B", "llama-3", "a-b_c d"}, ByModel: map[string][]*fleet.Worker{}}
	mi := s.modelIndex(v)
	f.Fuzz(func(t *testing.T, pat, name string) {
		for _, fuzzy := range []bool{false, true} {
			mi.resolve([]byte(name), fuzzy)
			mi.resolve([]byte(pat), fuzzy)
		}
		closeNames(v.Models, name, 5)
		// The regexp oracle is O(len(pat) x len(name)): keep inputs short.
		if !isASCII(pat) || !isASCII(name) || len(pat) > 256 || len(name) > 1024 {
			return
		}
		parts := strings.Split(lowerASCII(pat), "*")
		for i := range parts {
			parts[i] = regexp.QuoteMeta(parts[i])
		}
		re := regexp.MustCompile(`(?s)^` + strings.Join(parts, ".*") + `$`)
		want := re.MatchString(lowerASCII(name))
		if got := globMatch(lowerASCII(pat), appendLower(nil, name)); got != want {
			t.Fatalf("glob %q ~ %q = %v, regexp says %v", pat, name, got, want)
		}
	})
}

func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= 0x80 {
			return false
		}
	}
	return true
}

func TestNormalForms(t *testing.T) {
	f := func(in, collapsed, canon string) {
		t.Helper()
		if got := string(appendCollapsed(nil, in, true)); got != collapsed {
			t.Fatalf("collapsed(%q) = %q", in, got)
		}
		if got := string(appendCanon(nil, in)); got != canon {
			t.Fatalf("canon(%q) = %q", in, got)
		}
	}
	f("Qwen/Qwen2.5-72B-Instruct", "qwen2.572binstruct", "qwen/qwen2.5-72b-instruct")
	f("__a--b  c__", "abc", "a-b-c")
	f("", "", "")
	if got := closeNames([]string{"abc-def", "xyz"}, "abcdef", 5); !reflect.DeepEqual(got, []string{"abc-def"}) {
		t.Fatalf("closeNames %v", got)
	}
}

// A mapping or a canary rule names a service; its workers may serve
// several models (served names, LoRA adapters). The body then carries the
// service's model, not the alias the engine does not know, whichever of
// the service's workers is chosen; a name the worker serves is kept.
func TestAMappedNameIsRewrittenToTheServiceModelOnWorkersServingSeveralModels(t *testing.T) {
	s, _ := newTestSched(t,
		rec("a", "qwen3-8b", "qwen3-8b", "Qwen2.5-72B-Instruct"), // service defaults to the first model
		rec("b", "qwen3-8b", "qwen3-8b"),
		rec("c", "chat", "lora-a", "chat", "lora-b"), // a service named after its second model
	)
	cfg := cfgWith(t, func(c *config.Config) {
		c.ModelRouting.Enabled = true
		c.ModelRouting.Mappings = []config.ModelMapping{{Pattern: "gpt-4o", Services: []string{"qwen3-8b"}}, {Pattern: "gpt-5", Services: []string{"chat"}}}
		c.Canary.Enabled = true
		c.Canary.Rules = []config.CanaryRule{{Model: "my-alias", Targets: []config.CanaryTarget{{Service: "qwen3-8b", Weight: 1}}}}
		c.LoadBalancing.Algorithm = "round-robin"
	})
	seen := map[string]bool{}
	for i := 0; i < 8; i++ {
		for _, name := range []string{"gpt-4o", "my-alias"} {
			d, err := s.Pick(cfg, &Request{Model: []byte(name)}, nil)
			if err != nil {
				t.Fatal(err)
			}
			seen[d.Worker.ID] = true
			if d.Model != "qwen3-8b" || !d.Rewrite {
				t.Fatalf("%s on worker %s: body model %q (rewrite %v), want qwen3-8b", name, d.Worker.ID, d.Model, d.Rewrite)
			}
		}
		d, err := s.Pick(cfg, &Request{Model: []byte("gpt-5")}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if d.Model != "chat" {
			t.Fatalf("gpt-5 on worker %s: body model %q, want the service's model chat", d.Worker.ID, d.Model)
		}
	}
	if !seen["a"] || !seen["b"] {
		t.Fatalf("workers chosen: %v (the test needs both)", seen)
	}
}

// A reload of any other section keeps an unchanged canary rule's place in
// its rotation: a 1:9 canary reloaded before every request got none of
// them (each new compiled form restarted with the heaviest target).
func TestAReloadKeepsAnUnchangedCanaryRulesRotation(t *testing.T) {
	s := modelFleet(t)
	rules := []config.CanaryRule{{Model: "deepseek-*", Targets: []config.CanaryTarget{{Service: "deepseek", Weight: 9}, {Service: "deepseek-canary", Weight: 1}}}}
	got := map[string]int{}
	for i := 0; i < 20; i++ {
		cfg := cfgWith(t, func(c *config.Config) {
			c.Canary.Enabled = true
			c.Canary.Rules = rules
			c.Mirror.TimeoutMS = float64(1000 + i) // another section changes: a new snapshot
		})
		d, err := s.Pick(cfg, &Request{Model: []byte("deepseek-v3")}, nil)
		if err != nil {
			t.Fatal(err)
		}
		got[d.Worker.Service]++
	}
	if got["deepseek-canary"] != 2 || got["deepseek"] != 18 {
		t.Fatalf("20 requests, one reload before each: %v, want 18:2", got)
	}
}

// With session affinity on, a session bound to a worker of one of a canary
// rule's services keeps that service on its next turns (and so its worker,
// in strong and soft mode alike) instead of following the split's sequence;
// new sessions and requests without one still split by the weights; a
// service whose weight a reload sets to 0 lets its sessions go.
func TestACanaryRuleKeepsABoundSessionOnItsService(t *testing.T) {
	s := modelFleet(t)
	targets := []config.CanaryTarget{{Service: "deepseek", Weight: 1}, {Service: "deepseek-canary", Weight: 1}}
	for _, mode := range []string{"strong", "soft"} {
		cfg := cfgWith(t, func(c *config.Config) {
			c.Canary.Enabled = true
			c.Canary.Rules = []config.CanaryRule{{Model: "deepseek-*", Targets: targets}}
			c.SessionAffinity.Enabled = true
			c.SessionAffinity.Mode = mode
		})
		home := map[string]string{}
		sides := map[string]int{}
		for turn := 0; turn < 5; turn++ {
			for i := 0; i < 5; i++ { // odd: the split's sequence moves on each turn
				id := fmt.Sprintf("%s-%d", mode, i)
				d, err := s.Pick(cfg, &Request{Model: []byte("deepseek-v3"), SessionID: []byte(id)}, nil)
				if err != nil {
					t.Fatal(err)
				}
				if turn == 0 {
					home[id] = d.Worker.ID
					sides[d.Worker.Service]++
				} else if d.Worker.ID != home[id] || d.Layer != LayerAffinity {
					t.Fatalf("%s: session %s turn %d went to %s by %s/%s, bound to %s", mode, id, turn, d.Worker.ID, d.Layer, d.Reason, home[id])
				}
			}
		}
		if sides["deepseek"]+sides["deepseek-canary"] != 5 || sides["deepseek"] < 2 || sides["deepseek-canary"] < 2 {
			t.Fatalf("%s: five new sessions split %v, want 3:2", mode, sides)
		}
		// A retry after the bound worker failed, or its breaker open: the
		// session's service has no other worker, so the split decides (the
		// other side; the service kept would leave nothing to try).
		for id, wid := range home {
			w := s.Fleet.Get(wid)
			other := "deepseek"
			if w.Service == "deepseek" {
				other = "deepseek-canary"
			}
			for i := 0; i < 4; i++ { // both positions of the 1:1 sequence, twice
				d, err := s.Pick(cfg, &Request{Model: []byte("deepseek-v3"), SessionID: []byte(id), Tried: []int{w.Idx}}, nil)
				if err == nil && d.Worker.Service == other {
					break
				}
				if i == 3 {
					t.Fatalf("%s: session %s's retry after %s failed: %v %v", mode, id, wid, err, d.Worker)
				}
			}
			break
		}
		// The canary's weight set to 0: its sessions move to the other side.
		off := cfgWith(t, func(c *config.Config) {
			*c = *cfg
			c.Canary.Rules = []config.CanaryRule{{Model: "deepseek-*", Targets: []config.CanaryTarget{{Service: "deepseek", Weight: 1}, {Service: "deepseek-canary", Weight: 0}}}}
		})
		for id := range home {
			d, err := s.Pick(off, &Request{Model: []byte("deepseek-v3"), SessionID: []byte(id)}, nil)
			if err != nil {
				t.Fatal(err)
			}
			if d.Worker.Service != "deepseek" {
				t.Fatalf("%s: session %s stayed on %s after its weight went to 0", mode, id, d.Worker.Service)
			}
		}
	}
}

// A canary split 1:1 between two services of one worker each. Request X
// goes to "deepseek" and fails there; meanwhile request Y takes the rule's
// next turn. X's retry (Tried = [ds]) must go to the healthy
// "deepseek-canary" worker. It used to get "deepseek" again from the
// rule's sequence, whose only worker X had tried, and Pick answered
// ErrExhausted (the proxy then reported X's failure, with retries and a
// healthy service left).
func TestACanaryRetryIsNotExhaustedWhileTheOtherServiceIsHealthy(t *testing.T) {
	s := modelFleet(t)
	cfg := cfgWith(t, func(c *config.Config) {
		c.Canary.Enabled = true
		c.Canary.Rules = []config.CanaryRule{{Model: "deepseek-*", Targets: []config.CanaryTarget{{Service: "deepseek", Weight: 1}, {Service: "deepseek-canary", Weight: 1}}}}
	})
	x := &Request{Model: []byte("deepseek-v3")}
	dx := pick(t, s, cfg, x)
	if dx.Worker.ID != "ds" {
		t.Fatalf("first turn went to %s", dx.Worker.ID)
	}
	pick(t, s, cfg, &Request{Model: []byte("deepseek-v3")}) // Y: the canary's turn
	x.Tried = append(x.Tried, dx.Worker.Idx)                // X failed on ds
	d, err := s.Pick(cfg, x, nil)
	if err != nil {
		t.Fatalf("retry of a canary request after its worker failed: %v (deepseek-canary's worker is healthy and untried)", err)
	}
	if d.Worker.ID != "ds2" || d.Service != "deepseek-canary" {
		t.Fatalf("retry went to %s (service %q)", d.Worker.ID, d.Service)
	}
	// Both services' workers tried: exhausted, as before.
	x.Tried = append(x.Tried, d.Worker.Idx)
	if _, err := s.Pick(cfg, x, nil); !errors.Is(err, ErrExhausted) {
		t.Fatalf("every target's worker tried: %v, want ErrExhausted", err)
	}
}

// A canary rule splits 1:1 between "deepseek" (its only worker's breaker
// open) and "deepseek-canary" (healthy). The open worker must get nothing
// while a target service has an available worker. The rule used to hand
// the open service its turns, Pick's "every candidate is open, dispatch
// anyway" fallback saw only that service's worker, and half the requests
// went to the worker the breaker took out. With both services' workers
// open, requests are still dispatched anyway, over both services.
func TestACanaryDoesNotDispatchToAServiceWhoseWorkersAreAllOpen(t *testing.T) {
	s := modelFleet(t)
	cfg := cfgWith(t, func(c *config.Config) {
		c.Canary.Enabled = true
		c.Canary.Rules = []config.CanaryRule{{Model: "deepseek-*", Targets: []config.CanaryTarget{{Service: "deepseek", Weight: 1}, {Service: "deepseek-canary", Weight: 1}}}}
	})
	bad := s.Fleet.Get("ds")
	for i := 0; i < 3; i++ {
		bad.Breaker.Failure(s.Now(), false)
	}
	open := 0
	for i := 0; i < 10; i++ {
		d := pick(t, s, cfg, &Request{Model: []byte("deepseek-v3")})
		if d.Worker == bad {
			open++
			if open == 1 {
				t.Logf("request %d: %s %s/%s", i, d.Worker.ID, d.Layer, d.Reason)
			}
		}
	}
	if open > 0 {
		t.Fatalf("%d of 10 requests dispatched to the breaker-open worker while deepseek-canary's worker was available", open)
	}
	other := s.Fleet.Get("ds2")
	for i := 0; i < 3; i++ {
		other.Breaker.Failure(s.Now(), false)
	}
	got := map[string]int{}
	for i := 0; i < 4; i++ {
		d := pick(t, s, cfg, &Request{Model: []byte("deepseek-v3")})
		if d.Reason != ReasonAllBreakersOpen || d.Service != d.Worker.Service {
			t.Fatalf("every target open: %s by %s/%s (service %q)", d.Worker.ID, d.Layer, d.Reason, d.Service)
		}
		got[d.Worker.ID]++
	}
	if got["ds"] != 2 || got["ds2"] != 2 {
		t.Fatalf("every target open: %v, want the 1:1 split", got)
	}
}

// A canary rule publishes the alias "gpt-4o" over two services; the
// canary service has no routable worker yet (not deployed, scaled to 0,
// draining). GET /v1/models lists "gpt-4o" (one target has workers), and
// every request for it must reach the other service. Every request whose
// turn fell on the empty service used to fall through to model routing,
// where no worker serves "gpt-4o": 404 model_not_found on half the
// requests for a listed model.
func TestACanaryAliasIsServedWhileOneTargetHasNoWorkers(t *testing.T) {
	s := modelFleet(t)
	cfg := cfgWith(t, func(c *config.Config) {
		c.Canary.Enabled = true
		c.Canary.Rules = []config.CanaryRule{{Model: "gpt-4o", Targets: []config.CanaryTarget{{Service: "deepseek", Weight: 1}, {Service: "not-deployed-yet", Weight: 1}}}}
	})
	if !contains2(s.Models(cfg, s.Fleet.View()), "gpt-4o") {
		t.Fatalf("gpt-4o not listed")
	}
	for i := 0; i < 4; i++ {
		d, err := s.Pick(cfg, &Request{Model: []byte("gpt-4o")}, nil)
		if err != nil {
			t.Fatalf("request %d for gpt-4o (listed by /v1/models, service deepseek has a free worker): %v", i, err)
		}
		if d.Worker.Service != "deepseek" {
			t.Fatalf("request %d went to %s", i, d.Worker.ID)
		}
	}
}

// A canary name none of whose services has a routable worker falls through
// to model routing, and ServedModel (access control's check) says what
// model routing serves it with; while a service has a worker, the rule
// decides and ServedModel answers "". It used to answer "" as soon as a
// canary rule matched, and a fall-through to the default model was never
// checked against the user's models.
func TestServedModelOfACanaryNameThatFallsThrough(t *testing.T) {
	s := modelFleet(t)
	cfg := cfgWith(t, func(c *config.Config) {
		c.ModelRouting.Enabled = true
		c.ModelRouting.DefaultModel = "Llama-3.1-8B-Instruct"
		c.Canary.Enabled = true
		c.Canary.Rules = []config.CanaryRule{
			{Model: "gpt-4o", Targets: []config.CanaryTarget{{Service: "nowhere", Weight: 1}, {Service: "nowhere-canary", Weight: 1}}},
			{Model: "gpt-*", Targets: []config.CanaryTarget{{Service: "deepseek", Weight: 1}}},
		}
	})
	if got := s.ServedModel(cfg, []byte("gpt-4o")); got != "Llama-3.1-8B-Instruct" {
		t.Fatalf("ServedModel(gpt-4o) = %q, want the default model", got)
	}
	d := pick(t, s, cfg, &Request{Model: []byte("gpt-4o")})
	if d.Model != "Llama-3.1-8B-Instruct" {
		t.Fatalf("gpt-4o served as %q by %s", d.Model, d.Worker.ID)
	}
	if got := s.ServedModel(cfg, []byte("gpt-5")); got != "" {
		t.Fatalf("ServedModel(gpt-5) = %q, want \"\" (its rule's service has a worker)", got)
	}
}

// A default model that is an alias (a model mapping's or a canary rule's
// name) serves the names nothing else matches, as it serves requests
// without a model: unmatched names got 404, only the default's served
// models were tried. Access control checks the alias (ServedModel).
func TestADefaultModelThatIsAnAliasServesUnmatchedNames(t *testing.T) {
	s := modelFleet(t)
	mapped := routeCfg(t, func(mr *config.ModelRouting) {
		mr.DefaultModel = "chat"
		mr.Mappings = []config.ModelMapping{{Pattern: "chat", Services: []string{"qwen72"}}}
	})
	canary := cfgWith(t, func(c *config.Config) {
		c.ModelRouting.Enabled = true
		c.ModelRouting.DefaultModel = "chat"
		c.Canary.Enabled = true
		c.Canary.Rules = []config.CanaryRule{{Model: "chat", Targets: []config.CanaryTarget{{Service: "deepseek", Weight: 1}}}}
	})
	down := routeCfg(t, func(mr *config.ModelRouting) {
		mr.DefaultModel = "chat"
		mr.Mappings = []config.ModelMapping{{Pattern: "chat", Services: []string{"nobody"}}}
	})
	f := func(cfg *config.Config, model, wantSvc string) {
		t.Helper()
		d, err := s.Pick(cfg, &Request{Model: []byte(model)}, nil)
		if err != nil {
			t.Fatalf("%q: %s", model, err)
		}
		if d.Worker.Service != wantSvc || !d.Rewrite || d.Model != d.Worker.Models[0] {
			t.Fatalf("%q -> %s as %q (rewrite %v), want service %s as its model", model, d.Worker.Service, d.Model, d.Rewrite, wantSvc)
		}
	}
	f(mapped, "", "qwen72")
	f(mapped, "unknown-model", "qwen72")
	f(canary, "unknown-model", "deepseek")
	if d := pick(t, s, mapped, &Request{Model: []byte("qwen2.5-72b")}); d.Model != "Qwen2.5-72B-Instruct" {
		t.Fatalf("a served model's abbreviation went to %q", d.Model)
	}
	if _, err := s.Pick(down, &Request{Model: []byte("unknown-model")}, nil); !errors.Is(err, ErrNoWorkers) {
		t.Fatalf("default alias without workers: %v, want no workers", err)
	}
	for _, cfg := range []*config.Config{mapped, canary} {
		if got := s.ServedModel(cfg, []byte("unknown-model")); got != "chat" {
			t.Fatalf("ServedModel(unknown-model) = %q, want the default alias", got)
		}
	}
	if got := s.ServedModel(mapped, []byte("chat")); got != "" {
		t.Fatalf("ServedModel(chat) = %q, want \"\" (its mapping decides)", got)
	}
}

// Smart model selection's plain match_models names ("auto") are models a
// client may ask for: /v1/models lists them (clients pick from the list;
// models.retrieve("auto") answered 404 while chat with it was served), once
// one of the tiers' models is served, and never a wildcard.
func TestSmartSelectionNamesAreListedWhenATierIsServed(t *testing.T) {
	s := modelFleet(t)
	cfg := cfgWith(t, func(c *config.Config) {
		c.SmartModelSelection.Enabled = true
		c.SmartModelSelection.ClassifierURL = "http://classifier.test:1/classify"
		c.SmartModelSelection.MatchModels = []string{"auto", "smart-*"}
		c.ModelRouting.Enabled = true
		c.SmartModelSelection.Tiers = config.TierModels{L1: "nope", L2: "qwen2.5-72b", L3: "nope-either"}
	})
	got := s.Models(cfg, s.Fleet.View())
	if !contains2(got, "auto") || contains2(got, "smart-*") {
		t.Fatalf("Models %v: want auto listed, no wildcard", got)
	}
	dead := cfgWith(t, func(c *config.Config) {
		c.SmartModelSelection.Enabled = true
		c.SmartModelSelection.ClassifierURL = "http://classifier.test:1/classify"
		c.SmartModelSelection.MatchModels = []string{"auto"}
		c.SmartModelSelection.Tiers = config.TierModels{L1: "nope", L2: "nope", L3: "nope"}
	})
	if got := s.Models(dead, s.Fleet.View()); contains2(got, "auto") {
		t.Fatalf("Models %v lists auto while no tier's model is served", got)
	}
}

// A canary rule for a served model splits that model however the request
// spells it: another notation (case, separators), and with fuzzy matching
// an org prefix or an abbreviation, name the same model, and model routing
// sends them to its workers. Such names used to skip the rule (it was
// matched against the name as written only) and all went to the model's
// own service, while a name model routing did not know at all was split,
// as the default model, by the same rule: 1000 requests for "qwen3_8b"
// under a 30:70 canary of "qwen3-8b" all reached the stable service.
func TestACanaryRuleSplitsItsModelAskedInAnotherNotation(t *testing.T) {
	s := modelFleet(t)
	for _, fuzzy := range []bool{true, false} {
		cfg := cfgWith(t, func(c *config.Config) {
			c.ModelRouting.Enabled = true
			c.ModelRouting.FuzzyMatch = fuzzy
			c.Canary.Enabled = true
			c.Canary.Rules = []config.CanaryRule{{Model: "deepseek-v3", Targets: []config.CanaryTarget{{Service: "deepseek", Weight: 1}, {Service: "deepseek-canary", Weight: 1}}}}
		})
		names := []string{"DeepSeek_V3", "DEEPSEEK V3"}
		if fuzzy {
			names = append(names, "deepseek-ai/DeepSeek-V3", "deepseek-ai/deepseek_v3")
		}
		for _, name := range names {
			got := map[string]int{}
			for i := 0; i < 10; i++ {
				d, err := s.Pick(cfg, &Request{Model: []byte(name)}, nil)
				if err != nil {
					t.Fatalf("fuzzy %v, %q: %v", fuzzy, name, err)
				}
				got[d.Worker.Service]++
				want := "deepseek-v3"
				if d.Worker.Service == "deepseek-canary" {
					want = "deepseek-v3.1"
				}
				if d.Service != d.Worker.Service || d.Model != want || !d.Rewrite {
					t.Fatalf("fuzzy %v, %q: service %q on %s, model %q (rewrite %v), want %q", fuzzy, name, d.Service, d.Worker.ID, d.Model, d.Rewrite, want)
				}
			}
			if got["deepseek"] != 5 || got["deepseek-canary"] != 5 {
				t.Fatalf("fuzzy %v, %q: split %v, want 5:5 as for deepseek-v3", fuzzy, name, got)
			}
			// As the default model, the capacity report counts both
			// services' workers, as route sends it to both.
			dcfg := cfgWith(t, func(c *config.Config) { *c = *cfg; c.ModelRouting.DefaultModel = name })
			if ws := s.DefaultModelWorkers(dcfg, s.Fleet.View()); len(ws) != 2 {
				t.Fatalf("fuzzy %v, default model %q: DefaultModelWorkers %v, want ds and ds2", fuzzy, name, ws)
			}
			// Router mode direct naming the canary's worker: it gets the
			// name as its service serves it, as for "deepseek-v3".
			s.Mode = ModeDirect
			d, err := s.Pick(cfg, &Request{Model: []byte(name), DirectWorker: []byte("ds2")}, nil)
			s.Mode = ModeAuto
			if err != nil || d.Worker.ID != "ds2" || d.Model != "deepseek-v3.1" {
				t.Fatalf("fuzzy %v, %q direct to ds2: %v %v model %q", fuzzy, name, err, d.Worker, d.Model)
			}
		}
	}
}

// onlyGate leaves Pick only w, as request rate limiting's seat wait does
// once a seat freed on w.
type onlyGate struct{ w *fleet.Worker }

func (g onlyGate) Full(w *fleet.Worker) bool { return w != g.w }

// A request picked again (request rate limiting's seat wait: a tentative
// pick, a wait for a seat on the chosen worker or another candidate, a
// pick that must return that worker) keeps the canary service of its
// first pick: one request, one turn of the split. Every pick took a new
// turn, so the second pick of a 1:1 rule went to the other service, whose
// workers held no seat for it; the proxy started over and gave up after
// three rounds: 65 of 200 requests for a 1:1 canary under
// overall_concurrency 1 with overlimit queue got 503 no_workers on two
// idle engines (none without the canary).
func TestARequestPickedAgainKeepsItsCanaryTurn(t *testing.T) {
	s := modelFleet(t)
	cfg := cfgWith(t, func(c *config.Config) {
		c.Canary.Enabled = true
		c.Canary.Rules = []config.CanaryRule{{Model: "deepseek-*", Targets: []config.CanaryTarget{{Service: "deepseek", Weight: 1}, {Service: "deepseek-canary", Weight: 1}}}}
	})
	got := map[string]int{}
	for i := 0; i < 10; i++ {
		r := &Request{Model: []byte("deepseek-v3"), Tentative: true}
		d1, err := s.Pick(cfg, r, nil)
		if err != nil {
			t.Fatal(err)
		}
		r.Gate = onlyGate{d1.Worker}
		d2, err := s.Pick(cfg, r, nil)
		if err != nil {
			t.Fatal(err)
		}
		if d2.Worker != d1.Worker || d2.Service != d1.Service {
			t.Fatalf("request %d: first pick %s (%s), picked again %s (%s)", i, d1.Worker.ID, d1.Service, d2.Worker.ID, d2.Service)
		}
		got[d2.Service]++
	}
	if got["deepseek"] != 5 || got["deepseek-canary"] != 5 {
		t.Fatalf("10 requests picked twice each split %v, want 5:5", got)
	}
}

// UnknownModel says ErrUnknownModel exactly for the names Pick refuses as
// unknown, under every kind of model routing, and takes no canary turn.
func TestUnknownModelAgreesWithPick(t *testing.T) {
	s := modelFleet(t)
	cfgs := []*config.Config{
		cfgWith(t, nil),
		routeCfg(t, nil),
		routeCfg(t, func(mr *config.ModelRouting) { mr.FuzzyMatch = false }),
		routeCfg(t, func(mr *config.ModelRouting) {
			mr.Mappings = []config.ModelMapping{{Pattern: "gpt-4*", Services: []string{"qwen72"}}, {Pattern: "dead-*", Services: []string{"nowhere"}}}
		}),
		routeCfg(t, func(mr *config.ModelRouting) { mr.DefaultModel = "Llama-3.1-8B-Instruct" }),
		cfgWith(t, func(c *config.Config) {
			c.ModelRouting.Enabled = true
			c.Canary.Enabled = true
			c.Canary.Rules = []config.CanaryRule{
				{Model: "claude-*", Targets: []config.CanaryTarget{{Service: "deepseek", Weight: 1}, {Service: "deepseek-canary", Weight: 1}}},
				{Model: "gone", Targets: []config.CanaryTarget{{Service: "nowhere", Weight: 1}}},
			}
		}),
	}
	names := []string{"", "Qwen2.5-72B-Instruct", "qwen2.5-72b-instruct", "Qwen2.5-7B-Instruct", "qwen-72b", "gpt-4o", "dead-1",
		"claude-3", "gone", "nosuch", "Llama-3.1-8B-Instruct", "deepseek-v3", strings.Repeat("x", 2000)}
	for i, cfg := range cfgs {
		for _, n := range names {
			_, perr := s.Pick(cfg, &Request{Model: []byte(n)}, nil)
			uerr := s.UnknownModel(cfg, []byte(n))
			if errors.Is(perr, ErrUnknownModel) != errors.Is(uerr, ErrUnknownModel) {
				t.Errorf("config %d, %.20q: Pick %v, UnknownModel %v", i, n, perr, uerr)
			}
		}
	}
	// No canary turn is taken: the rule's picks alternate as before.
	cfg := cfgs[len(cfgs)-1]
	var got []string
	for range 4 {
		d := pick(t, s, cfg, &Request{Model: []byte("claude-3")})
		got = append(got, d.Worker.ID)
		s.UnknownModel(cfg, []byte("claude-3"))
		s.UnknownModel(cfg, []byte("claude-3"))
	}
	if got[0] == got[1] || got[0] != got[2] || got[1] != got[3] {
		t.Errorf("canary picks %v, want them alternating", got)
	}
}
