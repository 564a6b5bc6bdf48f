package tokenizer

import (
	"hash/maphash"
	"sync/atomic"
)

// sectionCache maps the sections of a text between added tokens (a chat's
// message contents, mostly) to their ids. A conversation re-sends its
// history with every turn and a fleet's users share system prompts, so the
// same sections come back again and again; encoding one costs about 15 µs
// per KB even when its words are in the word cache. Like wordCache it is a
// lock-free, 2-way set associative table of immutable entries; a hit is
// one hash, a comparison and a copy of the ids. Memory is bounded by
// sectionBudget bytes of entries (text and ids); past it, a miss is not
// stored unless it replaces an entry at least as large. A section is
// stored the second time it is seen (seen remembers hashes), so a stream of
// unique prompts allocates nothing.
type sectionCache struct {
	slots *[sectionSlots]atomic.Pointer[cacheEntry]
	seen  *[4 * sectionSlots]atomic.Uint64
	seed  maphash.Seed
	bytes atomic.Int64 // held by entries in slots
}

// entrySize is the memory a section entry holds, as the budget counts it.
func entrySize(e *cacheEntry) int64 { return int64(len(e.key) + 4*len(e.ids) + 64) }

const (
	sectionSlots = 1 << 12
	// Sections shorter than sectionMin are cheaper to encode than to cache;
	// longer than sectionMax they would crowd the cache out.
	sectionMin    = 128
	sectionMax    = 64 << 10
	sectionBudget = 32 << 20
)

func newSectionCache() sectionCache {
	return sectionCache{slots: new([sectionSlots]atomic.Pointer[cacheEntry]),
		seen: new([4 * sectionSlots]atomic.Uint64), seed: maphash.MakeSeed()}
}

func (c *sectionCache) set(s []byte) (int, uint64) {
	h := maphash.Bytes(c.seed, s)
	return int(h & (sectionSlots - 2)), h
}

// get returns the ids of section s, if cached.
func (c *sectionCache) get(s []byte) ([]uint32, bool) {
	if len(s) < sectionMin || len(s) > sectionMax || c.slots == nil {
		return nil, false
	}
	i, _ := c.set(s)
	return lookup2(c.slots[:], i, s)
}

// put caches the ids of section s.
func (c *sectionCache) put(s []byte, ids []uint32) {
	if len(s) < sectionMin || len(s) > sectionMax || c.slots == nil {
		return
	}
	i, h := c.set(s)
	if sn := &c.seen[h&(4*sectionSlots-1)]; sn.Load() != h {
		sn.Store(h) // first sighting: remember, store the next time
		return
	}
	i = victim2(c.slots[:], i, h)
	e := &cacheEntry{key: string(s), ids: append([]uint32(nil), ids...)}
	old := c.slots[i].Load()
	grow := entrySize(e)
	if old != nil {
		grow -= entrySize(old)
	}
	if grow > 0 && c.bytes.Load()+grow > sectionBudget {
		return
	}
	if !c.slots[i].CompareAndSwap(old, e) {
		return // another encode stored this slot first
	}
	c.bytes.Add(grow)
}

// reset empties the cache (tests and benchmarks).
func (c *sectionCache) reset() {
	if c.slots == nil {
		return
	}
	for i := range c.slots {
		c.slots[i].Store(nil)
	}
	for i := range c.seen {
		c.seen[i].Store(0)
	}
	c.bytes.Store(0)
}
