package sched

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/infera/infera/config"
	"github.com/infera/infera/fleet"
	"github.com/infera/infera/internal/zerotest"
)

func TestMain(m *testing.M) {
	slog.SetDefault(slog.New(slog.NewTextHandler(io.Discard, nil)))
	os.Exit(m.Run())
}

// clock is an injectable Scheduler.Now.
type clock struct{ ns atomic.Int64 }

func (c *clock) now() int64          { return c.ns.Load() }
func (c *clock) add(d time.Duration) { c.ns.Add(int64(d)) }
func newClock() *clock               { c := &clock{}; c.ns.Store(1_700_000_000 * int64(time.Second)); return c }
func cfgWith(t testing.TB, f func(c *config.Config)) *config.Config {
	t.Helper()
	c := config.Default()
	if f != nil {
		f(c)
	}
	if err := c.Validate(); err != nil {
		t.Fatalf("invalid test config: %s", err)
	}
	return c
}

// rec describes worker id serving models in service svc (svc "" = first model).
func rec(id, svc string, models ...string) fleet.Record {
	return fleet.Record{ID: id, URL: "http://" + id + ".test:1", Service: svc, Models: models}
}

func newTestSched(t testing.TB, recs ...fleet.Record) (*Scheduler, *clock) {
	t.Helper()
	f := fleet.NewFleet(fleet.BreakerConfig{Threshold: 3, Cooldown: time.Second, MaxCooldown: 8 * time.Second})
	for _, r := range recs {
		if err := f.Upsert(r); err != nil {
			t.Fatalf("upsert %s: %s", r.ID, err)
		}
	}
	s := NewScheduler(f, PolicyConfig)
	c := newClock()
	s.Now = c.now
	s.Memory = func() (uint64, uint64, error) { return 1 << 20, 1 << 40, nil }
	t.Cleanup(func() { s.Close(); f.Close() })
	return s, c
}

func workers(n int, model string) []fleet.Record {
	rs := make([]fleet.Record, n)
	for i := range rs {
		rs[i] = rec(fmt.Sprintf("w%03d", i), "", model)
	}
	return rs
}

func pick(t testing.TB, s *Scheduler, cfg *config.Config, r *Request) Decision {
	t.Helper()
	d, err := s.Pick(cfg, r, make([]*fleet.Worker, 0, 8))
	if err != nil {
		t.Fatalf("Pick: %s", err)
	}
	return d
}

// Requests for two models interleaved (an embed-then-chat pipeline), each
// model served by its own two workers, spread over each model's workers
// under every algorithm: one rotation counter shared by the two sets,
// modulo each set's size, sent every request of a model to the same one.
func TestInterleavedModelsRotateOverEachModelsWorkers(t *testing.T) {
	s, _ := newTestSched(t, rec("a", "", "mx"), rec("b", "", "mx"), rec("c", "", "my"), rec("d", "", "my"))
	for _, alg := range []string{"round-robin", "least-requests", "least-tokens"} {
		cfg := cfgWith(t, func(c *config.Config) { c.LoadBalancing.Algorithm = alg })
		seen := map[string]int{}
		for range 10 {
			for _, m := range []string{"mx", "my"} {
				seen[pick(t, s, cfg, &Request{Model: []byte(m)}).Worker.ID]++
			}
		}
		for _, id := range []string{"a", "b", "c", "d"} {
			if seen[id] != 5 {
				t.Fatalf("%s: picks per worker %v, want 5 each", alg, seen)
			}
		}
	}
}

