package sched

import (
	"math"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/zeebo/xxh3"

	"github.com/infera/infera/config"
	"github.com/infera/infera/fleet"
)

const (
	prefixShards = 64
	// prefixGroup consecutive blocks of a prompt share a shard, the one of
	// the group's first block, so that a match takes one read lock per
	// group instead of one per block. A block's key names its whole prefix,
	// so every prompt that has a block has its group's first block too:
	// the shard is a function of the block alone.
	prefixGroup = 8
	// prefixSlots is how many workers one block remembers; beyond it the
	// oldest recorded worker is forgotten (a prefix on every worker of a
	// large fleet still reads as "seen" for the hit-rate ceiling).
	prefixSlots = 6
	// maxPrefixBlocks bounds the blocks indexed per prompt (1 MiB at 128 B).
	maxPrefixBlocks = 8192
	// prefixSeed starts the hash chain.
	prefixSeed = 0x9E3779B97F4A7C15
	// mapBytesPerEntry approximates the rest of one block's heap cost: a Go
	// map entry of map[uint64]uint32 (key, value, control byte, load-factor
	// slack) and the slab's growth slack. With it the accounted size (96 B)
	// matches the measured heap cost (BenchmarkPrefixIndexInsert, 89-106 B).
	mapBytesPerEntry = 40
	// prefixEntryBytes is the accounted memory of one indexed block.
	prefixEntryBytes = int64(unsafe.Sizeof(pentry{})) + mapBytesPerEntry
	// memCheckEvery is how many new blocks trigger a memory check at most,
	// besides once per memCheckInterval.
	memCheckEvery    = 4096
	memCheckInterval = int64(time.Second)
)

// prefixIndex is the persistent prompt-prefix index: which worker has seen
// which prompt prefix, at block granularity.
//
// A prompt is cut into blocks of blockSize bytes; block i's key is
// xxh3(block i, seed = key of block i-1), so one key names the whole prefix
// up to that block and the flat hash map is an implicit prefix tree. A
// shorter tail than a block is not indexed. Keys are spread over 64 shards
// (padded) by groups of 8 consecutive blocks, each shard a map into a slab
// of entries with an intrusive LRU list. Matches take one read lock per
// group and stamp the access time atomically; eviction
// gives an entry touched since it was listed a second chance (CLOCK), so the
// list approximates LRU without write locks on the read path.
type prefixIndex struct {
	blockSize int
	epoch     int64 // unix ns; entry times are seconds since epoch

	shards [prefixShards]pshard

	entries   atomic.Int64
	budget    atomic.Int64 // bytes the index may use; MaxInt64 = unlimited
	evictTTL  atomic.Uint64
	evictMem  atomic.Uint64
	memNext   atomic.Int64 // unix ns of the next memory check
	sinceMem  atomic.Int64 // new blocks since the last memory check
	memMu     sync.Mutex   // serializes memory checks
	lastLimit atomic.Int64 // last computed eviction threshold (bytes)
}

type pshard struct {
	mu   sync.RWMutex
	m    map[uint64]uint32
	ents []pentry // ents[0] is the nil sentinel
	lruList
	free uint32
	_    [64]byte
}

type pentry struct {
	key    uint64
	last   uint32 // seconds since epoch of the last access (atomic)
	listed uint32 // seconds since epoch when moved to the list head
	links
	n   uint8 // used slots
	idx [prefixSlots]uint16
	ser [prefixSlots]uint16
}

func newPrefixIndex(blockSize int, now int64) *prefixIndex {
	p := &prefixIndex{blockSize: blockSize, epoch: now}
	p.budget.Store(math.MaxInt64)
	p.lastLimit.Store(-1)
	for i := range p.shards {
		p.shards[i].m = map[uint64]uint32{}
		p.shards[i].ents = make([]pentry, 1, 64)
	}
	return p
}

// prefix returns the index for the config's block size, starting a fresh
// one when the block size changed (old keys never match new blocks). A stale
// config with another block size gets nil (no prefix layer for it).
func (s *Scheduler) prefix(c *compiled, now int64) *prefixIndex {
	bs := c.cfg.PrefixIndex.BlockSize
	p := s.pidx.Load()
	if p != nil && p.blockSize == bs {
		return p
	}
	if bs <= 0 || c.stale.Load() {
		return nil
	}
	np := newPrefixIndex(bs, now)
	if s.pidx.CompareAndSwap(p, np) {
		if p != nil { // its evictions stay counted
			s.pidxEvicted[0].Add(p.evictTTL.Load())
			s.pidxEvicted[1].Add(p.evictMem.Load())
		}
		return np
	}
	return s.pidx.Load()
}

