package kvroute

import (
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/zeebo/xxh3"

	"github.com/infera/infera/fleet"
	"github.com/infera/infera/radix"
	"github.com/infera/infera/sched"
)

// KVAwareConfig configures the kv-aware cost function. The zero value of
// every field but Index is a sensible default.
type KVAwareConfig struct {
	// Index is the KV cache index fed by the kv package (required).
	Index *radix.Index
	// OverlapWeight (--kv-overlap-weight, default 1.0) scales the duplicate
	// cost: what recomputing a prefix that another worker caches costs
	// beyond this request's own wait, DuplicateCost x OverlapWeight prefill
	// tokens per duplicated token on a full cache. 0 routes on predicted
	// time to first token alone; higher values keep requests with the
	// worker holding their prefix harder.
	OverlapWeight float64
	// BlockSize is the KV block size in tokens the prompt hashes were
	// computed with (default 16).
	BlockSize int
	// Temperature (--router-temperature) > 0 samples from a softmax over
	// normalised costs instead of taking the minimum.
	Temperature float64
	// Seed seeds the sampler.
	Seed uint64
	// LoadBound is epsilon of the bounded-load rule: a worker with more
	// requests in flight than (1+epsilon) x the candidates' mean plus
	// LoadSlack pays, per request over the bound, as much as prefilling the
	// whole prompt. 0 means DefaultLoadBound; negative disables the rule.
	LoadBound float64
	// LoadSlack is the bound's additive slack in requests (0 means
	// DefaultLoadSlack; negative means none), so that a worker is never
	// over the bound at the first few requests of an idle fleet.
	LoadSlack float64
	// LearnSpeed turns on learning each worker's prefill speed from
	// ObserveFirstToken (see there). Off, every worker is assumed to run at
	// DefaultPrefillSecondsPerToken.
	LearnSpeed bool
	// Clock returns the current time in unix nanoseconds for
	// ObserveFirstToken (default time.Now; the simulator passes its virtual
	// clock).
	Clock func() int64
}

// The engine time model the cost function assumes, in prefill-token
// equivalents: the cost model counts work in uncached prompt tokens (one
// token of prefill is about 80 µs for an 8B model on one H100, which decodes
// a step in 12 ms plus 0.15 ms per running sequence).
const (
	// BusyStepTokens is what a decoding worker adds to a new request's time
	// to first token: the rest of its current step plus the decode share of
	// the request's own prefill step (about 1.5 decode steps of 12 ms =
	// 18 ms = 225 tokens of prefill).
	BusyStepTokens = 225
	// RunningSeqTokens is the decode cost of each running sequence in every
	// step (0.15 ms: about 2 tokens of prefill).
	RunningSeqTokens = 2
	// DefaultPrefillSecondsPerToken converts token equivalents to seconds
	// until a worker's speed has been learned (80 µs per token).
	DefaultPrefillSecondsPerToken = 80e-6
	// DuplicateCost is the cost, in prefill tokens, of each cached token a
	// request would recompute (and store a second copy of) on a worker
	// whose cache is full, at --kv-overlap-weight 1. Measured with `infera
	// bench simulate` (docs/routing.md): below about 3 the Mooncake
	// conversation trace falls under 95% of the pooled-cache ceiling; TTFT
	// is flat from 1 to 8.
	DuplicateCost = 7
	// DefaultLoadBound and DefaultLoadSlack: a worker may carry up to 1.2 x
	// the mean requests in flight plus 2 before the bound costs anything.
	DefaultLoadBound = 0.2
	DefaultLoadSlack = 2
)