func TestPickDefaultsLoadBalancing(t *testing.T) {
	s, _ := newTestSched(t, workers(3, "m")...)
	cfg := config.Default()
	// least-requests (default) picks the idle worker.
	v := s.Fleet.View()
	v.Routable[0].Acquire(10, 5, 1)
	v.Routable[1].Acquire(10, 5, 1)
	for i := 0; i < 5; i++ {
		d := pick(t, s, cfg, &Request{Model: []byte("m")})
		if d.Worker != v.Routable[2] || d.Layer != LayerLB {
			t.Fatalf("want w002 by lb, got %s by %s", d.Worker.ID, d.Layer)
		}
	}
	// A reload to round-robin spreads evenly, ignoring load.
	rr := cfgWith(t, func(c *config.Config) { c.LoadBalancing.Algorithm = "round-robin" })
	seen := map[string]int{}
	for i := 0; i < 30; i++ {
		seen[pick(t, s, rr, &Request{Model: []byte("m")}).Worker.ID]++
	}
	for _, w := range v.Routable {
		if seen[w.ID] != 10 {
			t.Fatalf("round-robin split %v", seen)
		}
	}
	// least-tokens follows tokens, not requests.
	lt := cfgWith(t, func(c *config.Config) { c.LoadBalancing.Algorithm = "least-tokens" })
	v.Routable[2].Acquire(1000, 5, 1)
	if d := pick(t, s, lt, &Request{Model: []byte("m")}); d.Worker == v.Routable[2] {
		t.Fatalf("least-tokens chose the worker with most tokens")
	}
	// Process-level policy forces the algorithm over the config.
	s.Policy = PolicyRoundRobin
	seen = map[string]int{}
	for i := 0; i < 30; i++ {
		seen[pick(t, s, cfg, &Request{Model: []byte("m")}).Worker.ID]++
	}
	if len(seen) != 3 {
		t.Fatalf("forced round-robin split %v", seen)
	}
}

func TestDirectMode(t *testing.T) {
	s, _ := newTestSched(t, rec("a", "", "m"), rec("b", "", "m"), fleet.Record{ID: "p", URL: "http://127.0.0.1:2", Models: []string{"m"}, Role: "prefill"})
	s.Mode = ModeDirect
	cfg := config.Default()
	f := func(r *Request, wantID string, wantLayer Layer) {
		t.Helper()
		d := pick(t, s, cfg, r)
		if d.Worker.ID != wantID && wantID != "*" {
			t.Fatalf("worker %s, want %s", d.Worker.ID, wantID)
		}
		if d.Layer != wantLayer {
			t.Fatalf("layer %s, want %s", d.Layer, wantLayer)
		}
	}
	s.Fleet.View().Routable[0].Acquire(1, 1, 1) // a is busier: lb would not choose it
	f(&Request{Model: []byte("m"), DirectWorker: []byte("a")}, "a", LayerDirect)
	f(&Request{Model: []byte("m"), DirectWorker: []byte("nope")}, "*", LayerLB)
	f(&Request{Model: []byte("m")}, "*", LayerLB)
	f(&Request{Model: []byte("m"), Leg: LegPrefill, DirectPrefill: []byte("p"), DirectWorker: []byte("a")}, "p", LayerDirect)
	// Prefill leg without header: only prefill workers are candidates.
	f(&Request{Model: []byte("m"), Leg: LegPrefill}, "p", LayerLB)
	// Auto mode ignores the header.
	s.Mode = ModeAuto
	for i := 0; i < 4; i++ {
		if d := pick(t, s, cfg, &Request{Model: []byte("m"), DirectWorker: []byte("a")}); d.Layer == LayerDirect {
			t.Fatalf("auto mode honoured the direct header")
		}
	}
	// Draining worker named directly falls back.
	s.Mode = ModeDirect
	r := rec("a", "", "m")
	r.Status = fleet.StatusDraining
	if err := s.Fleet.Upsert(r); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 4; i++ {
		if d := pick(t, s, cfg, &Request{Model: []byte("m"), DirectWorker: []byte("a")}); d.Worker.ID == "a" || d.Layer != LayerLB {
			t.Fatalf("draining direct worker: %s by %s", d.Worker.ID, d.Layer)
		}
	}
}

