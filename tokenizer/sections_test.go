package tokenizer

import (
	"bytes"
	"slices"
	"strings"
	"testing"
)

// encodeUncached is Encode without the section cache: the reference the
// cached encodings are checked against.
func encodeUncached(h *HF, dst []uint32, text []byte) []uint32 { return h.encode(dst, text, false) }

// FuzzSectionCacheEncodesAsWithout: a text encodes the same the first time
// (sections stored) and the second (sections served from the cache) as
// without the cache.
func FuzzSectionCacheEncodesAsWithout(f *testing.F) {
	h := loadQwen3(f)
	f.Add(prompt4K())
	f.Add([]byte("<|im_start|>system\n" + strings.Repeat("You are a helpful assistant. ", 10) + "<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"))
	f.Add([]byte(strings.Repeat("e\u0301 caf\u00e9 ", 40)))
	f.Fuzz(func(t *testing.T, text []byte) {
		want := encodeUncached(h, nil, text)
		for pass := 0; pass < 2; pass++ {
			if got := h.Encode(nil, text); !slices.Equal(got, want) {
				t.Fatalf("pass %d: %q encodes to %v, without the section cache %v", pass, text, got, want)
			}
		}
	})
}

// The section cache holds at most sectionBudget bytes, however many large
// sections go through it.
func TestSectionCacheStaysWithinItsBudget(t *testing.T) {
	c := newSectionCache()
	ids := make([]uint32, 8<<10)
	for i := 0; i < 4*sectionSlots; i++ {
		s := bytes.Repeat([]byte{byte(i), byte(i >> 8), byte(i >> 16)}, 20<<10)
		c.put(s, ids)
		c.put(s, ids) // stored the second time
	}
	var held int64
	for i := range c.slots {
		if e := c.slots[i].Load(); e != nil {
			held += entrySize(e)
		}
	}
	if held != c.bytes.Load() || held > sectionBudget {
		t.Fatalf("entries hold %d bytes, accounted %d, budget %d", held, c.bytes.Load(), sectionBudget)
	}
	// Sections under sectionMin or over sectionMax are not cached.
	for range 2 {
		c.put(make([]byte, sectionMin-1), ids[:1])
		c.put(make([]byte, sectionMax+1), ids[:1])
	}
	if _, ok := c.get(make([]byte, sectionMin-1)); ok {
		t.Fatal("a short section was cached")
	}
	if _, ok := c.get(make([]byte, sectionMax+1)); ok {
		t.Fatal("a huge section was cached")
	}
}

// A section is cached the second time it is seen, so unique prompts
// allocate nothing, and served from the cache the third time.
func TestSectionCacheStoresOnTheSecondSighting(t *testing.T) {
	h := loadQwen3(t)
	content := strings.Repeat("a section long enough to be cached, ", 8)
	text := []byte("<|im_start|>user\n" + content + "<|im_end|>\n")
	section := []byte("user\n" + content)
	h.sections.reset()
	for sighting := 1; sighting <= 3; sighting++ {
		if _, ok := h.sections.get(section); ok != (sighting == 3) {
			t.Fatalf("sighting %d: cached %v", sighting, ok)
		}
		h.Encode(nil, text)
	}
	// Unique sections of known words: nothing is stored, nothing allocated.
	texts := make([][]byte, 0, 512)
	for i := range cap(texts) {
		texts = append(texts, []byte("<|im_start|>user\n"+strings.Repeat("known words, ", 10+i)+"<|im_end|>\n"))
	}
	dst := encodeUncached(h, nil, texts[len(texts)-1]) // the words, warm
	i := 0
	if n := testing.AllocsPerRun(len(texts)-1, func() { dst = h.Encode(dst[:0], texts[i]); i++ }); n > 0.05 {
		t.Fatalf("%.2f allocations per unique prompt", n)
	}
}
