package govern

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// TestRedisAReturnThatFailedIsSentAgainOnceRedisAnswers: a request ends
// while Redis is down (its return of the user's concurrency slot fails),
// and Redis comes back with its data (restarted from its dump, or a
// stall that outlasted the call's deadline): the slot's member is in
// Redis's set again, and every request of the user met it until its lease
// expired (15 s). Returns that failed are kept and sent again once Redis
// answers: the slot is free within a moment.
func TestRedisAReturnThatFailedIsSentAgainOnceRedisAnswers(t *testing.T) {
	rs := startRedis(t)
	key, hash := mintKey(t)
	o := redisOptions(t, rs)
	c := userConfig(t, hash, `{"name":"t","concurrency":{"enabled":true,"limit":1}}`, "")
	c.UserLimit.OnStateError = "closed"
	g := newGov(t, o, c)
	u := identify(t, g, key)
	tk := admitOK(t, g, u, Request{})
	if err := rs.client(t).Save(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	rs.stop()
	errs := mStateErrors.Get()
	tk.FirstToken()
	tk.Done(Usage{}) // its return fails: Redis is down
	deadline := time.Now().Add(20 * time.Second)
	for mStateErrors.Get() == errs {
		if time.Now().After(deadline) {
			t.Fatal("the return never failed")
		}
		time.Sleep(50 * time.Millisecond)
	}
	rs.start() // with the dump: the slot's member is back
	deadline = time.Now().Add(3 * time.Second)
	for {
		tk, rej := g.Admit(context.Background(), u, Request{})
		if rej == nil {
			tk.FirstToken()
			tk.Done(Usage{})
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("3 s after Redis came back the user's only slot is still taken: %v", rej)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestRedisDownFailsACallAtOnce: with Redis down (connections refused) a
// call fails at once and on_state_error decides (here: admit): go-redis's
// own five dials 100 ms apart made every request wait about 0.8 s.
func TestRedisDownFailsACallAtOnce(t *testing.T) {
	rs := startRedis(t)
	key, hash := mintKey(t)
	o := redisOptions(t, rs)
	g := newGov(t, o, userConfig(t, hash, `{"name":"t","rate":{"enabled":true,"rpm":1000}}`, ""))
	u := identify(t, g, key)
	admitOK(t, g, u, Request{}).Done(Usage{})
	rs.stop()
	for i := range 3 {
		start := time.Now()
		tk := admitOK(t, g, u, Request{}) // fail open
		tk.Done(Usage{})
		if d := time.Since(start); d > 300*time.Millisecond {
			t.Fatalf("admission %d with Redis down took %v", i, d)
		}
	}
}

// TestRedisStallFailsCallsAtOnceAfterTheFirstTimeout: Redis stalls (a
// long script here; a fork on a large dataset or a partition without a
// reset in production). The first admission waits out its timeout and is
// admitted uncounted (on_state_error open); the ones after it are too,
// at once, instead of each waiting its own second behind the stalled
// pipeline. Once Redis answers, admissions are counted again.
func TestRedisStallFailsCallsAtOnceAfterTheFirstTimeout(t *testing.T) {
	rs := startRedis(t)
	key, hash := mintKey(t)
	o := redisOptions(t, rs)
	g := newGov(t, o, userConfig(t, hash, `{"name":"t","rate":{"enabled":true,"rpm":1000}}`, ""))
	u := identify(t, g, key)
	admitOK(t, g, u, Request{}).Done(Usage{})
	busy := busyRedis(t, rs, 4000)
	admitOK(t, g, u, Request{}).Done(Usage{}) // waits out its timeout, then fails open
	stalled := mStateStalled.Get()
	for i := range 5 {
		start := time.Now()
		admitOK(t, g, u, Request{}).Done(Usage{})
		if d := time.Since(start); d > 300*time.Millisecond {
			t.Fatalf("admission %d in the stall, after a call timed out, took %v", i, d)
		}
	}
	if mStateStalled.Get() == stalled {
		t.Fatal("no call was failed at once")
	}
	<-busy
	deadline := time.Now().Add(5 * time.Second)
	for {
		open := mStateFailOpen.Get()
		admitOK(t, g, u, Request{}).Done(Usage{})
		if mStateFailOpen.Get() == open {
			return // counted in Redis again
		}
		if time.Now().After(deadline) {
			t.Fatal("5 s after the stall admissions still fail open")
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestRedisAStallsProbeWaitsOneTimeout: Redis stalls for seconds (stopped
// here). Past the first timeout every admission but the stall's probes
// fails at once; a probe waits one timeout (1 s), no more. A probe waited
// three: behind an end-only pipeline the stall's hold let out (one
// timeout), then its own on a new connection, whose handshake go-redis
// timed out and retried on another connection (two). The probe is an
// admission, or the ends queued meanwhile (the dispatcher sends them as
// the probe when the hold ends before an admission comes): every probe is
// timed (probed), whoever sends it, and the stall has at least one.
func TestRedisAStallsProbeWaitsOneTimeout(t *testing.T) {
	rs := startRedis(t)
	key, hash := mintKey(t)
	o := redisOptions(t, rs)
	g := newGov(t, o, userConfig(t, hash, `{"name":"t","rate":{"enabled":true,"rpm":100000}}`, ""))
	var pmu sync.Mutex
	var probes []time.Duration
	g.rds.probed = func(d time.Duration) {
		pmu.Lock()
		probes = append(probes, d)
		pmu.Unlock()
	}
	u := identify(t, g, key)
	admitOK(t, g, u, Request{}).Done(Usage{})
	if err := rs.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := true
	cont := func() {
		if stopped {
			stopped = false
			rs.cmd.Process.Signal(syscall.SIGCONT)
		}
	}
	t.Cleanup(cont)
	start := time.Now()
	var worst time.Duration
	var waits []string // the admissions that waited, for the failure's message
	for i := 0; time.Since(start) < 6*time.Second; i++ {
		s := time.Now()
		admitOK(t, g, u, Request{}).Done(Usage{}) // fail open
		d := time.Since(s)
		if d > 100*time.Millisecond {
			waits = append(waits, fmt.Sprintf("admission %d at %v waited %v", i, s.Sub(start).Round(time.Millisecond), d.Round(time.Millisecond)))
		}
		if i > 0 && d > worst {
			worst = d // the first waits out the stall's first timeout
		}
		time.Sleep(50 * time.Millisecond)
	}
	pmu.Lock()
	inStall := slices.Clone(probes) // a probe still out is answered after cont
	pmu.Unlock()
	cont()
	if worst > 1500*time.Millisecond {
		t.Fatalf("an admission in the stall waited %v, want at most one timeout; the admissions that waited: %s", worst, strings.Join(waits, "; "))
	}
	// The hold (1 s) follows each timeout (1 s): probes at about 2 s and
	// 4 s into the stall.
	if len(inStall) == 0 {
		t.Fatalf("no probe in a stall of 6 s; the admissions that waited: %s", strings.Join(waits, "; "))
	}
	for i, d := range inStall {
		if d > 1500*time.Millisecond {
			t.Fatalf("probe %d of the stall waited %v, want at most one timeout (probes: %v; the admissions that waited: %s)", i, d, inStall, strings.Join(waits, "; "))
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		open := mStateFailOpen.Get()
		admitOK(t, g, u, Request{}).Done(Usage{})
		if mStateFailOpen.Get() == open {
			return // counted in Redis again
		}
		if time.Now().After(deadline) {
			t.Fatal("5 s after the stall admissions still fail open")
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestRedisAPhantomSlotIsReturnedWithoutTraffic: an admission times out
// in a stall that outlasts its probe too, and Redis runs it when it reads
// it: its slot is taken for a request admitted uncounted (fail open).
// Its return was kept for when Redis answers, but went out only ahead of
// the router's next pipeline: a router without traffic left the slot taken
// for every router until its lease expired (15 s; with a limit of one,
// the other router refused the user's every request meanwhile).
func TestRedisAPhantomSlotIsReturnedWithoutTraffic(t *testing.T) {
	rs := startRedis(t)
	key, hash := mintKey(t)
	o := redisOptions(t, rs)
	c := userConfig(t, hash, `{"name":"t","concurrency":{"enabled":true,"limit":1}}`, "")
	g1, g2 := newGov(t, o, c), newGov(t, o, c)
	u1, u2 := identify(t, g1, key), identify(t, g2, key)
	admitOK(t, g1, u1, Request{}).Done(Usage{}) // scripts and connections warm
	syncState(t, g1)
	admitOK(t, g2, u2, Request{}).Done(Usage{})
	syncState(t, g2)
	if err := rs.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := true
	cont := func() {
		if stopped {
			stopped = false
			rs.cmd.Process.Signal(syscall.SIGCONT)
		}
	}
	t.Cleanup(cont)
	start := time.Now()
	admitOK(t, g1, u1, Request{}).Done(Usage{})           // times out: admitted uncounted
	time.Sleep(4500*time.Millisecond - time.Since(start)) // past the probe of its return
	cont()
	deadline := time.Now().Add(4 * time.Second)
	for {
		tk, rej := g2.Admit(context.Background(), u2, Request{})
		if rej == nil {
			tk.Done(Usage{})
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("4 s after the stall the other router still meets the slot of the call that timed out: %v", rej)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestRedisCallsFailedAtOnceInAStallKeepNoReturns: in a stall, the calls
// failed at once (never sent) queued the return of their slot and kept it
// for sending again, as a call that timed out must; the list of kept
// returns (16,384) filled with them, evicting the return of the call that
// did time out and ran: its slot stayed taken for every router until its
// lease expired (the other router refused the user 429 concurrency_user).
func TestRedisCallsFailedAtOnceInAStallKeepNoReturns(t *testing.T) {
	rs := startRedis(t)
	key, hash := mintKey(t)
	o := redisOptions(t, rs)
	c := userConfig(t, hash, `{"name":"t","concurrency":{"enabled":true,"limit":1}}`, "")
	g1, g2 := newGov(t, o, c), newGov(t, o, c)
	u1, u2 := identify(t, g1, key), identify(t, g2, key)
	admitOK(t, g1, u1, Request{}).Done(Usage{})
	syncState(t, g1)
	admitOK(t, g2, u2, Request{}).Done(Usage{})
	syncState(t, g2)
	if err := rs.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := true
	cont := func() {
		if stopped {
			stopped = false
			rs.cmd.Process.Signal(syscall.SIGCONT)
		}
	}
	t.Cleanup(cont)
	start := time.Now()
	admitOK(t, g1, u1, Request{}).Done(Usage{}) // times out: admitted uncounted
	for range 1<<14 + 100 {
		admitOK(t, g1, u1, Request{}).Done(Usage{}) // failed at once: never sent
	}
	g1.rds.qmu.Lock()
	kept := g1.rds.keptLocked()
	g1.rds.qmu.Unlock()
	if kept > 2 {
		t.Errorf("%d returns kept for sending again, want those of the call that timed out", kept)
	}
	time.Sleep(4500*time.Millisecond - time.Since(start)) // past the probe of its return
	cont()
	deadline := time.Now().Add(4 * time.Second)
	for {
		tk, rej := g2.Admit(context.Background(), u2, Request{})
		if rej == nil {
			tk.Done(Usage{})
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("4 s after the stall the other router still meets the slot of the call that timed out: %v", rej)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// The returns that failed while Redis was down go out ahead of the first
// calls once it is back: Redis restarted from its data (dump or AOF)
// holds the slot and the seat of requests that ended meanwhile, and the
// first requests after the restart met them (429 concurrency_user and
// concurrency_overall with limits of one) when the returns were sent
// only after the first pipeline was answered.
func TestRedisTheFirstRequestsAfterARestartMeetNoPhantomSlotOrSeat(t *testing.T) {
	rs := startRedis(t)
	key, hash := mintKey(t)
	o := redisOptions(t, rs)
	c := userConfig(t, hash, `{"name":"t","concurrency":{"enabled":true,"limit":1}}`, `"rate_limit":{"overall_concurrency":1}`)
	g := newGov(t, o, c)
	u := identify(t, g, key)
	tk := admitOK(t, g, u, Request{})
	seat := acquireOK(t, g, []Target{w1}, PhaseMixed, 0)
	if err := rs.client(t).Save(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	rs.stop()
	tk.FirstToken()
	tk.Done(Usage{}) // both returns fail: Redis is down
	seat.Done()
	deadline := time.Now().Add(20 * time.Second)
	for {
		g.rds.qmu.Lock()
		n := g.rds.keptLocked()
		g.rds.qmu.Unlock()
		if n >= 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d returns kept, want 2", n)
		}
		time.Sleep(20 * time.Millisecond)
	}
	rs.start() // with the dump: the slot's and the seat's members are back
	if _, rej := g.Admit(context.Background(), u, Request{}); rej != nil {
		t.Fatalf("the first admission after the restart: %v", rej)
	}
	if _, _, rej := g.TryAcquire([]Target{w1}, PhaseMixed); rej != nil {
		t.Fatalf("the first seat after the restart: %v", rej)
	}
}