func (p *prefixIndex) sec(now int64) uint32 {
	d := (now - p.epoch) / int64(time.Second)
	if d < 0 {
		return 0
	}
	if d > math.MaxUint32 {
		return math.MaxUint32
	}
	return uint32(d)
}

func (p *prefixIndex) shard(h uint64) *pshard { return &p.shards[h>>58] }

// blockShard is the shard of block k of the chain hs: its group's first
// block's.
func (p *prefixIndex) blockShard(hs []uint64, k int) *pshard {
	return p.shard(hs[k&^(prefixGroup-1)])
}

// Len returns the number of indexed blocks.
func (p *prefixIndex) Len() int64 { return p.entries.Load() }

// Bytes returns the accounted memory of the index.
func (p *prefixIndex) Bytes() int64 { return p.entries.Load() * prefixEntryBytes }

// AppendTokenPrompt appends the prompt text the prefix layer hashes for a
// prompt given as token ids (completions): each id as 4 little-endian
// bytes, so prompts sharing leading tokens share leading bytes, however
// their JSON was spaced. Without it such prompts had no text to hash and
// the prefix layer never saw them.
func AppendTokenPrompt(dst []byte, ids []uint32) []byte {
	for _, id := range ids {
		dst = append(dst, byte(id), byte(id>>8), byte(id>>16), byte(id>>24))
	}
	return dst
}

// hashAndMatch fills r.phash with the chained hashes of r.Prompt's full
// blocks and returns how many leading blocks any worker has seen; r.psnap
// gets the workers of each of those blocks as the match saw them. With a
// deadline it checks the clock every 64 blocks and returns late=true past it.
func (p *prefixIndex) hashAndMatch(r *Request, now, deadline int64, clock func() int64) (depth int, late bool) {
	defer func() { r.pdepth = depth }()
	bs := p.blockSize
	n := min(len(r.Prompt)/bs, maxPrefixBlocks)
	hs := r.phash[:0]
	if cap(hs) < n {
		hs = make([]uint64, 0, n)
	}
	snaps := r.psnap[:0]
	h := uint64(prefixSeed)
	matching := true
	t := p.sec(now)
	var sh *pshard // read-locked while matching within a group
	for i := 0; i < n; i++ {
		h = xxh3.HashSeed(r.Prompt[i*bs:(i+1)*bs], h)
		hs = append(hs, h)
		if matching {
			if i%prefixGroup == 0 {
				if sh != nil {
					sh.mu.RUnlock()
				}
				sh = p.shard(h)
				sh.mu.RLock()
			}
			snaps = append(snaps, pslots{})
			if sh.touch(h, t, &snaps[len(snaps)-1]) {
				depth++
			} else {
				snaps = snaps[:len(snaps)-1]
				matching = false
				sh.mu.RUnlock()
				sh = nil
			}
		}
		if deadline != 0 && i&63 == 63 && clock() > deadline {
			if sh != nil {
				sh.mu.RUnlock()
			}
			r.phash, r.psnap = hs[:0], snaps[:0]
			return depth, true
		}
	}
	if sh != nil {
		sh.mu.RUnlock()
	}
	r.phash, r.psnap = hs, snaps
	return depth, false
}

// pslots is a block's workers as one read saw them.
type pslots struct {
	n        uint8
	idx, ser [prefixSlots]uint16
}

func (s *pslots) has(idx, ser uint16) bool {
	for k := 0; k < int(s.n); k++ {
		if s.idx[k] == idx && s.ser[k] == ser {
			return true
		}
	}
	return false
}

// touch reports whether block key h is indexed, stamps its access time and
// copies its workers into snap. The caller holds sh's read lock.
func (sh *pshard) touch(h uint64, t uint32, snap *pslots) bool {
	i, ok := sh.m[h]
	if ok {
		e := &sh.ents[i]
		if atomic.LoadUint32(&e.last) < t {
			atomic.StoreUint32(&e.last, t)
		}
		snap.n, snap.idx, snap.ser = e.n, e.idx, e.ser
	}
	return ok
}

// slots copies the workers recorded for block k of the chain hs into
// idx/ser.
func (p *prefixIndex) slots(hs []uint64, k int, idx, ser *[prefixSlots]uint16) int {
	h := hs[k]
	sh := p.blockShard(hs, k)
	sh.mu.RLock()
	i, ok := sh.m[h]
	n := 0
	if ok {
		e := &sh.ents[i]
		n = int(e.n)
		*idx, *ser = e.idx, e.ser
	}
	sh.mu.RUnlock()
	return n
}

