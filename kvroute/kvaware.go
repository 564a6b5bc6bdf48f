package kvroute

import (
	"math"
	"sync"
	"sync/atomic"

	"github.com/VictoriaMetrics/metrics"

	"github.com/infera/infera/fleet"
	"github.com/infera/infera/radix"
	"github.com/infera/infera/sched"
)

// KVAwareConfig configures the kv-aware cost function.
type KVAwareConfig struct {
	// Index is the KV cache index fed by the kv package (required).
	Index *radix.Index
	// OverlapWeight (--kv-overlap-weight, default 1.0) weighs prefill work
	// against decode load: higher values chase cache hits harder.
	OverlapWeight float64
	// BlockSize is the KV block size in tokens the prompt hashes were
	// computed with (default 16).
	BlockSize int
	// Temperature (--router-temperature) > 0 samples from a softmax over
	// normalised costs instead of taking the minimum.
	Temperature float64
	// Seed seeds the sampler and tie breaker.
	Seed uint64
}

// KVAware picks the worker with the lowest
//
//	cost_w = weight * p_w + d_w
//	p_w = active prefill tokens on w / block size + (n - o_w)
//	d_w = active KV blocks on w + (n - o_w)
//
// for a request of n prompt blocks of which w caches the first o_w. Ties go
// to the worker with fewer indexed blocks, then to a random one. With a
// temperature it samples from softmax(-normalised cost / T).
type KVAware struct {
	idx    *radix.Index
	weight float64
	bs     float64
	temp   float64
	rng    atomic.Uint64
	pool   sync.Pool

	mOverlap *metrics.Histogram
	mKV      *metrics.Counter
	mDefer   *metrics.Counter
}

var (
	_ sched.KVScorer      = (*KVAware)(nil)
	_ sched.KVRatioScorer = (*KVAware)(nil)
)

// NewKVAware returns the cost function over cfg.Index.
func NewKVAware(cfg KVAwareConfig) *KVAware {
	if cfg.OverlapWeight < 0 || math.IsNaN(cfg.OverlapWeight) {
		cfg.OverlapWeight = 0
	}
	if cfg.BlockSize <= 0 {
		cfg.BlockSize = 16
	}
	if cfg.Temperature < 0 || math.IsNaN(cfg.Temperature) {
		cfg.Temperature = 0
	}
	k := &KVAware{
		idx: cfg.Index, weight: cfg.OverlapWeight, bs: float64(cfg.BlockSize), temp: cfg.Temperature,
		mOverlap: metrics.GetOrCreateHistogram(`infera_router_kv_overlap_ratio`),
		mKV:      metrics.GetOrCreateCounter(`infera_router_kv_decisions_total{result="kv"}`),
		mDefer:   metrics.GetOrCreateCounter(`infera_router_kv_decisions_total{result="defer"}`),
	}
	k.rng.Store(cfg.Seed)
	k.pool.New = func() any { return &kvScratch{} }
	return k
}

// kvScratch holds one decision's working set (pooled: PickKV does not
// allocate in steady state).
type kvScratch struct {
	ov      []radix.Overlap
	byIdx   []int32 // overlap by Worker.Idx; all zero between calls
	overlap []int
	prefill []int64 // load snapshot used for the cost
	blocks  []int64
	cost    []float64
	ties    []int
}