// KVAware routes a request to the worker where serving it costs least,
// where the cost is its predicted time to first token plus what the choice
// costs the rest of the fleet. For a request of N prompt tokens in n
// blocks, of which candidate w caches the first o_w (o_max on the best
// candidate), in prefill-token equivalents:
//
//	q_w  queued prefill tokens on w (dispatched requests without a first token)
//	u_w  = N - o_w*block_size: the tokens w would prefill for this request
//	d_w  = BusyStepTokens + RunningSeqTokens*running_w if w is decoding, else 0
//	ttft_w = speed_w * (q_w + u_w + d_w)
//	x_w  = (o_max - o_w) * block_size: cached tokens w would duplicate
//	p_w  = w's cache size / the largest any candidate was seen to hold (0 cold .. 1 full)
//	e_w  = max(0, inflight_w + 1 - ((1+LoadBound) * mean inflight + LoadSlack))
//	cost_w = ttft_w + speed * (DuplicateCost*weight * p_w * x_w + N * e_w)
//
// The lowest cost wins. A request thus leaves the worker holding its prefix
// when that worker's queue makes it slower than prefilling the prompt
// elsewhere by more than the duplicate's cost; onto a cold worker (p = 0)
// that is exactly when its predicted TTFT exceeds the other's. The bounded
// load term keeps requests per worker within about LoadBound of the mean.
// Ties (equal cost: idle workers and a prompt no one caches beyond a common
// prefix) go to the highest rendezvous hash of the first uncached block and
// the worker's id, so a new prefix lands on the same worker on every router.
// With a temperature it samples from softmax(-normalised cost / T). It
// defers (nil) when the request has no block hashes or no candidate caches
// its first block.
type KVAware struct {
	idx    *radix.Index
	weight float64
	bs     float64
	temp   float64
	dup    float64 // DuplicateCost * weight
	eps    float64 // LoadBound (< 0: off)
	slack  float64
	learn  bool
	clock  func() int64
	rng    atomic.Uint64
	pool   sync.Pool
	// hwms holds each worker's largest indexed cache size seen, by
	// Worker.Idx; the largest among the candidates estimates a full cache.
	hwms []hwmSlot
	// speeds holds learned prefill speeds by Worker.Idx.
	speeds []speedSlot

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
	if cfg.OverlapWeight < 0 || math.IsNaN(cfg.OverlapWeight) || math.IsInf(cfg.OverlapWeight, 0) {
		cfg.OverlapWeight = 0
	}
	if cfg.BlockSize <= 0 {
		cfg.BlockSize = 16
	}
	if cfg.Temperature < 0 || math.IsNaN(cfg.Temperature) {
		cfg.Temperature = 0
	}
	switch {
	case cfg.LoadBound == 0 || math.IsNaN(cfg.LoadBound):
		cfg.LoadBound = DefaultLoadBound
	case cfg.LoadBound < 0 || math.IsInf(cfg.LoadBound, 1):
		cfg.LoadBound = -1
	}
	switch {
	case cfg.LoadSlack == 0 || math.IsNaN(cfg.LoadSlack) || math.IsInf(cfg.LoadSlack, 0):
		cfg.LoadSlack = DefaultLoadSlack
	case cfg.LoadSlack < 0:
		cfg.LoadSlack = 0
	}
	if cfg.Clock == nil {
		cfg.Clock = func() int64 { return time.Now().UnixNano() }
	}
	k := &KVAware{
		idx: cfg.Index, weight: cfg.OverlapWeight, bs: float64(cfg.BlockSize), temp: cfg.Temperature,
		dup: DuplicateCost * cfg.OverlapWeight, eps: cfg.LoadBound, slack: cfg.LoadSlack,
		learn: cfg.LearnSpeed, clock: cfg.Clock,
		mOverlap: metrics.GetOrCreateHistogram(`infera_router_kv_overlap_ratio`),
		mKV:      metrics.GetOrCreateCounter(`infera_router_kv_decisions_total{result="kv"}`),
		mDefer:   metrics.GetOrCreateCounter(`infera_router_kv_decisions_total{result="defer"}`),
	}
	k.hwms = make([]hwmSlot, radix.MaxWorkers)
	if k.learn {
		k.speeds = make([]speedSlot, radix.MaxWorkers)
	}
	k.rng.Store(cfg.Seed)
	k.pool.New = func() any { return &kvScratch{} }
	return k
}

// hwmSlot is one worker's largest indexed cache size seen.
type hwmSlot struct {
	serial atomic.Uint32
	blocks atomic.Int64
}

