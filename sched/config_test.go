package sched

import (
	"context"
	"errors"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/infera/infera/config"
)

// TestConfigSections parses every scheduling parameter changed from its
// default and checks that bad values are rejected.
func TestConfigSections(t *testing.T) {
	c, err := config.Parse([]byte(`{
		"load_balancing": {"algorithm": "Least-Tokens"},
		"session_affinity": {"enabled": true, "mode": "STRONG", "header": "X-Claude-Code-Session-Id", "ttl_s": 60, "max_entries": 10, "soft_max_load_ratio": 2, "require_session_id": true},
		"prefix_cache": {"enabled": true, "load_tolerance_factor": 0.5, "pending_request_threshold": 4, "hit_rate_threshold": 0.8},
		"prefix_index": {"ttl_s": 3600, "maintenance_interval_s": 5, "memory_threshold_ratio": 0, "reserved_memory_gb": 0, "block_size": 256},
		"sched_timeout": {"breaker_enabled": false, "wait_timeout_ms": 10, "trip_failure_ratio": 0.9, "cooldown_s": 1, "probe_wait_ms": 20},
		"model_routing": {"enabled": true, "default_model": "m", "fuzzy_match": false, "mappings": [{"pattern": "gpt-*", "services": ["a"]}]},
		"canary": {"enabled": true, "rules": [{"model": "*", "targets": [{"service": "a", "weight": 3}, {"service": "b", "weight": 1}]}]},
		"debug": {"decision_header": true}
	}`))
	if err != nil {
		t.Fatal(err)
	}
	if c.LoadBalancing.Algorithm != "least-tokens" || c.SessionAffinity.Mode != "strong" ||
		c.PrefixIndex.MemoryThresholdRatio != 0.70 || c.PrefixIndex.ReservedMemoryGB != 1.5 ||
		c.PrefixIndex.BlockSize != 256 || c.SchedTimeout.TripFailureRatio != 0.9 || !c.Debug.DecisionHeader {
		t.Fatalf("parsed %+v", c)
	}
	bad := func(js, want string) {
		t.Helper()
		_, err := config.Parse([]byte(js))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("%s: error %v, want %q", js, err, want)
		}
	}
	bad(`{"session_affinity": {"mode": "sticky"}}`, "session_affinity.mode")
	bad(`{"session_affinity": {"header": "X Session"}}`, "not a valid header name")
	bad(`{"session_affinity": {"header": "X-Sess:ion"}}`, "not a valid header name")
	bad(`{"session_affinity": {"max_entries": 0}}`, "session_affinity")
	bad(`{"prefix_cache": {"hit_rate_threshold": 1.5}}`, "prefix_cache")
	bad(`{"prefix_index": {"block_size": 0}}`, "block_size")
	bad(`{"sched_timeout": {"trip_failure_ratio": 0}}`, "trip_failure_ratio")
	bad(`{"model_routing": {"mappings": [{"pattern": "x", "services": [""]}]}}`, "services[0]")
	bad(`{"canary": {"rules": [{"model": "*", "targets": [{"service": "a", "weight": 0}]}]}}`, "weights sum to 0")
	bad(`{"load_balancing": {"algorithm": "random"}}`, "load_balancing")
}

func TestRequireSessionCustomHeader(t *testing.T) {
	s, _ := newTestSched(t, workers(1, "m")...)
	cfg := affCfg(t, func(sa *config.SessionAffinity) {
		sa.RequireSessionID = true
		sa.Header = "X-Claude-Code-Session-Id"
	})
	_, err := s.Pick(cfg, &Request{Model: []byte("m")}, nil)
	if !errors.Is(err, ErrSessionRequired) || !strings.Contains(err.Error(), "X-Claude-Code-Session-Id") {
		t.Fatalf("%v", err)
	}
}

func TestTripRatioChanged(t *testing.T) {
	var b schedBreaker
	m := newSchedMetrics(&Scheduler{})
	defer m.close()
	now := int64(50 * time.Second)
	f := func(ratio float64, ok, failed int, wantOpen bool) {
		t.Helper()
		b.reset()
		st := &config.SchedTimeout{BreakerEnabled: true, TripFailureRatio: ratio, CooldownSeconds: 1}
		for i := 0; i < ok; i++ {
			b.done(st, now, false, false, m)
		}
		for i := 0; i < failed; i++ {
			b.done(st, now, true, false, m)
		}
		if open := b.br.State() == sbOpen; open != wantOpen {
			t.Fatalf("ratio %.2f ok %d failed %d: open=%v", ratio, ok, failed, open)
		}
	}
	f(0.5, 10, 9, false) // 9/19 < 0.5
	f(0.5, 10, 10, true) // 10/20 = 0.5
	f(0.9, 10, 10, false)
	f(0.9, 1, 9, true) // 9/10
	f(1, 0, 10, true)
	f(0.1, 0, 9, false) // 9 samples: no judgment
}

