package bench

import (
	"github.com/infera/infera/engine"
	"github.com/infera/infera/kv"
	"github.com/infera/infera/radix"
)

// simKVSink feeds one simulated engine's KV cache events into the router's
// radix index, as the kv package's subscriber does for real engines: stored
// chains are rehashed from their tokens with the router's hash (kv.HashBlocks)
// and indexed under the worker's Idx; removals and clears are mirrored.
// It runs on the simulator's single goroutine.
type simKVSink struct {
	ix     *radix.Index
	worker int
	// byEngine maps an engine block hash to its router hash and chain root.
	byEngine map[uint64]simBlock
	scratch  []uint64
	rm       map[uint64][]uint64 // root -> router hashes, scratch for removals
}

type simBlock struct{ router, root uint64 }

var _ engine.KVEventSink = (*simKVSink)(nil)

func newSimKVSink(ix *radix.Index, worker int) *simKVSink {
	return &simKVSink{ix: ix, worker: worker, byEngine: map[uint64]simBlock{}, rm: map[uint64][]uint64{}}
}

func (s *simKVSink) BlockStored(hashes []uint64, parent uint64, hasParent bool, tokens []uint32, blockSize int) {
	var rparent, root uint64
	if hasParent {
		p, ok := s.byEngine[parent]
		if !ok {
			return // parent evicted meanwhile: the real indexer drops such chains too
		}
		rparent, root = p.router, p.root
	}
	s.scratch = kv.HashBlocksSeed(s.scratch[:0], tokens, blockSize, rparent)
	if len(s.scratch) != len(hashes) {
		return
	}
	if !hasParent {
		root = s.scratch[0]
	}
	if err := s.ix.Store(s.worker, 0, root, rparent, hasParent, s.scratch); err != nil {
		return
	}
	for i, h := range hashes {
		s.byEngine[h] = simBlock{router: s.scratch[i], root: root}
	}
}

func (s *simKVSink) BlockRemoved(hashes []uint64) {
	for _, h := range hashes {
		b, ok := s.byEngine[h]
		if !ok {
			continue
		}
		delete(s.byEngine, h)
		s.rm[b.root] = append(s.rm[b.root], b.router)
	}
	for root, rs := range s.rm {
		s.ix.Remove(s.worker, 0, root, rs)
		delete(s.rm, root)
	}
}

func (s *simKVSink) AllCleared() {
	clear(s.byEngine)
	s.ix.Clear(s.worker, 0)
}

func (s *simKVSink) Close() error { return nil }