// highWater records that w caches cb blocks now and returns the most it has
// been seen to cache (a new worker on a reused Idx starts over).
func (k *KVAware) highWater(w *fleet.Worker, cb int64) int64 {
	if w.Idx < 0 || w.Idx >= len(k.hwms) {
		return cb
	}
	sl := &k.hwms[w.Idx]
	if sl.serial.Load() != w.Serial {
		sl.serial.Store(w.Serial)
		sl.blocks.Store(cb)
		return cb
	}
	for {
		h := sl.blocks.Load()
		if cb <= h {
			return h
		}
		if sl.blocks.CompareAndSwap(h, cb) {
			return cb
		}
	}
}

// LoadBoundFromFlag maps a --kv-load-bound value, where 0 is a real setting
// (no tolerance above the mean), to KVAwareConfig.LoadBound, where 0 means
// the default.
func LoadBoundFromFlag(v float64) float64 {
	if v == 0 {
		return math.SmallestNonzeroFloat64
	}
	return v
}

// kvScratch holds one decision's working set (pooled: PickKV does not
// allocate in steady state).
type kvScratch struct {
	ov       []radix.Overlap
	byIdx    []int32 // overlap by Worker.Idx; all zero between calls
	overlap  []int
	queued   []int64 // q_w
	running  []int64 // sequences decoding on w
	inflight []int64
	uncached []int64 // u_w
	dupTok   []int64 // x_w
	pressure []float64
	speed    []float64 // seconds per token
	decode   []float64
	ttft     []float64 // seconds
	excess   []float64
	cost     []float64
	tokens   int64  // N
	key      uint64 // rendezvous key: the first uncached block's hash
	bound    float64
	meanSpd  float64
}

// random returns a uniformly distributed uint64 (splitmix64 over an atomic
// counter: lock-free and reproducible from the seed).
func (k *KVAware) random() uint64 { return mix64(k.rng.Add(0x9e3779b97f4a7c15)) }

func mix64(z uint64) uint64 {
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
	ReasonTieHash   = "tie on cost: highest rendezvous hash of the first uncached block"
	ReasonSampled   = "sampled by temperature"
)

