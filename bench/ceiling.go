package bench

import (
	"fmt"

	"github.com/infera/infera/engine"
)

// Ceiling is the pooled-cache hit-rate ceiling of a workload on a fleet: the
// prefix cache hit rate of one LRU cache as large as the whole fleet's KV
// capacity, fed the same prompts in the same order, with no timing (each
// request's blocks are inserted and released before the next one arrives).
// It is the yardstick of routing quality, measured in the units of
// Summary.HitRate (cached prompt tokens / prompt tokens): a reference point,
// not an upper bound. Separate engine caches with affinity routing can beat
// it: one LRU evicts by fleet-wide recency, so a run of prompts that are
// not reused again pushes every session's prefix out of it, while each of
// N partitioned caches is flushed only by what is routed to it (on the
// Mooncake trace, 500 requests, 8 engines of 8,192 blocks, kv-aware reaches
// 112.8% of it and prefix 105.2%).
type Ceiling struct {
	// Blocks is the pooled cache's capacity (engines x blocks per engine).
	Blocks int `json:"blocks"`
	// BlockSize is the tokens per block.
	BlockSize int `json:"block_size"`
	// Requests counts the requests fed; Skipped those left out because they
	// cannot fit one engine (every engine rejects them).
	Requests     int     `json:"requests"`
	Skipped      int     `json:"skipped"`
	PromptTokens int64   `json:"prompt_tokens"`
	CachedTokens int64   `json:"cached_tokens"`
	HitRate      float64 `json:"hit_rate"`
}

// CeilingConfig configures PooledCeiling.
type CeilingConfig struct {
	// Engines and EngineBlocks give the fleet's capacity; BlockSize the
	// tokens per block (as the engines' --block-size).
	Engines, EngineBlocks, BlockSize int
	// Load renders prompts as Simulate and RunLoad do (API, prompt content).
	Load LoadConfig
	// Progress, if set, is called now and then with the requests done.
	Progress func(done, total int, cached, prompt int64)
}

// PooledCeiling computes the pooled-cache ceiling of reqs. It renders and
// tokenizes every prompt exactly as the simulator does and counts hits with
// the engine's own cache (engine.KVCache: full blocks, chained hashes, the
// last prompt token always computed, LRU eviction), so its hit rate is
// directly comparable with a simulated or real run's. Requests that need
// more blocks (prompt plus output) than one engine holds are skipped, as
// every engine rejects them.
func PooledCeiling(reqs []TraceRequest, c CeilingConfig) (Ceiling, error) {
	if c.Engines <= 0 || c.EngineBlocks <= 0 {
		return Ceiling{}, fmt.Errorf("ceiling: engines and blocks per engine must be positive, got %d and %d", c.Engines, c.EngineBlocks)
	}
	total := int64(c.Engines) * int64(c.EngineBlocks)
	if total > 1<<26 {
		return Ceiling{}, fmt.Errorf("ceiling: a pooled cache of %d blocks is larger than the engine cache supports (%d)", total, 1<<26)
	}
	cache, err := engine.NewKVCache(c.BlockSize, int(total), nil)
	if err != nil {
		return Ceiling{}, fmt.Errorf("ceiling: %w", err)
	}
	out := Ceiling{Blocks: int(total), BlockSize: c.BlockSize}
	pr := newPromptRenderer(&c.Load)
	bs := c.BlockSize
	var hashes []uint64
	var a engine.KVAlloc
	for i := range reqs {
		r := &reqs[i]
		if c.Progress != nil && i%256 == 0 {
			c.Progress(i, len(reqs), out.CachedTokens, out.PromptTokens)
		}
		_, prompt := pr.render(i, r)
		if len(prompt) == 0 || cache.BlocksFor(len(prompt)+max(r.OutputLength, 1)) > c.EngineBlocks {
			out.Skipped++
			continue
		}
		hashes = cache.AppendHashes(hashes[:0], prompt)
		// As the engine: at most (p-1)/bs blocks can be hits.
		if !cache.Allocate(&a, hashes, prompt, len(hashes), (len(prompt)-1)/bs) {
			return out, fmt.Errorf("BUG: ceiling cache of %d blocks cannot hold %d prompt blocks", total, len(hashes))
		}
		out.Requests++
		out.PromptTokens += int64(len(prompt))
		out.CachedTokens += int64(a.CachedBlocks() * bs)
		cache.Free(&a)
	}
	if out.PromptTokens > 0 {
		out.HitRate = float64(out.CachedTokens) / float64(out.PromptTokens)
	}
	return out, nil
}
