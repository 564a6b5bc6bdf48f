package engine

import (
	"encoding/binary"
	"fmt"

	"github.com/zeebo/xxh3"
)

// KVCache is a paged KV cache of a fixed number of blocks with automatic
// prefix caching, as in vLLM:
//
//   - A block holds BlockSize tokens. Only full prompt blocks are hashed and
//     shared; partial tail blocks and the blocks of generated tokens are
//     private to their sequence.
//   - A full block's identity is a chained hash of its token ids and its
//     parent's hash (HashBlocks), so equal hashes mean equal prefixes.
//   - Blocks of running sequences are reference counted. A hashed block whose
//     count drops to zero stays cached and joins an LRU list; it is evicted,
//     least recently freed first, only when a new allocation needs room.
//   - Every change of the set of hashed blocks is reported, in order, to the
//     KVEventSink: BlockStored for newly inserted chains, BlockRemoved for
//     evictions, AllCleared for Clear.
//
// KVCache has no clock and no goroutines, and it is not safe for concurrent
// use: one owner (the Core, or a test) calls it. Slices handed to the sink are
// never modified afterwards, so the sink may keep them.
type KVCache struct {
	blockSize int
	capacity  int

	blocks    []kvBlock           // all blocks, preallocated
	free      []*kvBlock          // blocks holding nothing
	table     map[uint64]*kvBlock // hashed blocks by hash
	lru       kvList              // hashed blocks with refs == 0, front = most recently freed
	sink      KVEventSink         // nil: no events
	buf       []byte              // scratch for hashing one block
	evictions uint64
}

type kvBlock struct {
	hash       uint64
	refs       int32
	id         int32 // index in KVCache.blocks, never changes
	hashed     bool  // in table
	prev, next *kvBlock
}

// kvList is an intrusive doubly linked list of blocks with a sentinel.
type kvList struct {
	root kvBlock
	n    int
}

func (l *kvList) init() {
	l.root.prev = &l.root
	l.root.next = &l.root
	l.n = 0
}

func (l *kvList) pushFront(b *kvBlock) {
	b.prev = &l.root
	b.next = l.root.next
	l.root.next.prev = b
	l.root.next = b
	l.n++
}

func (l *kvList) remove(b *kvBlock) {
	b.prev.next = b.next
	b.next.prev = b.prev
	b.prev, b.next = nil, nil
	l.n--
}

func (l *kvList) back() *kvBlock {
	if l.n == 0 {
		return nil
	}
	return l.root.prev
}

// KVAlloc is the set of blocks one sequence holds. The zero value holds
// nothing. It is filled by KVCache.Allocate and emptied by KVCache.Free.
type KVAlloc struct {
	blocks []*kvBlock
	cached int // leading blocks that were already cached at allocation
}

// Blocks returns the number of blocks held.
func (a *KVAlloc) Blocks() int { return len(a.blocks) }

// CachedBlocks returns how many leading prompt blocks were prefix-cache hits
// when the allocation was made.
func (a *KVAlloc) CachedBlocks() int { return a.cached }

// appendIDs appends the physical ids of the first n blocks held (all when
// fewer are held).
func (a *KVAlloc) appendIDs(dst []int, n int) []int {
	for _, b := range a.blocks[:min(n, len(a.blocks))] {
		dst = append(dst, int(b.id))
	}
	return dst
}

// NewKVCache returns an empty cache of capacityBlocks blocks of blockSize
// tokens. sink may be nil.
func NewKVCache(blockSize, capacityBlocks int, sink KVEventSink) (*KVCache, error) {
	if blockSize <= 0 || blockSize > 1<<16 {
		return nil, fmt.Errorf("block size must be in [1, 65536], got %d", blockSize)
	}
	if capacityBlocks <= 0 || capacityBlocks > 1<<26 {
		return nil, fmt.Errorf("KV capacity must be in [1, 67108864] blocks, got %d", capacityBlocks)
	}
	c := &KVCache{
		blockSize: blockSize,
		capacity:  capacityBlocks,
		blocks:    make([]kvBlock, capacityBlocks),
		free:      make([]*kvBlock, 0, capacityBlocks),
		table:     make(map[uint64]*kvBlock),
		sink:      sink,
		buf:       make([]byte, 4*blockSize),
	}
	c.lru.init()
	// Free list is a stack; push in reverse so blocks are used in index order.
	for i := capacityBlocks - 1; i >= 0; i-- {
		c.blocks[i].id = int32(i)
		c.free = append(c.free, &c.blocks[i])
	}
	return c, nil
}

// BlockSize returns the number of tokens per block.
func (c *KVCache) BlockSize() int { return c.blockSize }

// Capacity returns the number of blocks.
func (c *KVCache) Capacity() int { return c.capacity }

// Used returns the number of blocks holding data: referenced by running
// sequences or kept as evictable prefix cache.
func (c *KVCache) Used() int { return c.capacity - len(c.free) }