// Router mode direct trusts the header with the worker, not with the
// model: a named worker that does not serve the requested name gets the
// name as asked (its engine answers for it), never its own only model in
// its place. It used to be rewritten to the worker's model, so a request
// for a model no worker serves, or one its user may not call, was served
// by the named single-model worker with a 200. Names that model routing
// sends to the named worker are still rewritten as routing would.
func TestADirectWorkerIsNotHandedAModelItDoesNotServe(t *testing.T) {
	s, _ := newTestSched(t, rec("a", "big", "Qwen2.5-72B-Instruct"), rec("b", "", "qwen3-8b"), rec("c", "", "llama-3-8b"))
	s.Mode = ModeDirect
	cfg := cfgWith(t, func(c *config.Config) {
		c.ModelRouting.Enabled = true
		c.ModelRouting.Mappings = []config.ModelMapping{{Pattern: "gpt-4*", Services: []string{"big"}}}
	})
	off := config.Default()
	f := func(cfg *config.Config, model, worker, want string) {
		t.Helper()
		d := pick(t, s, cfg, &Request{Model: []byte(model), DirectWorker: []byte(worker)})
		if d.Worker.ID != worker || d.Layer != LayerDirect {
			t.Fatalf("%s to %s: %s by %s", model, worker, d.Worker.ID, d.Layer)
		}
		got := model
		if d.Rewrite {
			got = d.Model
		}
		if got != want {
			t.Fatalf("%s to %s: forwarded as %q (model %q, rewrite %v), want %q", model, worker, got, d.Model, d.Rewrite, want)
		}
	}
	for _, c := range []*config.Config{cfg, off} {
		f(c, "llama-3-8b", "b", "llama-3-8b") // another worker's model
		f(c, "nope", "b", "nope")             // no worker's model
		f(c, "qwen3-8b", "b", "qwen3-8b")
		f(c, "QWEN3_8B", "b", "qwen3-8b") // another notation of its own
	}
	f(cfg, "gpt-4o", "a", "Qwen2.5-72B-Instruct")      // an alias of its service
	f(cfg, "gpt-4o", "b", "gpt-4o")                    // an alias of another service
	f(cfg, "qwen2.5-72b", "a", "Qwen2.5-72B-Instruct") // a fuzzy match
}

func TestErrors(t *testing.T) {
	s, _ := newTestSched(t)
	cfg := config.Default()
	if _, err := s.Pick(cfg, &Request{Model: []byte("m")}, nil); !errors.Is(err, ErrNoWorkers) {
		t.Fatalf("empty fleet: %v", err)
	}
	if err := s.Fleet.Upsert(rec("a", "", "m")); err != nil {
		t.Fatal(err)
	}
	_, err := s.Pick(cfg, &Request{Model: []byte("x")}, nil)
	var ue *UnknownModelError
	if !errors.Is(err, ErrUnknownModel) || !errors.As(err, &ue) || ue.Model != "x" {
		t.Fatalf("unknown model: %v", err)
	}
	var hint interface{ Suggestions() []string }
	if !errors.As(err, &hint) || ue.HTTPStatus() != 404 {
		t.Fatalf("unknown model error lacks Suggestions/HTTPStatus")
	}
	r := &Request{Model: []byte("m"), Tried: []int{s.Fleet.View().Routable[0].Idx}}
	if _, err := s.Pick(cfg, r, nil); !errors.Is(err, ErrExhausted) {
		t.Fatalf("all tried: %v", err)
	}
}

func TestRequireSession(t *testing.T) {
	s, _ := newTestSched(t, workers(2, "m")...)
	off := config.Default()
	on := cfgWith(t, func(c *config.Config) {
		c.SessionAffinity.Enabled = true
		c.SessionAffinity.RequireSessionID = true
	})
	notEnabled := cfgWith(t, func(c *config.Config) { c.SessionAffinity.RequireSessionID = true })
	r := &Request{Model: []byte("m")}
	if _, err := s.Pick(off, r, nil); err != nil {
		t.Fatalf("default config: %s", err)
	}
	if _, err := s.Pick(notEnabled, r, nil); err != nil {
		t.Fatalf("require without affinity enabled must not reject: %s", err)
	}
	_, err := s.Pick(on, r, nil)
	if !errors.Is(err, ErrSessionRequired) || !strings.Contains(err.Error(), "X-Session-Id") {
		t.Fatalf("want ErrSessionRequired naming the header, got %v", err)
	}
	if err := s.CheckSession(on, r); !errors.Is(err, ErrSessionRequired) {
		t.Fatalf("CheckSession: %v", err)
	}
	var st interface{ HTTPStatus() int }
	if !errors.As(err, &st) || st.HTTPStatus() != 400 {
		t.Fatalf("session error must carry HTTP 400: %v", err)
	}
	r.SessionID = []byte("s1")
	if _, err := s.Pick(on, r, nil); err != nil {
		t.Fatalf("with session: %s", err)
	}
}

