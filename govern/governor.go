package govern

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/infera/infera/config"
)

// Options are the process-level settings of a Governor (not hot-reloadable).
type Options struct {
	// State is "" for in-process counters, or redis://[:password@]host:port[/db]
	// (rediss:// for TLS) for counters shared by every router using it.
	State string
	// Now is the clock; nil means time.Now. Tests pass a fake clock.
	Now func() time.Time
	// LeaseTTL is how long a concurrency seat held in Redis outlives the
	// last heartbeat of the router holding it (a crashed router's seats are
	// free after at most this). Heartbeats run every LeaseTTL/3. Default 15s.
	LeaseTTL time.Duration
	// PollInterval is how often requests queued for a seat re-check Redis,
	// besides the release notifications routers publish. Default 100ms.
	PollInterval time.Duration
	// RedisPrefix prefixes every Redis key and channel. Default "infera:".
	RedisPrefix string
	// EndDelay is how long the end of a request (its reconciliation, the
	// seats it gives back) may wait in this router for the next admission
	// or seat acquisition to carry it to Redis in the same round trip,
	// before it is sent alone. Other routers see an end at most this (plus
	// a round trip) late; this router's next call always runs after it.
	// Default 2ms; negative: sent as soon as the dispatcher is idle.
	EndDelay time.Duration
}

// Governor identifies users and admits their requests. It is safe for
// concurrent use; Apply swaps its configuration at any time.
type Governor struct {
	now  func() time.Time
	opts Options
	snap atomic.Pointer[snapshot]
	// applied is the config Apply made current last (Applied).
	applied atomic.Pointer[config.Config]

	mu sync.Mutex // serializes Apply and the making of a user's state; guards states, gone and metrics
	// states are the counters of the configured users that have sent a
	// request since they were added (Governor.state makes them then, not
	// Apply: a user that never sends one costs its User and key record
	// alone). For the current snapshot s, s.users[name].st holds
	// states[name] whenever there is one.
	states map[string]*userState
	// gone keeps the counters of users a reload removed, so that adding
	// one back does not hand it a fresh quota (with Redis they are keyed
	// by name and stay anyway); goneOrder bounds it to maxGone, oldest
	// removal dropped first. Guarded by mu.
	gone      map[string]*userState
	goneOrder []goneEntry
	goneSeq   uint64
	cals      map[string]*calendar
	// metrics are the per-user series of the first
	// user_limit.metrics_max_users users, by name. Guarded by mu.
	metrics map[string]*userMetrics

	seats seatLimiter
	rds   *redisState // nil: in-process counters

	userSet *metrics.Set // per-user series (bounded)

	ticketPool sync.Pool
	seatPool   sync.Pool

	stop chan struct{}
	wg   sync.WaitGroup

	// flushers run when Close begins, before stop closes, while Redis
	// still takes calls (Lockouts.Start's flush).
	flushMu  sync.Mutex
	flushers []func()
	closing  bool // Close has run the flushers: none is added
}

// New returns a Governor serving an empty configuration (no users, no
// limits) until Apply. With Options.State it connects to Redis and checks
// that it answers.
func New(o Options) (*Governor, error) {
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.LeaseTTL <= 0 {
		o.LeaseTTL = 15 * time.Second
	}
	if o.PollInterval <= 0 {
		o.PollInterval = 100 * time.Millisecond
	}
	if o.RedisPrefix == "" {
		o.RedisPrefix = "infera:"
	}
	if o.EndDelay == 0 {
		o.EndDelay = 2 * time.Millisecond
	}
	g := &Governor{
		now:     o.Now,
		opts:    o,
		states:  map[string]*userState{},
		cals:    map[string]*calendar{},
		metrics: map[string]*userMetrics{},
		userSet: metrics.NewSet(),
		stop:    make(chan struct{}),
	}
	g.ticketPool.New = func() any { return &ticketState{g: g} }
	g.seatPool.New = func() any { return &seatState{g: g} }
	g.seats.init(g)
	if o.State != "" {
		r, err := newRedisState(g, o)
		if err != nil {
			return nil, err
		}
		g.rds = r
	}
	if err := g.Apply(&config.Config{}); err != nil {
		panic("BUG: the empty config does not apply: " + err.Error())
	}
	metrics.RegisterSet(g.userSet)
	g.wg.Add(1)
	go g.maintain()
	return g, nil
}

// Close stops background work and closes the Redis connection, after
// sending the ends already queued for Redis. Seats and tickets still held
// are not returned (in Redis their leases expire).
func (g *Governor) Close() error {
	select {
	case <-g.stop:
		return nil
	default:
	}
	g.flushMu.Lock()
	fs := g.flushers
	g.flushers, g.closing = nil, true
	g.flushMu.Unlock()
	for _, f := range fs {
		f()
	}
	close(g.stop)
	g.wg.Wait()
	metrics.UnregisterSet(g.userSet, true)
	if g.rds != nil {
		return g.rds.close()
	}
	return nil
}

