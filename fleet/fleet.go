package fleet

import (
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"sort"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/VictoriaMetrics/metrics"
)

// Hook is told about workers joining and leaving the fleet. WorkerAdded runs
// before the worker becomes routable; WorkerRemoved after it stopped being
// routable (in-flight requests may still hold it). Hooks run under the
// fleet's lock: keep them short and never call back into the Fleet.
type Hook interface {
	WorkerAdded(w *Worker) error
	WorkerRemoved(w *Worker)
}

// PublishHook is a Hook that is also told, after the WorkerAdded and
// WorkerRemoved calls of a change, that the change's View is published:
// what it does then (wake requests waiting on a removed worker, to pick
// again) sees the workers the same change added. WorkerRemoved runs
// before the View without the worker is published.
type PublishHook interface {
	Hook
	Published()
}

// View is an immutable snapshot of the fleet, swapped atomically on change.
type View struct {
	// All holds every live worker, draining ones included, ordered by ID.
	All []*Worker
	// Routable holds ACTIVE workers, ordered by ID.
	Routable []*Worker
	// ByModel maps a served model name to its routable workers.
	ByModel map[string][]*Worker
	// ByService maps a service name to its routable workers.
	ByService map[string][]*Worker
	// Models is the sorted union of routable workers' models.
	Models []string
	// MaxIdx is one more than the largest Worker.Idx in All.
	MaxIdx int
	// ByIdx maps Worker.Idx to the live worker (nil for free ids); len MaxIdx.
	ByIdx []*Worker
	// PD counts routable prefill and decode workers: 0 means every request
	// goes to one mixed worker (the PD code path costs nothing).
	PD int
}

// Fleet is the set of known workers. Discovery backends call Sync, Upsert
// and Remove; the request path reads View.
type Fleet struct {
	breaker BreakerConfig

	mu     sync.Mutex
	byID   map[string]*Worker
	free   []int
	next   int
	serial uint32
	hooks  []Hook
	view   atomic.Pointer[View]
	// retired holds, by engine (ID and address), the Load of removed
	// workers with requests still in flight, for a worker added again
	// with the same ID and address (Worker.Load), also after it was on
	// another engine meanwhile.
	retired map[Ref]*Load
	// With onePerEngine (OneWorkerPerEngine), engines maps the
	// EngineKey of each live worker's url to its id, and shadow holds, by
	// id, the records left out because a live worker of another id names
	// their engine: one of them joins when that engine is free again.
	onePerEngine bool
	engines      map[string]string
	shadow       map[string]Record

	ms *metrics.Set
}

// NewFleet returns an empty fleet whose workers use breaker settings bc.
func NewFleet(bc BreakerConfig) *Fleet {
	f := &Fleet{breaker: bc, byID: map[string]*Worker{}, retired: map[Ref]*Load{},
		engines: map[string]string{}, shadow: map[string]Record{}, ms: metrics.NewSet()}
	metrics.RegisterSet(f.ms)
	f.view.Store(&View{ByModel: map[string][]*Worker{}, ByService: map[string][]*Worker{}})
	// In the fleet's own set (not the default one) so that several fleets
	// (tests) do not panic on duplicate registration.
	f.ms.NewGauge(`infera_router_workers{state="routable"}`, func() float64 { return float64(len(f.View().Routable)) })
	f.ms.NewGauge(`infera_router_workers{state="all"}`, func() float64 { return float64(len(f.View().All)) })
	// A counter the breaker keeps, exposed as a counter (a gauge's TYPE
	// line made it a gauge).
	f.ms.RegisterMetricsWriter(func(w io.Writer) {
		v := f.View()
		if len(v.All) == 0 {
			return
		}
		metrics.WriteMetadataIfNeeded(w, "infera_router_worker_breaker_trips_total", "counter")
		for _, wk := range v.All {
			fmt.Fprintf(w, "infera_router_worker_breaker_trips_total{worker=%s} %d\n", QuoteLabel(wk.ID), wk.Breaker.Trips())
		}
	})
	return f
}

// Close unregisters the fleet's metrics.
func (f *Fleet) Close() { metrics.UnregisterSet(f.ms, true) }

// AddHook registers h and replays WorkerAdded for existing workers.
func (f *Fleet) AddHook(h Hook) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.hooks = append(f.hooks, h)
	for _, w := range f.byID {
		if err := h.WorkerAdded(w); err != nil {
			slog.Error("fleet hook rejected existing worker", "worker", w.ID, "err", err)
		}
	}
}

