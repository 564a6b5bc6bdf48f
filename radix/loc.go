package radix

// ref locates a block: the id of its node (an index into shard.nodeTab) and
// its offset in the node's keys.
type ref struct {
	node uint32
	off  uint32
}

// locSlot holds a key as its mixed hash: mixHash is a bijection of uint64
// (each step of murmur3's finalizer is invertible), so equal mixed hashes
// mean equal keys, and key 0 mixes to 0, the empty mark. Keeping the mixed
// hash spares growth, splits and deletions from mixing every key they move.
type locSlot struct {
	h uint64
	ref
}

// locMap maps block hashes to refs. It is an extendible hash table: a
// directory indexed by the top bits of the mixed hash points at small
// open-addressing tables (linear probing, backward-shift deletion, no
// tombstones), and a full table splits in two. Growing therefore rehashes at
// most one table of maxTableSlots slots while the shard's write lock is held,
// however large the shard is. Slots hold no pointers, so the GC never scans
// them and writing them costs no write barrier.
//
// The zero value is an empty map. It is not safe for concurrent use.
type locMap struct {
	dir   []*locTable // len(dir) == 1<<depth; a table of local depth d fills 1<<(depth-d) entries
	depth uint8
	n     int
	// Key 0 marks empty slots; a block whose hash is 0 lives here.
	zero    ref
	hasZero bool
	// maxSlots bounds a table before it splits (tests shrink it).
	maxSlots int
}

type locTable struct {
	slots []locSlot // a power of two long
	used  int
	depth uint8 // local depth: the directory bits all its keys share
}

const (
	minTableSlots = 8
	maxTableSlots = 1024
)

// mixHash spreads any key over all 64 bits (murmur3's finalizer): block
// hashes from engines need not be uniformly distributed.
func mixHash(k uint64) uint64 {
	k ^= k >> 33
	k *= 0xff51afd7ed558ccd
	k ^= k >> 33
	k *= 0xc4ceb9fe1a85ec53
	k ^= k >> 33
	return k
}

func (m *locMap) len() int { return m.n }

func (m *locMap) table(h uint64) *locTable {
	if m.depth == 0 {
		return m.dir[0]
	}
	return m.dir[h>>(64-m.depth)]
}

// get returns key's ref.
func (m *locMap) get(key uint64) (ref, bool) {
	if key == 0 {
		return m.zero, m.hasZero
	}
	if m.dir == nil {
		return ref{}, false
	}
	h := mixHash(key)
	t := m.table(h)
	mask := uint64(len(t.slots) - 1)
	for i := h & mask; ; i = (i + 1) & mask {
		s := &t.slots[i]
		if s.h == h {
			return s.ref, true
		}
		if s.h == 0 {
			return ref{}, false
		}
	}
}

// set stores r under key.
func (m *locMap) set(key uint64, r ref) {
	p, _ := m.insert(key)
	*p = r
}

// insert returns the ref stored under key, adding key with a zero ref when
// it is absent (found false). The pointer is valid until the next insert or
// delete.
func (m *locMap) insert(key uint64) (p *ref, found bool) {
	if key == 0 {
		if !m.hasZero {
			m.hasZero = true
			m.zero = ref{}
			m.n++
			return &m.zero, false
		}
		return &m.zero, true
	}
	if m.dir == nil {
		if m.maxSlots == 0 {
			m.maxSlots = maxTableSlots
		}
		m.dir = []*locTable{{slots: make([]locSlot, minTableSlots)}}
	}
	h := mixHash(key)
	for {
		t := m.table(h)
		mask := uint64(len(t.slots) - 1)
		i := h & mask
		for ; ; i = (i + 1) & mask {
			s := &t.slots[i]
			if s.h == h {
				return &s.ref, true
			}
			if s.h == 0 {
				break
			}
		}
		// Absent. Keep the load at or below 3/4 (linear probing degrades
		// quickly above it); otherwise grow or split first and retry.
		if (t.used+1)*4 <= len(t.slots)*3 {
			t.slots[i] = locSlot{h: h}
			t.used++
			m.n++
			return &t.slots[i].ref, false
		}
		m.grow(t, h)
	}
}