// slowClock advances by step on every read, so each deadline check sees
// time passing.
type slowClock struct {
	ns   atomic.Int64
	step atomic.Int64
}

func (c *slowClock) now() int64 { return c.ns.Add(c.step.Load()) }

func TestSchedTimeoutAndBreaker(t *testing.T) {
	s, _ := newTestSched(t, workers(4, "m")...)
	sc := &slowClock{}
	sc.ns.Store(1_700_000_000 * int64(time.Second))
	s.Now = sc.now
	cfg := cfgWith(t, func(c *config.Config) {
		c.SchedTimeout.WaitTimeoutMS = 5
		c.SchedTimeout.CooldownSeconds = 2
		c.SchedTimeout.ProbeWaitMS = 5
	})
	r := &Request{Model: []byte("m")}
	// Fast clock: no timeouts, layers decide.
	sc.step.Store(int64(time.Microsecond))
	for i := 0; i < 20; i++ {
		if d := pick(t, s, cfg, r); d.Layer != LayerLB {
			t.Fatalf("fast decision fell back: %s %s", d.Layer, d.Reason)
		}
	}
	// Each clock read costs 10ms: every decision exceeds the 5ms timeout.
	sc.step.Store(int64(10 * time.Millisecond))
	d := pick(t, s, cfg, r)
	if d.Layer != LayerFallback || d.Reason != ReasonSchedTimeout {
		t.Fatalf("want timeout fallback, got %s %s", d.Layer, d.Reason)
	}
	if s.SchedBreakerState() != sbClosed {
		t.Fatalf("breaker opened under 10 samples")
	}
	// The window holds 20 ok + timeouts; trips when timeouts/attempts >= 0.5.
	trippedAt := 0
	for i := 2; i <= 40 && trippedAt == 0; i++ {
		pick(t, s, cfg, r)
		if s.SchedBreakerState() == sbOpen {
			trippedAt = i
		}
	}
	if trippedAt != 20 {
		t.Fatalf("breaker tripped after %d timeouts, want 20 (20 ok + 20 timeouts = 0.5)", trippedAt)
	}
	// Open: straight to round-robin, no layers (timeout reason absent).
	sc.step.Store(int64(time.Microsecond))
	if d := pick(t, s, cfg, r); d.Reason != ReasonSchedBreakerOpen {
		t.Fatalf("open breaker: %s %s", d.Layer, d.Reason)
	}
	// After the cooldown a probe decides; a slow probe reopens.
	sc.ns.Add(int64(3 * time.Second))
	sc.step.Store(int64(10 * time.Millisecond))
	if d := pick(t, s, cfg, r); d.Reason != ReasonSchedTimeout || s.SchedBreakerState() != sbOpen {
		t.Fatalf("failed probe: %s state %d", d.Reason, s.SchedBreakerState())
	}
	// A fast probe closes it.
	sc.ns.Add(int64(3 * time.Second))
	sc.step.Store(int64(time.Microsecond))
	if d := pick(t, s, cfg, r); d.Layer != LayerLB || s.SchedBreakerState() != sbClosed {
		t.Fatalf("ok probe: %s state %d", d.Layer, s.SchedBreakerState())
	}
	// Disabled breaker: timeouts still fall back but never trip.
	off := cfgWith(t, func(c *config.Config) {
		c.SchedTimeout.BreakerEnabled = false
		c.SchedTimeout.WaitTimeoutMS = 5
	})
	sc.step.Store(int64(10 * time.Millisecond))
	for i := 0; i < 50; i++ {
		if d := pick(t, s, off, r); d.Reason != ReasonSchedTimeout {
			t.Fatalf("disabled breaker: want timeout fallback, got %s", d.Reason)
		}
	}
	if s.SchedBreakerState() != sbClosed {
		t.Fatalf("disabled breaker tripped")
	}
	// Wait timeout 0 disables the limit.
	nolimit := cfgWith(t, func(c *config.Config) { c.SchedTimeout.WaitTimeoutMS = 0 })
	if d := pick(t, s, nolimit, r); d.Layer != LayerLB {
		t.Fatalf("no limit: %s %s", d.Layer, d.Reason)
	}
}