// OneWorkerPerEngine makes the fleet route to one worker per engine: a
// record whose url names the engine of a live worker with another id
// (EngineKey: the same engine registered twice, by two sidecars, a copied
// --advertise-url, a stale record) is left out, with a warning naming both
// ids, and joins once that engine is free again (its worker removed,
// moved or draining). Without it each became a worker, and the engine took two shares
// of the traffic under two breakers and two load counters, each seeing
// half its load. For servers that reach engines at their urls
// (--request-transport http); over NATS a url is a sidecar's view of its
// engine, the same on every host. Call before the first worker is added.
func (f *Fleet) OneWorkerPerEngine() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.onePerEngine = true
}

// View returns the current snapshot.
func (f *Fleet) View() *View { return f.view.Load() }

// Get returns the live worker with id, or nil.
func (f *Fleet) Get(id string) *Worker {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.byID[id]
}

// Upsert adds or updates the worker described by r.
func (f *Fleet) Upsert(r Record) error {
	if err := r.Validate(); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.upsertLocked(r); err != nil {
		return err
	}
	f.promoteLocked()
	f.publishLocked()
	return nil
}

// Remove drops the worker with id (no-op when unknown).
func (f *Fleet) Remove(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.shadow[id]; ok {
		delete(f.shadow, id)
		return
	}
	if w := f.byID[id]; w != nil {
		f.removeLocked(w)
		f.promoteLocked()
		f.publishLocked()
	}
}

// LeftOut reports whether the record of id is held but not routed
// (OneWorkerPerEngine): a live worker of another id names its engine.
func (f *Fleet) LeftOut(id string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	_, ok := f.shadow[id]
	return ok
}

// SkippedError is a record Sync skipped: the fleet holds no worker with
// its ID (unless another record of rs had the same ID).
type SkippedError struct {
	ID  string
	Err error
}

func (e *SkippedError) Error() string { return e.Err.Error() }
func (e *SkippedError) Unwrap() error { return e.Err }

// Sync makes the fleet exactly rs: unknown workers are added, changed ones
// updated, missing ones removed. Invalid records, and records a hook
// refused, are skipped and returned as errors (*SkippedError).
func (f *Fleet) Sync(rs []Record) []error {
	var errs []error
	f.mu.Lock()
	defer f.mu.Unlock()
	keep := make(map[string]bool, len(rs))
	for _, r := range rs {
		if err := r.Validate(); err != nil {
			errs = append(errs, &SkippedError{ID: r.ID, Err: err})
			continue
		}
		if err := f.upsertLocked(r); err != nil {
			errs = append(errs, &SkippedError{ID: r.ID, Err: err})
			continue
		}
		keep[r.ID] = true
	}
	for id := range f.shadow {
		if !keep[id] {
			delete(f.shadow, id)
		}
	}
	for id, w := range f.byID {
		if !keep[id] {
			f.removeLocked(w)
		}
	}
	f.promoteLocked()
	f.publishLocked()
	return errs
}

func (f *Fleet) upsertLocked(r Record) error {
	if f.onePerEngine {
		key := EngineKey(r.URL)
		if other, held := f.engineHolder(key, r.ID); held {
			if old := f.byID[r.ID]; old != nil {
				f.removeLocked(old) // moved onto another worker's engine
			}
			if prev, had := f.shadow[r.ID]; !had || EngineKey(prev.URL) != key {
				slog.Warn("two workers name one engine: routing to one of them (give each engine one worker)",
					"engine", r.URL, "routed", other, "left_out", r.ID)
			}
			f.shadow[r.ID] = r
			return nil
		}
		delete(f.shadow, r.ID)
	}
	if old := f.byID[r.ID]; old != nil {
		if sameEndpoint(&old.Record, &r) {
			if old.Record.Status != r.Status || old.Record.Version != r.Version || old.maxModelLen.Load() != int64(max(r.MaxModelLen, 0)) {
				slog.Debug("worker updated", "id", r.ID, "status", r.Status, "version", r.Version, "max_model_len", r.MaxModelLen)
			}
			old.draining.Store(r.Status == StatusDraining)
			old.maxModelLen.Store(int64(max(r.MaxModelLen, 0)))
			old.Record.Status, old.Record.Version = r.Status, r.Version
			return nil
		}
		f.removeLocked(old)
	}
	w, err := f.newWorker(r)
	if err != nil {
		return err
	}
	for i, h := range f.hooks {
		if err := h.WorkerAdded(w); err != nil {
			for _, h := range f.hooks[:i] {
				h.WorkerRemoved(w)
			}
			f.releaseIdx(w)
			f.retireLoad(w)
			return fmt.Errorf("cannot add worker %q: %w", r.ID, err)
		}
	}
	f.registerMetrics(w)
	f.byID[r.ID] = w
	if f.onePerEngine {
		f.engines[EngineKey(w.URL)] = w.ID
	}
	slog.Info("worker added", "id", w.ID, "url", w.URL, "models", w.Models, "role", w.Role.String())
	return nil
}

