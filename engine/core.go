package engine

import (
	"errors"
	"fmt"
	"math"
	"time"
)

// Never is the next-event time of an idle Core: nothing will happen until the
// next Submit.
const Never = time.Duration(math.MaxInt64)

// CoreConfig configures a Core.
type CoreConfig struct {
	// BlockSize is the number of tokens per KV block.
	BlockSize int
	// CapacityBlocks is the KV cache size in blocks.
	CapacityBlocks int
	// MaxBatch is the maximum number of running (prefilling or decoding)
	// sequences; further requests wait in a FIFO queue.
	MaxBatch int
	// MaxPrefillTokens caps the uncached prompt tokens admitted into one step
	// (vLLM's max_num_batched_tokens). A longer prompt is still admitted when
	// it is the step's first, so nothing starves. 0 means no cap.
	MaxPrefillTokens int
	// Time is the step time model.
	Time TimeModel
	// Sink receives KV cache events; nil for none.
	Sink KVEventSink
}

// Request is one generation request as the Core sees it. The caller fills
// the input fields; the Core fills the output fields as the request
// progresses. A Request must not be reused until it is done or aborted.
type Request struct {
	// Prompt is the prompt's token ids. The Core keeps it (and hands slices
	// of it to the KV event sink); do not modify it afterwards.
	Prompt []uint32
	// MaxTokens is the number of tokens to generate (>= 1).
	MaxTokens int
	// Tag is opaque caller data, returned untouched in Events.
	Tag any
	// Transfer says where the prompt's KV comes from: computed here
	// (TransferNone) or transferred from a prefill engine (PD decode role).
	Transfer Transfer
	// HoldKV keeps the request's blocks after its last token until Release
	// (PD prefill role: the KV waits for its transfer to the decode engine).
	HoldKV bool

	// Output, set by the Core.

	// CachedTokens is the prompt prefix served from the prefix cache, set at
	// admission.
	CachedTokens int
	// Generated is the number of tokens generated so far.
	Generated int
	// SubmitAt, AdmitAt, FirstTokenAt and FinishAt are the times (in the
	// caller's clock) of submission, admission into the batch, the first
	// token and completion or abort.
	SubmitAt, AdmitAt, FirstTokenAt, FinishAt time.Duration

	state  reqState
	hashes []uint64
	alloc  KVAlloc
	seq    uint64 // submission order, for determinism checks
}

// Transfer is how a request's prompt KV reaches the Core.
type Transfer uint8

const (
	// TransferNone: the Core prefills the prompt itself.
	TransferNone Transfer = iota
	// TransferPush is SGLang's decode side: the prefill engine writes the
	// prompt's KV and its first output token into blocks the Core reserved;
	// the request then only decodes (tokens 2..MaxTokens).
	TransferPush
	// TransferPull is vLLM's decode side (NixlConnector): the Core reads the
	// prompt's KV from the prefill engine into blocks it reserved, then
	// recomputes the last prompt token in a decode step, which yields the
	// first output token.
	TransferPull
)

type reqState uint8

const (
	stateNew reqState = iota
	stateQueued
	stateWaitingKV // blocks reserved, KV transfer under way (not in the batch)
	stateReady     // KV arrived, waiting for a batch slot
	stateRunning
	stateHeld // finished, blocks kept for a transfer (HoldKV) until Release
	stateDone
	stateAborted
)

// Event reports progress of one request at the end of a step: a new token, and
// whether the request is done. A request with a Transfer also gets one
// WaitingKV event when it is admitted.
type Event struct {
	Req *Request
	// Tokens is the number of tokens generated so far (== Req.Generated).
	Tokens int
	// Done is true on the request's last token; its blocks are freed (or
	// held, with HoldKV).
	Done bool
	// WaitingKV is true (with Tokens 0) when a request with a Transfer was
	// admitted: its blocks are reserved and its KV may now be transferred;
	// report the end with TransferDone, or give up with Abort.
	WaitingKV bool
	// At is the step's end time (the admission time for WaitingKV).
	At time.Duration
}

// CoreStats are cumulative counters and current gauges of a Core.
type CoreStats struct {
	Submitted, Completed, Aborted, Rejected uint64
	PromptTokens, CachedPromptTokens        uint64
	GeneratedTokens                         uint64
	Steps                                   uint64
	Running, Queued                         int
	// WaitingKV counts requests whose KV transfer is under way, ReadyKV
	// those whose KV arrived and that wait for a batch slot, Held finished
	// requests whose blocks wait for their transfer (HoldKV).
	WaitingKV, ReadyKV, Held            int
	BlocksUsed, BlocksCached, BlocksCap int
	Evictions                           uint64
}

