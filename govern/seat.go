package govern

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// Phase is the part of a request's life a seat counts.
type Phase uint8

// Phases.
const (
	// PhaseMixed is a request on a PD-integrated instance: it holds an
	// overall seat from dispatch to Done and a prefill seat from dispatch
	// to FirstToken.
	PhaseMixed Phase = iota
	// PhasePrefill is a request on a PD-disaggregated prefill instance: a
	// prefill seat from dispatch to FirstToken (or Done).
	PhasePrefill
	// PhaseDecode is a request on a PD-disaggregated decode instance: a
	// decode seat from its dispatch (the first token) to Done.
	PhaseDecode
)

// Target is a candidate engine instance: Instance is its id, Service the
// service it belongs to. The scope (rate_limit.scope) picks which of the
// two, or neither (gateway), names the counter a seat takes.
type Target struct {
	Instance string
	Service  string
}

type scopeKind uint8

const (
	scopeInstance scopeKind = iota
	scopeService
	scopeGateway
)

// Counter indexes of a scope.
const (
	cOverall = iota
	cPrefill
	cDecode
)

var counterCodes = [3]Code{CodeConcurrencyOverall, CodeConcurrencyPrefill, CodeConcurrencyDecode}

// counters are the seats of one scope (an instance, a service or the
// gateway). In-process, n counts them; with Redis the counts live there and
// keys name them. waiting counts queued requests that list this scope.
// Guarded by seatLimiter.mu.
//
// A queued request waits on every level (instance, service, gateway) of
// each of its targets, and in process a seat counts on every level of its
// target (levels), whatever rate_limit.scope is; the limits are checked on
// the configured scope's counters only. So a reload that changes the
// scope finds the requests queued, and in process the seats in flight, on
// the new scope's counters. With Redis a seat is added to the configured
// scope's sets; at a reload that changes the scope, the router copies the
// seats it holds into the new scope's sets (followScopes), and a seat is
// removed from every set it is in.
//
// An instance's seats count on the counters of the service it belongs to
// now (service): a reload or the discovery that moves it to another
// service moves the counts of its seats in flight there (moveLocked), and
// their ends return them there.
type counters struct {
	n       [3]int
	waiting int
	keys    [3]string // Redis sorted sets of the scope's seats
	service string    // an instance's: the service its seats count on
}

// parts are the counters a phase holds.
func parts(ph Phase) uint64 {
	switch ph {
	case PhasePrefill:
		return 1 << cPrefill
	case PhaseDecode:
		return 1 << cDecode
	}
	return 1<<cOverall | 1<<cPrefill
}

// full returns the code of the first counter of ph at its limit, or CodeNone.
func (c *counters) full(ph Phase, lim *[3]int) Code {
	p := parts(ph)
	for i := range 3 {
		if p&(1<<i) != 0 && lim[i] > 0 && c.n[i] >= lim[i] {
			return counterCodes[i]
		}
	}
	return CodeNone
}

// phaseCode is the code reported for ph when no counter says which.
func phaseCode(ph Phase, lim *[3]int) Code {
	switch ph {
	case PhasePrefill:
		return CodeConcurrencyPrefill
	case PhaseDecode:
		return CodeConcurrencyDecode
	}
	if lim[cOverall] == 0 {
		return CodeConcurrencyPrefill
	}
	return CodeConcurrencyOverall
}

// levels are the counters of one target at every scope, indexed by
// scopeKind.
type levels [3]*counters

// take counts a seat for ph on every level. Lock must be held.
func (lv *levels) take(ph Phase) {
	p := parts(ph)
	for i := range 3 {
		if p&(1<<i) != 0 {
			for _, c := range lv {
				c.n[i]++
			}
			heldSeats[i].Add(1)
		}
	}
}

// wait adds d to the queued requests of every level. Lock must be held.
func (lv *levels) wait(d int) {
	for _, c := range lv {
		c.waiting += d
	}
}

// seatLimiter is request rate limiting's seats and FIFO queue.
type seatLimiter struct {
	g    *Governor
	mu   sync.Mutex
	inst map[string]*counters
	svc  map[string]*counters
	gw   *counters
	q    seatWaitList
}

func (l *seatLimiter) init(g *Governor) {
	l.g = g
	l.inst = map[string]*counters{}
	l.svc = map[string]*counters{}
	l.gw = l.newCounters(scopeGateway, "")
}

