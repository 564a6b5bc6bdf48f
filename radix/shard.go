package radix

import "math/bits"

// The methods below run with the shard's lock held (read lock for match,
// write lock for everything else).

// store adds m to hashes below parent and returns how many (block, m)
// entries were added.
func (s *shard) store(m uint32, parent uint64, hasParent bool, hashes []uint64) (int64, error) {
	before := s.entries
	// Phase 1: make sure the chain exists, extending m's own leaves in place
	// and creating new nodes (already holding m) where it diverges.
	var cur *node
	off := -1
	if hasParent {
		r, ok := s.loc.get(parent)
		if !ok {
			return 0, ErrUnknownParent
		}
		cur, off = s.node(r.node), int(r.off)
	}
	for hi, h := range hashes {
		if cur != nil && off+1 < len(cur.keys) {
			if cur.keys[off+1] == h {
				off++
				continue
			}
			s.split(cur, off+1)
		}
		// One probe finds the block (a child of cur, or anywhere when the
		// engine's parent disagrees with the hash chain: trust the hash)
		// or reserves its slot.
		p, found := s.loc.insert(h)
		if found {
			cur, off = s.node(p.node), int(p.off)
			continue
		}
		if cur != nil && cur.kids.len() == 0 && len(cur.members) == 1 && cur.members[0] == m {
			cur.keys = append(cur.keys, h)
			off = len(cur.keys) - 1
			*p = ref{cur.id, uint32(off)}
			s.entries++
			continue
		}
		n := s.newNode(cur) // touches no slot of s.loc: p stays valid
		// The rest of the event usually extends this new run.
		n.keys = append(make([]uint64, 0, max(4, len(hashes)-hi)), h)
		n.members = append(n.members, m)
		n.setBit(int(m >> 16))
		if cur == nil {
			s.roots.put(n)
		} else {
			cur.kids.put(n)
		}
		*p = ref{n.id, 0}
		s.entries++
		cur, off = n, 0
	}
	// Phase 2: add m to every run of blocks it does not hold yet.
	for i := 0; i < len(hashes); {
		r, ok := s.loc.get(hashes[i])
		if !ok {
			panic("BUG: radix: stored block vanished")
		}
		n, from := s.node(r.node), int(r.off)
		to, j := from+1, i+1
		for j < len(hashes) && to < len(n.keys) && n.keys[to] == hashes[j] {
			to++
			j++
		}
		s.addRange(n, from, to, m)
		i = j
	}
	return s.entries - before, nil
}

// remove drops m from hashes and returns how many entries it removed.
func (s *shard) remove(m uint32, hashes []uint64) int64 {
	before := s.entries
	for i := 0; i < len(hashes); {
		r, ok := s.loc.get(hashes[i])
		if !ok {
			i++
			continue
		}
		n, from := s.node(r.node), int(r.off)
		to, j := from+1, i+1
		for j < len(hashes) && to < len(n.keys) && n.keys[to] == hashes[j] {
			to++
			j++
		}
		s.removeRange(n, from, to, m)
		i = j
	}
	return before - s.entries
}

// purge drops every member for which drop is true, deleting emptied leaves.
func (s *shard) purge(drop func(uint32) bool) int64 {
	before := s.entries
	var walk func(n *node)
	walk = func(n *node) {
		for _, c := range n.kids.list(nil) {
			walk(c)
		}
		if n.dead {
			return // deleted or merged away while tidying a child
		}
		ms := n.members[:0]
		for _, v := range n.members {
			if drop(v) {
				s.entries -= int64(len(n.keys))
			} else {
				ms = append(ms, v)
			}
		}
		if len(ms) != len(n.members) {
			clear(n.members[len(ms):])
			n.members = ms
			clear(n.mask)
			for _, v := range ms {
				n.setBit(int(v >> 16))
			}
			s.tidy(n)
		}
	}
	for _, n := range s.roots.list(nil) {
		walk(n)
	}
	return before - s.entries
}

// split cuts n before keys[i] (0 < i < len(n.keys)); the tail becomes n's
// only child, holding n's children and a copy of its members.
func (s *shard) split(n *node, i int) {
	c := s.newNode(n)
	c.keys = n.keys[i:]
	c.members = append(c.members, n.members...)
	c.mask = append(c.mask, n.mask...)
	c.kids = n.kids
	n.keys = n.keys[:i:i]
	c.kids.each(func(g *node) { g.parent = c })
	n.kids = kids{}
	n.kids.put(c)
	for j, h := range c.keys {
		s.loc.set(h, ref{c.id, uint32(j)})
	}
}

