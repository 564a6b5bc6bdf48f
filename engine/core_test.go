package engine

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

func testCoreConfig() CoreConfig {
	return CoreConfig{BlockSize: 16, CapacityBlocks: 1024, MaxBatch: 64, MaxPrefillTokens: 8192, Time: DefaultTimeModel()}
}

func newTestCore(t testing.TB, cfg CoreConfig) *Core {
	t.Helper()
	c, err := NewCore(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// drain runs the core in virtual time until idle, bounded.
func drain(t testing.TB, c *Core, now time.Duration, evs []Event) ([]Event, time.Duration) {
	t.Helper()
	next := now
	for i := 0; ; i++ {
		if i > 1_000_000 {
			t.Fatal("core did not become idle")
		}
		var n time.Duration
		evs, n = c.Step(next, evs)
		if n == Never {
			return evs, next
		}
		next = n
	}
}

func TestTimeModel(t *testing.T) {
	m := DefaultTimeModel()
	f := func(got, want time.Duration) {
		t.Helper()
		if got != want {
			t.Fatalf("got %v, want %v", got, want)
		}
	}
	f(m.PrefillTime(0, 0), 0)
	f(m.PrefillTime(1000, 1), 8*time.Millisecond+80*time.Millisecond+250*time.Microsecond)
	f(m.DecodeStepTime(0), 0)
	f(m.DecodeStepTime(1), 12*time.Millisecond+150*time.Microsecond)
	f(m.DecodeStepTime(64), 12*time.Millisecond+64*150*time.Microsecond)
	m.Speedup = 10
	f(m.DecodeStepTime(1), (12*time.Millisecond+150*time.Microsecond)/10)
	m.Slow = 3
	f(m.DecodeStepTime(1), 3*(12*time.Millisecond+150*time.Microsecond)/10)
	f(m.StepTime(100, 1, 2), m.PrefillTime(100, 1)+m.DecodeStepTime(2))
	bad := DefaultTimeModel()
	bad.DecodeBase, bad.DecodePerSeq = 0, 0
	if bad.Validate() == nil {
		t.Fatal("zero decode model validated")
	}
}

// A huge slow-down saturates: it never wraps to a negative duration. The
// conversion overflowed, so `infera engine --speedup 1e-300` and a slow
// fault with factor 1e308 answered at once (a step of "1" ns).
func TestTimeModelHugeSlowDownSaturates(t *testing.T) {
	for _, m := range []TimeModel{
		{PrefillBase: 8 * time.Millisecond, DecodeBase: 12 * time.Millisecond, Speedup: 1e-300},
		{PrefillBase: 8 * time.Millisecond, DecodeBase: 12 * time.Millisecond, Slow: 1e308},
	} {
		if d := m.StepTime(100, 1, 1); d < 24*time.Hour {
			t.Fatalf("speedup %v, slow %v: a step takes %v", m.Speedup, m.Slow, d)
		}
		if d := m.TransferTime(1); d < 0 {
			t.Fatalf("speedup %v, slow %v: a transfer takes %v", m.Speedup, m.Slow, d)
		}
	}
	c := newTestCore(t, CoreConfig{BlockSize: 16, CapacityBlocks: 64, MaxBatch: 4,
		Time: TimeModel{PrefillBase: 8 * time.Millisecond, DecodeBase: 12 * time.Millisecond, Slow: 1e308}})
	req := &Request{Prompt: make([]uint32, 20), MaxTokens: 2}
	if err := c.Submit(req, 0); err != nil {
		t.Fatal(err)
	}
	_, next := c.Step(0, nil)
	if next < 24*time.Hour {
		t.Fatalf("the first step of a 1e308-times slowed engine ends at %v", next)
	}
}

func TestCoreSingleRequestTiming(t *testing.T) {
	c := newTestCore(t, testCoreConfig())
	r := &Request{Prompt: seqTokens(1, 100), MaxTokens: 5}
	if err := c.Submit(r, 0); err != nil {
		t.Fatal(err)
	}
	evs, end := drain(t, c, 0, nil)
	tm := DefaultTimeModel()
	wantFirst := tm.PrefillTime(100, 1)
	if r.FirstTokenAt != wantFirst {
		t.Fatalf("first token at %v, want %v", r.FirstTokenAt, wantFirst)
	}
	wantEnd := wantFirst + 4*tm.DecodeStepTime(1)
	if r.FinishAt != wantEnd || end != wantEnd {
		t.Fatalf("finish at %v (last event %v), want %v", r.FinishAt, end, wantEnd)
	}
	if len(evs) != 5 || !evs[4].Done || evs[0].Tokens != 1 || evs[4].Tokens != 5 {
		t.Fatalf("events %+v", evs)
	}
	st := c.Stats()
	if st.Completed != 1 || st.GeneratedTokens != 5 || st.PromptTokens != 100 || st.Running != 0 || st.BlocksUsed != 6 || st.BlocksCached != 6 {
		t.Fatalf("stats %+v", st)
	}
}

// TestCoreBatchingSlowsTokens: with N concurrent requests the per-token
// interval grows with N, in virtual time.
func TestCoreBatchingSlowsTokens(t *testing.T) {
	itl := func(n int) time.Duration {
		c := newTestCore(t, testCoreConfig())
		reqs := make([]*Request, n)
		for i := range reqs {
			reqs[i] = &Request{Prompt: seqTokens(1000*i, 64), MaxTokens: 20}
			if err := c.Submit(reqs[i], 0); err != nil {
				t.Fatal(err)
			}
		}
		drain(t, c, 0, nil)
		r := reqs[0]
		return (r.FinishAt - r.FirstTokenAt) / time.Duration(r.MaxTokens-1)
	}
	prev := time.Duration(0)
	for _, n := range []int{1, 8, 32, 64} {
		got := itl(n)
		want := DefaultTimeModel().DecodeStepTime(n)
		if got != want {
			t.Fatalf("batch %d: inter-token %v, want %v", n, got, want)
		}
		if got <= prev {
			t.Fatalf("batch %d: inter-token %v not above %v", n, got, prev)
		}
		prev = got
	}
}

func TestCoreMaxBatchQueues(t *testing.T) {
	cfg := testCoreConfig()
	cfg.MaxBatch = 2
	c := newTestCore(t, cfg)
	reqs := make([]*Request, 3)
	for i := range reqs {
		reqs[i] = &Request{Prompt: seqTokens(1000*i, 32), MaxTokens: 4}
		if err := c.Submit(reqs[i], 0); err != nil {
			t.Fatal(err)
		}
	}
	_, next := c.Step(0, nil)
	if st := c.Stats(); st.Running != 2 || st.Queued != 1 {
		t.Fatalf("running=%d queued=%d, want 2 1", st.Running, st.Queued)
	}
	drain(t, c, next, nil)
	if reqs[2].AdmitAt != reqs[0].FinishAt {
		t.Fatalf("third request admitted at %v, want when the first finished (%v)", reqs[2].AdmitAt, reqs[0].FinishAt)
	}
}

func TestCorePrefixCacheCutsTTFT(t *testing.T) {
	c := newTestCore(t, testCoreConfig())
	prompt := seqTokens(7, 2000)
	a := &Request{Prompt: prompt, MaxTokens: 2}
	if err := c.Submit(a, 0); err != nil {
		t.Fatal(err)
	}
	_, end := drain(t, c, 0, nil)
	b := &Request{Prompt: append(append([]uint32(nil), prompt...), 1, 2, 3), MaxTokens: 2}
	if err := c.Submit(b, end); err != nil {
		t.Fatal(err)
	}
	drain(t, c, end, nil)
	if a.CachedTokens != 0 || b.CachedTokens != 2000 {
		t.Fatalf("cached tokens %d, %d, want 0, 2000", a.CachedTokens, b.CachedTokens)
	}
	ttftA, ttftB := a.FirstTokenAt-a.SubmitAt, b.FirstTokenAt-b.SubmitAt
	if ttftB*5 > ttftA {
		t.Fatalf("cached TTFT %v not far below uncached %v", ttftB, ttftA)
	}
	// Identical prompt: the last token is always recomputed.
	d := &Request{Prompt: prompt, MaxTokens: 1}
	_ = c.Submit(d, 10*time.Second)
	drain(t, c, 10*time.Second, nil)
	if d.CachedTokens != 2000-16 {
		t.Fatalf("identical prompt cached %d, want %d", d.CachedTokens, 2000-16)
	}
	if st := c.Stats(); st.CachedPromptTokens != uint64(2000+2000-16) {
		t.Fatalf("cached prompt tokens %d", st.CachedPromptTokens)
	}
}

func TestCoreKVLimitsAdmission(t *testing.T) {
	cfg := testCoreConfig()
	cfg.CapacityBlocks = 10
	c := newTestCore(t, cfg)
	// Each needs ceil((64+16)/16) = 5 blocks: two fit, the third waits.
	reqs := make([]*Request, 3)
	for i := range reqs {
		reqs[i] = &Request{Prompt: seqTokens(1000*i, 64), MaxTokens: 16}
		if err := c.Submit(reqs[i], 0); err != nil {
			t.Fatal(err)
		}
	}
	c.Step(0, nil)
	if st := c.Stats(); st.Running != 2 || st.Queued != 1 || st.BlocksUsed != 10 {
		t.Fatalf("stats %+v", st)
	}
	drain(t, c, 0, nil)
	if st := c.Stats(); st.Completed != 3 || st.Evictions == 0 {
		t.Fatalf("stats %+v: want 3 completed and evictions", st)
	}
	big := &Request{Prompt: seqTokens(0, 150), MaxTokens: 20}
	if err := c.Submit(big, 0); err == nil || !strings.Contains(err.Error(), "KV blocks") {
		t.Fatalf("oversized request: err %v", err)
	}
	for _, bad := range []*Request{{MaxTokens: 1}, {Prompt: []uint32{1}, MaxTokens: 0}} {
		if err := c.Submit(bad, 0); err == nil {
			t.Fatalf("bad request %+v accepted", bad)
		}
	}
}

func TestCoreAbort(t *testing.T) {
	cfg := testCoreConfig()
	cfg.MaxBatch = 1
	c := newTestCore(t, cfg)
	a := &Request{Prompt: seqTokens(0, 40), MaxTokens: 100}
	b := &Request{Prompt: seqTokens(500, 40), MaxTokens: 100}
	_ = c.Submit(a, 0)
	_ = c.Submit(b, 0)
	_, next := c.Step(0, nil)
	evs, _ := c.Step(next, nil)
	if len(evs) != 1 || evs[0].Req != a {
		t.Fatalf("events %+v", evs)
	}
	if !c.Abort(b, next) || c.Abort(b, next) {
		t.Fatal("abort of queued request")
	}
	if !c.Abort(a, next) {
		t.Fatal("abort of running request failed")
	}
	if st := c.Stats(); st.Aborted != 2 || st.Running != 0 || st.Queued != 0 || c.Cache().Evictable() != c.Cache().Used() {
		t.Fatalf("after aborts: %+v evictable=%d", st, c.Cache().Evictable())
	}
	// The aborted request's step still ends; nothing is emitted for it.
	evs, n := drain(t, c, next, nil)
	if len(evs) != 0 || n < next {
		t.Fatalf("events after abort: %+v", evs)
	}
	// A finished request can be resubmitted.
	if err := c.Submit(a, n); err != nil {
		t.Fatal(err)
	}
}

func TestCorePrefillBudget(t *testing.T) {
	cfg := testCoreConfig()
	cfg.MaxPrefillTokens = 1000
	c := newTestCore(t, cfg)
	for i := 0; i < 3; i++ {
		_ = c.Submit(&Request{Prompt: seqTokens(10000*i, 600), MaxTokens: 3}, 0)
	}
	c.Step(0, nil)
	if st := c.Stats(); st.Running != 1 || st.Queued != 2 {
		t.Fatalf("running=%d queued=%d, want 1 2", st.Running, st.Queued)
	}
}

// TestCoreDeterministic: the same calls give the same events at the same
// times.
func TestCoreDeterministic(t *testing.T) {
	run := func() string {
		cfg := testCoreConfig()
		cfg.CapacityBlocks = 24
		cfg.MaxBatch = 4
		sink := &fakeSink{}
		cfg.Sink = sink
		c := newTestCore(t, cfg)
		var b strings.Builder
		var evs []Event
		now := time.Duration(0)
		next := Never
		for i := 0; i < 40; i++ {
			arrive := time.Duration(i) * 7 * time.Millisecond
			for next <= arrive {
				evs, next = c.Step(next, evs[:0])
				for _, ev := range evs {
					fmt.Fprintf(&b, "%v %d %d %v|", ev.At, ev.Req.Tag, ev.Tokens, ev.Done)
				}
			}
			now = arrive
			shared := seqTokens(1, 16*(i%5))
			r := &Request{Prompt: append(shared, seqTokens(100*i, 20)...), MaxTokens: 1 + i%9, Tag: i}
			if err := c.Submit(r, now); err != nil {
				t.Fatal(err)
			}
			if i%7 == 3 {
				c.Abort(r, now)
			}
			evs, next = c.Step(now, evs[:0])
			for _, ev := range evs {
				fmt.Fprintf(&b, "%v %d %d %v|", ev.At, ev.Req.Tag, ev.Tokens, ev.Done)
			}
		}
		evs, _ = drain(t, c, next, evs[:0])
		for _, ev := range evs {
			fmt.Fprintf(&b, "%v %d %d %v|", ev.At, ev.Req.Tag, ev.Tokens, ev.Done)
		}
		fmt.Fprintf(&b, "%+v %q", c.Stats(), sink.events)
		return b.String()
	}
	a, b := run(), run()
	if a != b {
		t.Fatalf("runs differ:\n%s\n%s", a, b)
	}
	if !strings.Contains(a, "removed") || !strings.Contains(a, "true|") {
		t.Fatalf("scenario too weak (no evictions or completions): %s", a)
	}
}
