package bench

import (
	"math/rand/v2"
	"testing"

	"github.com/infera/infera/engine"
)

// completionsLoad renders a hash id as exactly 16 tokens, so trace blocks
// and 16-token KV blocks coincide.
func completionsLoad() LoadConfig {
	lc := DefaultLoadConfig()
	lc.API = "completions"
	lc.Prompt = PromptConfig{TokensPerBlock: 16, BytesPerToken: 4}
	return lc
}

func TestPooledCeilingCountsSharedPrefixes(t *testing.T) {
	reqs := []TraceRequest{
		{InputLength: 48, OutputLength: 4, HashIDs: []int64{1, 2, 3}},
		{InputLength: 48, OutputLength: 4, HashIDs: []int64{1, 2, 4}}, // 32 cached
		{InputLength: 48, OutputLength: 4, HashIDs: []int64{1, 2, 3}}, // 32: the last token is always computed
		{InputLength: 40, OutputLength: 4, HashIDs: []int64{1, 2, 5}}, // 32
		{InputLength: 4000, OutputLength: 4, HashIDs: []int64{9}},     // larger than one engine: skipped
	}
	c, err := PooledCeiling(reqs, CeilingConfig{Engines: 2, EngineBlocks: 100, BlockSize: 16, Load: completionsLoad()})
	if err != nil {
		t.Fatal(err)
	}
	if c.Requests != 4 || c.Skipped != 1 || c.PromptTokens != 184 || c.CachedTokens != 96 || c.Blocks != 200 {
		t.Fatalf("ceiling %+v", c)
	}
	if _, err := PooledCeiling(reqs, CeilingConfig{Engines: 0, EngineBlocks: 100, BlockSize: 16, Load: completionsLoad()}); err == nil {
		t.Fatal("zero engines accepted")
	}
	if _, err := PooledCeiling(reqs, CeilingConfig{Engines: 1 << 20, EngineBlocks: 1 << 20, BlockSize: 16, Load: completionsLoad()}); err == nil {
		t.Fatal("a pooled cache beyond the engine's limit accepted")
	}
}

// naiveLRU is a reference pooled cache: a recency list of block hashes.
type naiveLRU struct {
	cap  int
	list []uint64 // most recent first
}

func (n *naiveLRU) request(hashes []uint64, maxHit int) int {
	in := map[uint64]bool{}
	for _, h := range n.list {
		in[h] = true
	}
	hit := 0
	for hit < len(hashes) && in[hashes[hit]] {
		hit++
	}
	hit = min(hit, maxHit)
	// Pin the request's blocks, evict least recent others to fit it, then
	// release its blocks first block most recent.
	mine := map[uint64]bool{}
	for _, h := range hashes {
		mine[h] = true
	}
	rest := n.list[:0:0]
	for _, h := range n.list {
		if !mine[h] {
			rest = append(rest, h)
		}
	}
	if over := len(rest) + len(hashes) - n.cap; over > 0 {
		rest = rest[:len(rest)-over]
	}
	n.list = append(append([]uint64(nil), hashes...), rest...)
	return hit
}

// The ceiling agrees with a naive LRU over the same prompts.
func TestPooledCeilingMatchesNaiveLRU(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for iter := range 20 {
		var reqs []TraceRequest
		for range 60 {
			n := 1 + rng.IntN(6)
			ids := []int64{int64(rng.IntN(3))}
			for j := 1; j < n; j++ {
				ids = append(ids, ids[j-1]*7+int64(rng.IntN(3)))
			}
			reqs = append(reqs, TraceRequest{InputLength: n*16 - rng.IntN(8), OutputLength: 1, HashIDs: ids})
		}
		capacity := 4 + rng.IntN(30)
		lc := completionsLoad()
		c, err := PooledCeiling(reqs, CeilingConfig{Engines: 1, EngineBlocks: capacity, BlockSize: 16, Load: lc})
		if err != nil {
			t.Fatal(err)
		}
		ref := &naiveLRU{cap: capacity}
		pr := newPromptRenderer(&lc)
		kc, _ := engine.NewKVCache(16, 1, nil)
		var cached, prompt int64
		for i := range reqs {
			_, toks := pr.render(i, &reqs[i])
			if kc.BlocksFor(len(toks)+1) > capacity {
				continue
			}
			hashes := kc.AppendHashes(nil, toks)
			cached += int64(ref.request(hashes, (len(toks)-1)/16) * 16)
			prompt += int64(len(toks))
		}
		if c.CachedTokens != cached || c.PromptTokens != prompt {
			t.Fatalf("iter %d (capacity %d): ceiling %d/%d cached, naive LRU %d/%d", iter, capacity, c.CachedTokens, c.PromptTokens, cached, prompt)
		}
	}
}