// maintain sweeps idle seat counters and, with Redis, renews leases and
// serves queues.
func (g *Governor) maintain() {
	defer g.wg.Done()
	sweep := time.NewTicker(time.Minute)
	defer sweep.Stop()
	for {
		select {
		case <-g.stop:
			return
		case <-sweep.C:
			g.seats.sweep()
		}
	}
}

// snapshot is one compiled configuration; immutable once stored.
type snapshot struct {
	keys      map[string]*keyRecord // by key id
	users     map[string]*User
	authUsers bool // users are configured: requests must carry a user key
	cal       *calendar
	userDry   bool
	userOpen  bool // admit when the state store fails
	rl        rlConf
	// replaced is closed when the next Apply replaces this snapshot: it
	// wakes the queued requests to read their queue timeout again.
	replaced chan struct{}
}

// rlConf is request rate limiting, compiled.
type rlConf struct {
	limited   bool
	scope     scopeKind
	queue     bool
	queueSize int
	timeout   time.Duration
	dry       bool
	open      bool
	lim       [3]int // overall, prefill, decode; 0 = no limit
}

// User is an identified API user (a value of the current configuration).
type User struct {
	name    string
	enabled bool
	tmpl    *template // nil: no limits
	// tmplName names the template that applies (bound, or the default),
	// even one whose capabilities are all off (tmpl nil then).
	tmplName string
	models   *modelSet // nil: every model
	// st is the user's counters: nil until its first request that needs
	// them (Governor.state), then the same for every snapshot's User of
	// this user. Set once.
	st   atomic.Pointer[userState]
	m    *userMetrics // nil: beyond user_limit.metrics_max_users
	snap *snapshot    // the configuration it belongs to
}

// Name returns the user's name.
func (u *User) Name() string { return u.name }

// DefaultOutputTokens is the output estimate of u's template for a request
// without max_tokens (rate.default_output_tokens, with rate limiting on),
// or 0 when it sets none.
func (u *User) DefaultOutputTokens() int64 {
	if u == nil || u.tmpl == nil {
		return 0
	}
	return u.tmpl.defOut
}

// LimitsConcurrency reports whether the user's concurrency limit is
// enforced: its template limits user concurrency, outside dry run.
func (u *User) LimitsConcurrency() bool {
	return u != nil && u.tmpl != nil && u.tmpl.concLimit > 0 && !u.tmpl.dry && !u.snap.userDry
}

// Stale reports whether u (from Identify) belongs to a configuration a
// reload has replaced since: the caller identifies the key again before
// admitting the request, as a new request's key (a user disabled, removed
// or given another template or model list while its request's body was
// still arriving was admitted as it stood at authentication).
func (g *Governor) Stale(u *User) bool { return u != nil && u.snap != g.snap.Load() }

// template is a quota template, compiled.
type template struct {
	name    string
	dry     bool
	any     bool // some capability is on
	counted bool // some rule keeps counters (all but periods)

	periods *minuteMask // nil: always allowed

	quota                       bool
	wIn, wOut, wCached, wPrompt float64 // wPrompt = max(wIn, wCached): the estimate's prompt weight
	win                         [numPeriods]winLimit
	concLimit                   int // 0: off
	concQueue                   bool
	concQueueSize               int
	concTimeout                 time.Duration
	rpm, tpm                    int64 // 0: off
	defOut                      int64
}

type winLimit struct {
	on             bool
	maxReq, maxTok int64 // maxTok in milli-tokens; 0: no limit
}