func TestBreakerWindowRolls(t *testing.T) {
	var b schedBreaker
	m := newSchedMetrics(&Scheduler{})
	defer m.close()
	st := &config.SchedTimeout{BreakerEnabled: true, TripFailureRatio: 0.5, CooldownSeconds: 1}
	now := int64(100 * time.Second)
	// 9 failures in one second: under 10 samples, no judgment.
	for i := 0; i < 9; i++ {
		b.done(st, now, true, false, m)
	}
	if b.br.State() != sbClosed {
		t.Fatalf("tripped under 10 samples")
	}
	// 11 seconds later the old failures left the window.
	now += int64(11 * time.Second)
	for i := 0; i < 9; i++ {
		b.done(st, now, false, false, m)
	}
	b.done(st, now, true, false, m)
	if b.br.State() != sbClosed {
		t.Fatalf("stale failures counted")
	}
}

func TestConcurrentPick(t *testing.T) {
	s, c := newTestSched(t, workers(8, "m")...)
	cfg := cfgWith(t, func(c *config.Config) {
		c.SessionAffinity.Enabled = true
		c.SessionAffinity.MaxEntries = 64
		c.PrefixCache.Enabled = true
		c.PrefixIndex.BlockSize = 16
	})
	cfg2 := cfgWith(t, func(c *config.Config) {
		c.SessionAffinity.Enabled = true
		c.SessionAffinity.Mode = "strong"
		c.PrefixCache.Enabled = true
		c.PrefixIndex.BlockSize = 32
		c.Canary.Enabled = true
		c.Canary.Rules = []config.CanaryRule{{Model: "*", Targets: []config.CanaryTarget{{Service: "m", Weight: 1}}}}
	})
	var wg sync.WaitGroup
	// Reloads: fresh config pointers while requests flow.
	stop := make(chan struct{})
	var reloaded atomic.Pointer[config.Config]
	reloaded.Store(cfg)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(time.Millisecond):
			}
			nc := *cfg
			nc.PrefixIndex.BlockSize = 16 + 16*(i%2)
			nc.SessionAffinity.MaxEntries = 64 << (i % 8)
			reloaded.Store(&nc)
		}
	}()
	var pickers sync.WaitGroup
	for g := 0; g < 4; g++ {
		pickers.Add(1)
		go func(g int) {
			defer pickers.Done()
			scratch := make([]*fleet.Worker, 0, 8)
			var r Request
			for i := 0; i < 2000; i++ {
				r.Reset()
				r.Model = []byte("m")
				r.SessionID = fmt.Appendf(nil, "s%d", i%100)
				r.Prompt = []byte(strings.Repeat(fmt.Sprintf("prompt %d ", i%17), 20))
				use := reloaded.Load()
				if i%3 == 0 {
					use = cfg2
				}
				d, err := s.Pick(use, &r, scratch)
				if err != nil {
					t.Error(err)
					return
				}
				d.Worker.Acquire(1, 1, 1)
				d.Worker.Release(1, 1, 1, false)
				if i%500 == 0 {
					c.add(time.Second)
					s.Maintain(use)
				}
				if g == 0 && i%700 == 0 {
					s.Fleet.Remove("w007")
					_ = s.Fleet.Upsert(rec("w007", "", "m"))
				}
			}
		}(g)
	}
	pickers.Wait()
	close(stop)
	wg.Wait()
}

