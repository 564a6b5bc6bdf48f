package engine

import (
	"fmt"
	"reflect"
	"strings"
	"sync"
	"testing"
)

// fakeSink records KV events as strings, in order.
type fakeSink struct {
	events []string
	closed bool
}

func (s *fakeSink) BlockStored(hashes []uint64, parent uint64, hasParent bool, tokens []uint32, blockSize int) {
	if len(tokens) != len(hashes)*blockSize {
		s.events = append(s.events, fmt.Sprintf("BAD stored: %d tokens for %d blocks", len(tokens), len(hashes)))
	}
	p := "-"
	if hasParent {
		p = fmt.Sprintf("%x", parent)
	}
	s.events = append(s.events, fmt.Sprintf("stored parent=%s %s", p, hexList(hashes)))
}

func (s *fakeSink) BlockRemoved(hashes []uint64) {
	s.events = append(s.events, "removed "+hexList(hashes))
}

func (s *fakeSink) AllCleared() { s.events = append(s.events, "cleared") }

func (s *fakeSink) Close() error { s.closed = true; return nil }

func hexList(h []uint64) string {
	var b strings.Builder
	for i, x := range h {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, "%x", x)
	}
	return b.String()
}

func seqTokens(start, n int) []uint32 {
	t := make([]uint32, n)
	for i := range t {
		t[i] = uint32(start + i)
	}
	return t
}

func TestHashBlocks(t *testing.T) {
	f := func(tokens []uint32, bs, want int) {
		t.Helper()
		h := HashBlocks(nil, tokens, bs)
		if len(h) != want {
			t.Fatalf("HashBlocks(%d tokens, bs=%d): %d hashes, want %d", len(tokens), bs, len(h), want)
		}
		c, err := NewKVCache(bs, 4, nil)
		if err != nil {
			t.Fatal(err)
		}
		if h2 := c.AppendHashes(nil, tokens); !reflect.DeepEqual(h, h2) && len(h) > 0 {
			t.Fatalf("HashBlocks and AppendHashes disagree: %v vs %v", h, h2)
		}
	}
	f(nil, 4, 0)
	f(seqTokens(0, 3), 4, 0)
	f(seqTokens(0, 4), 4, 1)
	f(seqTokens(0, 11), 4, 2)
	f(seqTokens(0, 200), 100, 2) // block larger than the stack buffer

	// Chaining: equal second blocks after different first blocks differ.
	a := append(seqTokens(0, 4), seqTokens(100, 4)...)
	b := append(seqTokens(50, 4), seqTokens(100, 4)...)
	ha, hb := HashBlocks(nil, a, 4), HashBlocks(nil, b, 4)
	if ha[1] == hb[1] {
		t.Fatalf("second block hash ignores its parent")
	}
	// Prefix stability.
	if hc := HashBlocks(nil, append(a, 7, 7, 7, 7), 4); hc[0] != ha[0] || hc[1] != ha[1] {
		t.Fatalf("hashes not prefix-stable")
	}
}