// Core is the clock-free continuous-batching scheduler of the simulated
// engine: a FIFO queue, a running batch of at most MaxBatch sequences, a
// KVCache and a TimeModel. It never reads a clock and starts no goroutines;
// the caller passes the current time to every call, in a time base of its
// choice (durations since an arbitrary origin), never decreasing.
//
// # Steps
//
// The Core runs one step at a time. Starting a step admits queued requests
// (FIFO, while the batch has room, the step's prefill token budget allows and
// the KV cache can hold prompt plus MaxTokens), then fixes the step's
// duration from the TimeModel: prefill of the newly admitted requests'
// uncached tokens plus one decode step of the sequences that were already
// running. When the step ends, every sequence in it has one more token (a
// newly admitted one gets its first token from its prefill); sequences that
// reached MaxTokens are done and free their blocks. The next step starts at
// the end of the previous one if there is work, so a late caller does not
// stretch simulated time.
//
// # Driving it
//
// Step(now, dst) finishes the current step if it has ended by now (appending
// its Events to dst) and then, when idle, starts the next one. It returns the
// time at which the caller must call Step again (Never when idle with nothing
// queued). Calling Step early is harmless. Submit and Abort may be called at
// any time; after a Submit to an idle Core call Step(now) to start work.
//
// A discrete-event simulator keeps one Core per simulated engine and a
// priority queue of next-event times, with no goroutines and no real clock:
//
//	next := core.Step(0, nil) // after Submit(req, 0)
//	for next != engine.Never {
//		evs, next = core.Step(next, evs[:0]) // now = the event time
//		for _, ev := range evs { ... ev.Req, ev.Tokens, ev.Done, ev.At ... }
//	}
//
// Interleave arrivals by calling Submit(req, t) then Step(t) at each arrival
// time t that precedes the pending next event. Given the same sequence of
// calls with the same arguments, a Core produces the same events at the same
// times (no randomness; no map iteration order reaches the output).
//
// A Core is not safe for concurrent use.
type Core struct {
	cfg   CoreConfig
	cache *KVCache

	queue   []*Request // FIFO; queue[qhead:] are waiting
	qhead   int
	running []*Request
	inStep  int // running[:inStep] take part in the current step

	// ready holds requests whose transferred KV arrived, FIFO; they join
	// the batch before queued requests are admitted.
	ready           []*Request
	waitingKV, held int

	busy      bool
	stepStart time.Duration
	stepEnd   time.Duration

	nseq uint64

	stats CoreStats
}

// NewCore returns an idle Core with an empty cache.
func NewCore(cfg CoreConfig) (*Core, error) {
	if cfg.MaxBatch <= 0 {
		return nil, fmt.Errorf("max batch must be positive, got %d", cfg.MaxBatch)
	}
	if cfg.MaxPrefillTokens < 0 {
		return nil, fmt.Errorf("max prefill tokens must not be negative, got %d", cfg.MaxPrefillTokens)
	}
	if err := cfg.Time.Validate(); err != nil {
		return nil, err
	}
	cache, err := NewKVCache(cfg.BlockSize, cfg.CapacityBlocks, cfg.Sink)
	if err != nil {
		return nil, err
	}
	return &Core{cfg: cfg, cache: cache, running: make([]*Request, 0, cfg.MaxBatch)}, nil
}

// Cache returns the Core's KV cache (for inspection; do not allocate from it
// while requests run).
func (c *Core) Cache() *KVCache { return c.cache }

// Config returns the configuration the Core was built with.
func (c *Core) Config() CoreConfig { return c.cfg }

// SetSlow multiplies the duration of steps started from now on by f (fault
// injection); f <= 0 means 1.
func (c *Core) SetSlow(f float64) { c.cfg.Time.Slow = f }

// ErrTooLong is returned by Submit when prompt plus MaxTokens cannot fit in
// the whole KV cache.
var ErrTooLong = errors.New("request does not fit in the KV cache")

// Submit queues req at time now. It fails, leaving req untouched, on an empty
// prompt, MaxTokens < 1, or a request larger than the cache.
func (c *Core) Submit(req *Request, now time.Duration) error {
	if req.state != stateNew && req.state != stateDone && req.state != stateAborted {
		return errors.New("request is already queued or running")
	}
	if len(req.Prompt) == 0 {
		c.stats.Rejected++
		return errors.New("prompt is empty")
	}
	if req.MaxTokens < 1 {
		c.stats.Rejected++
		return fmt.Errorf("max tokens must be at least 1, got %d", req.MaxTokens)
	}
	if need := c.cache.BlocksFor(len(req.Prompt) + req.MaxTokens); need > c.cache.Capacity() {
		c.stats.Rejected++
		return fmt.Errorf("prompt of %d tokens plus %d generated tokens needs %d KV blocks, the cache holds %d: %w",
			len(req.Prompt), req.MaxTokens, need, c.cache.Capacity(), ErrTooLong)
	}
	req.hashes = c.cache.AppendHashes(req.hashes[:0], req.Prompt)
	req.CachedTokens, req.Generated = 0, 0
	req.SubmitAt, req.AdmitAt, req.FirstTokenAt, req.FinishAt = now, 0, 0, 0
	req.state = stateQueued
	c.nseq++
	req.seq = c.nseq
	if c.qhead > 0 && c.qhead == len(c.queue) {
		c.queue, c.qhead = c.queue[:0], 0
	}
	c.queue = append(c.queue, req)
	c.stats.Submitted++
	c.stats.PromptTokens += uint64(len(req.Prompt))
	return nil
}

