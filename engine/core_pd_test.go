package engine

import (
	"testing"
	"time"
)

func TestTransferTime(t *testing.T) {
	m := DefaultTimeModel()
	if got, want := m.TransferTime(0), time.Millisecond; got != want {
		t.Fatalf("TransferTime(0) = %v, want %v", got, want)
	}
	if got, want := m.TransferTime(100), time.Millisecond+100*40*time.Microsecond; got != want {
		t.Fatalf("TransferTime(100) = %v, want %v", got, want)
	}
	m.Speedup = 4
	if got, want := m.TransferTime(100), (time.Millisecond+4*time.Millisecond)/4; got != want {
		t.Fatalf("TransferTime(100) at speedup 4 = %v, want %v", got, want)
	}
	m.TransferPerBlock = -1
	if m.Validate() == nil {
		t.Fatal("negative transfer time validated")
	}
}

// submitAt submits r at now and steps the core, returning its events.
func submitAt(t *testing.T, c *Core, r *Request, now time.Duration) ([]Event, time.Duration) {
	t.Helper()
	if err := c.Submit(r, now); err != nil {
		t.Fatal(err)
	}
	return c.Step(now, nil)
}

// A pushed request (SGLang decode) reserves its blocks without a batch slot
// or any prefill, gets its first token when the KV arrives and then decodes
// one token per decode step.
func TestCorePushTransfer(t *testing.T) {
	c := newTestCore(t, testCoreConfig())
	r := &Request{Prompt: seqTokens(1, 100), MaxTokens: 4, Transfer: TransferPush}
	evs, next := submitAt(t, c, r, 0)
	if len(evs) != 1 || !evs[0].WaitingKV || evs[0].Req != r || next != Never {
		t.Fatalf("admission events %+v next %v, want one WaitingKV and an idle core", evs, next)
	}
	st := c.Stats()
	if st.WaitingKV != 1 || st.Running != 0 || st.BlocksUsed != c.cache.BlocksFor(104) {
		t.Fatalf("stats after admission %+v", st)
	}
	at := 50 * time.Millisecond
	evs, ok := c.TransferDone(r, at, nil)
	if !ok || len(evs) != 1 || evs[0].Tokens != 1 || evs[0].Done || r.FirstTokenAt != at {
		t.Fatalf("TransferDone events %+v ok %v first %v", evs, ok, r.FirstTokenAt)
	}
	if _, ok := c.TransferDone(r, at, nil); ok {
		t.Fatal("TransferDone accepted twice")
	}
	evs, end := drain(t, c, at, nil)
	tm := DefaultTimeModel()
	if want := at + 3*tm.DecodeStepTime(1); r.FinishAt != want || end != want {
		t.Fatalf("finished at %v (end %v), want %v: three decode steps, no prefill", r.FinishAt, end, want)
	}
	if len(evs) != 3 || evs[2].Tokens != 4 || !evs[2].Done {
		t.Fatalf("decode events %+v", evs)
	}
	if st := c.Stats(); st.Completed != 1 || st.BlocksUsed != c.cache.Cached() || st.GeneratedTokens != 4 {
		t.Fatalf("stats after completion %+v", st)
	}
}

// A pulled request (vLLM decode) recomputes its last prompt token in its
// first step, at the cost of one more decoding sequence.
func TestCorePullTransfer(t *testing.T) {
	c := newTestCore(t, testCoreConfig())
	r := &Request{Prompt: seqTokens(1, 100), MaxTokens: 2, Transfer: TransferPull}
	submitAt(t, c, r, 0)
	at := 10 * time.Millisecond
	evs, ok := c.TransferDone(r, at, nil)
	if !ok || len(evs) != 0 {
		t.Fatalf("pull TransferDone events %+v ok %v, want none", evs, ok)
	}
	if st := c.Stats(); st.ReadyKV != 1 || st.WaitingKV != 0 {
		t.Fatalf("stats %+v", st)
	}
	evs, _ = drain(t, c, at, nil)
	tm := DefaultTimeModel()
	if want := at + tm.DecodeStepTime(1); r.FirstTokenAt != want {
		t.Fatalf("first token at %v, want %v (one decode step)", r.FirstTokenAt, want)
	}
	if want := at + 2*tm.DecodeStepTime(1); r.FinishAt != want || len(evs) != 2 {
		t.Fatalf("finish %v events %d, want %v and 2", r.FinishAt, len(evs), want)
	}
}

// Transferred requests wait for batch slots; waiting for a transfer takes
// none.
func TestCoreTransferBatchSlots(t *testing.T) {
	cfg := testCoreConfig()
	cfg.MaxBatch = 1
	c := newTestCore(t, cfg)
	local := &Request{Prompt: seqTokens(1, 32), MaxTokens: 3}
	remote := &Request{Prompt: seqTokens(2, 32), MaxTokens: 3, Transfer: TransferPush}
	if err := c.Submit(local, 0); err != nil {
		t.Fatal(err)
	}
	evs, next := submitAt(t, c, remote, 0)
	if len(evs) != 1 || !evs[0].WaitingKV {
		t.Fatalf("the remote request was not admitted beside a full batch: %+v", evs)
	}
	c.TransferDone(remote, 0, nil)
	if st := c.Stats(); st.Running != 1 || st.ReadyKV != 1 {
		t.Fatalf("stats %+v, want the ready request to wait for the slot", st)
	}
	drain(t, c, next, nil)
	if remote.AdmitAt < local.FinishAt {
		t.Fatalf("ready request joined the batch at %v, before the slot freed at %v", remote.AdmitAt, local.FinishAt)
	}
	if remote.Generated != 3 || local.Generated != 3 {
		t.Fatalf("generated %d and %d, want 3 each", remote.Generated, local.Generated)
	}
}

