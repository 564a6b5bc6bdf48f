package tokenizer

import (
	"hash/maphash"
	"sync"
	"sync/atomic"
)

// byteLevelAlphabet returns GPT-2's byte-to-rune table: printable bytes map
// to themselves, the rest to runes from U+0100 upwards.
func byteLevelAlphabet() (enc [256]rune, dec map[rune]byte) {
	dec = make(map[rune]byte, 256)
	n := 0
	for b := 0; b < 256; b++ {
		if (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff) {
			enc[b] = rune(b)
		} else {
			enc[b] = rune(256 + n)
			n++
		}
		dec[enc[b]] = byte(b)
	}
	return enc, dec
}

type merge struct {
	rank uint32
	id   uint32
}

func pairKey(a, b uint32) uint64 { return uint64(a)<<32 | uint64(b) }

// bpe is a byte-level BPE model over raw bytes.
type bpe struct {
	byteID [256]uint32
	merges map[uint64]merge
	cache  wordCache
	// whole, when the model sets ignore_merges, maps a pre-token found
	// whole in the vocab to its id, taken before any merge.
	whole map[string]uint32
}

// symbol is one node of the doubly linked list a word is merged in.
type symbol struct {
	id         uint32
	prev, next int32
	dead       bool
}

type candidate struct {
	rank, id  uint32
	pos       int32
	leftID    uint32
	rightID   uint32
	rightNode int32
}

// candHeap is a binary min-heap ordered by (rank, pos), written out to
// avoid container/heap's interface boxing.
type candHeap []candidate

func (h candHeap) less(i, j int) bool {
	if h[i].rank != h[j].rank {
		return h[i].rank < h[j].rank
	}
	return h[i].pos < h[j].pos
}

func (h *candHeap) push(c candidate) {
	*h = append(*h, c)
	s := *h
	for i := len(s) - 1; i > 0; {
		p := (i - 1) / 2
		if !s.less(i, p) {
			break
		}
		s[i], s[p] = s[p], s[i]
		i = p
	}
}

func (h *candHeap) pop() candidate {
	s := *h
	top := s[0]
	n := len(s) - 1
	s[0] = s[n]
	s = s[:n]
	for i := 0; ; {
		l, r, m := 2*i+1, 2*i+2, i
		if l < n && s.less(l, m) {
			m = l
		}
		if r < n && s.less(r, m) {
			m = r
		}
		if m == i {
			break
		}
		s[i], s[m] = s[m], s[i]
		i = m
	}
	*h = s
	return top
}

// scratch holds per-call buffers, pooled to avoid steady-state allocations.
type scratch struct {
	syms []symbol
	heap candHeap
	ids  []uint32
	norm []byte
}

var scratchPool = sync.Pool{New: func() any { return &scratch{} }}

// encodeWord appends the BPE ids of one pre-token.
func (m *bpe) encodeWord(dst []uint32, word []byte, sc *scratch) []uint32 {
	if len(word) == 1 {
		return append(dst, m.byteID[word[0]])
	}
	if m.whole != nil {
		if id, ok := m.whole[string(word)]; ok {
			return append(dst, id)
		}
	}
	if ids, ok := m.cache.get(word); ok {
		return append(dst, ids...)
	}
	start := len(dst)
	if len(word) <= 48 {
		dst = m.mergeSmall(dst, word, sc)
	} else {
		dst = m.mergeHeap(dst, word, sc)
	}
	m.cache.put(word, dst[start:])
	return dst
}

// mergeSmall merges by repeated linear scans: fastest for short words.
func (m *bpe) mergeSmall(dst []uint32, word []byte, sc *scratch) []uint32 {
	ids := sc.ids[:0]
	for _, b := range word {
		ids = append(ids, m.byteID[b])
	}
	for len(ids) > 1 {
		best := merge{rank: ^uint32(0)}
		at := -1
		for i := 0; i+1 < len(ids); i++ {
			if mg, ok := m.merges[pairKey(ids[i], ids[i+1])]; ok && mg.rank < best.rank {
				best, at = mg, i
			}
		}
		if at < 0 {
			break
		}
		ids[at] = best.id
		ids = append(ids[:at+1], ids[at+2:]...)
	}
	sc.ids = ids
	return append(dst, ids...)
}