// record notes that w was sent the prompt with block keys hs. snaps holds
// the leading blocks' workers as the match saw them (hashAndMatch's
// r.psnap): a block that already listed w is skipped without a lock (the
// match stamped its time). The snapshot is a few microseconds old: a block
// that lost w since (evicted, or w pushed out of its slots by newer
// workers) is missed here and recorded again by the next request that
// sends it to w. It reports whether a memory check is due.
func (p *prefixIndex) record(hs []uint64, snaps []pslots, w *fleet.Worker, now int64) bool {
	t := p.sec(now)
	idx, ser := uint16(w.Idx), uint16(w.Serial)
	var added int64
	budget := p.budget.Load()
	for k, h := range hs {
		if k < len(snaps) && snaps[k].has(idx, ser) {
			continue
		}
		sh := p.blockShard(hs, k)
		sh.mu.Lock()
		if i, ok := sh.m[h]; ok {
			e := &sh.ents[i]
			e.add(idx, ser)
			atomic.StoreUint32(&e.last, t)
			e.listed = t
			sh.moveFront(i)
			sh.mu.Unlock()
			continue
		}
		if budget != math.MaxInt64 {
			per := budget / prefixShards
			for int64(len(sh.m)+1)*prefixEntryBytes > per && sh.tail != 0 {
				if sh.evictOne() {
					added--
					p.evictMem.Add(1)
				}
			}
			if int64(len(sh.m)+1)*prefixEntryBytes > per {
				sh.mu.Unlock()
				continue // budget too small for even one block here
			}
		}
		i := sh.alloc()
		e := &sh.ents[i]
		*e = pentry{key: h, last: t, listed: t, n: 1}
		e.idx[0], e.ser[0] = idx, ser
		sh.m[h] = i
		sh.pushFront(i)
		sh.mu.Unlock()
		added++
	}
	if added != 0 {
		p.entries.Add(added)
	}
	return added > 0 && (p.sinceMem.Add(added) >= memCheckEvery || now >= p.memNext.Load())
}

// checkMemory reads process memory and the container limit and sets the
// index's byte budget: over the threshold it evicts the excess (LRU); under
// it the index may grow by the headroom. The threshold is the smaller of
// limit x memory_threshold_ratio and limit - reserved_memory_gb.
func (s *Scheduler) checkMemory(cfg *config.Config, p *prefixIndex, now int64) {
	if !p.memMu.TryLock() {
		return
	}
	defer p.memMu.Unlock()
	p.sinceMem.Store(0)
	p.memNext.Store(now + memCheckInterval)
	if s.Memory == nil {
		return
	}
	proc, limit, err := s.Memory()
	if err != nil || limit == 0 {
		return
	}
	pi := &cfg.PrefixIndex
	thr := math.Min(float64(limit)*pi.MemoryThresholdRatio, float64(limit)-pi.ReservedMemoryGB*(1<<30))
	if thr < 0 {
		thr = 0
	}
	p.lastLimit.Store(int64(thr))
	cur := p.Bytes()
	var budget int64
	if float64(proc) > thr {
		budget = max(cur-int64(float64(proc)-thr), 0)
		p.evictTo(budget)
	} else {
		budget = cur + int64(thr-float64(proc))
	}
	p.budget.Store(budget)
}

// evictTo evicts least recently used blocks until the index fits budget.
func (p *prefixIndex) evictTo(budget int64) {
	per := budget / prefixShards
	for si := range p.shards {
		sh := &p.shards[si]
		sh.mu.Lock()
		var n int64
		for int64(len(sh.m))*prefixEntryBytes > per && sh.tail != 0 {
			if sh.evictOne() {
				n++
			}
		}
		sh.mu.Unlock()
		p.entries.Add(-n)
		p.evictMem.Add(uint64(n))
	}
}

// sweep removes blocks not accessed for ttl seconds and refreshes the LRU
// order of touched ones. It returns how many blocks it removed.
func (p *prefixIndex) sweep(now int64, ttl float64) int {
	t := p.sec(now)
	ttlS := uint32(min(ttl, math.MaxUint32))
	removed := 0
	for si := range p.shards {
		sh := &p.shards[si]
		sh.mu.Lock()
		var n int64
		for steps := len(sh.m); sh.tail != 0 && steps > 0; steps-- {
			i := sh.tail
			e := &sh.ents[i]
			last := atomic.LoadUint32(&e.last)
			if t >= last && t-last > ttlS {
				sh.remove(i)
				n++
				continue
			}
			if last > e.listed {
				e.listed = last
				sh.moveFront(i)
				continue
			}
			break
		}
		sh.mu.Unlock()
		p.entries.Add(-n)
		p.evictTTL.Add(uint64(n))
		removed += int(n)
	}
	return removed
}

