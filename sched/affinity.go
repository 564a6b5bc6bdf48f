package sched

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/infera/infera/config"
	"github.com/infera/infera/fleet"
	"github.com/zeebo/xxh3"
)

// affinityTable binds session ids to workers: a fixed array of shards, each
// a map from the session id's xxh3 hash to a slot of a slab with an
// intrusive LRU list. A hit takes one shard lock and allocates nothing;
// slots of evicted entries are reused.
//
// max_entries bounds the whole table exactly: a binding that takes it over
// the limit evicts the least recently used binding of the table (the oldest
// of the shards' own oldest). The layout never changes, so a reload of
// max_entries keeps every binding (a lowered limit evicts the oldest at
// once).
type affinityTable struct {
	maxEntries atomic.Int64
	shards     [affShards]affShard
	count      atomic.Int64
	evictions  atomic.Uint64
}

// affShards is the number of shards (a power of two).
const affShards = 64

type affShard struct {
	mu   sync.Mutex
	m    map[uint64]uint32 // key -> slab index
	ents []affEntry        // ents[0] is the nil sentinel
	lruList
	free uint32 // free list through next
	_    [64]byte
}

type affEntry struct {
	key  uint64
	w    *fleet.Worker
	last int64 // unix ns of the last use
	links
}

func newAffinityTable(maxEntries int) *affinityTable {
	t := &affinityTable{}
	t.maxEntries.Store(int64(maxEntries))
	for i := range t.shards {
		t.shards[i].m = map[uint64]uint32{}
		t.shards[i].ents = make([]affEntry, 1, 16)
	}
	return t
}

// affinity returns the table, setting its limit to cfg's max_entries (a
// lowered limit evicts the oldest bindings beyond it at once).
func (s *Scheduler) affinity(c *compiled) *affinityTable {
	max := int64(c.cfg.SessionAffinity.MaxEntries)
	t := s.aff.Load()
	if t == nil {
		nt := newAffinityTable(int(max))
		if s.aff.CompareAndSwap(nil, nt) {
			return nt
		}
		t = s.aff.Load()
	}
	if c.stale.Load() || t.maxEntries.Load() == max {
		return t
	}
	if t.maxEntries.Swap(max) > max {
		t.trim()
	}
	return t
}

func (t *affinityTable) shard(key uint64) *affShard {
	return &t.shards[(key^key>>32)&(affShards-1)]
}

// get returns the worker bound to key if the binding is younger than ttl,
// refreshing it; an expired binding is removed.
func (t *affinityTable) get(key uint64, now, ttl int64) *fleet.Worker {
	sh := t.shard(key)
	sh.mu.Lock()
	i, ok := sh.m[key]
	if !ok {
		sh.mu.Unlock()
		return nil
	}
	e := &sh.ents[i]
	if now-e.last > ttl {
		sh.remove(i)
		sh.mu.Unlock()
		t.count.Add(-1)
		return nil
	}
	e.last = now
	sh.moveFront(i)
	w := e.w
	sh.mu.Unlock()
	return w
}

// bind binds key to w. A new binding that takes the table over
// max_entries evicts the table's least recently used one.
func (t *affinityTable) bind(key uint64, w *fleet.Worker, now int64) {
	sh := t.shard(key)
	sh.mu.Lock()
	if i, ok := sh.m[key]; ok {
		e := &sh.ents[i]
		e.w, e.last = w, now
		sh.moveFront(i)
		sh.mu.Unlock()
		return
	}
	var i uint32
	if sh.free != 0 {
		i = sh.free
		sh.free = sh.ents[i].next
	} else {
		sh.ents = append(sh.ents, affEntry{})
		i = uint32(len(sh.ents) - 1)
	}
	sh.ents[i] = affEntry{key: key, w: w, last: now}
	sh.m[key] = i
	sh.pushFront(i)
	sh.mu.Unlock()
	// Every binding that counts past the limit evicts one, so concurrent
	// binds leave the table at the limit, not above it.
	if t.count.Add(1) > t.maxEntries.Load() {
		t.evictOldest()
	}
}

// evictOldest removes the least recently used binding of the table: the
// oldest of the shards' least recently used ones, taking one shard lock at
// a time.
func (t *affinityTable) evictOldest() {
	for attempt := 0; ; attempt++ {
		best, bestKey, bestLast := -1, uint64(0), int64(0)
		for si := range t.shards {
			sh := &t.shards[si]
			sh.mu.Lock()
			if sh.tail != 0 {
				if e := &sh.ents[sh.tail]; best < 0 || e.last < bestLast {
					best, bestKey, bestLast = si, e.key, e.last
				}
			}
			sh.mu.Unlock()
		}
		if best < 0 {
			return // emptied meanwhile (a sweep, a lowered limit)
		}
		sh := &t.shards[best]
		sh.mu.Lock()
		// The oldest may have been used or removed since the scan; then
		// scan again, and after a few tries take that shard's oldest.
		if sh.tail != 0 && (sh.ents[sh.tail].key == bestKey || attempt >= 3) {
			sh.remove(sh.tail)
			sh.mu.Unlock()
			t.count.Add(-1)
			t.evictions.Add(1)
			return
		}
		sh.mu.Unlock()
	}
}

// trim evicts the least recently used bindings beyond max_entries (after
// the limit was lowered), holding every shard's lock.
func (t *affinityTable) trim() {
	for si := range t.shards {
		t.shards[si].mu.Lock()
	}
	n := 0
	for max := t.maxEntries.Load(); t.count.Load()-int64(n) > max; n++ {
		best := -1
		var bestLast int64
		for si := range t.shards {
			if sh := &t.shards[si]; sh.tail != 0 && (best < 0 || sh.ents[sh.tail].last < bestLast) {
				best, bestLast = si, sh.ents[sh.tail].last
			}
		}
		if best < 0 {
			break
		}
		t.shards[best].remove(t.shards[best].tail)
	}
	for si := range t.shards {
		t.shards[si].mu.Unlock()
	}
	t.count.Add(int64(-n))
	t.evictions.Add(uint64(n))
}

