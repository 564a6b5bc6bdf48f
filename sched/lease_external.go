package sched

import "github.com/infera/infera/fleet"

// AcquireExternal fills l for a dispatch attempt on w, an upstream outside
// the scheduling pipeline (fleet.NewStandalone: a split proxy's external
// API, another region's gateway). w's breaker is consulted as Pick consults
// a chosen worker's: AcquireExternal returns ok false when it refuses (open
// within its cooldown, or half-open with its probe taken: onTrial), and l
// then holds nothing. The lease accounts one request on w and no token, prefill or KV
// load (an external upstream's capacity is its own business); it ends like
// any lease (FirstToken, Verdict, Done). now is the scheduler's clock
// (Scheduler.Now).
func (l *Lease) AcquireExternal(w *fleet.Worker, now func() int64) (ok, onTrial bool) {
	l.Reset()
	ok, probe, onTrial := w.Breaker.AdmitWhy(now())
	if !ok {
		return false, onTrial
	}
	l.acquire(Decision{Worker: w, Probe: probe}, 0, 0, 0, nil, now)
	return true, false
}