// forget takes w off the blocks of hs that an attempt of the request
// recorded it on (those snaps says it did not hold before): the attempt
// failed, so w did not cache the prompt, and the prefix layer sent the
// next requests with it to the worker that failed. A block left without
// workers goes.
func (p *prefixIndex) forget(hs []uint64, snaps []pslots, w *fleet.Worker) {
	idx, ser := uint16(w.Idx), uint16(w.Serial)
	for k, h := range hs {
		if k < len(snaps) && snaps[k].has(idx, ser) {
			continue
		}
		sh := p.blockShard(hs, k)
		sh.mu.Lock()
		if i, ok := sh.m[h]; ok {
			if e := &sh.ents[i]; e.drop(idx, ser) && e.n == 0 {
				sh.remove(i)
				p.entries.Add(-1)
			}
		}
		sh.mu.Unlock()
	}
}

// drop takes a worker off the entry and reports whether it was there.
// Lock must be held.
func (e *pentry) drop(idx, ser uint16) bool {
	for k := 0; k < int(e.n); k++ {
		if e.idx[k] == idx && e.ser[k] == ser {
			copy(e.idx[k:e.n], e.idx[k+1:e.n])
			copy(e.ser[k:e.n], e.ser[k+1:e.n])
			e.n--
			return true
		}
	}
	return false
}

func (e *pentry) has(idx, ser uint16) bool {
	for k := 0; k < int(e.n); k++ {
		if e.idx[k] == idx && e.ser[k] == ser {
			return true
		}
	}
	return false
}

// add records a worker, forgetting the oldest when all slots are used.
// Lock must be held.
func (e *pentry) add(idx, ser uint16) {
	if e.has(idx, ser) {
		return
	}
	if int(e.n) == prefixSlots {
		copy(e.idx[:], e.idx[1:])
		copy(e.ser[:], e.ser[1:])
		e.n--
	}
	e.idx[e.n], e.ser[e.n] = idx, ser
	e.n++
}

// Lock must be held for the shard methods below.

// evictOne removes the tail or gives it a second chance; it reports
// whether an entry was removed.
func (sh *pshard) evictOne() bool {
	i := sh.tail
	e := &sh.ents[i]
	if last := atomic.LoadUint32(&e.last); last > e.listed {
		e.listed = last
		sh.moveFront(i)
		// Every entry gets at most one second chance per access, so the
		// caller's loop terminates.
		return false
	}
	sh.remove(i)
	return true
}

func (sh *pshard) alloc() uint32 {
	if sh.free != 0 {
		i := sh.free
		sh.free = sh.ents[i].next
		return i
	}
	sh.ents = append(sh.ents, pentry{})
	return uint32(len(sh.ents) - 1)
}

func (sh *pshard) unlink(i uint32)    { lruUnlink(&sh.lruList, sh.ents, i) }
func (sh *pshard) pushFront(i uint32) { lruPushFront(&sh.lruList, sh.ents, i) }
func (sh *pshard) moveFront(i uint32) { lruMoveFront(&sh.lruList, sh.ents, i) }

func (sh *pshard) remove(i uint32) {
	sh.unlink(i)
	delete(sh.m, sh.ents[i].key)
	sh.ents[i] = pentry{links: links{next: sh.free}}
	sh.free = i
}

// idxSet is a bitset over Worker.Idx for fleets of up to 1024 workers.
type idxSet [16]uint64

func (b *idxSet) set(i int)      { b[i>>6] |= 1 << (i & 63) }
func (b *idxSet) has(i int) bool { return b[i>>6]&(1<<(i&63)) != 0 }