// Cached returns the number of hashed (prefix-cache) blocks.
func (c *KVCache) Cached() int { return len(c.table) }

// Evictable returns the number of cached blocks no sequence references.
func (c *KVCache) Evictable() int { return c.lru.n }

// Evictions returns the number of blocks evicted so far.
func (c *KVCache) Evictions() uint64 { return c.evictions }

// BlocksFor returns the number of blocks n tokens occupy.
func (c *KVCache) BlocksFor(n int) int {
	if n <= 0 {
		return 0
	}
	return (n + c.blockSize - 1) / c.blockSize
}

// HashBlocks appends to dst the chained hashes of the full blocks of tokens
// (a trailing partial block is not hashed) for the given block size. Block i
// hashes its tokens (little-endian uint32s) with xxh3 seeded by the hash of
// block i-1, the first block by 0.
func HashBlocks(dst []uint64, tokens []uint32, blockSize int) []uint64 {
	if blockSize <= 0 {
		return dst
	}
	var stack [4 * 64]byte
	buf := stack[:0]
	if 4*blockSize > len(stack) {
		buf = make([]byte, 0, 4*blockSize)
	}
	var parent uint64
	for len(tokens) >= blockSize {
		parent = hashBlock(buf, parent, tokens[:blockSize])
		dst = append(dst, parent)
		tokens = tokens[blockSize:]
	}
	return dst
}

func hashBlock(buf []byte, parent uint64, tokens []uint32) uint64 {
	buf = buf[:4*len(tokens)]
	for i, t := range tokens {
		binary.LittleEndian.PutUint32(buf[4*i:], t)
	}
	return xxh3.HashSeed(buf, parent)
}

// AppendHashes appends the chained hashes of the full blocks of tokens.
func (c *KVCache) AppendHashes(dst []uint64, tokens []uint32) []uint64 {
	var parent uint64
	for len(tokens) >= c.blockSize {
		parent = hashBlock(c.buf, parent, tokens[:c.blockSize])
		dst = append(dst, parent)
		tokens = tokens[c.blockSize:]
	}
	return dst
}

// Match returns the number of leading full blocks of tokens present in the
// cache. It does not change the LRU order.
func (c *KVCache) Match(tokens []uint32) int {
	var parent uint64
	n := 0
	for len(tokens) >= c.blockSize {
		parent = hashBlock(c.buf, parent, tokens[:c.blockSize])
		if _, ok := c.table[parent]; !ok {
			break
		}
		n++
		tokens = tokens[c.blockSize:]
	}
	return n
}

// MatchHashes is Match for precomputed block hashes (see AppendHashes).
func (c *KVCache) MatchHashes(hashes []uint64) int {
	for i, h := range hashes {
		if _, ok := c.table[h]; !ok {
			return i
		}
	}
	return len(hashes)
}

// CanAllocate reports whether Allocate(hashes, _, totalBlocks, maxHit) would
// succeed now.
func (c *KVCache) CanAllocate(hashes []uint64, totalBlocks int) bool {
	need, ok := c.need(hashes, totalBlocks)
	return ok && need <= len(c.free)+c.lru.n
}

// need returns how many blocks must be taken from the free list or evicted,
// after counting that pinning present blocks removes them from the LRU.
func (c *KVCache) need(hashes []uint64, totalBlocks int) (int, bool) {
	if totalBlocks < len(hashes) || totalBlocks > c.capacity {
		return 0, false
	}
	need := totalBlocks
	for _, h := range hashes {
		if b, ok := c.table[h]; ok {
			need-- // reused, not new
			if b.refs == 0 {
				need++ // leaves the evictable set
			}
		}
	}
	return need, true
}