func (l *seatLimiter) newCounters(k scopeKind, name string) *counters {
	c := &counters{}
	if l.g.rds != nil || l.g.opts.State != "" {
		base := l.g.opts.RedisPrefix + "{rl}:" + [...]string{"i:", "s:", "g"}[k] + name
		c.keys = [3]string{base + ":overall", base + ":prefill", base + ":decode"}
	}
	return c
}

// levels returns the counters of t at every scope: t's instance's seats
// move to t.Service first if they counted on another service. Lock must be
// held.
func (l *seatLimiter) levels(t *Target) levels {
	inst := l.counter(scopeInstance, t)
	if inst.service != t.Service {
		l.moveLocked(inst, t.Service)
	}
	return levels{scopeInstance: inst, scopeService: l.counter(scopeService, t), scopeGateway: l.gw}
}

// current returns lv with the service level its instance counts on now
// (lv was resolved before a move). Lock must be held.
func (l *seatLimiter) current(lv levels) levels {
	if inst := lv[scopeInstance]; inst != nil && lv[scopeService] != nil {
		if c := l.svc[inst.service]; c != lv[scopeService] {
			lv[scopeService] = l.counter(scopeService, &Target{Service: inst.service})
		}
	}
	return lv
}

// moveLocked makes instance counters inst count on service svc: the
// counts of its seats in flight leave its old service's counters for
// svc's. Lock must be held.
func (l *seatLimiter) moveLocked(inst *counters, svc string) {
	if inst.n != [3]int{} {
		from := l.counter(scopeService, &Target{Service: inst.service})
		to := l.counter(scopeService, &Target{Service: svc})
		for i := range inst.n {
			from.n[i] -= inst.n[i]
			to.n[i] += inst.n[i]
		}
	}
	inst.service = svc
}

// MoveInstance tells the seats that instance t.Instance belongs to service
// t.Service now (a reload or the discovery changed its record): its seats
// in flight count on t.Service's counters from now on, and their ends
// return them there; the old service's counters no longer count them, and
// requests queued for them are served. Without it (before), the moved
// seats stayed on the old service until they ended, where they still
// held its seats and the new service admitted past its limit. With Redis
// the seats this router holds on the instance move to the service's sets
// (as a scope reload copies them, within --state-end-delay).
func (g *Governor) MoveInstance(t Target) {
	l := &g.seats
	if g.rds != nil {
		g.rds.moveService(l.newCounters(scopeInstance, t.Instance).keys, l.newCounters(scopeService, t.Service).keys)
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	inst := l.inst[t.Instance]
	if inst == nil || inst.service == t.Service {
		return
	}
	l.moveLocked(inst, t.Service)
	if l.q.n > 0 {
		l.pumpLocked()
	}
}

// counter returns the counters of t's scope. Lock must be held.
func (l *seatLimiter) counter(k scopeKind, t *Target) *counters {
	var m map[string]*counters
	var name string
	switch k {
	case scopeGateway:
		return l.gw
	case scopeService:
		m, name = l.svc, t.Service
	default:
		m, name = l.inst, t.Instance
	}
	c := m[name]
	if c == nil {
		c = l.newCounters(k, name)
		m[name] = c
	}
	return c
}

// sweep forgets idle scopes (removed instances and services).
func (l *seatLimiter) sweep() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, m := range []map[string]*counters{l.inst, l.svc} {
		for k, c := range m {
			if c.n == [3]int{} && c.waiting == 0 {
				delete(m, k)
			}
		}
	}
}

// Seat is a concurrency seat on one engine instance for one dispatch
// attempt. The zero Seat (no limit applies) is valid and its methods do
// nothing. FirstToken and Done are idempotent and safe from any
// goroutine, also concurrently; calls after Done do nothing.
type Seat struct {
	ss  *seatState
	gen uint64
}

// seatState is pooled; state = gen<<seatFlags | held counters | flags.
type seatState struct {
	state atomic.Uint64

	g      *Governor
	lv     levels       // in process: the counters it is counted on
	keys   [3][3]string // Redis: its target's sets at every scope, by scopeKind
	origin scopeKind    // Redis: the scope it was taken in
	in     uint8        // Redis: the scopes whose sets hold it (bits by scopeKind; redisState.mu)
	member string
	remote bool
}

const (
	ssActive   = 1 << 3 // bits 0..2 are the held counters
	ssFTBusy   = 1 << 4 // FirstToken is returning the prefill seat
	ssDoneBusy = 1 << 5 // Done is returning the rest
	ssFlags    = 6
	ssHeld     = 7
)

