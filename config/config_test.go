package config

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestParse(t *testing.T) {
	ok := func(in string, check func(c *Config) bool) {
		t.Helper()
		c, err := Parse([]byte(in))
		if err != nil {
			t.Fatalf("Parse(%q): %v", in, err)
		}
		if !check(c) {
			t.Fatalf("Parse(%q): unexpected %+v", in, c)
		}
	}
	bad := func(in, want string) {
		t.Helper()
		_, err := Parse([]byte(in))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("Parse(%q): err %v, want it to mention %q", in, err, want)
		}
	}
	ok(``, func(c *Config) bool {
		return c.Timeouts.StreamFirstPacketSeconds == 300 && c.Timeouts.StreamIdleSeconds == 300 &&
			c.Timeouts.StreamTotalSeconds == 0 && c.Timeouts.NonStreamTotalSeconds == 900 &&
			c.SessionAffinity.TTLSeconds == 1800 && c.SessionAffinity.MaxEntries == 100000 &&
			c.PrefixIndex.BlockSize == 128 && c.PrefixCache.HitRateThreshold == 0.5
	})
	ok(`{"load_balancing":{"algorithm":"least-tokens"}}`, func(c *Config) bool { return c.LoadBalancing.Algorithm == "least-tokens" })
	ok(`{"prefix_index":{"memory_threshold_ratio":0,"reserved_memory_gb":0}}`, func(c *Config) bool {
		return c.PrefixIndex.MemoryThresholdRatio == 0.7 && c.PrefixIndex.ReservedMemoryGB == 1.5
	})
	ok(`{"workers":[{"url":"http://127.0.0.1:1","models":["a"]}]}`, func(c *Config) bool { return c.Workers[0].Role == "mixed" })
	bad(`{`, "cannot parse")
	bad(`{"load_balancing":{"algorithm":"fastest"}}`, "load_balancing.algorithm")
	bad(`{"no_such_section":{}}`, "unknown field")
	bad(`{"timeouts":{"stream_idle_s":-1}}`, "timeouts")
	bad(`{"workers":[{"url":"ftp://x"}]}`, "http://")
	bad(`{"workers":[{"url":"http://a"},{"url":"http://a"}]}`, "duplicate")
	bad(`{"canary":{"rules":[{"model":"*","targets":[{"service":"a","weight":0}]}]}}`, "weights")
	bad(`{"session_affinity":{"mode":"sticky"}}`, "session_affinity.mode")
	bad(`{"pd":{"mode":"mooncake"}}`, "not supported")
}

func TestStoreReload(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "c.json")
	write := func(s string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(`{"load_balancing":{"algorithm":"round-robin"}}`)
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	var changes int
	s.OnChange(func(old, cur *Config) { changes++ })
	first := s.Load()
	if first.LoadBalancing.Algorithm != "round-robin" {
		t.Fatal(first.LoadBalancing)
	}
	// Valid change: swapped.
	write(`{"load_balancing":{"algorithm":"least-tokens"}}`)
	if ok, err := s.Reload(); !ok || err != nil {
		t.Fatalf("reload: %v %v", ok, err)
	}
	if s.Load().LoadBalancing.Algorithm != "least-tokens" || first.LoadBalancing.Algorithm != "round-robin" {
		t.Fatal("snapshot not swapped, or old snapshot mutated")
	}
	// Invalid file: rejected, old config keeps serving.
	write(`{"load_balancing":{"algorithm":"nope"}}`)
	if ok, err := s.Reload(); ok || err == nil {
		t.Fatalf("invalid reload accepted")
	}
	write(`{"load_balancing":`)
	if ok, err := s.Reload(); ok || err == nil {
		t.Fatalf("malformed reload accepted")
	}
	if s.Load().LoadBalancing.Algorithm != "least-tokens" || changes != 1 {
		t.Fatalf("after invalid reloads: %q changes=%d", s.Load().LoadBalancing.Algorithm, changes)
	}
}

func TestWatchFileAndSIGHUP(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "c.json")
	os.WriteFile(path, []byte(`{}`), 0o644)
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	defer close(stop)
	go s.Watch(20*time.Millisecond, stop)
	wait := func(alg string) {
		t.Helper()
		for i := 0; i < 200; i++ {
			if s.Load().LoadBalancing.Algorithm == alg {
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
		t.Fatalf("config never became %q", alg)
	}
	// File change (size differs) is picked up by polling.
	os.WriteFile(path, []byte(`{"load_balancing":{"algorithm":"round-robin"}}`), 0o644)
	wait("round-robin")
	// Same size, same mtime second is possible: SIGHUP forces a reload.
	time.Sleep(50 * time.Millisecond)
	os.WriteFile(path, []byte(`{"load_balancing":{"algorithm":"least-tokens"}}`), 0o644)
	syscall.Kill(os.Getpid(), syscall.SIGHUP)
	wait("least-tokens")
}