func (f *Fleet) newWorker(r Record) (*Worker, error) {
	u, err := url.Parse(r.URL)
	if err != nil {
		return nil, fmt.Errorf("worker %q: bad url %q: %w", r.ID, r.URL, err)
	}
	role, _ := ParseRole(r.Role)
	w := &Worker{
		ID:               r.ID,
		URL:              r.URL,
		Addr:             u.Host,
		TLS:              u.Scheme == "https",
		Models:           append([]string(nil), r.Models...),
		Service:          r.Service,
		Role:             role,
		KVEventsEndpoint: r.KVEventsEndpoint,
		KVReplayEndpoint: r.KVReplayEndpoint,
		BlockSize:        r.BlockSize,
		DPSize:           r.DPSize,
		Record:           r,
	}
	w.maxModelLen.Store(int64(max(r.MaxModelLen, 0)))
	if u.Port() == "" {
		if w.TLS {
			w.Addr += ":443"
		} else {
			w.Addr += ":80"
		}
	}
	if w.Service == "" && len(w.Models) > 0 {
		w.Service = w.Models[0]
	}
	w.PD = parsePD(&r, u.Hostname())
	w.Load = f.inheritLoad(w.ID, w.Addr)
	w.draining.Store(r.Status == StatusDraining)
	w.Breaker.init(&f.breaker)
	f.serial++
	w.Serial = f.serial
	if n := len(f.free); n > 0 {
		w.Idx = f.free[n-1]
		f.free = f.free[:n-1]
	} else {
		w.Idx = f.next
		f.next++
	}
	return w, nil
}

// Per-worker series, named infera_router_worker_<name>{worker="<id>"}.
// registerMetrics creates them once the worker is admitted, unregisterMetrics
// drops them when it leaves.
var (
	workerCounters = [...]string{"requests_total", "failures_total"} // w.mRequests, w.mFailures
	workerGauges   = [...]struct {
		name  string
		value func(w *Worker) float64
	}{
		{"breaker_state", func(w *Worker) float64 { return float64(w.Breaker.State()) }},
		{"active_requests", func(w *Worker) float64 { return float64(w.Load.Requests.Load()) }},
		{"active_tokens", func(w *Worker) float64 { return float64(w.Load.Tokens.Load()) }},
		{"prefix_hit_rate", func(w *Worker) float64 { return max(w.HitRate(), 0) }},
		{"routable", func(w *Worker) float64 {
			if w.Draining() || w.Removed() {
				return 0
			}
			return 1 // ACTIVE as far as discovery is concerned
		}},
	}
)

func workerSeries(name, id string) string {
	return `infera_router_worker_` + name + `{worker=` + QuoteLabel(id) + `}`
}

// QuoteLabel quotes s as a Prometheus text-format label value: a
// backslash, a double quote and a newline escaped (the format's only
// escapes), invalid UTF-8 as U+FFFD, every other rune as it is. Go's %q is
// not this: it writes \u00a0, \x.. and \t, which Prometheus's parser
// refuses (a worker id may hold any rune but spaces and ASCII controls).
func QuoteLabel(s string) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	if strings.ContainsAny(s, "\"\\\n") {
		s = labelEscaper.Replace(s)
	}
	return `"` + s + `"`
}