// prefixLayer is layer 2 over the prefix index: among candidates that have
// seen at least hit_rate_threshold of the prompt, the deepest match that
// passes the load guards (pending requests, load tolerance) wins; ties go
// to the least loaded.
func (s *Scheduler) prefixLayer(cfg *config.Config, p *prefixIndex, v *fleet.View, avail []*fleet.Worker, r *Request, depth int, ls *loadStats) (Decision, Reason) {
	if depth == 0 {
		return Decision{}, ReasonPrefixMiss
	}
	pc := &cfg.PrefixCache
	bs, plen := p.blockSize, len(r.Prompt)
	minDepth := int(math.Ceil(pc.HitRateThreshold * float64(plen) / float64(bs)))
	minDepth = max(minDepth, 1)
	if depth < minDepth {
		return Decision{}, ReasonPrefixBelow
	}
	small := v.MaxIdx <= len(idxSet{})*64
	var cands, seen idxSet
	if small {
		for _, w := range avail {
			cands.set(w.Idx)
		}
	}
	var idx, ser [prefixSlots]uint16
	anyHit := false
	for d := depth; d >= minDepth; d-- {
		var n int
		if d <= len(r.psnap) {
			sn := &r.psnap[d-1]
			n, idx, ser = int(sn.n), sn.idx, sn.ser
		} else {
			n = p.slots(r.phash, d-1, &idx, &ser)
		}
		var best *fleet.Worker
		var bestLoad int64
		for k := 0; k < n; k++ {
			i := int(idx[k])
			if i >= len(v.ByIdx) {
				continue
			}
			w := v.ByIdx[i]
			if w == nil || uint16(w.Serial) != ser[k] {
				continue
			}
			if small {
				if !cands.has(i) || seen.has(i) {
					continue
				}
				seen.set(i)
			} else if !contains(avail, w) {
				continue
			}
			anyHit = true
			if !s.passesGuards(pc, w, avail, ls) {
				continue
			}
			if l := w.Load.Requests.Load(); best == nil || l < bestLoad {
				best, bestLoad = w, l
			}
		}
		if best != nil {
			ratio := float64(d*bs) / float64(plen)
			return Decision{Worker: best, Layer: LayerPrefix, Reason: ReasonPrefixHit, Ratio: ratio}, ReasonNone
		}
	}
	if anyHit {
		s.m.prefixOverload.Inc()
		return Decision{}, ReasonPrefixOverload
	}
	return Decision{}, ReasonPrefixMiss
}

// passesGuards applies the prefix layer's load guards to a hit worker.
func (s *Scheduler) passesGuards(pc *config.PrefixCache, w *fleet.Worker, avail []*fleet.Worker, ls *loadStats) bool {
	if w.Load.Pending.Load() > int64(pc.PendingRequestThreshold) {
		return false
	}
	return !overloaded(w.Load.Requests.Load(), ls.average(avail), 1+pc.LoadToleranceFactor)
}

// kvLayer is layer 2 with the KV index as match basis (kv-aware policy): the
// scorer sees only candidates that pass the prefix layer's load guards, and
// when it reports a ratio, the hit rate threshold applies.
func (s *Scheduler) kvLayer(cfg *config.Config, avail []*fleet.Worker, r *Request, ls *loadStats) (Decision, bool) {
	pc := &cfg.PrefixCache
	if !pc.Enabled {
		// Plain kv-aware policy: the cost function weighs overlap against
		// load over every candidate by itself; the prefix-caching layer's
		// guards apply only when that layer is enabled.
		if rs, ok := s.KV.(KVRatioScorer); ok {
			if w, ratio := rs.PickKVRatio(avail, r); w != nil {
				return Decision{Worker: w, Layer: LayerKV, Reason: ReasonKVHit, Ratio: ratio}, true
			}
			return Decision{}, false
		}
		if w := s.KV.PickKV(avail, r); w != nil {
			return Decision{Worker: w, Layer: LayerKV, Reason: ReasonKVHit}, true
		}
		return Decision{}, false
	}
	ls.average(avail) // before partitioning
	// Partition guarded workers to the front (the order of avail only
	// affects this decision).
	n := 0
	for i, w := range avail {
		if s.passesGuards(pc, w, avail, ls) {
			avail[i], avail[n] = avail[n], avail[i]
			n++
		}
	}
	if n == 0 {
		return Decision{}, false
	}
	guarded := avail[:n]
	if rs, ok := s.KV.(KVRatioScorer); ok {
		w, ratio := rs.PickKVRatio(guarded, r)
		if w == nil || ratio < pc.HitRateThreshold {
			return Decision{}, false
		}
		return Decision{Worker: w, Layer: LayerKV, Reason: ReasonKVHit, Ratio: ratio}, true
	}
	if w := s.KV.PickKV(guarded, r); w != nil {
		return Decision{Worker: w, Layer: LayerKV, Reason: ReasonKVHit}, true
	}
	return Decision{}, false
}
