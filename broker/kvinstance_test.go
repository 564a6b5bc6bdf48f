package broker

import (
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/infera/infera/internal/testsrv"
)

// TestKVEventInstanceHeaderIsParsedOrRefused: the subscriber hands on the
// relay's Infera-Instance as a number, 0 when a relay older than the header
// sent none, and refuses a frame whose header is anything but 1-16 hex
// digits other than zero (counted as bad, never delivered).
func TestKVEventInstanceHeaderIsParsedOrRefused(t *testing.T) {
	ns := testsrv.StartNATS(t)
	pnc, rnc := connect(t, ns.URL), connect(t, ns.URL)
	var mu sync.Mutex
	got := map[string]uint64{} // payload -> instance
	sub, err := SubscribeKVEvents(rnc, func(id string, instance uint64, topic []byte, seq uint64, payload []byte) {
		mu.Lock()
		got[string(payload)] = instance
		mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	rnc.Flush()
	send := func(payload string, instance ...string) {
		t.Helper()
		m := nats.NewMsg(KVEventsSubject("w1"))
		m.Header.Set(HdrSeq, "7")
		if len(instance) > 0 {
			m.Header[HdrInstance] = instance
		}
		m.Data = []byte(payload)
		if err := pnc.PublishMsg(m); err != nil {
			t.Fatal(err)
		}
	}
	bad0 := mKVBad.Get()
	send("none")
	send("relay", FormatInstance(0x00c0ffee12345678))
	send("short", "2a")
	send("upper", "00C0FFEE12345678")
	refused := [][]string{{"0000000000000000"}, {"0"}, {"xyz"}, {"0x2a"}, {""}, {"00000000000000002a"}, {"-2a"}, {"2a", "2b"}}
	for _, v := range refused {
		send("refused", v...)
	}
	send("last")
	deadline := time.Now().Add(5 * time.Second)
	for {
		mu.Lock()
		_, done := got["last"]
		mu.Unlock()
		if done {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the last frame never arrived")
		}
		time.Sleep(5 * time.Millisecond)
	}
	mu.Lock()
	defer mu.Unlock()
	want := map[string]uint64{"none": 0, "relay": 0x00c0ffee12345678, "short": 0x2a, "upper": 0x00c0ffee12345678, "last": 0}
	for p, w := range want {
		if g, ok := got[p]; !ok || g != w {
			t.Errorf("frame %q: instance %x (delivered %v), want %x", p, g, ok, w)
		}
	}
	if _, ok := got["refused"]; ok {
		t.Errorf("a frame with a malformed instance header was delivered")
	}
	if n := mKVBad.Get() - bad0; n != uint64(len(refused)) {
		t.Errorf("%d frames counted bad, want %d", n, len(refused))
	}
}

// TestRelayStartedLaterHasTheLargerInstanceID: the router prefers the
// larger instance id as the newer publisher, so a relay started even a
// millisecond later must have the larger id, whatever its random bits;
// the header form is 16 hex digits that parse back to the id.
func TestRelayStartedLaterHasTheLargerInstanceID(t *testing.T) {
	t0 := time.Date(2026, 12, 2, 16, 0, 0, 0, time.UTC)
	for i := 0; i < 1000; i++ {
		a, b := newInstanceID(t0), newInstanceID(t0.Add(time.Millisecond))
		if a >= b {
			t.Fatalf("relay started at %v has id %x, not below %x of one started 1ms later", t0, a, b)
		}
		s := FormatInstance(a)
		if id, ok := parseInstance([]string{s}); len(s) != 16 || !ok || id != a {
			t.Fatalf("FormatInstance(%x) = %q parses to %x, %v", a, s, id, ok)
		}
	}
	if id := newInstanceID(time.Unix(0, 0)); id == 0 {
		t.Fatal("an id drawn at the epoch is 0 (no instance)")
	}
	if id := newInstanceID(time.Unix(-5, 0)); id == 0 || id >= 1<<instanceRandBits {
		t.Fatalf("an id drawn before the epoch is %x, want non-zero and older than any since", id)
	}
}