var labelEscaper = strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`)

// registerMetrics creates w's series. It is called only for a worker every
// hook admitted: the gauges read w, so a refused worker's would export it,
// and stand in (GetOrCreateGauge) for the next worker with its id.
func (f *Fleet) registerMetrics(w *Worker) {
	w.mRequests = f.ms.GetOrCreateCounter(workerSeries(workerCounters[0], w.ID))
	w.mFailures = f.ms.GetOrCreateCounter(workerSeries(workerCounters[1], w.ID))
	for _, g := range workerGauges {
		f.ms.GetOrCreateGauge(workerSeries(g.name, w.ID), func() float64 { return g.value(w) })
	}
}

// unregisterMetrics drops w's series.
func (f *Fleet) unregisterMetrics(w *Worker) {
	for _, name := range workerCounters {
		f.ms.UnregisterMetric(workerSeries(name, w.ID))
	}
	for _, g := range workerGauges {
		f.ms.UnregisterMetric(workerSeries(g.name, w.ID))
	}
}

// busy reports whether requests still hold load units of l.
func (l *Load) busy() bool {
	return l.Requests.Load() != 0 || l.Tokens.Load() != 0 || l.PrefillTokens.Load() != 0 ||
		l.Blocks.Load() != 0 || l.Pending.Load() != 0
}

// retireLoad keeps w's Load for a worker added again with its ID and
// address while w's requests still run, and forgets the retired loads
// whose requests have all ended. Lock must be held.
func (f *Fleet) retireLoad(w *Worker) {
	for ref, l := range f.retired {
		if !l.busy() {
			delete(f.retired, ref)
		}
	}
	if w.Load.busy() {
		f.retired[w.Ref()] = w.Load
	}
}

// inheritLoad returns the Load for a new worker with id at addr: the
// retired one of a worker with the same id and address whose requests
// still run (the engine is still serving them: the balancer must see
// them, and their releases must land on the counters it reads), else a
// fresh one. Lock must be held.
func (f *Fleet) inheritLoad(id, addr string) *Load {
	// Keyed by engine: a worker that moved to another engine and comes
	// back finds the requests still running on this one (they were
	// forgotten at the move, TestAWorkerMovedAwayAndBackCarriesItsInFlightLoad).
	if l, ok := f.retired[Ref{id, addr}]; ok {
		delete(f.retired, Ref{id, addr})
		return l
	}
	return new(Load)
}

func (f *Fleet) releaseIdx(w *Worker) {
	f.free = append(f.free, w.Idx)
}

func (f *Fleet) removeLocked(w *Worker) {
	delete(f.byID, w.ID)
	if f.onePerEngine {
		if key := EngineKey(w.URL); f.engines[key] == w.ID {
			delete(f.engines, key)
		}
	}
	w.removed.Store(true)
	f.releaseIdx(w)
	f.retireLoad(w)
	for _, h := range f.hooks {
		h.WorkerRemoved(w)
	}
	f.unregisterMetrics(w)
	slog.Info("worker removed", "id", w.ID, "url", w.URL)
}

// engineHolder returns the id of the live worker, other than id, whose
// url names the engine key (OneWorkerPerEngine), unless it is draining:
// the engine then serves through the other record meanwhile. Lock must be
// held.
func (f *Fleet) engineHolder(key, id string) (string, bool) {
	other, ok := f.engines[key]
	if !ok || other == id {
		return "", false
	}
	if w := f.byID[other]; w == nil || w.Draining() {
		return "", false
	}
	return other, true
}

// promoteLocked adds the left-out records (OneWorkerPerEngine) whose
// engine no live worker names any more, or only a draining one, in id
// order. Lock must be held.
func (f *Fleet) promoteLocked() {
	if len(f.shadow) == 0 {
		return
	}
	ids := make([]string, 0, len(f.shadow))
	for id := range f.shadow {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		r := f.shadow[id]
		if _, held := f.engineHolder(EngineKey(r.URL), id); held {
			continue
		}
		delete(f.shadow, id)
		if err := f.upsertLocked(r); err != nil {
			slog.Error("worker left out for naming another worker's engine cannot join now that the engine is free", "worker", id, "err", err)
			continue
		}
		slog.Info("worker left out for naming another worker's engine joins: the engine is free", "worker", id, "engine", r.URL)
	}
}

func (f *Fleet) publishLocked() {
	v := &View{ByModel: map[string][]*Worker{}, ByService: map[string][]*Worker{}}
	for _, w := range f.byID {
		v.All = append(v.All, w)
		if w.Idx >= v.MaxIdx {
			v.MaxIdx = w.Idx + 1
		}
	}
	sort.Slice(v.All, func(i, j int) bool { return v.All[i].ID < v.All[j].ID })
	v.ByIdx = make([]*Worker, v.MaxIdx)
	for _, w := range v.All {
		v.ByIdx[w.Idx] = w
	}
	models := map[string]bool{}
	for _, w := range v.All {
		if w.Draining() {
			continue
		}
		v.Routable = append(v.Routable, w)
		if w.IsPD() {
			v.PD++
		}
		for _, m := range w.Models {
			v.ByModel[m] = append(v.ByModel[m], w)
			if !models[m] {
				models[m] = true
				v.Models = append(v.Models, m)
			}
		}
		if w.Service != "" {
			v.ByService[w.Service] = append(v.ByService[w.Service], w)
		}
	}
	sort.Strings(v.Models)
	f.view.Store(v)
	for _, h := range f.hooks {
		if p, ok := h.(PublishHook); ok {
			p.Published()
		}
	}
}

// ByID returns the worker with id from All (sorted by ID), or nil.
func (v *View) ByID(id []byte) *Worker {
	lo, hi := 0, len(v.All)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if v.All[m].ID < string(id) {
			lo = m + 1
		} else {
			hi = m
		}
	}
	if lo < len(v.All) && v.All[lo].ID == string(id) {
		return v.All[lo]
	}
	return nil
}
