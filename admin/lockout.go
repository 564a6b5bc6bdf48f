package admin

import (
	"net/netip"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/infera/infera/govern"
)

// Wrong admin keys are counted per client address in this process's table
// (api.go: maxAuthFailures within authWindow), and, with --state redis,
// in Redis too (ShareLockouts), so that the admin listeners of every
// router sharing it count one address's wrong keys together: a lockout
// any of them begins holds on all, and on a router started during it. The
// table stays the first check (a locked address and a right key cost no
// Redis call); only a wrong key is sent to Redis, and its 401 does not
// wait for the answer, but the address's next request waits for it (at
// most govern.AnswerWait), so that a lockout it tells holds for that request.
// Redis holds the address and
// its count, never a key. When Redis cannot be asked the wrong key counts
// in this process alone, as without Redis, and the failure is counted.

var (
	// mLockoutStateCountErrors counts wrong admin keys Redis could not
	// count; mLockoutStateSyncErrors the failed reads of the lockouts in
	// force (at start, on reconnecting).
	mLockoutStateCountErrors = metrics.NewCounter(`infera_admin_auth_lockout_state_errors_total{op="count"}`)
	mLockoutStateSyncErrors  = metrics.NewCounter(`infera_admin_auth_lockout_state_errors_total{op="sync"}`)
	// mLockoutStateDropped counts wrong admin keys not sent to Redis:
	// 4096 waited already (counted in this process alone).
	mLockoutStateDropped = metrics.NewCounter(`infera_admin_auth_lockout_state_dropped_total`)
	// mLockoutStateFull counts wrong admin keys Redis did not count: it
	// counts 262,144 new addresses in the window already.
	mLockoutStateFull = metrics.NewCounter(`infera_admin_auth_lockout_state_full_total`)
)

// ShareLockouts counts wrong admin keys in l too (the governor's
// Lockouts("admin"); nil: this process alone) and locks here every
// address the admin listeners sharing it lock out, those locked now and
// from now on. Call it before Start. Without an admin listener (no
// address or no key) it does nothing.
func (a *Admin) ShareLockouts(l *govern.Lockouts) {
	if l == nil || a.fails == nil || a.o.Addr == "" || a.o.Key == "" {
		return
	}
	a.shared = l
	l.Start(maxAuthFailures, authWindow, a.counted)
	l.Watch(func(ip netip.Addr, left time.Duration) { a.fails.Lock(ip, left) }, func(err error) {
		mLockoutStateSyncErrors.Inc()
		authLog.Warn("cannot read the admin lockouts in force from the state store: until it answers, this process knows only its own", "err", err)
	})
}

// wrongKey counts a wrong admin key from ip, here, and sends it to Redis
// without waiting (counted): the 401 is this process's table's.
func (a *Admin) wrongKey(ip netip.Addr) {
	began := a.fails.Failed(ip)
	if a.shared == nil {
		return
	}
	if !a.shared.Report(a.fails, govern.Guess{Addr: ip}, began) {
		mLockoutStateDropped.Inc()
		authLog.Warn("too many wrong admin keys wait for the state store: one counted by this process alone")
	}
}

// counted is Redis's answer about a wrong admin key: its lockout then
// holds here too, and the address's requests are no longer held for it.
func (a *Admin) counted(c govern.Counted) {
	if c.Held {
		defer a.fails.Release(c.Addr) // after Lock: the request waiting sees it
	}
	if c.Err != nil {
		mLockoutStateCountErrors.Inc()
		authLog.Warn("cannot count a wrong admin key in the state store: counted by this process alone", "err", c.Err)
		return
	}
	if c.Full {
		mLockoutStateFull.Inc()
		return
	}
	if c.Left > 0 {
		a.fails.Lock(c.Addr, c.Left)
	}
}