func TestKVCacheMatchAllocateFree(t *testing.T) {
	sink := &fakeSink{}
	c, err := NewKVCache(4, 10, sink)
	if err != nil {
		t.Fatal(err)
	}
	p := seqTokens(1, 10) // 2 full blocks + 2 tokens
	h := c.AppendHashes(nil, p)
	if c.Match(p) != 0 {
		t.Fatalf("empty cache matched")
	}
	var a KVAlloc
	// 10 prompt + 6 generated = 16 tokens = 4 blocks.
	if !c.Allocate(&a, h, p, 4, 2) {
		t.Fatalf("allocate failed")
	}
	if a.Blocks() != 4 || a.CachedBlocks() != 0 || c.Used() != 4 || c.Cached() != 2 || c.Evictable() != 0 {
		t.Fatalf("after allocate: blocks=%d cached=%d used=%d tableCached=%d evictable=%d", a.Blocks(), a.CachedBlocks(), c.Used(), c.Cached(), c.Evictable())
	}
	if got := c.Match(p); got != 2 {
		t.Fatalf("Match = %d, want 2", got)
	}
	// A second sequence sharing the prefix pins the same blocks.
	var b KVAlloc
	if !c.Allocate(&b, h, p, 3, 2) {
		t.Fatalf("second allocate failed")
	}
	if b.CachedBlocks() != 2 || c.Used() != 5 {
		t.Fatalf("shared allocate: cachedBlocks=%d used=%d, want 2, 5", b.CachedBlocks(), c.Used())
	}
	c.Free(&a)
	if c.Evictable() != 0 || c.Used() != 3 {
		t.Fatalf("after first free: evictable=%d used=%d, want 0, 3", c.Evictable(), c.Used())
	}
	c.Free(&b)
	if c.Evictable() != 2 || c.Used() != 2 || c.Match(p) != 2 {
		t.Fatalf("after second free: evictable=%d used=%d match=%d", c.Evictable(), c.Used(), c.Match(p))
	}
	want := []string{"stored parent=- " + hexList(h)}
	if !reflect.DeepEqual(sink.events, want) {
		t.Fatalf("events %q, want %q", sink.events, want)
	}
	// maxHit caps the reported hit.
	var d KVAlloc
	if !c.Allocate(&d, h, p, 2, 1) || d.CachedBlocks() != 1 {
		t.Fatalf("maxHit not applied: %d", d.CachedBlocks())
	}
	c.Free(&d)
	// Too big.
	if c.Allocate(&d, h, p, 11, 2) {
		t.Fatalf("allocated more than capacity")
	}
	if c.Allocate(&d, h, p[:5], 2, 2) {
		t.Fatalf("allocated with too few tokens")
	}
}

func TestKVCacheLRUEviction(t *testing.T) {
	sink := &fakeSink{}
	c, err := NewKVCache(2, 4, sink)
	if err != nil {
		t.Fatal(err)
	}
	x := seqTokens(10, 4) // 2 blocks
	y := seqTokens(20, 4)
	z := seqTokens(30, 4)
	hx, hy, hz := c.AppendHashes(nil, x), c.AppendHashes(nil, y), c.AppendHashes(nil, z)
	if !c.Insert(x) || !c.Insert(y) {
		t.Fatalf("insert failed")
	}
	if c.Used() != 4 || c.Evictable() != 4 {
		t.Fatalf("used=%d evictable=%d", c.Used(), c.Evictable())
	}
	// Touch x again (pin + free) so y becomes least recently used.
	var a KVAlloc
	if !c.Allocate(&a, hx, x, 2, 2) {
		t.Fatal("re-allocate x failed")
	}
	c.Free(&a)
	if !c.Insert(z) {
		t.Fatal("insert z failed")
	}
	if c.Match(y) != 0 || c.Match(x) != 2 || c.Match(z) != 2 {
		t.Fatalf("after eviction: match x=%d y=%d z=%d, want 2 0 2", c.Match(x), c.Match(y), c.Match(z))
	}
	if c.Evictions() != 2 {
		t.Fatalf("evictions=%d, want 2", c.Evictions())
	}
	// Eviction order within a chain: the tail block goes first.
	want := []string{
		"stored parent=- " + hexList(hx),
		"stored parent=- " + hexList(hy),
		"removed " + hexList([]uint64{hy[1], hy[0]}),
		"stored parent=- " + hexList(hz),
	}
	if !reflect.DeepEqual(sink.events, want) {
		t.Fatalf("events\n%q\nwant\n%q", sink.events, want)
	}
	// Pinned blocks are never evicted: pin x, then z must be evicted to fit y.
	if !c.Allocate(&a, hx, x, 2, 2) {
		t.Fatal("pin x failed")
	}
	if !c.Insert(y) || c.Match(x) != 2 || c.Match(z) != 0 {
		t.Fatalf("pinned x evicted or z kept: x=%d z=%d", c.Match(x), c.Match(z))
	}
	// Now nothing is evictable except y; a 3-block allocation cannot fit.
	var b KVAlloc
	if c.Allocate(&b, nil, nil, 3, 0) {
		t.Fatal("allocated 3 blocks with 2 evictable")
	}
	if !c.Allocate(&b, nil, nil, 2, 0) || c.Match(y) != 0 {
		t.Fatal("private allocation did not evict y")
	}
	c.Free(&b)
	c.Free(&a)
}

