package upstream

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/infera/infera/config"
	"github.com/infera/infera/internal/logx"
)

// Poller keeps the last capacity report of every member of
// config.GlobalScheduling: one goroutine per member GETs its CapacityPath
// every poll_interval_ms (with 10% jitter), authenticated with the
// member's API key, bounded by poll_timeout_ms. A failed poll (network
// error, non-200 answer, invalid report) marks the member failed, so a
// member that went down stops being a candidate at once rather than after
// stale_after_ms; its last report still tells Serves which models it
// serves until it is stale (a region restarting serves them again soon:
// busy, not unknown).
//
// A member whose forward failed as its fault (ForwardFailed) is out for
// forward_failure_backoff_ms, whatever its polls say: a member that
// answers its polls but hangs on forwarded requests would otherwise be
// readmitted by its next poll, and every poll interval another request
// would wait out the forward's bound on it. Then Pick gives one request
// its trial (Admit); its success readmits the member, its failure doubles
// the backoff, up to forward_failure_max_backoff_ms (Backoff).
//
// Pick runs on the request path (only when the local fleet is saturated):
// it reads atomics and allocates nothing.
//
// Metrics (one series per member, resolved when the member is added and
// unregistered when a reload removes or replaces it):
//
//	infera_global_capacity_polls_total{member,result="ok"|"error"}
//	infera_global_member_free{member}       free capacity as Pick sees it (-1: no fresh report)
//	infera_global_forwarded_total{member}   requests the dispatch forwarded to it
//	infera_global_member_backoff_state{member} 0 in, 1 on trial, 2 out after failed forwards
//	infera_global_member_stalled{member}    1 while it is stalled (forward_stall_ms)
//
// A member that answers its polls but no forward (its engines hang behind
// a live gateway) took every forward its report had room for until the
// first of them reached its bound (forward_stream_first_packet_ms, 30 s,
// or forward_non_stream_first_byte_ms, 300 s), each good poll making room
// again. Once a forward has waited forward_stall_ms for its first byte
// with no forward answered since, the member is stalled: Pick skips it
// until one of its forwards is answered, or none waits any more (the
// waiting ones then failed, and its backoff took over). A member that is
// slow under load still answers some forward now and then, which keeps
// it in.
type Poller struct {
	client *http.Client
	set    *metrics.Set

	mu      sync.Mutex // serializes Update and Close; Lock must be held to write members
	closed  bool
	members atomic.Pointer[[]*Member]
	cfg     atomic.Pointer[config.GlobalScheduling]
	wg      sync.WaitGroup
}

// Member is one member gateway as the Poller knows it.
type Member struct {
	name string
	url  string
	key  config.Secret
	ep   Endpoint

	report    atomic.Pointer[report]
	forwarded atomic.Int64 // forwarded since the last report
	// failed: a poll of the member, or a forward to it (Failed), failed
	// since its last good report. It takes no forward until its next good
	// poll, but its report, until stale, still says which models it
	// serves (Serves).
	failed atomic.Bool
	// out keeps the member out after forwards that failed as its fault,
	// good polls or not (ForwardFailed).
	out Backoff
	// stall tells a member that takes forwards and answers none
	// (Sending, Sent, stalled).
	stall stallClock
	cfg   *atomic.Pointer[config.GlobalScheduling] // the poller's

	ctx    context.Context
	cancel context.CancelFunc
	// wake tells the member's loop that poll_interval_ms changed, so it
	// times its next poll by the new interval, not the one its timer was
	// set with.
	wake chan struct{}

	pollsOK, pollsErr, forwardedTotal *metrics.Counter
	lbl                               string // `{member="name"`
	logThrottle                       logx.Throttle
}

type report struct {
	at  time.Time
	cap Capacity
}

// NewPoller returns a Poller with no members; call Update with the config,
// and again on every reload.
func NewPoller() *Poller {
	p := &Poller{
		client: &http.Client{
			Transport: &http.Transport{
				Proxy:               nil, // members are addressed directly
				DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
				MaxIdleConnsPerHost: 2,
				IdleConnTimeout:     90 * time.Second,
				ForceAttemptHTTP2:   true,
			},
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		},
		set: metrics.NewSet(),
	}
	empty := []*Member{}
	p.members.Store(&empty)
	metrics.RegisterSet(p.set)
	return p
}