// mergeHeap merges with a priority queue: O(n log n) for long words.
// Lower rank first, then leftmost, as Hugging Face's BPE does.
func (m *bpe) mergeHeap(dst []uint32, word []byte, sc *scratch) []uint32 {
	syms := sc.syms[:0]
	for i, b := range word {
		syms = append(syms, symbol{id: m.byteID[b], prev: int32(i - 1), next: int32(i + 1)})
	}
	syms[len(syms)-1].next = -1
	h := sc.heap[:0]
	push := func(i int32) {
		j := syms[i].next
		if j < 0 {
			return
		}
		if mg, ok := m.merges[pairKey(syms[i].id, syms[j].id)]; ok {
			h.push(candidate{rank: mg.rank, id: mg.id, pos: i, leftID: syms[i].id, rightID: syms[j].id, rightNode: j})
		}
	}
	for i := range syms {
		push(int32(i))
	}
	for len(h) > 0 {
		c := h.pop()
		l := &syms[c.pos]
		if l.dead || l.id != c.leftID || l.next != c.rightNode {
			continue
		}
		r := &syms[c.rightNode]
		if r.dead || r.id != c.rightID {
			continue
		}
		l.id = c.id
		r.dead = true
		l.next = r.next
		if r.next >= 0 {
			syms[r.next].prev = c.pos
		}
		if l.prev >= 0 {
			push(l.prev)
		}
		push(c.pos)
	}
	for i := int32(0); i >= 0; i = syms[i].next {
		dst = append(dst, syms[i].id)
	}
	sc.syms, sc.heap = syms, h
	return dst
}

// wordCache maps pre-tokens to their ids: a lock-free, 2-way set
// associative table of immutable entries. A lookup is one hash and at most
// two atomic loads (plain loads on amd64), so parallel encodes share it
// without touching a lock's cache line; a miss publishes a new entry,
// evicting one of the two in its set. Memory stays flat under adversarial
// input: cacheSlots entries of at most cacheMaxWord bytes.
type wordCache struct {
	slots *[cacheSlots]atomic.Pointer[cacheEntry]
	seed  maphash.Seed
}

// cacheEntry is an entry of the word and section caches: a key (a word, a
// section) and its ids, never modified once published.
type cacheEntry struct {
	key string
	ids []uint32
}

// lookup2 returns the ids of key in the 2-way set that starts at slot i.
func lookup2(slots []atomic.Pointer[cacheEntry], i int, key []byte) ([]uint32, bool) {
	if e := slots[i].Load(); e != nil && e.key == string(key) {
		return e.ids, true
	}
	if e := slots[i+1].Load(); e != nil && e.key == string(key) {
		return e.ids, true
	}
	return nil, false
}

// victim2 returns the slot of the 2-way set at i that a new entry takes: an
// empty one, else either, by a bit of the key's hash h.
func victim2(slots []atomic.Pointer[cacheEntry], i int, h uint64) int {
	switch {
	case slots[i].Load() == nil:
		return i
	case slots[i+1].Load() == nil:
		return i + 1
	}
	return i + int(h>>32)&1
}

const (
	cacheSlots   = 1 << 16
	cacheMaxWord = 256
)

func newWordCache() wordCache {
	return wordCache{slots: new([cacheSlots]atomic.Pointer[cacheEntry]), seed: maphash.MakeSeed()}
}

// set returns the index of the first slot of word's set.
func (c *wordCache) set(word []byte) (int, uint64) {
	h := maphash.Bytes(c.seed, word)
	return int(h & (cacheSlots - 2)), h
}

func (c *wordCache) get(word []byte) ([]uint32, bool) {
	if len(word) > cacheMaxWord || c.slots == nil {
		return nil, false
	}
	i, _ := c.set(word)
	return lookup2(c.slots[:], i, word)
}

func (c *wordCache) put(word []byte, ids []uint32) {
	if len(word) > cacheMaxWord || c.slots == nil {
		return
	}
	i, h := c.set(word)
	c.slots[victim2(c.slots[:], i, h)].Store(&cacheEntry{key: string(word), ids: append([]uint32(nil), ids...)})
}

// reset empties the cache (tests and benchmarks).
func (c *wordCache) reset() {
	if c.slots == nil {
		return
	}
	for i := range c.slots {
		c.slots[i].Store(nil)
	}
}