// Abort removes a queued, waiting, ready or running request at time now
// and frees its blocks. It returns false when req is none of these. A
// running request leaves the current step without shortening it. Aborting a
// held request releases it (see Release).
func (c *Core) Abort(req *Request, now time.Duration) bool {
	switch req.state {
	case stateHeld:
		return c.Release(req)
	case stateWaitingKV:
		c.waitingKV--
		c.cache.Free(&req.alloc)
	case stateReady:
		for i, r := range c.ready {
			if r == req {
				c.ready = append(c.ready[:i], c.ready[i+1:]...)
				break
			}
		}
		c.cache.Free(&req.alloc)
	case stateQueued:
		for i := c.qhead; i < len(c.queue); i++ {
			if c.queue[i] == req {
				copy(c.queue[i:], c.queue[i+1:])
				c.queue[len(c.queue)-1] = nil
				c.queue = c.queue[:len(c.queue)-1]
				break
			}
		}
	case stateRunning:
		for i, r := range c.running {
			if r == req {
				copy(c.running[i:], c.running[i+1:])
				c.running[len(c.running)-1] = nil
				c.running = c.running[:len(c.running)-1]
				if i < c.inStep {
					c.inStep--
				}
				break
			}
		}
		c.cache.Free(&req.alloc)
	default:
		return false
	}
	req.state = stateAborted
	req.FinishAt = now
	c.stats.Aborted++
	return true
}

// TransferDone reports at time now that the KV of req, admitted with a
// Transfer (its WaitingKV event came), has arrived. A TransferPush request
// gets its first token now (appended to dst, with Done when MaxTokens is 1)
// and decodes from the next step on; a TransferPull request takes part in
// the next step as one more decoding sequence, which gives its first token.
// Either waits for a batch slot first. It returns false, changing nothing,
// when req is not waiting for its KV. After it, call Step(now) if the Core
// was idle.
func (c *Core) TransferDone(req *Request, now time.Duration, dst []Event) ([]Event, bool) {
	if req.state != stateWaitingKV {
		return dst, false
	}
	c.waitingKV--
	if req.Transfer == TransferPush {
		req.Generated = 1
		req.FirstTokenAt = now
		c.stats.GeneratedTokens++
		done := req.Generated >= req.MaxTokens
		dst = append(dst, Event{Req: req, Tokens: 1, Done: done, At: now})
		if done {
			c.finish(req, now)
			return dst, true
		}
	}
	req.state = stateReady
	c.ready = append(c.ready, req)
	return dst, true
}

// Release frees the blocks of a held request (HoldKV, finished): its
// transfer is over. It returns false when req is not held.
func (c *Core) Release(req *Request) bool {
	if req.state != stateHeld {
		return false
	}
	c.held--
	c.cache.Free(&req.alloc)
	req.state = stateDone
	return true
}

// BlockIDs appends the ids of the first n blocks req holds (its prompt's
// blocks: a prefill engine reports them as vLLM's remote_block_ids). Block
// ids index the cache's physical blocks. It returns dst unchanged when req
// holds no blocks.
func (c *Core) BlockIDs(dst []int, req *Request, n int) []int {
	return req.alloc.appendIDs(dst, n)
}

// finish ends a request that produced its last token at time at: its
// blocks are freed, or kept until Release with HoldKV.
func (c *Core) finish(r *Request, at time.Duration) {
	r.FinishAt = at
	c.stats.Completed++
	if r.HoldKV {
		r.state = stateHeld
		c.held++
		return
	}
	r.state = stateDone
	c.cache.Free(&r.alloc)
}

// Step advances the Core to time now: it finishes the current step if it
// ended at or before now, appending its events to dst, and starts the next
// step when there is work. It returns dst and the time of the next event
// (the current step's end), or Never when idle with nothing queued.
func (c *Core) Step(now time.Duration, dst []Event) ([]Event, time.Duration) {
	start := now
	if c.busy {
		if now < c.stepEnd {
			return dst, c.stepEnd
		}
		dst = c.finishStep(dst)
		start = c.stepEnd
	}
	dst = c.startStep(start, dst)
	if !c.busy {
		return dst, Never
	}
	return dst, c.stepEnd
}