// Apply compiles c and makes it current. Counters of users and scopes
// that still exist carry over; in-flight tickets and seats return to the
// counters they were taken from. c must be valid (config.Validate).
func (g *Governor) Apply(c *config.Config) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	// The maps are made at their size: grown entry by entry, they left
	// their smaller tables behind (3.4 MB for 20,000 users, a third of
	// what Apply keeps; TestApplyingManyUsersAllocatesLittleBesideWhatItKeeps).
	nkeys := 0
	for i := range c.Users {
		nkeys += len(c.Users[i].Keys)
	}
	s := &snapshot{keys: make(map[string]*keyRecord, nkeys), users: make(map[string]*User, len(c.Users)), replaced: make(chan struct{})}
	ul := c.UserLimit
	tz := ul.Timezone
	if tz == "" {
		tz = "UTC"
	}
	cal := g.cals[tz]
	if cal == nil {
		loc, err := time.LoadLocation(tz)
		if err != nil {
			return fmt.Errorf("cannot load timezone %q: %w", tz, err)
		}
		cal = newCalendar(loc)
		g.cals[tz] = cal
	}
	s.cal = cal
	s.userDry = ul.DryRun
	s.userOpen = ul.OnStateError != config.StateErrorClosed
	tmpls := map[string]*template{}
	var def *template
	for i := range ul.Templates {
		t, err := compileTemplate(&ul.Templates[i])
		if err != nil {
			return fmt.Errorf("user_limit.templates[%d]: %w", i, err)
		}
		tmpls[t.name] = t
		if ul.Templates[i].Default {
			def = t
		}
	}
	maxUsers := ul.MetricsMaxUsers
	if maxUsers == 0 {
		maxUsers = 100
	}
	// Only users with counters have a state: those that sent a request
	// (or were given one back from gone).
	states := make(map[string]*userState, min(len(c.Users), len(g.states)+len(g.gone)))
	for i := range c.Users {
		cu := &c.Users[i]
		u := &User{name: cu.Name, enabled: cu.Enabled, tmpl: def, models: compileModels(cu.Models), snap: s}
		st := g.states[cu.Name]
		if st == nil {
			st = g.gone[cu.Name] // removed earlier: taken back below
		}
		if st != nil {
			states[cu.Name] = st
			u.st.Store(st)
		}
		if cu.Template != "" {
			u.tmpl = tmpls[cu.Template]
			if u.tmpl == nil {
				return fmt.Errorf("users[%d].template: no template %q", i, cu.Template)
			}
		}
		if u.tmpl != nil {
			u.tmplName = u.tmpl.name
			if !u.tmpl.any {
				u.tmpl = nil
			}
		}
		s.users[u.name] = u
		for j, k := range cu.Keys {
			h, err := config.ParseKeyHash(k)
			if err != nil {
				return fmt.Errorf("users[%d].keys[%d]: %w", i, j, err)
			}
			if s.keys[h.ID] != nil {
				return fmt.Errorf("users[%d].keys[%d]: key id %s is used twice", i, j, h.ID)
			}
			s.keys[h.ID] = &keyRecord{salt: h.Salt, sum: h.Sum, user: u}
		}
	}
	s.authUsers = len(c.Users) > 0
	// Nothing fails from here on.
	ms := make(map[string]*userMetrics, min(len(c.Users), maxUsers))
	for i := range c.Users[:min(len(c.Users), maxUsers)] {
		name := c.Users[i].Name
		m := g.metrics[name]
		if m == nil {
			m = newUserMetrics(g.userSet, name)
		}
		delete(g.metrics, name)
		ms[name] = m
		s.users[name].m = m
	}
	for _, m := range g.metrics { // users removed, or beyond maxUsers now
		m.unregister(g.userSet)
	}
	g.metrics = ms
	var removed []*userState
	for name, st := range g.states {
		if states[name] == nil {
			removed = append(removed, st) // its queued requests are refused below
		}
	}
	g.states = states
	g.keepGone(removed)
	s.rl = compileRateLimit(&c.RateLimit)
	if old := g.snap.Swap(s); old != nil {
		close(old.replaced)
	}
	// A user disabled or removed: its requests queued for a seat stop
	// waiting. Limits may have grown or a user's template changed: serve
	// the queues.
	g.Retarget()
	g.seats.reloaded()
	for _, st := range states {
		g.userReloaded(st)
	}
	for _, st := range removed {
		g.userReloaded(st)
	}
	g.applied.Store(c)
	return nil
}

// maxGone bounds the counters kept of removed users.
const maxGone = 10000

// goneEntry is one removal: st filed at its seq-th removal.
type goneEntry struct {
	st  *userState
	seq uint64
}

// keepGone files the states of the users a reload removed and unfiles
// those of the users it has back (g.states); past maxGone the oldest
// removals are forgotten. Called with mu held.
func (g *Governor) keepGone(removed []*userState) {
	if g.gone == nil {
		g.gone = map[string]*userState{}
	}
	for name := range g.gone {
		if g.states[name] != nil {
			delete(g.gone, name)
		}
	}
	for _, st := range removed {
		g.goneSeq++
		st.goneSeq = g.goneSeq
		g.gone[st.name] = st
		g.goneOrder = append(g.goneOrder, goneEntry{st, st.goneSeq})
	}
	live := func(e goneEntry) bool { return g.gone[e.st.name] == e.st && e.st.goneSeq == e.seq }
	for len(g.gone) > maxGone {
		e := g.goneOrder[0]
		g.goneOrder = g.goneOrder[1:]
		if live(e) {
			delete(g.gone, e.st.name)
		}
	}
	if len(g.goneOrder) > 2*len(g.gone)+64 { // entries of users added back or removed again
		order := g.goneOrder[:0]
		for _, e := range g.goneOrder {
			if live(e) {
				order = append(order, e)
			}
		}
		clear(g.goneOrder[len(order):])
		g.goneOrder = order
	}
}