// Update applies a config snapshot: members added start being polled,
// removed ones stop, and a member whose URL or key changed starts afresh
// (no report until its first poll). Timeouts and thresholds apply from
// the next poll and the next Pick; a changed interval times the next poll
// of every member from its last one (at once if the new interval has
// already passed since, or if its report is stale by a staleness bound
// the reload shrank). A disabled section stops every poll.
func (p *Poller) Update(g *config.GlobalScheduling) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return errors.New("poller is closed")
	}
	old := *p.members.Load()
	oldCfg := p.cfg.Load()
	var want []config.Member
	if g.Enabled {
		want = g.Members
	}
	// Check the whole list before changing anything (config validation
	// already did; a bad list must not leave the poller half updated).
	eps := make([]Endpoint, len(want))
	seen := make(map[string]bool, len(want))
	for i := range want {
		if seen[want[i].Name] {
			return fmt.Errorf("duplicate member name %q", want[i].Name)
		}
		seen[want[i].Name] = true
		ep, err := ParseEndpoint(want[i].URL)
		if err != nil {
			return fmt.Errorf("member %q: %w", want[i].Name, err)
		}
		eps[i] = ep
	}
	keep := make(map[*Member]bool, len(old))
	next := make([]*Member, len(want))
	for i := range want {
		cm := &want[i]
		for _, o := range old {
			if o.name == cm.Name && o.url == cm.URL && o.key == cm.APIKey {
				next[i] = o
				keep[o] = true
				break
			}
		}
	}
	for _, o := range old {
		if !keep[o] {
			o.cancel()
			for _, n := range o.seriesNames() {
				p.set.UnregisterMetric(n)
			}
		}
	}
	fresh := make(map[*Member]bool, len(want))
	for i := range want {
		if next[i] == nil {
			next[i] = p.newMember(&want[i], eps[i])
			fresh[next[i]] = true
		}
	}
	p.cfg.Store(g)
	p.members.Store(&next)
	// A kept member's next poll was timed with the old interval: a changed
	// interval, or a staleness bound that shrank (its report may be stale
	// by the new bound long before that poll), re-times it (loop).
	retime := oldCfg != nil && (oldCfg.PollIntervalMS != g.PollIntervalMS || g.StaleAfterMS < oldCfg.StaleAfterMS)
	for _, m := range next {
		if fresh[m] {
			p.wg.Add(1)
			go p.loop(m)
		} else if retime {
			select {
			case m.wake <- struct{}{}:
			default:
			}
		}
	}
	return nil
}

func (p *Poller) newMember(cm *config.Member, ep Endpoint) *Member {
	m := &Member{name: cm.Name, url: cm.URL, key: cm.APIKey, ep: ep, wake: make(chan struct{}, 1), cfg: &p.cfg}
	m.ctx, m.cancel = context.WithCancel(context.Background())
	m.logThrottle.Every = 30 * time.Second
	m.lbl = fmt.Sprintf(`{member=%q`, cm.Name)
	names := m.seriesNames()
	m.pollsOK = p.set.GetOrCreateCounter(names[0])
	m.pollsErr = p.set.GetOrCreateCounter(names[1])
	m.forwardedTotal = p.set.GetOrCreateCounter(names[2])
	p.set.NewGauge(names[3], func() float64 {
		g := p.cfg.Load()
		if g == nil {
			return -1
		}
		r := m.report.Load()
		now := time.Now()
		if r == nil || m.failed.Load() || !m.ready(g, now) || m.stall.stalled(now.UnixNano(), ms(g.ForwardStallMS)) || now.Sub(r.at) > ms(g.StaleAfterMS) {
			return -1
		}
		return float64(int64(r.cap.Free) - m.forwarded.Load())
	})
	p.set.NewGauge(names[4], func() float64 { return float64(m.out.State()) })
	p.set.NewGauge(names[5], func() float64 {
		if g := p.cfg.Load(); g != nil && m.stall.stalled(time.Now().UnixNano(), ms(g.ForwardStallMS)) {
			return 1
		}
		return 0
	})
	return m
}

// seriesNames returns the names of the member's series: polls ok, polls
// failed, forwarded, free, backoff state, stalled. A member that leaves
// the config takes them off /metrics.
func (m *Member) seriesNames() [6]string {
	return [6]string{
		`infera_global_capacity_polls_total` + m.lbl + `,result="ok"}`,
		`infera_global_capacity_polls_total` + m.lbl + `,result="error"}`,
		`infera_global_forwarded_total` + m.lbl + `}`,
		`infera_global_member_free` + m.lbl + `}`,
		`infera_global_member_backoff_state` + m.lbl + `}`,
		`infera_global_member_stalled` + m.lbl + `}`,
	}
}

