package tokenizer

import (
	"fmt"
	"slices"
	"sync"
	"testing"
)

// TestWordCacheNeverReturnsAnotherWordsIDs fills the cache far beyond its
// size from several goroutines (sets collide and evict) and checks that
// every hit returns the ids stored for that very word.
func TestWordCacheNeverReturnsAnotherWordsIDs(t *testing.T) {
	c := newWordCache()
	idsOf := func(w string) []uint32 { return []uint32{uint32(len(w)), uint32(w[len(w)-1]), uint32(w[0])} }
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 3 * cacheSlots / 4 {
				w := fmt.Sprintf("w%d-%d", i, g%2) // goroutines 0/2 and 1/3 share words
				if ids, ok := c.get([]byte(w)); ok && !slices.Equal(ids, idsOf(w)) {
					errs <- fmt.Errorf("get(%q) = %v, want %v", w, ids, idsOf(w))
					return
				}
				c.put([]byte(w), idsOf(w))
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	hits := 0
	for i := range 3 * cacheSlots / 4 {
		for k := range 2 {
			w := fmt.Sprintf("w%d-%d", i, k)
			ids, ok := c.get([]byte(w))
			if ok && !slices.Equal(ids, idsOf(w)) {
				t.Fatalf("get(%q) = %v, want %v", w, ids, idsOf(w))
			}
			if ok {
				hits++
			}
		}
	}
	// 1.5 x cacheSlots words were stored: most slots must hold one.
	if hits < cacheSlots/2 || hits > cacheSlots {
		t.Fatalf("%d hits after storing %d words in %d slots", hits, 3*cacheSlots/2, cacheSlots)
	}
	long := make([]byte, cacheMaxWord+1)
	c.put(long, []uint32{1})
	if _, ok := c.get(long); ok {
		t.Fatal("a word longer than cacheMaxWord was cached")
	}
}