func TestDecisionAppendRoute(t *testing.T) {
	f := func(d Decision, want string) {
		t.Helper()
		if got := string(d.AppendRoute(nil)); got != want {
			t.Fatalf("got %q want %q", got, want)
		}
	}
	f(Decision{Layer: LayerLB}, "layer=lb")
	f(Decision{Layer: LayerPrefix, Reason: ReasonPrefixHit, Ratio: 0.834}, "layer=prefix; reason=prefix-hit; ratio=0.83")
	f(Decision{Layer: LayerPrefix, Reason: ReasonPrefixHit, Ratio: 1}, "layer=prefix; reason=prefix-hit; ratio=1.00")
	f(Decision{Layer: LayerFallback, Reason: ReasonSchedTimeout, Service: "b"}, "layer=fallback; reason=sched-timeout; service=b")
}

func TestBreakerInPick(t *testing.T) {
	s, c := newTestSched(t, workers(3, "m")...)
	cfg := config.Default()
	v := s.Fleet.View()
	bad := v.Routable[0]
	for i := 0; i < 3; i++ {
		bad.Breaker.Failure(s.Now(), false)
	}
	// Excluded while open.
	for i := 0; i < 30; i++ {
		if d := pick(t, s, cfg, &Request{Model: []byte("m")}); d.Worker == bad {
			t.Fatalf("open worker chosen")
		}
	}
	// After the cooldown, it is a candidate again and its dispatch is the probe.
	c.add(time.Second)
	probes := 0
	for i := 0; i < 30; i++ {
		if d := pick(t, s, cfg, &Request{Model: []byte("m")}); d.Worker == bad {
			if !d.Probe {
				t.Fatalf("dispatch to a half-open worker is not marked as probe")
			}
			probes++
		}
	}
	if probes != 1 {
		t.Fatalf("%d probes, want exactly 1 while half-open", probes)
	}
	bad.Breaker.Success(true)
	// All open: still dispatches (fallback), no error.
	for _, w := range v.Routable {
		for i := 0; i < 3; i++ {
			w.Breaker.Failure(s.Now(), false)
		}
	}
	d := pick(t, s, cfg, &Request{Model: []byte("m")})
	if d.Layer != LayerFallback || d.Reason != ReasonAllBreakersOpen {
		t.Fatalf("all open: %s %s", d.Layer, d.Reason)
	}
}

// The scheduling breaker trips under cooldown_s 600; the operator reloads
// cooldown_s to 1 (every parameter is hot-reloadable, "changes take
// effect immediately"). Two seconds later the breaker probes (and the
// probe in time closes it): it kept the deadline the old cooldown set, and
// every decision skipped the layers for the rest of the ten minutes.
func TestAReloadedCooldownAppliesToAnOpenSchedBreaker(t *testing.T) {
	s, _ := newTestSched(t, workers(4, "m")...)
	sc := &slowClock{}
	sc.ns.Store(1_700_000_000 * int64(time.Second))
	s.Now = sc.now
	long := cfgWith(t, func(c *config.Config) {
		c.SchedTimeout.WaitTimeoutMS = 5
		c.SchedTimeout.CooldownSeconds = 600
		c.SchedTimeout.ProbeWaitMS = 5
	})
	r := &Request{Model: []byte("m")}
	sc.step.Store(int64(10 * time.Millisecond)) // every decision times out
	for i := 0; i < 20 && s.SchedBreakerState() != sbOpen; i++ {
		pick(t, s, long, r)
	}
	if s.SchedBreakerState() != sbOpen {
		t.Fatal("breaker did not trip")
	}
	short := cfgWith(t, func(c *config.Config) { *c = *long; c.SchedTimeout.CooldownSeconds = 1 })
	sc.step.Store(int64(time.Microsecond))
	sc.ns.Add(int64(2 * time.Second))
	d := pick(t, s, short, r)
	if d.Reason == ReasonSchedBreakerOpen || s.SchedBreakerState() != sbClosed {
		t.Fatalf("2 s after cooldown_s was reloaded to 1: %s/%s, breaker state %d (want a probe that closes it)", d.Layer, d.Reason, s.SchedBreakerState())
	}
}

