package radix

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"unsafe"
)

// NumShards is the number of shards (a power of two).
const NumShards = 64

// MaxWorkers bounds Worker ids (fleet.Worker.Idx); MaxRanks bounds dp ranks.
const (
	MaxWorkers = 4096
	MaxRanks   = 1 << 16
	maxWords   = MaxWorkers / 64
)

// ErrUnknownParent is returned by Store when the parent block is not indexed.
var ErrUnknownParent = errors.New("parent block is not in the index")

// Overlap is one worker's cached prefix length in blocks. A worker holds a
// block when any of its dp ranks does.
type Overlap struct {
	Worker int
	Blocks int
}

func member(worker, rank int) uint32 { return uint32(worker)<<16 | uint32(rank) }

// Index is the sharded radix tree. The zero value is not usable; call New.
type Index struct {
	shards [NumShards]paddedShard
	// counts[w] is the number of blocks indexed for worker w (all ranks).
	counts [MaxWorkers]atomic.Int64
}

type paddedShard struct {
	shard
	_ [128 - unsafe.Sizeof(shard{})%128]byte
}

type shard struct {
	mu    sync.RWMutex
	roots kids
	loc   locMap
	// nodeTab resolves node ids (chunks of nodeChunk, so growing it never
	// copies the table); free holds the ids of deleted nodes for reuse.
	nodeTab [][]*node
	free    []uint32
	nodes   int
	// entries counts (block, member) pairs.
	entries int64
}

const nodeChunk = 1024

type node struct {
	keys    []uint64
	members []uint32 // sorted
	// mask has bit w set when a member of worker w (any rank) holds the
	// node: Match intersects these, one word per 64 workers.
	mask   []uint64
	parent *node
	kids   kids
	id     uint32 // index in shard.nodeTab, for refs
	dead   bool   // removed from the tree (purge skips it)
	// Inline storage for the common case of one member of one of the first
	// 64 workers: a new node costs one allocation less for each.
	member1 [1]uint32
	mask1   [1]uint64
}

// New returns an empty index.
func New() *Index {
	return &Index{}
}

func (x *Index) shardFor(root uint64) *shard {
	// Block hashes are xxh3 outputs: the high bits are as good as any.
	return &x.shards[root>>(64-6)&(NumShards-1)].shard
}

func checkMember(worker, rank int) error {
	if worker < 0 || worker >= MaxWorkers || rank < 0 || rank >= MaxRanks {
		return fmt.Errorf("radix: worker %d rank %d out of range", worker, rank)
	}
	return nil
}

// Store records that (worker, rank) caches hashes, a chain continuing below
// parent (hasParent false when hashes[0] starts a chain). root is the first
// block hash of the chain (hashes[0] when !hasParent); it picks the shard.
// Writes for one worker must be issued in order by one goroutine.
func (x *Index) Store(worker, rank int, root, parent uint64, hasParent bool, hashes []uint64) error {
	if len(hashes) == 0 {
		return nil
	}
	if err := checkMember(worker, rank); err != nil {
		return err
	}
	if !hasParent {
		root = hashes[0]
	}
	m := member(worker, rank)
	s := x.shardFor(root)
	s.mu.Lock()
	added, err := s.store(m, parent, hasParent, hashes)
	s.mu.Unlock()
	x.counts[worker].Add(added)
	return err
}

// Remove records that (worker, rank) evicted hashes, all of the chain that
// starts at root. Unknown hashes are ignored.
func (x *Index) Remove(worker, rank int, root uint64, hashes []uint64) {
	if len(hashes) == 0 || checkMember(worker, rank) != nil {
		return
	}
	m := member(worker, rank)
	s := x.shardFor(root)
	s.mu.Lock()
	removed := s.remove(m, hashes)
	s.mu.Unlock()
	x.counts[worker].Add(-removed)
}

// Clear drops every block of (worker, rank) (AllBlocksCleared).
func (x *Index) Clear(worker, rank int) {
	if checkMember(worker, rank) != nil || x.counts[worker].Load() == 0 {
		return // nothing of the worker's: no walk over the index
	}
	m := member(worker, rank)
	x.purge(worker, func(v uint32) bool { return v == m })
}

// RemoveWorker drops every block of worker, all ranks. It returns after the
// purge, so the caller may reuse the id at once.
func (x *Index) RemoveWorker(worker int) {
	if worker < 0 || worker >= MaxWorkers {
		return
	}
	x.purge(worker, func(v uint32) bool { return int(v>>16) == worker })
	x.counts[worker].Store(0)
}

func (x *Index) purge(worker int, drop func(uint32) bool) {
	for i := range x.shards {
		s := &x.shards[i].shard
		s.mu.Lock()
		n := s.purge(drop)
		s.mu.Unlock()
		x.counts[worker].Add(-n)
	}
}

// WorkerBlocks returns how many blocks are indexed for worker (all ranks).
func (x *Index) WorkerBlocks(worker int) int64 {
	if worker < 0 || worker >= MaxWorkers {
		return 0
	}
	return x.counts[worker].Load()
}

// Match appends to dst, for every worker holding at least the first block of
// hashes, the number of leading blocks of hashes it caches, in no particular
// order. It does not allocate when dst has room.
func (x *Index) Match(dst []Overlap, hashes []uint64) []Overlap {
	if len(hashes) == 0 {
		return dst
	}
	s := x.shardFor(hashes[0])
	s.mu.RLock()
	dst = s.match(dst, hashes)
	s.mu.RUnlock()
	return dst
}

// Stats describes the index size.
type Stats struct {
	// Blocks is the number of distinct block hashes indexed.
	Blocks int
	// Entries is the number of (block, member) pairs.
	Entries int64
	// Nodes is the number of radix nodes.
	Nodes int
	// Bytes estimates the memory held by the index.
	Bytes int64
}

// Stats walks the shards (one read lock at a time) and returns totals.
func (x *Index) Stats() Stats {
	var st Stats
	for i := range x.shards {
		s := &x.shards[i].shard
		s.mu.RLock()
		st.Blocks += s.loc.len()
		st.Entries += s.entries
		st.Nodes += s.nodes
		st.Bytes += s.bytes()
		s.mu.RUnlock()
	}
	return st
}

// nodeBytes is the size of a node struct, for Stats.Bytes.
const nodeBytes = int64(unsafe.Sizeof(node{}))

// bytes estimates shard memory. s.mu must be held.
func (s *shard) bytes() int64 {
	b := s.loc.bytes() + int64(len(s.nodeTab))*nodeChunk*8 + int64(cap(s.free))*4
	var walk func(n *node)
	walk = func(n *node) {
		b += nodeBytes + int64(cap(n.keys))*8 + int64(cap(n.members))*4 + n.kids.bytes()
		n.kids.each(walk)
	}
	s.roots.each(walk)
	return b
}
