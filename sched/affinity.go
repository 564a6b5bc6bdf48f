package sched

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/infera/infera/fleet"
	"github.com/zeebo/xxh3"
)

// affinityTable binds session ids to workers: a fixed power-of-two array of
// shards, each a map from the session id's xxh3 hash to a slot of a slab
// with an intrusive LRU list. A hit takes one shard lock and allocates
// nothing; slots of evicted entries are reused.
//
// max_entries is enforced per shard (ceil(max/shards)), so "oldest evicted"
// is exact within a shard. The shard count grows with max_entries (1 shard
// below 512 entries, up to 64), so small tables are exact LRU.
type affinityTable struct {
	maxEntries atomic.Int64
	perShard   atomic.Int64
	mask       uint64
	shards     []affShard
	count      atomic.Int64
	evictions  atomic.Uint64
}

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

func affinityShards(maxEntries int) int {
	n := 1
	for n < 64 && maxEntries/(n*2) >= 256 {
		n *= 2
	}
	return n
}

func newAffinityTable(maxEntries int) *affinityTable {
	n := affinityShards(maxEntries)
	t := &affinityTable{mask: uint64(n - 1), shards: make([]affShard, n)}
	t.maxEntries.Store(int64(maxEntries))
	t.perShard.Store(int64((maxEntries + n - 1) / n))
	for i := range t.shards {
		t.shards[i].m = map[uint64]uint32{}
		t.shards[i].ents = make([]affEntry, 1, 16)
	}
	return t
}

// affinity returns the table for cfg, replacing it when max_entries changes
// the shard layout (bindings are then rebuilt as sessions return).
func (s *Scheduler) affinity(c *compiled) *affinityTable {
	max := c.cfg.SessionAffinity.MaxEntries
	t := s.aff.Load()
	if t != nil && (c.stale.Load() || int(t.maxEntries.Load()) == max) {
		return t
	}
	if t != nil && affinityShards(max) == len(t.shards) {
		per := int64((max + len(t.shards) - 1) / len(t.shards))
		t.maxEntries.Store(int64(max))
		if t.perShard.Swap(per) > per {
			t.trim() // a lowered cap frees its memory now, not as entries expire
		}
		return t
	}
	nt := newAffinityTable(max)
	if s.aff.CompareAndSwap(t, nt) {
		return nt
	}
	return s.aff.Load()
}

func (t *affinityTable) shard(key uint64) *affShard {
	return &t.shards[(key^key>>32)&t.mask]
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

// bind binds key to w, evicting the shard's least recently used entry when
// the shard is full.
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
	added := int64(1)
	for per := int(t.perShard.Load()); len(sh.m) >= per && sh.tail != 0; {
		sh.remove(sh.tail)
		added--
		t.evictions.Add(1)
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
	t.count.Add(added)
}

// trim evicts each shard's least recently used bindings beyond the
// per-shard cap (after the cap was lowered).
func (t *affinityTable) trim() {
	per := int(t.perShard.Load())
	for si := range t.shards {
		sh := &t.shards[si]
		sh.mu.Lock()
		n := 0
		for len(sh.m) > per && sh.tail != 0 {
			sh.remove(sh.tail)
			n++
		}
		sh.mu.Unlock()
		t.count.Add(int64(-n))
		t.evictions.Add(uint64(n))
	}
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
	w := t.get(xxh3.Hash(r.SessionID), now, int64(sa.TTLSeconds*float64(time.Second)))
	if w == nil {
		return nil, ReasonAffinityNew
	}
	// avail holds only live, untried, breaker-available candidates for the
	// model: a bound worker that left, is open, or does not serve the model
	// is re-bound.
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
	s.affinity(c).bind(xxh3.Hash(r.SessionID), w, now)
}

func contains(ws []*fleet.Worker, w *fleet.Worker) bool {
	for _, x := range ws {
		if x == w {
			return true
		}
	}
	return false
}
