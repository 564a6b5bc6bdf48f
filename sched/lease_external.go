package sched

import "github.com/infera/infera/fleet"

// AcquireExternal fills l for a dispatch attempt on w, an upstream outside
// the scheduling pipeline (fleet.NewStandalone: a split proxy's external
// API, another region's gateway). w's breaker is consulted as Pick consults
// a chosen worker's: AcquireExternal returns false when it refuses (open
// within its cooldown, or half-open with its probe taken), and l then holds
// nothing. The lease accounts one request on w and no token, prefill or KV
// load (an external upstream's capacity is its own business); it ends like
// any lease (FirstToken, Verdict, Done). now is the scheduler's clock
// (Scheduler.Now).
func (l *Lease) AcquireExternal(w *fleet.Worker, now func() int64) bool {
	l.Reset()
	ok, probe := w.Breaker.Admit(now())
	if !ok {
		return false
	}
	l.acquire(Decision{Worker: w, Probe: probe}, 0, 0, 0, nil, now)
	return true
}