func compileRateLimit(r *config.RateLimit) rlConf {
	rl := rlConf{
		limited:   r.Limited(),
		queue:     r.Overlimit == config.OverlimitQueue,
		queueSize: r.QueueSize,
		timeout:   time.Duration(r.QueueTimeoutMS * float64(time.Millisecond)),
		dry:       r.DryRun,
		open:      r.OnStateError != config.StateErrorClosed,
		lim:       [3]int{r.OverallConcurrency, r.PrefillConcurrency, r.DecodeConcurrency},
	}
	switch r.Scope {
	case config.ScopeService:
		rl.scope = scopeService
	case config.ScopeGateway:
		rl.scope = scopeGateway
	default:
		rl.scope = scopeInstance
	}
	return rl
}

func compileTemplate(ct *config.QuotaTemplate) (*template, error) {
	t := &template{name: ct.Name, dry: ct.DryRun}
	if ct.Periods.Enabled {
		m, err := compileSegments(ct.Periods.Segments)
		if err != nil {
			return nil, err
		}
		t.periods = m
		t.any = t.any || m != nil
	}
	if q := ct.Quota; q.Enabled {
		t.wIn, t.wOut, t.wCached = q.Weights.Input, q.Weights.Output, q.Weights.Cached
		t.wPrompt = max(t.wIn, t.wCached)
		for _, w := range q.Windows {
			p, ok := parsePeriod(w.Period)
			if !ok {
				return nil, fmt.Errorf("bad period %q", w.Period)
			}
			if w.MaxRequests > 0 || w.MaxTokens > 0 {
				t.win[p] = winLimit{on: true, maxReq: w.MaxRequests, maxTok: w.MaxTokens * 1000}
				t.quota = true
			}
		}
		t.any = t.any || t.quota
	}
	if cc := ct.Concurrency; cc.Enabled && cc.Limit > 0 {
		t.concLimit = cc.Limit
		t.concQueue = cc.Overlimit == config.OverlimitQueue
		t.concQueueSize = cc.QueueSize
		t.concTimeout = time.Duration(cc.QueueTimeoutMS * float64(time.Millisecond))
		t.any = true
	}
	if r := ct.Rate; r.Enabled && (r.RPM > 0 || r.TPM > 0) {
		t.rpm, t.tpm = r.RPM, r.TPM
		t.any = true
	}
	if ct.Rate.Enabled {
		// The spec: the default output estimate applies only when rate
		// limiting is on (a value kept while it is off changes nothing);
		// without it a request without max_tokens reserves its prompt
		// alone against token quotas, and is charged its usage at the end.
		t.defOut = ct.Rate.DefaultOutputTokens
	}
	t.counted = t.quota || t.concLimit > 0 || t.rpm > 0 || t.tpm > 0
	return t, nil
}

// AuthRequired reports whether users are configured, so that every
// request must carry a user's key (or the global --api-key, which the
// proxy checks itself).
func (g *Governor) AuthRequired() bool { return g.snap.Load().authUsers }

// Identify finds the user of an API key (the bearer token). An unknown
// or malformed key is a 401 rejection, a disabled user's key 403. The
// key's record is found by its key id; its secret is checked by a salted
// SHA-256 compared in constant time. It does not allocate, and never logs
// or returns the key.
func (g *Governor) Identify(key []byte) (*User, *Rejection) {
	s := g.snap.Load()
	id, ok := config.KeyID(unsafeString(key))
	if !ok {
		mAuthUnknown.Inc()
		return nil, rejInvalidKey
	}
	rec := s.keys[id]
	if rec == nil || !rec.matches(key) {
		mAuthUnknown.Inc()
		return nil, rejInvalidKey
	}
	if !rec.user.enabled {
		mAuthDisabled.Inc()
		return nil, rejUserDisabled
	}
	return rec.user, nil
}

// waitQueued waits for ch (the grant), ctx or the queue timeout, measured
// from since; timeout reads it from a snapshot. A reload wakes the wait to
// read it again from the new snapshot, so a queued request follows a
// changed timeout as a new one would: shortened below the time it has
// waited, it ends at once. It reports which ended it.
func (g *Governor) waitQueued(ctx context.Context, ch <-chan struct{}, since time.Time, timeout func(s *snapshot) time.Duration) (granted, timedOut bool) {
	s := g.snap.Load()
	t := time.NewTimer(time.Until(since.Add(timeout(s))))
	defer t.Stop()
	for {
		select {
		case <-ch:
			return true, false
		case <-ctx.Done():
			return false, false
		case <-t.C:
		case <-s.replaced:
		}
		s = g.snap.Load()
		d := time.Until(since.Add(timeout(s)))
		if d <= 0 {
			return false, true
		}
		t.Reset(d)
	}
}