// Close stops every poll and unregisters the metrics.
func (p *Poller) Close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	for _, m := range *p.members.Load() {
		m.cancel()
	}
	empty := []*Member{}
	p.members.Store(&empty)
	p.mu.Unlock()
	p.wg.Wait()
	metrics.UnregisterSet(p.set, true)
	p.client.CloseIdleConnections()
}

func (p *Poller) loop(m *Member) {
	defer p.wg.Done()
	t := time.NewTimer(0)
	defer t.Stop()
	var last time.Time // start of the last poll
	for {
		select {
		case <-m.ctx.Done():
			return
		case <-m.wake:
			// A reload changed poll_interval_ms: the next poll is due
			// one new interval after the last one (at once if that has
			// passed, or if the report is stale by the new bound), not
			// when the old interval's timer fires.
			g := p.cfg.Load()
			due := last.Add(jittered(ms(g.PollIntervalMS)))
			if time.Since(last) >= ms(g.StaleAfterMS) {
				due = time.Now()
			}
			t.Reset(time.Until(due))
			continue
		case <-t.C:
		}
		g := p.cfg.Load()
		last = time.Now()
		p.poll(m, g)
		t.Reset(jittered(ms(g.PollIntervalMS)))
	}
}

// jittered returns iv give or take 10%.
func jittered(iv time.Duration) time.Duration {
	return iv - iv/10 + rand.N(iv/5+1)
}

// poll fetches one report and stores it, or clears the member's report.
func (p *Poller) poll(m *Member, g *config.GlobalScheduling) {
	c, err := p.fetch(m, ms(g.PollTimeoutMS))
	if m.ctx.Err() != nil {
		return // removed meanwhile
	}
	if err != nil {
		m.pollsErr.Inc()
		m.failed.Store(true) // no candidate; its models stay known until its report is stale
		m.logThrottle.Warn("global scheduling: capacity poll failed", "member", m.name, "err", err.Error())
		return
	}
	m.pollsOK.Inc()
	m.report.Store(&report{at: time.Now(), cap: c})
	m.forwarded.Store(0)
	m.failed.Store(false)
}

func (p *Poller) fetch(m *Member, timeout time.Duration) (Capacity, error) {
	ctx, cancel := context.WithTimeout(m.ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, m.ep.RootURL(CapacityPath), nil)
	if err != nil {
		return Capacity{}, fmt.Errorf("cannot build capacity request: %w", err)
	}
	req.Header.Set("Accept", "application/json")
	req.Header.Set("User-Agent", "infera-global-scheduling")
	if m.key.IsSet() {
		req.Header.Set("Authorization", string(m.key.AppendBearer(nil)))
	}
	resp, err := p.client.Do(req)
	if err != nil {
		if ctx.Err() == context.DeadlineExceeded {
			return Capacity{}, fmt.Errorf("capacity poll timed out after %v", timeout)
		}
		return Capacity{}, fmt.Errorf("cannot reach member: %s", DescribeError(err))
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, MaxCapacityBytes+1))
	if err != nil {
		return Capacity{}, fmt.Errorf("cannot read capacity report: %s", DescribeError(err))
	}
	if resp.StatusCode != http.StatusOK {
		return Capacity{}, fmt.Errorf("capacity endpoint answered status %d", resp.StatusCode)
	}
	return ParseCapacity(body)
}

// Pick returns the member to forward a request for model to: among the
// members with a report younger than stale_after_ms that serve model, the
// one with the most free capacity for it (its report's, less the requests
// forwarded to it since), provided that is at least min_free; ties go to
// the first in list order. It returns nil when global scheduling is
// disabled, no member qualifies, or model is longer than MaxModelBytes.
// The caller must not forward a request that carries HopHeader.
func (p *Poller) Pick(model []byte) *Member {
	best, _ := p.scan(model)
	return best
}

// Serves reports whether a member's current report (not stale) lists
// model, whatever its free capacity, a member whose poll or forward failed
// since included: a model served elsewhere whose members have no room now,
// or failed a moment ago, is busy, not unknown.
func (p *Poller) Serves(model []byte) bool {
	_, serves := p.scan(model)
	return serves
}

