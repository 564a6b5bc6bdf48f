package kvroute

import (
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/infera/infera/fleet"
)

// Speed learning. An engine prefills its queue in FIFO order, so between
// two first tokens on one worker it was busy serving the later request:
// request k's service time is t_k - max(arrival_k, t_(k-1)), where t is the
// first-token time. Summed over a busy period these are exactly the time the
// engine worked, batching included (requests prefilled in one step share
// it). The worker's prefill speed is the decayed sum of service times over
// the decayed sum of prefill tokens (plus a per-request overhead), so a
// worker on a slower GPU, or with more decode load interleaved, is seen as
// slower. It needs nothing but the first-token callback: no request ids, no
// engine metrics.
const (
	// speedDecay is the weight of the past at each observation (a window
	// of about 256 requests per worker).
	speedDecay = 1 - 1.0/256
	// speedOverheadTokens is each request's fixed prefill overhead in
	// token equivalents (the 8 ms forward-pass floor at 80 µs per token).
	speedOverheadTokens = 100
	// speedMinObservations is how many first tokens a worker needs before
	// its learned speed replaces the default.
	speedMinObservations = 32
)

// speedSlot is one worker's learned prefill speed, by Worker.Idx.
type speedSlot struct {
	mu     sync.Mutex
	serial atomic.Uint32
	n      int
	last   int64   // unix ns of the latest first token
	busy   float64 // decayed service seconds
	tokens float64 // decayed prefill tokens
	spt    atomic.Uint64
	_      [16]byte
}

// ObserveFirstToken tells the cost function that a request dispatched to w
// with prefillTokens uncached prompt tokens (the prefill its decision
// accounted, sched.Decision.PrefillTokens) produced its first token ttft
// after it was dispatched, now. The live router calls it where it calls
// fleet.Worker.FirstToken; the simulator does the same. It is a no-op
// unless KVAwareConfig.LearnSpeed is set. Safe for concurrent use; it does
// not allocate.
func (k *KVAware) ObserveFirstToken(w *fleet.Worker, prefillTokens int64, ttft time.Duration) {
	if !k.learn || w == nil || w.Idx < 0 || w.Idx >= len(k.speeds) || ttft < 0 {
		return
	}
	now := k.clock()
	sl := &k.speeds[w.Idx]
	sl.mu.Lock()
	defer sl.mu.Unlock()
	if sl.serial.Load() != w.Serial {
		// A new worker took this Idx.
		sl.spt.Store(0)
		sl.serial.Store(w.Serial)
		sl.n, sl.last, sl.busy, sl.tokens = 0, 0, 0, 0
	}
	start := max(now-int64(ttft), sl.last)
	service := float64(max(now-start, 0)) / 1e9
	sl.last = max(sl.last, now)
	sl.busy = sl.busy*speedDecay + service
	sl.tokens = sl.tokens*speedDecay + float64(max(prefillTokens, 0)) + speedOverheadTokens
	sl.n++
	if sl.n >= speedMinObservations && sl.tokens > 0 {
		sl.spt.Store(math.Float64bits(sl.busy / sl.tokens))
	}
}

// speedOf returns w's learned prefill seconds per token, or 0 when unknown.
func (k *KVAware) speedOf(w *fleet.Worker) float64 {
	if !k.learn || w.Idx < 0 || w.Idx >= len(k.speeds) {
		return 0
	}
	sl := &k.speeds[w.Idx]
	v := math.Float64frombits(sl.spt.Load())
	if sl.serial.Load() != w.Serial || !(v > 0) {
		return 0
	}
	return v
}

// Observing reports whether ObserveFirstToken learns anything (LearnSpeed):
// callers skip timing first tokens for it otherwise.
func (k *KVAware) Observing() bool { return k.learn }