// unbusy clears bit; the call that leaves the state inactive and idle
// recycles it.
func (ss *seatState) unbusy(bit uint64) {
	for {
		st := ss.state.Load()
		n := st &^ bit
		if ss.state.CompareAndSwap(st, n) {
			if n&(ssActive|ssFTBusy|ssDoneBusy) == 0 {
				ss.g.seatPool.Put(ss)
			}
			return
		}
	}
}

// heldKeys returns the Redis sets of the counters in held at every scope
// whose sets hold the seat. redisState.mu must be held.
func (ss *seatState) heldKeys(held uint64) []string {
	keys := make([]string, 0, 2)
	for i := range 3 {
		if held&(1<<i) != 0 {
			for k := range ss.keys {
				if ss.in&(1<<k) != 0 {
					keys = append(keys, ss.keys[k][i])
				}
			}
		}
	}
	return keys
}

func (g *Governor) newSeat(lv levels, ph Phase) (*seatState, Seat) {
	ss := g.seatPool.Get().(*seatState)
	ss.lv = lv
	ss.keys = [3][3]string{}
	ss.in = 0
	ss.member, ss.remote = "", false
	gen := ss.state.Load()>>ssFlags + 1
	ss.state.Store(gen<<ssFlags | ssActive | parts(ph))
	return ss, Seat{ss: ss, gen: gen}
}

// FirstToken returns the prefill seat (PhaseMixed, PhasePrefill): the
// request's first token has arrived.
func (s Seat) FirstToken() {
	ss := s.ss
	if ss == nil {
		return
	}
	for {
		st := ss.state.Load()
		if st>>ssFlags != s.gen || st&ssActive == 0 || st&(1<<cPrefill) == 0 {
			return
		}
		if ss.state.CompareAndSwap(st, st&^(1<<cPrefill)|ssFTBusy) {
			break
		}
	}
	ss.g.releaseSeat(ss, 1<<cPrefill)
	ss.unbusy(ssFTBusy)
}

// Done returns every seat still held.
func (s Seat) Done() {
	ss := s.ss
	if ss == nil {
		return
	}
	var st uint64
	for {
		st = ss.state.Load()
		if st>>ssFlags != s.gen || st&ssActive == 0 {
			return
		}
		if ss.state.CompareAndSwap(st, s.gen<<ssFlags|st&ssFTBusy|ssDoneBusy) {
			break
		}
	}
	if held := st & ssHeld; held != 0 {
		ss.g.releaseSeat(ss, held)
	}
	ss.unbusy(ssDoneBusy)
}

func (g *Governor) releaseSeat(ss *seatState, held uint64) {
	if ss.remote {
		g.rds.releaseSeat(ss, held)
		return
	}
	if ss.lv[0] == nil {
		return // fail-open seat
	}
	l := &g.seats
	scope := g.snap.Load().rl.scope
	l.mu.Lock()
	lv := l.current(ss.lv)
	for i := range 3 {
		if held&(1<<i) != 0 {
			for _, c := range lv {
				c.n[i]--
			}
			heldSeats[i].Add(-1)
		}
	}
	if lv[scope].waiting > 0 || ss.lv[scope].waiting > 0 {
		l.pumpLocked()
	}
	l.mu.Unlock()
}

// Acquire takes a seat on the first of targets (in the caller's order of
// preference) that has one free for phase ph, and returns it with the
// target's index. When none has: in reject mode (or dry run) it answers at
// once (a 429 rejection, or in dry run a seat on targets[0] over the
// limit); in queue mode it waits in one FIFO queue, served in arrival order
// whenever a seat of one of its targets' scopes frees, until the queue
// timeout or until ctx ends (the client left: removed at once). With no
// limit configured it returns the zero Seat and index 0. targets must not
// be empty.
func (g *Governor) Acquire(ctx context.Context, targets []Target, ph Phase) (Seat, int, *Rejection) {
	return g.acquire(ctx, targets, ph, true, nil)
}

// AcquireUnless is Acquire for a request that may stop waiting: when
// stale answers non-nil as the request queues, or when Retarget asks it
// (a worker left the fleet, a reload), the request leaves the queue at
// once, holding nothing, with that answer: TargetsGone when none of
// targets can serve it any more (the caller picks them again), or the
// refusal a new request would get (Revoked: a reload disabled its user).
// stale is called with the queue's lock held, only while the request is
// queued: it must be short and must not call back into the Governor but
// for Revoked.
func (g *Governor) AcquireUnless(ctx context.Context, targets []Target, ph Phase, stale func() *Rejection) (Seat, int, *Rejection) {
	return g.acquire(ctx, targets, ph, true, stale)
}

