package govern

import (
	"context"
	"testing"
	"time"

	"github.com/infera/infera/config"
)

// Records kept in Redis are read by every Governor sharing it: the first
// record under a key stays (a second Keep answers the first), a record
// expires with its TTL, a key without one is nil, and with Redis down both
// calls fail at once. In-process counters have no records.
func TestRecordsAreSharedFirstKeptAndExpire(t *testing.T) {
	if newGov(t, Options{}, &config.Config{}).Records() != nil {
		t.Fatal("in-process counters have records")
	}
	rs := startRedis(t)
	a := newGov(t, Options{State: rs.url()}, &config.Config{}).Records()
	b := newGov(t, Options{State: rs.url()}, &config.Config{}).Records()
	got, err := a.Keep("resp:x", []byte("first"), time.Hour)
	if err != nil || string(got) != "first" {
		t.Fatalf("Keep: %q %v", got, err)
	}
	if got, err := b.Keep("resp:x", []byte("second"), time.Hour); err != nil || string(got) != "first" {
		t.Fatalf("a second Keep: %q %v, want the first", got, err)
	}
	if got, err := b.Find("resp:x"); err != nil || string(got) != "first" {
		t.Fatalf("Find from another router: %q %v", got, err)
	}
	if got, err := b.Find("resp:y"); err != nil || got != nil {
		t.Fatalf("Find of no record: %q %v", got, err)
	}
	c := rs.client(t)
	if ttl := c.PTTL(context.Background(), "infera:resp:x").Val(); ttl <= 59*time.Minute || ttl > time.Hour {
		t.Fatalf("TTL %v, want the hour Keep asked", ttl)
	}
	if _, err := a.Keep("resp:short", []byte("v"), 50*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		got, err := a.Find("resp:short")
		if err != nil {
			t.Fatal(err)
		}
		if got == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the record outlived its TTL")
		}
	}
	if _, err := a.Keep("resp:z", nil, time.Hour); err == nil {
		t.Fatal("an empty record was kept")
	}
	rs.stop()
	start := time.Now()
	if got, err := b.Find("resp:x"); err == nil {
		t.Fatalf("Find with Redis down: %q", got)
	}
	if _, err := a.Keep("resp:w", []byte("v"), time.Hour); err == nil {
		t.Fatal("Keep with Redis down succeeded")
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("the calls with Redis down took %v", d)
	}
}
