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
// Redis call); only a wrong key asks Redis. Redis holds the address and
// its count, never a key. When Redis cannot be asked the wrong key counts
// in this process alone, as without Redis, and the failure is counted.

var (
	// mLockoutStateCountErrors counts wrong admin keys Redis could not
	// count; mLockoutStateSyncErrors the failed reads of the lockouts in
	// force (at start, on reconnecting).
	mLockoutStateCountErrors = metrics.NewCounter(`infera_admin_auth_lockout_state_errors_total{op="count"}`)
	mLockoutStateSyncErrors  = metrics.NewCounter(`infera_admin_auth_lockout_state_errors_total{op="sync"}`)
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
	l.Watch(func(ip netip.Addr, left time.Duration) { a.fails.Lock(ip, left) }, func(err error) {
		mLockoutStateSyncErrors.Inc()
		authLog.Warn("cannot read the admin lockouts in force from the state store: until it answers, this process knows only its own", "err", err)
	})
}

// wrongKey counts a wrong admin key from ip, here and in Redis, whose
// lockout then holds here too.
func (a *Admin) wrongKey(ip netip.Addr) {
	a.fails.Failed(ip)
	if a.shared == nil {
		return
	}
	left, _, err := a.shared.Failed(ip, maxAuthFailures, authWindow)
	if err != nil {
		mLockoutStateCountErrors.Inc()
		authLog.Warn("cannot count a wrong admin key in the state store: counted by this process alone", "err", err)
		return
	}
	if left > 0 {
		a.fails.Lock(ip, left)
	}
}