// unbind removes key's binding if it is to w (a request that bound the
// session elsewhere meanwhile keeps its binding).
func (t *affinityTable) unbind(key uint64, w *fleet.Worker) {
	sh := t.shard(key)
	sh.mu.Lock()
	i, ok := sh.m[key]
	if !ok || sh.ents[i].w != w {
		sh.mu.Unlock()
		return
	}
	sh.remove(i)
	sh.mu.Unlock()
	t.count.Add(-1)
}

// sweep removes bindings idle for longer than ttl.
func (t *affinityTable) sweep(now, ttl int64) int {
	removed := 0
	for si := range t.shards {
		sh := &t.shards[si]
		sh.mu.Lock()
		for sh.tail != 0 && now-sh.ents[sh.tail].last > ttl {
			sh.remove(sh.tail)
			removed++
		}
		sh.mu.Unlock()
	}
	t.count.Add(int64(-removed))
	return removed
}

// Lock must be held for the list operations below.

func (sh *affShard) unlink(i uint32)    { lruUnlink(&sh.lruList, sh.ents, i) }
func (sh *affShard) pushFront(i uint32) { lruPushFront(&sh.lruList, sh.ents, i) }
func (sh *affShard) moveFront(i uint32) { lruMoveFront(&sh.lruList, sh.ents, i) }

func (sh *affShard) remove(i uint32) {
	sh.unlink(i)
	delete(sh.m, sh.ents[i].key)
	sh.ents[i] = affEntry{links: links{next: sh.free}}
	sh.free = i
}

// affinityLookup is layer 1. It returns the bound worker when the binding is
// usable, else nil and the reason it fell through.
func (s *Scheduler) affinityLookup(c *compiled, avail []*fleet.Worker, r *Request, now int64, ls *loadStats) (*fleet.Worker, Reason) {
	sa := &c.cfg.SessionAffinity
	t := s.affinity(c)
	w := t.get(sessionKey(r), now, int64(sa.TTLSeconds*float64(time.Second)))
	if w == nil {
		return nil, ReasonAffinityNew
	}
	// avail holds only live, untried, breaker-available candidates for the
	// model: a bound worker that left, is open, or does not serve the model
	// is re-bound. One the gate passed over (its concurrency seats all
	// taken: full for now) keeps the binding, as soft mode's overload does;
	// this request goes elsewhere.
	if !w.Removed() && !contains(avail, w) && contains(r.gated, w) {
		s.m.affOverload.Inc()
		return nil, ReasonAffinityOverload
	}
	if w.Removed() || !contains(avail, w) {
		s.m.affRebind.Inc()
		return nil, ReasonAffinityRebind
	}
	if sa.Mode == "soft" && overloaded(w.Load.Requests.Load(), ls.average(avail), sa.SoftMaxLoadRatio) {
		s.m.affOverload.Inc()
		return nil, ReasonAffinityOverload
	}
	return w, ReasonNone
}

func (s *Scheduler) affinityBind(c *compiled, r *Request, w *fleet.Worker, now int64) {
	s.affinity(c).bind(sessionKey(r), w, now)
}

// sessionKey is the affinity table's key for r: its session and the model
// it names. A session that uses several models (Claude Code's main and
// small models, chat beside embeddings) has a worker for each: one
// binding for the session re-bound it to each model's worker in turn, and
// every turn of the main model lost its KV cache.
func sessionKey(r *Request) uint64 {
	return xxh3.HashSeed(r.Model, xxh3.Hash(r.SessionID))
}

func contains(ws []*fleet.Worker, w *fleet.Worker) bool {
	for _, x := range ws {
		if x == w {
			return true
		}
	}
	return false
}

// BoundWorker returns the worker r's session is bound to (for r's model),
// refreshing the binding, or nil: affinity off, no session id, no binding
// or an expired one. The split proxy keeps a session on the entry it
// started on by it: a fleet worker (the local service) or the standalone
// worker of an external entry (BindSession).
func (s *Scheduler) BoundWorker(cfg *config.Config, r *Request) *fleet.Worker {
	if !cfg.SessionAffinity.Enabled || len(r.SessionID) == 0 {
		return nil
	}
	c := s.compiled(cfg)
	return s.affinity(c).get(sessionKey(r), s.Now(), int64(cfg.SessionAffinity.TTLSeconds*float64(time.Second)))
}

// BindSession binds r's session (for r's model) to w, a worker outside the
// fleet that served it (a split proxy's external entry); the scheduler
// binds sessions to fleet workers itself. A later pick for the local
// fleet finds w among no candidates and binds the worker it picks.
func (s *Scheduler) BindSession(cfg *config.Config, r *Request, w *fleet.Worker) {
	if !cfg.SessionAffinity.Enabled || len(r.SessionID) == 0 {
		return
	}
	s.affinityBind(s.compiled(cfg), r, w, s.Now())
}

// UnbindSession drops r's session's binding (for r's model) if it is to w,
// a worker that refused the session's request (a split proxy's external
// entry answering 429 or 5xx, or unreachable; or the fleet worker the
// local entry's last attempt went to): its next request is split again
// rather than sent back to it.
func (s *Scheduler) UnbindSession(cfg *config.Config, r *Request, w *fleet.Worker) {
	if !cfg.SessionAffinity.Enabled || len(r.SessionID) == 0 {
		return
	}
	if t := s.aff.Load(); t != nil {
		t.unbind(sessionKey(r), w)
	}
}