// Allocate gives a sequence totalBlocks blocks, the first len(hashes) of which
// are its full prompt blocks with those chained hashes (tokens holds at least
// len(hashes)*BlockSize prompt tokens, used for BlockStored events). Prompt
// blocks already cached are shared; the others are inserted into the cache
// and reported to the sink; the remaining totalBlocks-len(hashes) blocks are
// private. Least recently freed cached blocks are evicted to make room. It
// returns false, changing nothing, when the blocks cannot be found.
// maxHit bounds the reported prefix hit (CachedBlocks) in blocks.
func (c *KVCache) Allocate(a *KVAlloc, hashes []uint64, tokens []uint32, totalBlocks, maxHit int) bool {
	if len(a.blocks) != 0 {
		panic("BUG: KVCache.Allocate on a non-empty KVAlloc")
	}
	if len(tokens) < len(hashes)*c.blockSize {
		return false
	}
	need, ok := c.need(hashes, totalBlocks)
	if !ok || need > len(c.free)+c.lru.n {
		return false
	}
	// Prefix hit, before anything changes.
	hit := c.MatchHashes(hashes)
	if hit > maxHit {
		hit = maxHit
	}
	if hit < 0 {
		hit = 0
	}
	// Pin present blocks first so eviction cannot take them.
	a.blocks = growBlocks(a.blocks, totalBlocks)
	for _, h := range hashes {
		b, ok := c.table[h]
		if ok {
			if b.refs == 0 {
				c.lru.remove(b)
			}
			b.refs++
		}
		a.blocks = append(a.blocks, b) // nil when missing
	}
	// Blocks still to take: everything not pinned above. (need counts
	// pinned blocks that left the LRU, which is right for the admission
	// check but would over-evict here.) Repeated missing hashes share one
	// block, so this may overestimate; never evict more than the LRU holds.
	pinned := 0
	for _, b := range a.blocks {
		if b != nil {
			pinned++
		}
	}
	if short := totalBlocks - pinned - len(c.free); short > 0 {
		c.evict(min(short, c.lru.n))
	}
	// Insert missing prompt blocks, reporting each contiguous run of new
	// blocks as one chain.
	runStart := -1
	for i, h := range hashes {
		if a.blocks[i] == nil {
			if b, ok := c.table[h]; ok { // repeated hash inserted above
				b.refs++
				a.blocks[i] = b
			}
		}
		if b := a.blocks[i]; b != nil {
			if runStart >= 0 {
				c.stored(hashes, tokens, runStart, i)
				runStart = -1
			}
			continue
		}
		b := c.take()
		b.hash = h
		b.hashed = true
		b.refs = 1
		c.table[h] = b
		a.blocks[i] = b
		if runStart < 0 {
			runStart = i
		}
	}
	if runStart >= 0 {
		c.stored(hashes, tokens, runStart, len(hashes))
	}
	for len(a.blocks) < totalBlocks {
		b := c.take()
		b.refs = 1
		a.blocks = append(a.blocks, b)
	}
	a.cached = hit
	return true
}

func growBlocks(s []*kvBlock, n int) []*kvBlock {
	if cap(s) >= n {
		return s[:0]
	}
	return make([]*kvBlock, 0, n)
}

func (c *KVCache) stored(hashes []uint64, tokens []uint32, from, to int) {
	if c.sink == nil {
		return
	}
	var parent uint64
	if from > 0 {
		parent = hashes[from-1]
	}
	c.sink.BlockStored(hashes[from:to:to], parent, from > 0, tokens[from*c.blockSize:to*c.blockSize:to*c.blockSize], c.blockSize)
}

func (c *KVCache) take() *kvBlock {
	n := len(c.free)
	if n == 0 {
		panic("BUG: KVCache free list empty after eviction")
	}
	b := c.free[n-1]
	c.free = c.free[:n-1]
	return b
}

// evict frees n least recently freed cached blocks and reports them.
func (c *KVCache) evict(n int) {
	var removed []uint64
	if c.sink != nil {
		removed = make([]uint64, 0, n)
	}
	for ; n > 0; n-- {
		b := c.lru.back()
		if b == nil {
			panic("BUG: KVCache evicting from an empty LRU")
		}
		c.lru.remove(b)
		delete(c.table, b.hash)
		if removed != nil {
			removed = append(removed, b.hash)
		}
		c.release(b)
		c.evictions++
	}
	if len(removed) > 0 {
		c.sink.BlockRemoved(removed)
	}
}

func (c *KVCache) release(b *kvBlock) {
	*b = kvBlock{id: b.id}
	c.free = append(c.free, b)
}

// Free returns a sequence's blocks. Private blocks become free; hashed blocks
// no one else references stay cached as evictable, the sequence's last block
// first in eviction order.
func (c *KVCache) Free(a *KVAlloc) {
	for i := len(a.blocks) - 1; i >= 0; i-- {
		b := a.blocks[i]
		a.blocks[i] = nil
		b.refs--
		switch {
		case b.refs > 0:
		case b.refs < 0:
			panic("BUG: KVCache block reference count below zero")
		case b.hashed:
			c.lru.pushFront(b)
		default:
			c.release(b)
		}
	}
	a.blocks = a.blocks[:0]
	a.cached = 0
}

// Insert caches the full blocks of tokens as if a sequence had prefilled and
// finished: it is Allocate of the prompt blocks followed by Free. It returns
// false when the blocks do not fit.
func (c *KVCache) Insert(tokens []uint32) bool {
	hashes := c.AppendHashes(nil, tokens)
	var a KVAlloc
	if !c.Allocate(&a, hashes, tokens, len(hashes), 0) {
		return false
	}
	c.Free(&a)
	return true
}

// Clear drops the whole prefix cache and reports AllCleared. Blocks still
// referenced by sequences stay allocated but become private to them.
func (c *KVCache) Clear() {
	for h, b := range c.table {
		delete(c.table, h)
		b.hashed = false
		if b.refs == 0 {
			c.lru.remove(b)
			c.release(b)
		}
	}
	if c.sink != nil {
		c.sink.AllCleared()
	}
}