// A HoldKV request keeps its blocks after its last token until Release;
// Abort of a held request releases it without counting an abort.
func TestCoreHoldKVRelease(t *testing.T) {
	c := newTestCore(t, testCoreConfig())
	r := &Request{Prompt: seqTokens(1, 64), MaxTokens: 1, HoldKV: true}
	submitAt(t, c, r, 0)
	evs, _ := drain(t, c, 0, nil)
	if len(evs) != 1 || !evs[0].Done {
		t.Fatalf("events %+v", evs)
	}
	st := c.Stats()
	if st.Held != 1 || st.Completed != 1 || c.cache.Evictable() != 0 {
		t.Fatalf("stats %+v evictable %d, want the blocks held", st, c.cache.Evictable())
	}
	ids := c.BlockIDs(nil, r, 4)
	if len(ids) != 4 || ids[0] != 0 || ids[3] != 3 {
		t.Fatalf("block ids %v, want [0 1 2 3]", ids)
	}
	if err := c.Submit(r, 0); err == nil {
		t.Fatal("a held request was resubmitted")
	}
	if !c.Abort(r, 0) || c.Release(r) {
		t.Fatal("abort of a held request did not release it exactly once")
	}
	if st := c.Stats(); st.Held != 0 || st.Aborted != 0 || c.cache.Evictable() != 4 {
		t.Fatalf("after release %+v evictable %d", st, c.cache.Evictable())
	}
}

// Aborting a request whose transfer is under way, or done and waiting for
// a slot, frees its blocks.
func TestCoreAbortDuringTransfer(t *testing.T) {
	for _, done := range []bool{false, true} {
		cfg := testCoreConfig()
		cfg.MaxBatch = 1
		c := newTestCore(t, cfg)
		busy := &Request{Prompt: seqTokens(9, 16), MaxTokens: 50}
		if err := c.Submit(busy, 0); err != nil {
			t.Fatal(err)
		}
		r := &Request{Prompt: seqTokens(1, 40), MaxTokens: 8, Transfer: TransferPull}
		submitAt(t, c, r, 0)
		if done {
			c.TransferDone(r, 0, nil)
		}
		before := c.cache.Used() - c.cache.Evictable()
		if !c.Abort(r, time.Millisecond) {
			t.Fatal("abort refused")
		}
		st := c.Stats()
		if st.WaitingKV != 0 || st.ReadyKV != 0 || st.Aborted != 1 || c.cache.Used()-c.cache.Evictable() != before-c.cache.BlocksFor(48) {
			t.Fatalf("done=%v: stats %+v after abort", done, st)
		}
		if _, ok := c.TransferDone(r, time.Millisecond, nil); ok {
			t.Fatal("TransferDone accepted an aborted request")
		}
	}
}

// The interference PD removes: running sequences wait for every prefill of
// their engine. The same decodes take longer per token on a mixed engine
// that also prefills arriving prompts than on a decode engine.
func TestMixedPrefillsSlowDecodes(t *testing.T) {
	run := func(mixed bool) time.Duration {
		c := newTestCore(t, CoreConfig{BlockSize: 16, CapacityBlocks: 1 << 16, MaxBatch: 64, MaxPrefillTokens: 8192, Time: DefaultTimeModel()})
		var decs []*Request
		for i := range 8 {
			r := &Request{Prompt: seqTokens(100+i, 512), MaxTokens: 100}
			if !mixed {
				r.Transfer = TransferPush // its KV arrives at once
			}
			if err := c.Submit(r, 0); err != nil {
				t.Fatal(err)
			}
			decs = append(decs, r)
		}
		evs, next := c.Step(0, nil)
		for _, ev := range evs {
			if ev.WaitingKV {
				c.TransferDone(ev.Req, 0, nil)
				next = 0
			}
		}
		// On the mixed engine a 2048-token prompt (172 ms of prefill) arrives
		// every 300 ms.
		for arrive, i := 300*time.Millisecond, 0; i < 100000; i++ {
			if mixed && arrive <= next {
				p := &Request{Prompt: seqTokens(1000+i, 2048), MaxTokens: 1}
				if err := c.Submit(p, arrive); err != nil {
					t.Fatal(err)
				}
				arrive += 300 * time.Millisecond
			}
			evs, next = c.Step(next, evs[:0])
			if next == Never || decs[0].FinishAt > 0 && decs[7].FinishAt > 0 {
				break
			}
		}
		var sum time.Duration
		for _, r := range decs {
			sum += (r.FinishAt - r.FirstTokenAt) / time.Duration(r.MaxTokens-1)
		}
		return sum / time.Duration(len(decs))
	}
	decodeOnly, mixed := run(false), run(true)
	t.Logf("mean time per output token: decode engine %v, mixed engine %v", decodeOnly, mixed)
	if want := DefaultTimeModel().DecodeStepTime(8); decodeOnly != want {
		t.Fatalf("decode engine TPOT %v, want one decode step of 8 sequences (%v)", decodeOnly, want)
	}
	if mixed < decodeOnly*3/2 {
		t.Fatalf("mixed engine TPOT %v is not clearly above the decode engine's %v", mixed, decodeOnly)
	}
}