func TestKVCachePartialChainStored(t *testing.T) {
	// A chain whose middle block is already cached reports the missing runs
	// separately, each with its parent.
	sink := &fakeSink{}
	c, _ := NewKVCache(1, 8, sink)
	p := []uint32{1, 2, 3}
	h := c.AppendHashes(nil, p)
	var a KVAlloc
	if !c.Allocate(&a, h[1:2], p[1:2], 1, 0) { // block 1 alone
		t.Fatal("allocate failed")
	}
	c.Free(&a)
	sink.events = nil
	if !c.Allocate(&a, h, p, 3, 2) {
		t.Fatal("allocate failed")
	}
	if a.CachedBlocks() != 0 {
		t.Fatalf("prefix hit %d without block 0", a.CachedBlocks())
	}
	want := []string{
		"stored parent=- " + hexList(h[:1]),
		fmt.Sprintf("stored parent=%x %s", h[1], hexList(h[2:])),
	}
	if !reflect.DeepEqual(sink.events, want) {
		t.Fatalf("events %q, want %q", sink.events, want)
	}
	c.Free(&a)
	if c.Used() != 3 || c.Evictable() != 3 {
		t.Fatalf("used=%d evictable=%d", c.Used(), c.Evictable())
	}
}

func TestKVCacheClear(t *testing.T) {
	sink := &fakeSink{}
	c, _ := NewKVCache(2, 8, sink)
	p := seqTokens(1, 6)
	h := c.AppendHashes(nil, p)
	var a KVAlloc
	if !c.Allocate(&a, h, p, 4, 3) {
		t.Fatal("allocate failed")
	}
	c.Insert(seqTokens(100, 2))
	c.Clear()
	if c.Cached() != 0 || c.Match(p) != 0 || c.Used() != 4 {
		t.Fatalf("after clear: cached=%d match=%d used=%d, want 0 0 4", c.Cached(), c.Match(p), c.Used())
	}
	// The running sequence's blocks are private now: re-inserting the same
	// prompt allocates new blocks, freeing the old ones returns them.
	var b KVAlloc
	if !c.Allocate(&b, h, p, 3, 3) || b.CachedBlocks() != 0 || c.Used() != 7 {
		t.Fatalf("re-allocate after clear: cached=%d used=%d", b.CachedBlocks(), c.Used())
	}
	c.Free(&a)
	if c.Used() != 3 {
		t.Fatalf("used=%d after freeing cleared sequence, want 3", c.Used())
	}
	c.Free(&b)
	if c.Used() != 3 || c.Evictable() != 3 {
		t.Fatalf("used=%d evictable=%d, want 3 3", c.Used(), c.Evictable())
	}
	if got := sink.events[len(sink.events)-2]; got != "cleared" {
		t.Fatalf("events %q: no cleared before the re-store", sink.events)
	}
}

// lockedSink is fakeSink behind a mutex, for tests that read it from another
// goroutine than the cache owner.
type lockedSink struct {
	mu sync.Mutex
	fakeSink
}

func (s *lockedSink) BlockStored(hashes []uint64, parent uint64, hasParent bool, tokens []uint32, blockSize int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fakeSink.BlockStored(hashes, parent, hasParent, tokens, blockSize)
}

func (s *lockedSink) BlockRemoved(hashes []uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fakeSink.BlockRemoved(hashes)
}

func (s *lockedSink) AllCleared() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fakeSink.AllCleared()
}

func (s *lockedSink) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.fakeSink.Close()
}

// Reusing a cached prefix under pressure must not over-evict (regression:
// Allocate evicted one extra block per reused LRU block and panicked on an
// empty LRU).
func TestKVCacheReuseUnderPressure(t *testing.T) {
	c, err := NewKVCache(16, 4, nil)
	if err != nil {
		t.Fatal(err)
	}
	toks := make([]uint32, 32)
	for i := range toks {
		toks[i] = uint32(i + 1)
	}
	hashes := HashBlocks(nil, toks, 16)
	var a KVAlloc
	if !c.Allocate(&a, hashes, toks, 2, 2) {
		t.Fatal("first allocation failed")
	}
	c.Free(&a)
	var b KVAlloc
	if !c.Allocate(&b, hashes, toks, 4, 1) {
		t.Fatal("reuse allocation failed")
	}
	if b.CachedBlocks() != 1 || c.Used() != 4 {
		t.Fatalf("cached %d used %d", b.CachedBlocks(), c.Used())
	}
}