// A name no worker is known to serve, while a routable worker's models are
// not known yet (a static worker listed without --worker-model whose engine
// has not answered /v1/models), is ErrNoWorkers (503, which clients
// retry), not ErrUnknownModel (404): it was 404 until the engine, started
// after the router, was asked again.
func TestAnUnknownNameWhileAWorkersModelsArePendingIsNoWorkers(t *testing.T) {
	s, _ := newTestSched(t, rec("a", "", "m"), rec("b", ""))
	cfg := config.Default()
	if _, err := s.Pick(cfg, &Request{Model: []byte("x")}, nil); !errors.Is(err, ErrNoWorkers) || errors.Is(err, ErrUnknownModel) {
		t.Fatalf("a worker's models pending: %v, want ErrNoWorkers", err)
	}
	if err := s.Fleet.Upsert(rec("b", "", "m2")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Pick(cfg, &Request{Model: []byte("x")}, nil); !errors.Is(err, ErrUnknownModel) {
		t.Fatalf("every worker's models known: %v, want ErrUnknownModel", err)
	}
}

// Request.Prefer sends a request to that engine's worker when it is an
// available candidate, before the layers; a tried one, or an engine no
// worker is, leaves the decision to them.
func TestPickPrefersTheNamedWorker(t *testing.T) {
	s, _ := newTestSched(t, rec("a", "s", "m"), rec("b", "s", "m"), rec("c", "s", "m"))
	cfg := cfgWith(t, nil)
	var b *fleet.Worker
	for _, w := range s.Fleet.View().Routable {
		if w.ID == "b" {
			b = w
		}
	}
	for range 5 {
		d := pick(t, s, cfg, &Request{Model: []byte("m"), Prefer: b.Ref()})
		if d.Worker != b || d.Layer != LayerAffinity || d.Reason != ReasonAffinityHit {
			t.Fatalf("%s %v %v", d.Worker.ID, d.Layer, d.Reason)
		}
	}
	if d := pick(t, s, cfg, &Request{Model: []byte("m"), Prefer: b.Ref(), Tried: []int{b.Idx}}); d.Worker == b {
		t.Fatal("a tried worker was preferred")
	}
	seen := map[string]bool{}
	for range 6 {
		seen[pick(t, s, cfg, &Request{Model: []byte("m"), Prefer: fleet.Ref{ID: "b", Addr: "elsewhere:1"}}).Worker.ID] = true
	}
	if len(seen) < 2 {
		t.Fatalf("an engine no worker is decided: %v", seen)
	}
	// A reload that replaces b's worker (same id and address, another
	// model list: a new Serial) leaves the engine, and what it stored,
	// where it was: the request still goes there (it was routed by the
	// layers, to an engine that answered 404 for the response it named).
	ref := b.Ref()
	if err := s.Fleet.Upsert(rec("b", "s", "m", "m2")); err != nil {
		t.Fatal(err)
	}
	var nb *fleet.Worker
	for _, w := range s.Fleet.View().Routable {
		if w.ID == "b" {
			nb = w
		}
	}
	if nb == nil || nb.Serial == b.Serial {
		t.Fatal("the upsert did not replace b's worker")
	}
	for range 5 {
		if d := pick(t, s, cfg, &Request{Model: []byte("m"), Prefer: ref}); d.Worker != nb {
			t.Fatalf("after b's worker was replaced: %s", d.Worker.ID)
		}
	}
}

// TestRequestResetClearsEveryField: Reset leaves nothing a request set (every
// field, also one added later: zerotest.Fill), keeping only the capacity
// of its buffers.
func TestRequestResetClearsEveryField(t *testing.T) {
	r := &Request{}
	zerotest.Fill(r)
	r.Reset()
	if d := zerotest.Dirty(r); len(d) > 0 {
		t.Fatalf("after Reset, left from the last request: %s", zerotest.String(d))
	}
}
