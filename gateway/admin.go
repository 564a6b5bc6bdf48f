package gateway

import (
	"sync"
	"time"

	"github.com/VictoriaMetrics/metrics"

	"github.com/infera/infera/admin"
	"github.com/infera/infera/config"
	"github.com/infera/infera/fleet"
	"github.com/infera/infera/govern"
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
	if g.certs != nil {
		o.TLS = g.certs.Config()
	}
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
		HitRate:         w.HitRate(),
	}
	req, fail := w.Counts()
	wi.Requests, wi.Failures = int64(req), int64(fail)
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

var _ admin.UsageSource = fleetView{}

// UserUsage implements admin.UsageSource from the governance.
func (v fleetView) UserUsage(name string) (govern.UserStatus, error) {
	return v.g.gov.UserStatus(name)
}

// RuleHits implements admin.Fleet: the rules of request and user rate
// limiting that refused, would have refused (dry run) or queued a request,
// with their counts since the process started. Rules never hit are left
// out.
func (v fleetView) RuleHits() []admin.RuleHit {
	var out []admin.RuleHit
	for _, s := range ruleHitSeries() {
		if n := s.c.Get(); n > 0 {
			out = append(out, admin.RuleHit{Rule: s.rule, Result: s.result, DryRun: s.dry, Count: n})
		}
	}
	return out
}

// ruleHit is one of govern's hit counters.
type ruleHit struct {
	rule, result string
	dry          bool
	c            *metrics.Counter
}

// ruleHitSeries resolves, once, govern's hit counters by their documented
// series (docs/governance.md, Metrics): infera_user_limit_hits_total for
// user rules, infera_rate_limit_hits_total for concurrency seats, with
// rule = the error code and result rejected, dry_run or queued. govern
// registers them when it is initialised (before this runs), so these are
// its counters, counting every governor of the process.
var ruleHitSeries = sync.OnceValue(func() []ruleHit {
	results := []struct {
		label, result string
		dry           bool
	}{
		{"rejected", admin.ResultBlock, false},
		{"dry_run", admin.ResultWouldBlock, true},
		{"queued", admin.ResultQueued, false},
	}
	var out []ruleHit
	for c := govern.CodeOutsidePeriod; c < govern.CodeStateUnavailable; c++ {
		family := "infera_user_limit_hits_total"
		if c >= govern.CodeConcurrencyOverall {
			family = "infera_rate_limit_hits_total"
		}
		for _, r := range results {
			out = append(out, ruleHit{rule: c.String(), result: r.result, dry: r.dry,
				c: metrics.GetOrCreateCounter(family + `{rule="` + c.String() + `",result="` + r.label + `"}`)})
		}
	}
	return out
})
