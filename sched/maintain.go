package sched

import (
	"context"
	"time"

	"github.com/infera/infera/breaker"
	"github.com/infera/infera/config"
)

// Run performs the maintenance sweep every prefix_index.maintenance_interval_s
// of the current config (load returns it, e.g. config.Store.Load) until ctx
// is done: expired prefix index blocks and session bindings are removed and
// the index's memory budget is re-checked. Start it once per Scheduler.
//
// The interval is looked up again at least every configCheck, so a reload
// that shortens it takes effect within that, not once the old interval is
// over.
func (s *Scheduler) Run(ctx context.Context, load func() *config.Config) {
	last := time.Now()
	t := time.NewTimer(0)
	defer t.Stop()
	var seen *config.Config
	for {
		if cfg := load(); cfg != seen {
			seen = cfg
			s.adopt(cfg)
		}
		d := time.Duration(load().PrefixIndex.MaintenanceIntervalSeconds * float64(time.Second))
		if d <= 0 {
			d = time.Minute
		}
		wait := time.Until(last.Add(d))
		if wait <= 0 {
			s.Maintain(load())
			last = time.Now()
			wait = d
		}
		t.Reset(min(wait, configCheck))
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// adopt applies a reloaded cfg's session table limit now, not at the next
// request with affinity on: a lowered session_affinity.max_entries evicts
// the oldest bindings beyond it within configCheck, whether affinity is
// enabled or not.
func (s *Scheduler) adopt(cfg *config.Config) {
	if s.aff.Load() != nil {
		s.affinity(s.compiled(cfg))
	}
}

// configCheck is how often Run looks for a changed maintenance interval
// (and a reloaded config: adopt).
const configCheck = time.Second

// Maintain runs one maintenance pass under cfg (Run calls it; tests call it
// directly with an injected clock).
func (s *Scheduler) Maintain(cfg *config.Config) {
	now := s.Now()
	if p := s.pidx.Load(); p != nil {
		p.sweep(now, cfg.PrefixIndex.TTLSeconds)
		s.checkMemory(cfg, p, now)
	}
	if t := s.aff.Load(); t != nil {
		t.sweep(now, int64(cfg.SessionAffinity.TTLSeconds*float64(time.Second)))
	}
}

// Stats is a snapshot of the scheduler's state for tests and debugging.
type Stats struct {
	PrefixBlocks     int64
	PrefixBytes      int64
	PrefixBudget     int64 // -1: unlimited
	PrefixEvictions  uint64
	AffinityEntries  int64
	HitRateCeiling   float64
	SchedBreaker     breaker.State
	SchedBreakerTrip uint64
}

// Stats returns current counters.
func (s *Scheduler) Stats() Stats {
	st := Stats{PrefixBudget: -1, HitRateCeiling: s.m.Ceiling(), SchedBreaker: s.sb.br.State(), SchedBreakerTrip: s.sb.trips.Load()}
	if p := s.pidx.Load(); p != nil {
		st.PrefixBlocks, st.PrefixBytes = p.Len(), p.Bytes()
		if b := p.budget.Load(); b < 1<<62 {
			st.PrefixBudget = b
		}
		st.PrefixEvictions = p.evictMem.Load() + p.evictTTL.Load()
	}
	if t := s.aff.Load(); t != nil {
		st.AffinityEntries = t.count.Load()
	}
	return st
}