// scan goes over the members' current reports for model: best is Pick's
// choice, serves whether any report lists model at all.
func (p *Poller) scan(model []byte) (best *Member, serves bool) {
	g := p.cfg.Load()
	if g == nil || !g.Enabled || len(model) > MaxModelBytes {
		return nil, false
	}
	now := time.Now()
	stale := ms(g.StaleAfterMS)
	bestFree := int64(0)
	for _, m := range *p.members.Load() {
		r := m.report.Load()
		if r == nil || now.Sub(r.at) > stale {
			continue
		}
		f := r.cap.FreeFor(model)
		if f < 0 {
			continue
		}
		serves = true
		if m.failed.Load() || !m.ready(g, now) || m.stall.stalled(now.UnixNano(), ms(g.ForwardStallMS)) {
			continue
		}
		free := int64(f) - m.forwarded.Load()
		if free < int64(g.MinFree) || best != nil && free <= bestFree {
			continue
		}
		best, bestFree = m, free
	}
	return best, serves
}

// Members returns the members in config order (for the capacity view of
// an admin page or a test).
func (p *Poller) Members() []*Member { return *p.members.Load() }

// Name returns the member's configured name.
func (m *Member) Name() string { return m.name }

// Endpoint returns the member's parsed base URL.
func (m *Member) Endpoint() *Endpoint { return &m.ep }

// APIKey returns the key to send the member as "Authorization: Bearer".
func (m *Member) APIKey() config.Secret { return m.key }

// Forwarded records that a request was forwarded to the member: Pick
// counts it against the member's free capacity until the next report.
func (m *Member) Forwarded() {
	m.forwarded.Add(1)
	m.forwardedTotal.Inc()
}

// Failed records that the member could not take a forwarded request for
// a reason that is not its fault (it answered 429, the router's own
// connection limit, nothing was sent): it is no candidate until its next
// successful poll. Its report still tells Serves which models it serves
// (a request for one is busy, not unknown), not Report.
func (m *Member) Failed() { m.failed.Store(true) }

// Admit is called for the member Pick returned, just before the request is
// forwarded: ok is false when another request took its trial meanwhile;
// trial is true when this forward is the member's trial after its backoff,
// which the caller ends with exactly one of ForwardSucceeded,
// ForwardFailed or ForwardAbandoned.
func (m *Member) Admit() (ok, trial bool) {
	g := m.cfg.Load()
	if g == nil {
		return true, false
	}
	return m.out.Admit(time.Now().UnixNano(), ms(g.ForwardFailureBackoffMS), ms(g.ForwardFailureMaxBackoffMS))
}

// ForwardSucceeded records a forward the member answered: its trial's
// success readmits it.
func (m *Member) ForwardSucceeded(trial bool) { m.out.Succeeded(trial) }

// ForwardFailed records a forward that failed as the member's fault
// (unreachable, a timeout, an invalid answer, 5xx, the gateway's key
// refused): the member is out for its backoff, whatever its polls say
// (without a backoff, until its next good poll, as Failed).
func (m *Member) ForwardFailed(trial bool) {
	m.failed.Store(true)
	if g := m.cfg.Load(); g != nil {
		m.out.Failed(time.Now().UnixNano(), trial, ms(g.ForwardFailureBackoffMS))
	}
}

// ForwardAbandoned ends a trial that said nothing of the member: the next
// request tries it.
func (m *Member) ForwardAbandoned(trial bool) { m.out.Abandon(trial) }

// Sending records a forward about to be sent to the member; Sent ends it
// (exactly once), answered when the member answered it (a response head,
// whatever its status; not a timeout, an unreachable member or a client
// that left). Between the two the forward waits for its first byte, and
// a member whose forwards wait forward_stall_ms with none answered is
// skipped (stalled).
func (m *Member) Sending() { m.stall.sending(time.Now().UnixNano()) }

// Sent ends a forward Sending began (see there).
func (m *Member) Sent(answered bool) { m.stall.sent(time.Now().UnixNano(), answered) }

// ready reports whether the member's forward backoff lets a request
// through at now (its trial included).
func (m *Member) ready(g *config.GlobalScheduling, now time.Time) bool {
	return m.out.Ready(now.UnixNano(), ms(g.ForwardFailureBackoffMS), ms(g.ForwardFailureMaxBackoffMS))
}

// Report returns the member's last report and its age, ok false when there
// is none (never polled), the last poll or a forward failed since, or it
// is out after failed forwards.
func (m *Member) Report() (c Capacity, age time.Duration, ok bool) {
	r := m.report.Load()
	if r == nil || m.failed.Load() {
		return Capacity{}, 0, false
	}
	if g := m.cfg.Load(); g != nil && !m.ready(g, time.Now()) {
		return Capacity{}, 0, false
	}
	return r.cap, time.Since(r.at), true
}

func ms(v float64) time.Duration { return time.Duration(v * float64(time.Millisecond)) }