// score fills s for cands and returns the chosen index (-1 to defer) and
// the reason.
func (k *KVAware) score(cands []*fleet.Worker, r *sched.Request, s *kvScratch) (int, string) {
	hashes := r.BlockHashes
	if len(hashes) == 0 || len(cands) == 0 {
		return -1, ReasonNoHashes
	}
	n := len(hashes)
	bs := int64(k.bs)
	N := max(int64(r.PromptTokens), int64(n)*bs)
	maxHit := int((N - 1) / bs) // the last prompt token is always computed
	s.tokens = N
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
	s.overlap = s.overlap[:0]
	omax := 0
	for _, w := range cands {
		o := 0
		if w.Idx >= 0 {
			o = int(s.byIdx[w.Idx])
		}
		omax = max(omax, o)
		s.overlap = append(s.overlap, o)
	}
	for _, o := range s.ov {
		if o.Worker < len(s.byIdx) {
			s.byIdx[o.Worker] = 0
		}
	}
	if omax == 0 {
		return -1, ReasonNoOverlap
	}
	s.key = hashes[min(omax, n-1)]
	hmax := int64(min(omax, maxHit))

	// Fleet terms: in-flight requests, the cache-size high-water mark and
	// the mean speed.
	s.queued, s.running, s.inflight, s.uncached = s.queued[:0], s.running[:0], s.inflight[:0], s.uncached[:0]
	s.dupTok, s.pressure, s.speed, s.decode = s.dupTok[:0], s.pressure[:0], s.speed[:0], s.decode[:0]
	s.ttft, s.excess, s.cost = s.ttft[:0], s.excess[:0], s.cost[:0]
	var hwm int64
	var sumR int64
	var sumSpd float64
	known := 0
	for _, w := range cands {
		inf := max(w.Load.Requests.Load(), 0)
		sumR += inf
		s.inflight = append(s.inflight, inf)
		cb := k.idx.WorkerBlocks(w.Idx)
		hwm = max(hwm, k.highWater(w, cb))
		s.pressure = append(s.pressure, float64(cb))
		spd := k.speedOf(w)
		s.speed = append(s.speed, spd)
		if spd > 0 {
			sumSpd += spd
			known++
		}
	}
	for i, cb := range s.pressure {
		s.pressure[i] = 0
		if hwm > 0 {
			s.pressure[i] = min(1, cb/float64(hwm))
		}
	}
	// Workers whose speed is not known yet run at the mean of the others.
	s.meanSpd = DefaultPrefillSecondsPerToken
	if known > 0 {
		s.meanSpd = sumSpd / float64(known)
	}
	for i, v := range s.speed {
		if v == 0 {
			s.speed[i] = s.meanSpd
		}
	}
	s.bound = math.Inf(1)
	if k.eps >= 0 {
		s.bound = (1+k.eps)*float64(sumR+1)/float64(len(cands)) + k.slack
	}

	best, hi := math.Inf(1), math.Inf(-1)
	for i, w := range cands {
		hit := int64(min(s.overlap[i], maxHit))
		u := N - hit*bs
		q := max(w.Load.PrefillTokens.Load(), 0)
		run := max(s.inflight[i]-max(w.Load.Pending.Load(), 0), 0)
		d := 0.0
		if run > 0 {
			d = BusyStepTokens + RunningSeqTokens*float64(run)
		}
		x := (hmax - hit) * bs
		ex := max(0, float64(s.inflight[i]+1)-s.bound)
		ttft := s.speed[i] * (float64(q) + float64(u) + d)
		c := ttft + s.meanSpd*(k.dup*s.pressure[i]*float64(x)+float64(N)*ex)
		s.queued = append(s.queued, q)
		s.running = append(s.running, run)
		s.uncached = append(s.uncached, u)
		s.decode = append(s.decode, d)
		s.dupTok = append(s.dupTok, x)
		s.excess = append(s.excess, ex)
		s.ttft = append(s.ttft, ttft)
		s.cost = append(s.cost, c)
		best, hi = min(best, c), max(hi, c)
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
	choice, ties := -1, 0
	var top uint64
	for i, c := range s.cost {
		if c != best {
			continue
		}
		ties++
		if choice < 0 {
			choice = i
			continue
		}
		if ties == 2 {
			top = rendezvous(s.key, cands[choice])
		}
		if h := rendezvous(s.key, cands[i]); h > top {
			choice, top = i, h
		}
	}
	if ties > 1 {
		return choice, ReasonTieHash
	}
	return choice, ReasonLowest
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
	i, _ := k.score(cands, r, s)
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

// KVCandidate is one candidate's terms in a KVExplanation. Token counts
// are prefill-token equivalents; see KVAware for the model.
type KVCandidate struct {
	Worker string `json:"worker"`
	Idx    int    `json:"idx"`
	// OverlapBlocks is o_w: leading prompt blocks the worker caches.
	OverlapBlocks int `json:"overlap_blocks"`
	// CachedBlocks is the worker's indexed cache size and CachePressure
	// p_w, that size over the largest seen.
	CachedBlocks  int64   `json:"cached_blocks"`
	CachePressure float64 `json:"cache_pressure"`
	// ActivePrefillTokens is q_w, the prefill tokens queued on the worker;
	// ActiveBlocks the KV blocks of its active requests; InFlight its
	// requests in flight and RunningRequests those past their first token.
	ActivePrefillTokens int64 `json:"active_prefill_tokens"`
	ActiveBlocks        int64 `json:"active_blocks"`
	InFlight            int64 `json:"in_flight"`
	RunningRequests     int64 `json:"running_requests"`
	// UncachedTokens is u_w, the prompt tokens the worker would prefill;
	// DecodeTokens d_w, its decode interference.
	UncachedTokens int64   `json:"uncached_tokens"`
	DecodeTokens   float64 `json:"decode_tokens"`
	// PrefillUsPerToken is the worker's (learned or assumed) prefill speed
	// and PredictedTTFTMs the predicted time to first token.
	PrefillUsPerToken float64 `json:"prefill_us_per_token"`
	PredictedTTFTMs   float64 `json:"predicted_ttft_ms"`
	// DuplicateTokens is x_w, the cached tokens the worker would recompute
	// and duplicate; DuplicateCostMs their cost.
	DuplicateTokens int64   `json:"duplicate_tokens"`
	DuplicateCostMs float64 `json:"duplicate_cost_ms"`
	// LoadExcess is e_w, requests over the load bound; LoadCostMs its cost.
	LoadExcess float64 `json:"load_excess"`
	LoadCostMs float64 `json:"load_cost_ms"`
	// CostMs is the total (lowest wins).
	CostMs float64 `json:"cost_ms"`
	// Rendezvous is the tie-break hash (highest wins among equal costs).
	Rendezvous string `json:"rendezvous"`
	// Probability is the softmax probability (temperature > 0 only).
	Probability float64 `json:"probability,omitempty"`
}

// KVExplanation is the kv-aware decision for one request, for
// POST /debug/route.
type KVExplanation struct {
	Blocks        int     `json:"blocks"`
	BlockSize     int     `json:"block_size"`
	PromptTokens  int64   `json:"prompt_tokens"`
	OverlapWeight float64 `json:"overlap_weight"`
	// DuplicateCost is DuplicateCost x OverlapWeight.
	DuplicateCost float64 `json:"duplicate_cost"`
	// LoadBound is the in-flight requests a worker may carry before the
	// bounded-load term applies (0 when the rule is off).
	LoadBound   float64 `json:"load_bound,omitempty"`
	Temperature float64 `json:"temperature,omitempty"`
	// Key is the rendezvous key (hash of the first block past the longest
	// cached prefix), in hex.
	Key        string        `json:"key,omitempty"`
	Candidates []KVCandidate `json:"candidates"`
	// Choice is the chosen worker's ID, empty when kv-aware defers.
	Choice string `json:"choice"`
	Reason string `json:"reason"`
}

// Explain computes what PickKV would decide for r and why, without
// updating metrics (with a temperature the sample is a fresh draw).
func (k *KVAware) Explain(cands []*fleet.Worker, r *sched.Request) KVExplanation {
	s := &kvScratch{}
	i, reason := k.score(cands, r, s)
	e := KVExplanation{
		Blocks: len(r.BlockHashes), BlockSize: int(k.bs), OverlapWeight: k.weight, DuplicateCost: k.dup,
		PromptTokens: s.tokens, Temperature: k.temp, Reason: reason, Candidates: []KVCandidate{},
	}
	if i >= 0 {
		e.Choice = cands[i].ID
	}
	if len(s.cost) != len(cands) {
		return e
	}
	e.Key = hex64(s.key)
	if !math.IsInf(s.bound, 1) {
		e.LoadBound = s.bound
	}
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, c := range s.cost {
		lo, hi = min(lo, c), max(hi, c)
	}
	var sum float64
	for j, w := range cands {
		c := KVCandidate{
			Worker: w.ID, Idx: w.Idx, OverlapBlocks: s.overlap[j],
			CachedBlocks: k.idx.WorkerBlocks(w.Idx), CachePressure: s.pressure[j],
			ActivePrefillTokens: s.queued[j], ActiveBlocks: w.Load.Blocks.Load(),
			InFlight: s.inflight[j], RunningRequests: s.running[j],
			UncachedTokens: s.uncached[j], DecodeTokens: s.decode[j],
			PrefillUsPerToken: s.speed[j] * 1e6, PredictedTTFTMs: s.ttft[j] * 1e3,
			DuplicateTokens: s.dupTok[j], DuplicateCostMs: s.meanSpd * k.dup * s.pressure[j] * float64(s.dupTok[j]) * 1e3,
			LoadExcess: s.excess[j], LoadCostMs: s.meanSpd * float64(s.tokens) * s.excess[j] * 1e3,
			CostMs: s.cost[j] * 1e3, Rendezvous: hex64(rendezvous(s.key, w)),
		}
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

// rendezvous is w's rendezvous hash for key: the same on every router for
// the same worker id.
func rendezvous(key uint64, w *fleet.Worker) uint64 { return mix64(key ^ xxh3.HashString(w.ID)) }

func hex64(v uint64) string {
	const digits = "0123456789abcdef"
	var b [16]byte
	for i := 15; i >= 0; i-- {
		b[i] = digits[v&15]
		v >>= 4
	}
	return string(b[:])
}