func contains(ms []uint32, m uint32) (int, bool) {
	lo, hi := 0, len(ms)
	for lo < hi {
		mid := int(uint(lo+hi) >> 1)
		if ms[mid] < m {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	return lo, lo < len(ms) && ms[lo] == m
}

// addRange makes m hold n.keys[from:to], splitting n as needed.
func (s *shard) addRange(n *node, from, to int, m uint32) {
	if _, ok := contains(n.members, m); ok {
		return
	}
	if to < len(n.keys) {
		s.split(n, to)
	}
	if from > 0 {
		s.split(n, from)
		n = n.kids.only()
	}
	i, _ := contains(n.members, m)
	n.members = append(n.members, 0)
	copy(n.members[i+1:], n.members[i:])
	n.members[i] = m
	n.setBit(int(m >> 16))
	s.entries += int64(len(n.keys))
	s.tidy(n)
}

// removeRange drops m from n.keys[from:to], splitting n as needed.
func (s *shard) removeRange(n *node, from, to int, m uint32) {
	if _, ok := contains(n.members, m); !ok {
		return
	}
	if to < len(n.keys) {
		s.split(n, to)
	}
	if from > 0 {
		s.split(n, from)
		n = n.kids.only()
	}
	i, _ := contains(n.members, m)
	copy(n.members[i:], n.members[i+1:])
	n.members = n.members[:len(n.members)-1]
	n.fixBit(int(m >> 16))
	s.entries -= int64(len(n.keys))
	s.tidy(n)
}

func sameMembers(a, b []uint32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// tidy restores the tree's invariants around n after its members changed:
// empty leaves are deleted (up the path) and runs with equal members merged.
func (s *shard) tidy(n *node) {
	for n != nil && len(n.members) == 0 && n.kids.len() == 0 {
		p := n.parent
		for _, h := range n.keys {
			s.loc.del(h)
		}
		if p == nil {
			s.roots.del(n.keys[0])
		} else {
			p.kids.del(n.keys[0])
		}
		s.freeNode(n)
		n = p
	}
	if n == nil {
		return
	}
	// Merge n into its parent, then its only child into n, when members agree.
	if p := n.parent; p != nil && p.kids.len() == 1 && sameMembers(p.members, n.members) {
		s.absorb(p)
		n = p
	}
	if n.kids.len() == 1 {
		if c := n.kids.only(); sameMembers(c.members, n.members) {
			s.absorb(n)
		}
	}
}

// absorb merges n's only child into n.
func (s *shard) absorb(n *node) {
	c := n.kids.only()
	base := len(n.keys)
	n.keys = append(n.keys, c.keys...)
	for j, h := range c.keys {
		s.loc.set(h, ref{n.id, uint32(base + j)})
	}
	n.kids = c.kids
	n.kids.each(func(g *node) { g.parent = n })
	s.freeNode(c)
}

// node resolves a node id.
func (s *shard) node(id uint32) *node { return s.nodeTab[id/nodeChunk][id%nodeChunk] }

// newNode returns an empty node below parent with a fresh id.
func (s *shard) newNode(parent *node) *node {
	n := &node{parent: parent}
	n.members, n.mask = n.member1[:0], n.mask1[:0]
	if k := len(s.free); k > 0 {
		n.id = s.free[k-1]
		s.free = s.free[:k-1]
	} else {
		total := len(s.nodeTab) * nodeChunk
		if s.nodes+len(s.free) >= total {
			s.nodeTab = append(s.nodeTab, make([]*node, nodeChunk))
		}
		n.id = uint32(s.nodes)
	}
	s.nodeTab[n.id/nodeChunk][n.id%nodeChunk] = n
	s.nodes++
	return n
}

// freeNode marks n deleted and releases its id.
func (s *shard) freeNode(n *node) {
	n.dead = true
	s.nodeTab[n.id/nodeChunk][n.id%nodeChunk] = nil
	s.free = append(s.free, n.id)
	s.nodes--
}

func (n *node) setBit(w int) {
	for len(n.mask) <= w/64 {
		n.mask = append(n.mask, 0)
	}
	n.mask[w/64] |= 1 << (w % 64)
}

// fixBit clears worker w's bit unless another of its ranks is a member.
func (n *node) fixBit(w int) {
	i, _ := contains(n.members, uint32(w)<<16)
	if i < len(n.members) && int(n.members[i]>>16) == w {
		return
	}
	if w/64 < len(n.mask) {
		n.mask[w/64] &^= 1 << (w % 64)
	}
}

// match walks the longest path of hashes, appending overlaps to dst. The
// alive set (workers holding every block so far) is a bitset on the stack:
// each node costs one AND per 64 workers, whatever its member count.
func (s *shard) match(dst []Overlap, hashes []uint64) []Overlap {
	n := s.roots.get(hashes[0])
	if n == nil {
		return dst
	}
	var alive [maxWords]uint64
	words := copy(alive[:], n.mask)
	depth, i := 0, 0
	for {
		k := 0
		for k < len(n.keys) && i+k < len(hashes) && n.keys[k] == hashes[i+k] {
			k++
		}
		depth += k
		i += k
		if k < len(n.keys) || i == len(hashes) {
			break
		}
		c := n.kids.get(hashes[i])
		if c == nil {
			break
		}
		// Workers missing from c stop at depth.
		any := false
		for w := 0; w < words; w++ {
			var cm uint64
			if w < len(c.mask) {
				cm = c.mask[w]
			}
			gone := alive[w] &^ cm
			for gone != 0 {
				b := bits.TrailingZeros64(gone)
				gone &= gone - 1
				dst = append(dst, Overlap{Worker: w*64 + b, Blocks: depth})
			}
			alive[w] &= cm
			any = any || alive[w] != 0
		}
		if !any {
			return dst
		}
		n = c
	}
	for w := 0; w < words; w++ {
		for a := alive[w]; a != 0; a &= a - 1 {
			dst = append(dst, Overlap{Worker: w*64 + bits.TrailingZeros64(a), Blocks: depth})
		}
	}
	return dst
}