// grow doubles t, or splits it when it is already maxSlots long. h is the
// mixed hash of a key that belongs to t.
func (m *locMap) grow(t *locTable, h uint64) {
	if len(t.slots) < m.maxSlots {
		old := t.slots
		t.slots, t.used = make([]locSlot, 2*len(old)), 0
		for _, s := range old {
			if s.h != 0 {
				t.put(s)
			}
		}
		return
	}
	if t.depth == m.depth {
		if m.depth == 64 {
			panic("BUG: radix: location map directory exhausted")
		}
		// Double the directory: entry i becomes entries 2i and 2i+1.
		dir := make([]*locTable, 2*len(m.dir))
		for i, x := range m.dir {
			dir[2*i], dir[2*i+1] = x, x
		}
		m.dir = dir
		m.depth++
	}
	// Split on the next hash bit below t's local depth: keys with the bit
	// set move to a new table of the same size, the others stay in t.
	bit := 63 - t.depth
	mask := uint64(len(t.slots) - 1)
	var start uint64 // a slot empty before the split: no probe run crosses it
	for t.slots[start].h != 0 {
		start++
	}
	hi := &locTable{slots: make([]locSlot, len(t.slots)), depth: t.depth + 1}
	t.depth++
	// One walk from start, in probe order: a key with the bit set moves to
	// hi; a key that stays moves to the first free slot from its home, in
	// case the keys moved out cut its probe run. That slot lies between its
	// home and where it is (no empty slot separated them, so start does
	// not), all already walked.
	for k := uint64(1); k < uint64(len(t.slots)); k++ {
		j := (start + k) & mask
		s := t.slots[j]
		if s.h == 0 {
			continue
		}
		t.slots[j] = locSlot{}
		if s.h>>bit&1 == 1 {
			hi.put(s)
			t.used--
			continue
		}
		i := s.h & mask
		for t.slots[i].h != 0 {
			i = (i + 1) & mask
		}
		t.slots[i] = s
	}
	// The directory entries of t: a run of 1<<(depth - old t.depth)
	// starting at h's top bits; the second half goes to hi.
	d := t.depth - 1
	span := 1 << (m.depth - d)
	first := 0
	if d > 0 {
		first = int(h>>(64-d)) * span
	}
	for i := first + span/2; i < first+span; i++ {
		m.dir[i] = hi
	}
}

// put adds s to t, which has room and does not hold s.h.
func (t *locTable) put(s locSlot) {
	mask := uint64(len(t.slots) - 1)
	i := s.h & mask
	for t.slots[i].h != 0 {
		i = (i + 1) & mask
	}
	t.slots[i] = s
	t.used++
}

// del removes key.
func (m *locMap) del(key uint64) {
	if key == 0 {
		if m.hasZero {
			m.hasZero, m.zero = false, ref{}
			m.n--
		}
		return
	}
	if m.dir == nil {
		return
	}
	h := mixHash(key)
	t := m.table(h)
	mask := uint64(len(t.slots) - 1)
	i := h & mask
	for {
		if t.slots[i].h == h {
			break
		}
		if t.slots[i].h == 0 {
			return
		}
		i = (i + 1) & mask
	}
	// Backward-shift deletion: move later slots of the probe run into the
	// hole when their home position allows it.
	for j := (i + 1) & mask; t.slots[j].h != 0; j = (j + 1) & mask {
		home := t.slots[j].h & mask
		// Move j to i unless home lies cyclically in (i, j].
		if (j-home)&mask >= (j-i)&mask {
			t.slots[i] = t.slots[j]
			i = j
		}
	}
	t.slots[i] = locSlot{}
	t.used--
	m.n--
}

// bytes estimates the memory held by m.
func (m *locMap) bytes() int64 {
	b := int64(len(m.dir)) * 8
	for i, t := range m.dir {
		// Count each table once: at the first of its directory entries.
		if i > 0 && m.dir[i-1] == t {
			continue
		}
		b += int64(len(t.slots))*16 + 48
	}
	return b
}