// random returns a uniformly distributed uint64 (splitmix64 over an atomic
// counter: lock-free and reproducible from the seed).
func (k *KVAware) random() uint64 {
	z := k.rng.Add(0x9e3779b97f4a7c15)
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

func (k *KVAware) uniform() float64 { return float64(k.random()>>11) / (1 << 53) }

// Decision reasons reported by Explain.
const (
	ReasonNoHashes  = "no block hashes: defer to load balancing"
	ReasonNoOverlap = "no candidate caches the prompt: defer to load balancing"
	ReasonLowest    = "lowest cost"
	ReasonTieCache  = "tie on cost: smaller cache"
	ReasonTieRand   = "tie on cost and cache: random"
	ReasonSampled   = "sampled by temperature"
)

// score fills s.overlap and s.cost for cands and returns the chosen index
// (-1 to defer) and the reason.
func (k *KVAware) score(cands []*fleet.Worker, hashes []uint64, s *kvScratch) (int, string) {
	if len(hashes) == 0 || len(cands) == 0 {
		return -1, ReasonNoHashes
	}
	n := len(hashes)
	s.ov = k.idx.Match(s.ov[:0], hashes)
	hiIdx := 0
	for _, w := range cands {
		hiIdx = max(hiIdx, w.Idx)
	}
	for len(s.byIdx) <= hiIdx {
		s.byIdx = append(s.byIdx, 0)
	}
	for _, o := range s.ov {
		if o.Worker < len(s.byIdx) {
			s.byIdx[o.Worker] = int32(o.Blocks)
		}
	}
	s.overlap, s.cost = s.overlap[:0], s.cost[:0]
	s.prefill, s.blocks = s.prefill[:0], s.blocks[:0]
	best := math.Inf(1)
	hi := math.Inf(-1)
	anyOverlap := false
	for _, w := range cands {
		o := 0
		if w.Idx >= 0 {
			o = int(s.byIdx[w.Idx])
		}
		miss := float64(n - o)
		pt, ab := w.Load.PrefillTokens.Load(), w.Load.Blocks.Load()
		p := float64(pt)/k.bs + miss
		d := float64(ab) + miss
		c := k.weight*p + d
		anyOverlap = anyOverlap || o > 0
		s.overlap = append(s.overlap, o)
		s.prefill = append(s.prefill, pt)
		s.blocks = append(s.blocks, ab)
		s.cost = append(s.cost, c)
		best = min(best, c)
		hi = max(hi, c)
	}
	for _, o := range s.ov {
		if o.Worker < len(s.byIdx) {
			s.byIdx[o.Worker] = 0
		}
	}
	if !anyOverlap {
		return -1, ReasonNoOverlap
	}
	if k.temp > 0 && hi > best {
		// Softmax over costs normalised to [0, 1]; the minimum has logit 0.
		var sum float64
		for _, c := range s.cost {
			sum += math.Exp(-(c - best) / (hi - best) / k.temp)
		}
		u := k.uniform() * sum
		for i, c := range s.cost {
			u -= math.Exp(-(c - best) / (hi - best) / k.temp)
			if u < 0 {
				return i, ReasonSampled
			}
		}
		return len(s.cost) - 1, ReasonSampled
	}
	s.ties = s.ties[:0]
	for i, c := range s.cost {
		if c == best {
			s.ties = append(s.ties, i)
		}
	}
	if len(s.ties) == 1 {
		return s.ties[0], ReasonLowest
	}
	// Tie: prefer the smaller cache (keeps caches balanced), then random.
	minCache := int64(math.MaxInt64)
	for _, i := range s.ties {
		minCache = min(minCache, k.idx.WorkerBlocks(cands[i].Idx))
	}
	j := 0
	for _, i := range s.ties {
		if k.idx.WorkerBlocks(cands[i].Idx) == minCache {
			s.ties[j] = i
			j++
		}
	}
	if j == 1 {
		return s.ties[0], ReasonTieCache
	}
	return s.ties[k.random()%uint64(j)], ReasonTieRand
}

// PickKV implements KVScorer: it returns the lowest-cost candidate, or nil
// (defer to load balancing) when the request has no block hashes or no
// candidate caches its first block.
func (k *KVAware) PickKV(cands []*fleet.Worker, r *sched.Request) *fleet.Worker {
	w, _ := k.PickKVRatio(cands, r)
	return w
}

// PickKVRatio implements KVRatioScorer: PickKV plus the share of the
// prompt's blocks the chosen worker caches.
func (k *KVAware) PickKVRatio(cands []*fleet.Worker, r *sched.Request) (*fleet.Worker, float64) {
	s := k.pool.Get().(*kvScratch)
	i, _ := k.score(cands, r.BlockHashes, s)
	var w *fleet.Worker
	var ratio float64
	if i >= 0 {
		w = cands[i]
		ratio = float64(s.overlap[i]) / float64(len(r.BlockHashes))
		k.mKV.Inc()
		k.mOverlap.Update(ratio)
	} else {
		k.mDefer.Inc()
	}
	k.pool.Put(s)
	return w, ratio
}

// KVCandidate is one candidate's terms in a KVExplanation.
type KVCandidate struct {
	Worker string `json:"worker"`
	Idx    int    `json:"idx"`
	// OverlapBlocks is o_w: leading prompt blocks the worker caches.
	OverlapBlocks int `json:"overlap_blocks"`
	// CachedBlocks is the worker's indexed cache size (tie breaker).
	CachedBlocks        int64 `json:"cached_blocks"`
	ActivePrefillTokens int64 `json:"active_prefill_tokens"`
	ActiveBlocks        int64 `json:"active_blocks"`
	// PrefillBlocks is p_w, DecodeBlocks d_w, Cost weight*p_w + d_w.
	PrefillBlocks float64 `json:"prefill_blocks"`
	DecodeBlocks  float64 `json:"decode_blocks"`
	Cost          float64 `json:"cost"`
	// Probability is the softmax probability (temperature > 0 only).
	Probability float64 `json:"probability,omitempty"`
}

// KVExplanation is the kv-aware decision for one request, for
// POST /debug/route.
type KVExplanation struct {
	Blocks        int           `json:"blocks"`
	BlockSize     int           `json:"block_size"`
	OverlapWeight float64       `json:"overlap_weight"`
	Temperature   float64       `json:"temperature,omitempty"`
	Candidates    []KVCandidate `json:"candidates"`
	// Choice is the chosen worker's ID, empty when kv-aware defers.
	Choice string `json:"choice"`
	Reason string `json:"reason"`
}

// Explain computes what PickKV would decide for r and why, without
// updating metrics (with a temperature the sample is a fresh draw).
func (k *KVAware) Explain(cands []*fleet.Worker, r *sched.Request) KVExplanation {
	s := &kvScratch{}
	i, reason := k.score(cands, r.BlockHashes, s)
	e := KVExplanation{
		Blocks: len(r.BlockHashes), BlockSize: int(k.bs), OverlapWeight: k.weight,
		Temperature: k.temp, Reason: reason, Candidates: []KVCandidate{},
	}
	if i >= 0 {
		e.Choice = cands[i].ID
	}
	if len(s.cost) != len(cands) {
		return e
	}
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, c := range s.cost {
		lo, hi = min(lo, c), max(hi, c)
	}
	var sum float64
	for j, w := range cands {
		miss := float64(len(r.BlockHashes) - s.overlap[j])
		c := KVCandidate{
			Worker: w.ID, Idx: w.Idx, OverlapBlocks: s.overlap[j], CachedBlocks: k.idx.WorkerBlocks(w.Idx),
			ActivePrefillTokens: s.prefill[j], ActiveBlocks: s.blocks[j],
			Cost: s.cost[j],
		}
		c.PrefillBlocks = float64(c.ActivePrefillTokens)/k.bs + miss
		c.DecodeBlocks = float64(c.ActiveBlocks) + miss
		if k.temp > 0 && hi > lo {
			c.Probability = math.Exp(-(s.cost[j] - lo) / (hi - lo) / k.temp)
			sum += c.Probability
		}
		e.Candidates = append(e.Candidates, c)
	}
	if sum > 0 {
		for j := range e.Candidates {
			e.Candidates[j].Probability /= sum
		}
	}
	return e
}