func TestRunSweepsOnInterval(t *testing.T) {
	s, c := newTestSched(t, workers(2, "m")...)
	cfg := cfgWith(t, func(cf *config.Config) {
		cf.PrefixIndex.MaintenanceIntervalSeconds = 0.02
		cf.PrefixIndex.TTLSeconds = 10
		cf.SessionAffinity.Enabled = true
		cf.SessionAffinity.TTLSeconds = 10
	})
	pick(t, s, cfg, &Request{Model: []byte("m"), Prompt: prompt("run ", 512), SessionID: []byte("s")})
	if st := s.Stats(); st.PrefixBlocks != 4 || st.AffinityEntries != 1 {
		t.Fatalf("before: %+v", st)
	}
	c.add(20 * time.Second)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Run(ctx, func() *config.Config { return cfg }); close(done) }()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if st := s.Stats(); st.PrefixBlocks == 0 && st.AffinityEntries == 0 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	<-done
	if st := s.Stats(); st.PrefixBlocks != 0 || st.AffinityEntries != 0 {
		t.Fatalf("Run did not sweep: %+v", st)
	}
}

// A reload that shortens prefix_index.maintenance_interval_s takes effect
// within about a second, not once the old interval (up to 10^8 s) is over:
// Run slept a whole old interval before it looked at the config again.
func TestRunFollowsAShorterMaintenanceIntervalAtOnce(t *testing.T) {
	s, c := newTestSched(t, workers(2, "m")...)
	slow := cfgWith(t, func(cf *config.Config) {
		cf.PrefixIndex.MaintenanceIntervalSeconds = 3600
		cf.PrefixIndex.TTLSeconds = 10
	})
	fast := cfgWith(t, func(cf *config.Config) {
		cf.PrefixIndex.MaintenanceIntervalSeconds = 0.05
		cf.PrefixIndex.TTLSeconds = 10
	})
	var cur atomic.Pointer[config.Config]
	cur.Store(slow)
	pick(t, s, slow, &Request{Model: []byte("m"), Prompt: prompt("run ", 512)})
	if st := s.Stats(); st.PrefixBlocks != 4 {
		t.Fatalf("before: %+v", st)
	}
	c.add(20 * time.Second)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Run(ctx, cur.Load); close(done) }()
	defer func() { cancel(); <-done }()
	time.Sleep(100 * time.Millisecond) // Run is waiting out the slow interval
	cur.Store(fast)
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) && s.Stats().PrefixBlocks != 0 {
		time.Sleep(10 * time.Millisecond)
	}
	if st := s.Stats(); st.PrefixBlocks != 0 {
		t.Fatalf("3 s after the interval went from 3600 s to 0.05 s, no sweep yet: %+v", st)
	}
}

// TestLiveReload changes the config file under a config.Store while
// requests keep flowing: the next Pick follows the new file.
func TestLiveReload(t *testing.T) {
	s, _ := newTestSched(t, rec("a", "svc-a", "m"), rec("b", "svc-b", "m"))
	path := t.TempDir() + "/infera.json"
	write := func(js string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(js), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(`{"load_balancing": {"algorithm": "round-robin"}}`)
	st, err := config.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	count := func() map[string]int {
		got := map[string]int{}
		for i := 0; i < 20; i++ {
			got[pick(t, s, st.Load(), &Request{Model: []byte("m"), SessionID: []byte("x")}).Worker.ID]++
		}
		return got
	}
	if got := count(); got["a"] != 10 || got["b"] != 10 {
		t.Fatalf("round-robin %v", got)
	}
	write(`{"load_balancing": {"algorithm": "round-robin"}, "session_affinity": {"enabled": true, "mode": "strong"}}`)
	if changed, err := st.Reload(); err != nil || !changed {
		t.Fatalf("reload: %v %v", changed, err)
	}
	if got := count(); len(got) != 1 {
		t.Fatalf("affinity after reload %v", got)
	}
	write(`{"canary": {"enabled": true, "rules": [{"model": "m", "targets": [{"service": "svc-b", "weight": 1}]}]}}`)
	if _, err := st.Reload(); err != nil {
		t.Fatal(err)
	}
	if got := count(); got["b"] != 20 {
		t.Fatalf("canary after reload %v", got)
	}
}