// TargetsGone is AcquireUnless's answer to a request whose targets all
// left while it waited. It is never a client's answer: the caller picks
// the request's targets again (another instance may serve it, or none:
// then it is answered as a new request would be).
var TargetsGone = &Rejection{Code: CodeNone, Status: 503, Message: "every instance the request waited for left the fleet"}

// Retarget asks the requests queued through AcquireUnless whether they
// still wait (an instance left the fleet; Apply asks it too): one whose
// stale answers leaves the queue with that answer (both backends).
// Without it such a request waited for a seat no instance would free, or
// was served for a user a reload had disabled, until its queue timeout
// (429) or a seat freed, while a new request got its answer at once.
func (g *Governor) Retarget() {
	l := &g.seats
	l.mu.Lock()
	for w := l.q.head; w != nil; {
		next := w.next
		if w.stale != nil {
			if rej := w.stale(); rej != nil {
				l.dequeueLocked(w)
				w.state, w.rej = rejected, rej
				w.ch <- struct{}{}
			}
		}
		w = next
	}
	l.mu.Unlock()
}

// TryAcquire is Acquire that never waits: when no target has a free seat
// it returns the rejection at once, whatever the over-limit handling. With
// over-limit handling queue that refusal is not counted in the hit
// metrics: a caller that wants to wait calls Acquire next (after giving
// back what it should not hold while queued), which counts the request as
// queued, or as rejected when the queue is full or its wait times out.
func (g *Governor) TryAcquire(targets []Target, ph Phase) (Seat, int, *Rejection) {
	return g.acquire(context.Background(), targets, ph, false, nil)
}

func (g *Governor) acquire(ctx context.Context, targets []Target, ph Phase, wait bool, stale func() *Rejection) (Seat, int, *Rejection) {
	s := g.snap.Load()
	rl := &s.rl
	if !rl.limited || len(targets) == 0 {
		return Seat{}, 0, nil
	}
	if g.rds != nil {
		return g.acquireRemote(ctx, rl, targets, ph, wait, stale)
	}
	l := &g.seats
	l.mu.Lock()
	code := CodeNone
	for i := range targets {
		lv := l.levels(&targets[i])
		c := lv[rl.scope]
		f := c.full(ph, &rl.lim)
		if f == CodeNone && c.waiting > 0 && !rl.dry {
			f = phaseCode(ph, &rl.lim) // no overtaking the queue
		}
		if f != CodeNone {
			if code == CodeNone {
				code = f
			}
			continue
		}
		lv.take(ph)
		l.mu.Unlock()
		_, seat := g.newSeat(lv, ph)
		return seat, i, nil
	}
	if rl.dry {
		hit(code, true)
		lv := l.levels(&targets[0])
		lv.take(ph)
		l.mu.Unlock()
		_, seat := g.newSeat(lv, ph)
		return seat, 0, nil
	}
	if !rl.queue {
		l.mu.Unlock()
		hit(code, false)
		return Seat{}, -1, reject(code, 0, false)
	}
	if !wait {
		l.mu.Unlock()
		return Seat{}, -1, reject(code, 0, false) // not counted: the caller queues next
	}
	if l.q.n >= rl.queueSize {
		l.mu.Unlock()
		hit(code, false)
		return Seat{}, -1, reject(code, 0, true)
	}
	w := &seatWaiter{ch: make(chan struct{}, 1), ph: ph, code: code, since: time.Now(), lvs: make([]levels, len(targets)), stale: stale}
	for i := range targets {
		w.lvs[i] = l.levels(&targets[i])
	}
	if rej := l.enqueueLocked(w); rej != nil {
		l.mu.Unlock()
		return Seat{}, -1, rej
	}
	seatQueued.Add(1)
	l.mu.Unlock()
	hitQueued(code)
	return g.waitSeat(ctx, w)
}

