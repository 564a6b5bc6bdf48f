package gateway

import (
	"time"

	"github.com/infera/infera/admin"
	"github.com/infera/infera/config"
	"github.com/infera/infera/fleet"
	"github.com/infera/infera/radix"
)

// openAdmin builds the configuration center over the freshly opened store.
// It runs before anything reads the store (static discovery, the
// scheduler's maintenance loop, the file watch): with --state redis it
// loads or seeds the management data there, and with
// --persist-snapshot-dir and no --config it restores the newest good
// snapshot, so the rest of the gateway starts from that config.
func (g *Gateway) openAdmin() error {
	o := admin.OptionsFromFlags(g.flags, g.store)
	o.Backup = func(c *config.Config) config.Backup { return c.Backup }
	a, err := admin.New(o)
	if err != nil {
		return err
	}
	g.admin = a
	return nil
}

// startAdmin gives the configuration center the fleet view and opens its
// listener (when --admin-port and an admin key are set).
func (g *Gateway) startAdmin() error {
	g.admin.SetFleet(fleetView{g})
	return g.admin.Start()
}

// Admin returns the configuration center.
func (g *Gateway) Admin() *admin.Admin { return g.admin }

// fleetView is what the console's fleet page shows of this gateway. It
// reads the fleet's current View and the workers' atomic counters on each
// admin request (a few per second per open console), never on the request
// path.
type fleetView struct{ g *Gateway }

var _ admin.Fleet = fleetView{}

// Workers implements admin.Fleet.
func (v fleetView) Workers() []admin.WorkerInfo {
	view := v.g.fleet.View()
	now := time.Now().UnixNano()
	out := make([]admin.WorkerInfo, 0, len(view.All))
	for _, w := range view.All {
		out = append(out, workerInfo(w, v.g.kvIndex, now))
	}
	return out
}

// workerInfo describes one worker. idx is the KV-aware radix index (nil
// without --router-policy kv-aware).
func workerInfo(w *fleet.Worker, idx *radix.Index, now int64) admin.WorkerInfo {
	wi := admin.WorkerInfo{
		ID:              w.ID,
		URL:             w.URL,
		Models:          append([]string{}, w.Models...),
		Service:         w.Service,
		Role:            w.Role.String(),
		Status:          workerStatus(w, now),
		Breaker:         fleet.BreakerStateName(w.Breaker.State()),
		ActiveRequests:  w.Load.Requests.Load(),
		ActiveTokens:    w.Load.Tokens.Load(),
		PendingRequests: w.Load.Pending.Load(),
		KVBlocks:        -1,
		// No component measures a per-worker cache hit rate yet.
		HitRate: -1,
	}
	if idx != nil {
		wi.KVBlocks = idx.WorkerBlocks(w.Idx)
	}
	return wi
}

// workerStatus is routable, draining (its discovery record says so: no new
// requests) or excluded (its breaker is open and the cooldown has not
// ended: the scheduler offers it no requests until the probe).
func workerStatus(w *fleet.Worker, now int64) string {
	switch {
	case w.Draining():
		return admin.StatusDraining
	case !w.Breaker.Available(now):
		return admin.StatusExcluded
	}
	return admin.StatusRoutable
}

// RuleHits implements admin.Fleet.
func (v fleetView) RuleHits() []admin.RuleHit { return nil }