// Busy reports whether a step is in progress.
func (c *Core) Busy() bool { return c.busy }

// NextEventAt returns the end of the current step, or Never when idle.
func (c *Core) NextEventAt() time.Duration {
	if c.busy {
		return c.stepEnd
	}
	return Never
}

func (c *Core) finishStep(dst []Event) []Event {
	at := c.stepEnd
	c.busy = false
	c.stats.Steps++
	kept := c.running[:0]
	for i, r := range c.running {
		if i >= c.inStep {
			kept = append(kept, r)
			continue
		}
		r.Generated++
		c.stats.GeneratedTokens++
		if r.Generated == 1 {
			r.FirstTokenAt = at
		}
		done := r.Generated >= r.MaxTokens
		dst = append(dst, Event{Req: r, Tokens: r.Generated, Done: done, At: at})
		if done {
			c.finish(r, at)
			continue
		}
		kept = append(kept, r)
	}
	for i := len(kept); i < len(c.running); i++ {
		c.running[i] = nil
	}
	c.running = kept
	c.inStep = 0
	return dst
}

func (c *Core) startStep(now time.Duration, dst []Event) []Event {
	decode := len(c.running)
	// Transferred requests take free batch slots first, in arrival order:
	// they only decode (a pulled one recomputes its last prompt token,
	// which costs what one more decoding sequence costs).
	n := 0
	for _, r := range c.ready {
		if len(c.running) >= c.cfg.MaxBatch {
			break
		}
		r.state = stateRunning
		r.AdmitAt = max(now, r.SubmitAt)
		c.running = append(c.running, r)
		n++
	}
	if n > 0 {
		clear(c.ready[:n])
		c.ready = append(c.ready[:0], c.ready[n:]...)
		decode += n
	}
	prefillSeqs, prefillTokens := 0, 0
	bs := c.cache.BlockSize()
	for c.qhead < len(c.queue) {
		r := c.queue[c.qhead]
		remote := r.Transfer != TransferNone
		if !remote && len(c.running) >= c.cfg.MaxBatch {
			break
		}
		p := len(r.Prompt)
		// The last prompt token is always computed, so at most
		// (p-1)/bs blocks can be hits (as in vLLM).
		maxHit := (p - 1) / bs
		uncached := 0
		if !remote {
			hit := c.cache.MatchHashes(r.hashes)
			if hit > maxHit {
				hit = maxHit
			}
			uncached = p - hit*bs
			if prefillSeqs > 0 && c.cfg.MaxPrefillTokens > 0 && prefillTokens+uncached > c.cfg.MaxPrefillTokens {
				break
			}
		}
		if !c.cache.Allocate(&r.alloc, r.hashes, r.Prompt, c.cache.BlocksFor(p+r.MaxTokens), maxHit) {
			break // FIFO: wait for blocks
		}
		c.queue[c.qhead] = nil
		c.qhead++
		r.CachedTokens = r.alloc.CachedBlocks() * bs
		c.stats.CachedPromptTokens += uint64(r.CachedTokens)
		if remote {
			// Blocks reserved; the KV transfer may start.
			r.state = stateWaitingKV
			r.AdmitAt = max(now, r.SubmitAt)
			c.waitingKV++
			dst = append(dst, Event{Req: r, WaitingKV: true, At: r.AdmitAt})
			continue
		}
		r.state = stateRunning
		r.AdmitAt = max(now, r.SubmitAt)
		c.running = append(c.running, r)
		prefillSeqs++
		prefillTokens += p - r.CachedTokens
	}
	if c.qhead == len(c.queue) {
		c.queue, c.qhead = c.queue[:0], 0
	}
	c.inStep = len(c.running)
	if c.inStep == 0 {
		return dst
	}
	c.busy = true
	c.stepStart = now
	d := c.cfg.Time.StepTime(prefillTokens, prefillSeqs, decode)
	if d <= 0 {
		d = 1 // keep time moving even with a degenerate model
	}
	c.stepEnd = now + d
	return dst
}

// Stats returns the Core's counters and gauges.
func (c *Core) Stats() CoreStats {
	s := c.stats
	s.Running = len(c.running)
	s.Queued = len(c.queue) - c.qhead
	s.WaitingKV, s.ReadyKV, s.Held = c.waitingKV, len(c.ready), c.held
	s.BlocksUsed = c.cache.Used()
	s.BlocksCached = c.cache.Cached()
	s.BlocksCap = c.cache.Capacity()
	s.Evictions = c.cache.Evictions()
	return s
}
