package gateway

import (
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/infera/infera/config"
	"github.com/infera/infera/fleet"
	"github.com/infera/infera/govern"
)

// governClock is the governance's clock (allowed periods, quota windows,
// buckets); nil is time.Now. Tests set it before New.
var governClock func() time.Time

// setupGovern builds the governor (users, quota templates, request rate
// limiting; docs/governance.md): counters in the process, or in Redis with
// --state redis://..., applied now and on every config change.
func (g *Gateway) setupGovern() error {
	endDelay := g.flags.StateEndDelay
	if endDelay <= 0 {
		endDelay = -1 // govern: as soon as the dispatcher is free
	}
	gov, err := govern.New(govern.Options{State: g.flags.State, Now: governClock, EndDelay: endDelay})
	if err != nil {
		return err
	}
	g.gov = gov
	// With --state redis the admin listeners of the routers sharing it
	// count wrong admin keys together (admin/lockout.go).
	g.admin.ShareLockouts(gov.Lockouts("admin"))
	if err := gov.Apply(g.store.Load()); err != nil {
		return fmt.Errorf("governance: %w", err)
	}
	// A request queued for a seat whose every candidate a reload or the
	// discovery removes picks again at once (govern.Governor.Retarget).
	g.fleet.AddHook(&retargetHook{gov: gov})
	g.store.OnChange(func(_, c *config.Config) {
		closed := gov.AuthRequired()
		if err := gov.Apply(c); err != nil {
			slog.Error("governance settings not applied; the previous ones stay", "err", err)
			return
		}
		if closed && !gov.AuthRequired() && g.flags.APIKey == "" {
			// Documented (no users and no --api-key: open), but a change
			// that removed the last user must not open the door unseen.
			slog.Warn("the configuration has no users left and no --api-key is set: the inference endpoints now take requests without a key")
		}
	})
	return nil
}

// retargetHook tells the governor a worker's service (WorkerAdded), and
// its seat queue that a worker left, once the fleet's View without it (and with the workers the same change
// added) is published: a request waiting on it picks again at once, and
// picked from the View before the change when told from WorkerRemoved (a
// reload that replaced a service's only worker answered it no_workers).
type retargetHook struct {
	gov     *govern.Governor
	removed atomic.Bool
}

// WorkerAdded moves the seats in flight on the worker's id to its service
// (a reload or the discovery replaced its record with another service):
// with rate_limit.scope service they count there from now on
// (govern.Governor.MoveInstance).
func (h *retargetHook) WorkerAdded(w *fleet.Worker) error {
	h.gov.MoveInstance(govern.Target{Instance: w.ID, Service: w.Service})
	return nil
}

func (h *retargetHook) WorkerRemoved(*fleet.Worker) { h.removed.Store(true) }
func (h *retargetHook) Published() {
	if h.removed.Swap(false) {
		h.gov.Retarget()
	}
}