// waitSeat waits for w to be granted (both backends), up to the current
// rate_limit.queue_timeout_ms.
func (g *Governor) waitSeat(ctx context.Context, w *seatWaiter) (Seat, int, *Rejection) {
	l := &g.seats
	granted, timedOut := g.waitQueued(ctx, w.ch, w.since, seatTimeout)
	l.mu.Lock()
	if w.state == waiting {
		l.dequeueLocked(w)
		w.state = left // a pump pass holding w in its copy of the queue gives back what it took for it
		l.mu.Unlock()
		seatQueued.Add(-1)
		seatQueueWait.UpdateDuration(w.since)
		if timedOut {
			hit(w.code, false) // refused in the end; a client that left is not counted
		}
		return Seat{}, -1, reject(w.code, 0, true)
	}
	l.mu.Unlock()
	seatQueued.Add(-1)
	seatQueueWait.UpdateDuration(w.since)
	if w.state == rejected {
		return Seat{}, -1, w.rej
	}
	if !granted { // granted as the wait ended: give it back
		w.seat.Done()
		return Seat{}, -1, reject(w.code, 0, true)
	}
	return w.seat, w.idx, nil
}

func seatTimeout(s *snapshot) time.Duration { return s.rl.timeout }

// enqueueLocked queues w, unless it is stale already (a Retarget ran
// between its pick and now): then it returns the answer. Lock must be
// held.
func (l *seatLimiter) enqueueLocked(w *seatWaiter) *Rejection {
	if w.stale != nil {
		if rej := w.stale(); rej != nil {
			return rej
		}
	}
	l.q.push(w)
	for i := range w.lvs {
		w.lvs[i].wait(1)
	}
	return nil
}

// dequeueLocked removes w from the queue; a w no longer queued is left
// alone. Lock must be held.
func (l *seatLimiter) dequeueLocked(w *seatWaiter) {
	if !l.q.remove(w) {
		return
	}
	for i := range w.lvs {
		w.lvs[i].wait(-1)
	}
}

// pumpLocked grants seats to queued requests in arrival order (in
// process). Lock must be held.
func (l *seatLimiter) pumpLocked() {
	rl := &l.g.snap.Load().rl
	for w := l.q.head; w != nil; {
		next := w.next
		for i, lv := range w.lvs {
			lv = l.current(lv) // its instance may have moved since it queued
			// In dry run nothing waits: the first target takes it, over
			// the limit, as a new request would (a reload turned it on).
			if rl.limited && !rl.dry && lv[rl.scope].full(w.ph, &rl.lim) != CodeNone {
				continue
			}
			l.dequeueLocked(w)
			lv.take(w.ph)
			_, w.seat = l.g.newSeat(lv, w.ph)
			w.idx, w.state = i, granted
			w.ch <- struct{}{}
			break
		}
		w = next
	}
}

// reloaded serves the queue after a configuration change (limits may have
// grown, or been removed).
func (l *seatLimiter) reloaded() {
	if l.g.rds != nil {
		l.g.rds.followScopes() // the seats held follow a change of rate_limit.scope
		l.g.rds.kickSeats()
		return
	}
	l.mu.Lock()
	if l.q.n > 0 {
		l.pumpLocked()
		l.refuseQueuedLocked()
	}
	l.mu.Unlock()
}

// refuseQueuedLocked refuses the requests still queued when overlimit is
// reject now (a reload switched it from queue): as a new request would
// be, at once. Lock must be held.
func (l *seatLimiter) refuseQueuedLocked() {
	if l.g.snap.Load().rl.queue {
		return
	}
	for w := l.q.head; w != nil; {
		next := w.next
		l.dequeueLocked(w)
		hit(w.code, false)
		w.state, w.rej = rejected, reject(w.code, 0, false)
		w.ch <- struct{}{}
		w = next
	}
}

// seatWaiter is a request queued for a seat.
type seatWaiter struct {
	prev, next *seatWaiter
	ch         chan struct{}
	ph         Phase
	code       Code
	lvs        []levels          // per target; waits on the counters of the current scope
	stale      func() *Rejection // AcquireUnless: why it stops waiting (Retarget)
	since      time.Time
	state      waitState
	rej        *Rejection
	seat       Seat
	idx        int
}

type seatWaitList struct {
	head, tail *seatWaiter
	n          int
}

func (l *seatWaitList) push(w *seatWaiter) {
	w.prev, w.next = l.tail, nil
	if l.tail != nil {
		l.tail.next = w
	} else {
		l.head = w
	}
	l.tail = w
	l.n++
}

// remove unlinks w and reports whether it was in the list (removing it
// twice does nothing).
func (l *seatWaitList) remove(w *seatWaiter) bool {
	if w.prev == nil && l.head != w {
		return false
	}
	if w.prev != nil {
		w.prev.next = w.next
	} else {
		l.head = w.next
	}
	if w.next != nil {
		w.next.prev = w.prev
	} else {
		l.tail = w.prev
	}
	w.prev, w.next = nil, nil
	l.n--
	return true
}
