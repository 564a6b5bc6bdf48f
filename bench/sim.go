package bench

import (
	"container/heap"
	"errors"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/infera/infera/config"
	"github.com/infera/infera/engine"
	"github.com/infera/infera/fleet"
	"github.com/infera/infera/kv"
	"github.com/infera/infera/kvroute"
	"github.com/infera/infera/radix"
	"github.com/infera/infera/sched"
	"github.com/infera/infera/tokenizer"
)

// SimConfig configures a fleet simulation.
type SimConfig struct {
	// Engines is the number of simulated engines.
	Engines int
	// Core is every engine's configuration (block size, KV capacity, batch,
	// time model), exactly as `infera engine` builds it from its flags.
	Core engine.CoreConfig
	// Policy is the router policy (kv-aware, round-robin, least-requests,
	// least-tokens).
	Policy string
	// Model is the served model name.
	Model string
	// Load supplies the API (chat renders messages like the engine does),
	// prompt content and arrival mode (trace or poisson; closed loop is
	// simulated too).
	Load LoadConfig
	// MaxITLSamples caps the recorded inter-token gaps (0: 4 million).
	MaxITLSamples int
	// KVOverlapWeight is the kv-aware duplicate-cost weight
	// (--kv-overlap-weight of infera serve; 0 means its default 1.0, < 0
	// means 0).
	KVOverlapWeight float64
	// KVLoadBound is the kv-aware bounded-load epsilon
	// (kvroute.KVAwareConfig.LoadBound: 0 default, < 0 off).
	KVLoadBound float64
	// KVLearnSpeed turns on the kv-aware scorer's speed learning from first
	// tokens (kvroute.KVAwareConfig.LearnSpeed).
	KVLearnSpeed bool
	// EngineSlow, if set, multiplies engine i's step durations by
	// EngineSlow[i % len(EngineSlow)] (a heterogeneous fleet; values <= 0
	// mean 1).
	EngineSlow []float64
	// Progress, if set, shows requests done, virtual time and hit rate.
	Progress *Progress
	// Scorer, if set, builds the kv-aware scorer over the simulation's KV
	// index and virtual clock (unix ns) instead of kvroute.NewKVAware
	// (experiments and tests).
	Scorer func(ix *radix.Index, clock func() int64) sched.KVScorer
	// DynamoOverlapWeight is kv_overlap_score_weight of the dynamo policy
	// (PolicyDynamo; 0 means Dynamo's default 1.0, < 0 means 0).
	DynamoOverlapWeight float64
}

var (
	simMu    sync.Mutex // one simulation at a time: the fleet is shared
	simFleet *fleet.Fleet
)

// sharedSimFleet returns the process's simulation fleet. fleet.NewFleet
// registers process-global metrics, so a process may create only one.
func sharedSimFleet() *fleet.Fleet {
	if simFleet == nil {
		simFleet = fleet.NewFleet(fleet.BreakerConfig{})
	}
	return simFleet
}

type simReq struct {
	core    engine.Request
	idx     int
	arrival time.Duration
	worker  *fleet.Worker
	eng     int
	tokens  int64 // Acquire accounting
	blocks  int64
	prefill int64 // uncached prompt tokens, the prefill load accounted
	first   bool
	lastTok time.Duration
	res     *Result
}

type simEngine struct {
	core *engine.Core
	next time.Duration
	evs  []engine.Event
}

// evQueue is a min-heap of (time, engine) step ends with lazy invalidation.
type evItem struct {
	at  time.Duration
	eng int
}
type evQueue []evItem

func (q evQueue) Len() int { return len(q) }
func (q evQueue) Less(i, j int) bool {
	if q[i].at != q[j].at {
		return q[i].at < q[j].at
	}
	return q[i].eng < q[j].eng
}
func (q evQueue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *evQueue) Push(x any)   { *q = append(*q, x.(evItem)) }
func (q *evQueue) Pop() any {
	old := *q
	it := old[len(old)-1]
	*q = old[:len(old)-1]
	return it
}

// SimResult is one simulation's output.
type SimResult struct {
	Run *Run
	// Virtual is the simulated time span; Real is the wall time it took.
	Virtual, Real time.Duration
	Workers       int
	// Layers counts the scheduler's decisions by layer (kv, prefix, lb, ...).
	Layers map[string]int
	// IndexBlocks is the number of blocks in the kv-aware index at the end.
	IndexBlocks int
}

// Simulate runs the workload reqs against a simulated fleet: arrivals are
// routed by sched.Scheduler.Pick over a fleet.Fleet of simulated workers
// (with Acquire/FirstToken/Release as the router does), each engine is an
// engine.Core driven in virtual time, and under kv-aware the router's
// kvroute.KVAware scorer reads a radix index fed from the engines' KV events
// (delivered instantly: event transport delay is not modelled). Network and router overheads are
// not modelled. It is deterministic for a given input.
func Simulate(reqs []TraceRequest, cfg SimConfig) (*SimResult, error) {
	if cfg.Engines <= 0 || cfg.Engines > radix.MaxWorkers {
		return nil, fmt.Errorf("engines must be in [1, %d], got %d", radix.MaxWorkers, cfg.Engines)
	}
	if err := cfg.Load.Validate(); err != nil {
		return nil, err
	}
	if cfg.Model == "" {
		cfg.Model = "sim-model"
	}
	dynamo := cfg.Policy == PolicyDynamo
	polName := cfg.Policy
	if dynamo {
		polName = "kv-aware" // the kv layer decides every request
	}
	routerPolicy, prefixOn, err := ParsePolicy(polName)
	if err != nil {
		return nil, err
	}
	kvAware := routerPolicy == "kv-aware"
	var dyn *dynamoScorer
	simMu.Lock()
	defer simMu.Unlock()
	realStart := time.Now()

	fl := sharedSimFleet()
	recs := make([]fleet.Record, cfg.Engines)
	for i := range recs {
		recs[i] = fleet.Record{
			ID:        "sim-" + strconv.Itoa(i),
			URL:       "http://10." + strconv.Itoa(i>>8&255) + "." + strconv.Itoa(i&255) + ".1:8100",
			Models:    []string{cfg.Model},
			BlockSize: cfg.Core.BlockSize,
		}
	}
	if errs := fl.Sync(recs); len(errs) > 0 {
		return nil, fmt.Errorf("cannot build simulated fleet: %w", errors.Join(errs...))
	}
	defer fl.Sync(nil)
	view := fl.View()
	byIdx := make([]int, view.MaxIdx)
	for _, w := range view.All {
		n, _ := strconv.Atoi(w.ID[len("sim-"):])
		byIdx[w.Idx] = n
	}
	var ix *radix.Index
	policy, ok := sched.ParsePolicy(routerPolicy)
	if !ok {
		return nil, fmt.Errorf("unknown router policy %q", routerPolicy)
	}
	s := sched.NewScheduler(fl, policy)
	defer s.Close()
	if kvAware {
		ix = radix.New()
	}
	var now time.Duration
	base := time.Unix(1_700_000_000, 0).UnixNano()
	s.Now = func() int64 { return base + int64(now) }
	var observer firstTokenObserver
	if kvAware {
		w := simWeight(cfg.KVOverlapWeight)
		switch {
		case dynamo:
			dyn = newDynamoScorer(ix, cfg.Core.BlockSize, simWeight(cfg.DynamoOverlapWeight))
			s.KV = dyn
		case cfg.Scorer != nil:
			s.KV = cfg.Scorer(ix, s.Now)
		default:
			s.KV = kvroute.NewKVAware(kvroute.KVAwareConfig{Index: ix, OverlapWeight: w, BlockSize: cfg.Core.BlockSize, Seed: 1,
				LoadBound: cfg.KVLoadBound, LearnSpeed: cfg.KVLearnSpeed, Clock: s.Now})
		}
		observer, _ = s.KV.(firstTokenObserver)
	}
	engines := make([]simEngine, cfg.Engines)
	for i := range engines {
		cc := cfg.Core
		if kvAware {
			w := view.All[0]
			for _, x := range view.All {
				if x.ID == recs[i].ID {
					w = x
				}
			}
			cc.Sink = newSimKVSink(ix, w.Idx)
		}
		if len(cfg.EngineSlow) > 0 {
			cc.Time.Slow = cfg.EngineSlow[i%len(cfg.EngineSlow)]
		}
		c, err := engine.NewCore(cc)
		if err != nil {
			return nil, fmt.Errorf("cannot build simulated engine: %w", err)
		}
		engines[i] = simEngine{core: c, next: engine.Never}
	}
	appCfg := config.Default()
	appCfg.PrefixCache.Enabled = prefixOn

	results := make([]Result, len(reqs))
	layers := map[string]int{}
	run := &Run{}
	maxITL := cfg.MaxITLSamples
	if maxITL <= 0 {
		maxITL = 4 << 20
	}
	var q evQueue
	scratch := make([]*fleet.Worker, 0, cfg.Engines)
	var sr sched.Request
	lc := cfg.Load
	bs := cfg.Core.BlockSize
	pr := newPromptRenderer(&lc)
	issued := 0
	inflight := 0
	var promptSum, cachedSum int64
	var tokText []byte
	var rngAt time.Duration
	rng := newPoisson(lc.Seed, lc.Rate)

	var finishEvents func(evs []engine.Event)
	arrive := func(i int, t time.Duration) {
		r := &reqs[i]
		res := &results[i]
		res.Index, res.Start = i, t
		if lc.Arrival != ArrivalClosed && inflight >= lc.InFlight() {
			// As RunLoad: an open-loop arrival past --max-in-flight is
			// refused, never sent.
			res.Err = errOverload
			run.Dropped++
			return
		}
		text, prompt := pr.render(i, r)
		sr.Reset()
		sr.Model = []byte(cfg.Model)
		sr.Stream = lc.Stream
		sr.MaxTokens = r.OutputLength
		sr.PromptTokens = len(prompt)
		sr.Prompt = text // what the proxy passes: the concatenated message contents
		if lc.TokenPrompts && lc.API == "completions" {
			tokText = sched.AppendTokenPrompt(tokText[:0], prompt) // the token ids' text, as the proxy passes it
			sr.Prompt = tokText
		}
		if kvAware {
			sr.BlockHashes = kv.HashBlocks(sr.BlockHashes[:0], prompt, bs, "")
		}
		d, err := s.Pick(appCfg, &sr, scratch)
		if err != nil {
			res.Err = "route: " + err.Error()
			res.Status = 503
			return
		}
		sq := &simReq{idx: i, arrival: t, worker: d.Worker, eng: byIdx[d.Worker.Idx], res: res}
		sq.core = engine.Request{Prompt: prompt, MaxTokens: r.OutputLength, Tag: sq}
		sq.tokens = int64(len(prompt) + r.OutputLength)
		sq.blocks = int64((len(prompt) + r.OutputLength + bs - 1) / bs)
		sq.prefill = d.PrefillTokens(&sr) // as the proxy accounts it
		layers[d.Layer.String()]++
		res.Worker = d.Worker.ID
		res.PromptTokens = len(prompt)
		e := &engines[sq.eng]
		if err := e.core.Submit(&sq.core, t); err != nil {
			res.Err = err.Error()
			res.Status = 400
			return
		}
		d.Worker.Acquire(sq.tokens, sq.prefill, sq.blocks)
		if dyn != nil {
			dyn.dispatched(i, d.Worker, &sr)
		}
		inflight++
		var nx time.Duration
		// A step ending exactly at t finishes here.
		e.evs, nx = e.core.Step(t, e.evs[:0])
		finishEvents(e.evs)
		if nx != e.next {
			e.next = nx
			if nx != engine.Never {
				heap.Push(&q, evItem{at: nx, eng: sq.eng})
			}
		}
	}
	// firstByte is the router's first byte of sq's answer at t: the first
	// token of a stream, the whole answer otherwise (the engine writes a
	// non-streamed answer when it is done).
	firstByte := func(sq *simReq, t time.Duration) {
		sq.worker.FirstToken(sq.prefill)
		if observer != nil {
			observer.ObserveFirstToken(sq.worker, sq.prefill, t-sq.arrival)
		}
		sq.first = true
	}
	finishEvents = func(evs []engine.Event) {
		for _, ev := range evs {
			sq := ev.Req.Tag.(*simReq)
			res := sq.res
			if ev.Tokens == 1 {
				res.TTFT = ev.At - sq.arrival
				if lc.Stream {
					firstByte(sq, ev.At)
				}
				if dyn != nil {
					dyn.firstToken(sq.idx)
				}
				res.CachedTokens = ev.Req.CachedTokens
				promptSum += int64(len(ev.Req.Prompt))
				cachedSum += int64(ev.Req.CachedTokens)
			} else if lc.Stream {
				gap := ev.At - sq.lastTok
				res.ITLSum += gap
				res.ITLCount++
				res.ITLMax = max(res.ITLMax, gap)
				if len(run.ITLs) < maxITL {
					run.ITLs = append(run.ITLs, gap)
				}
			}
			sq.lastTok = ev.At
			if ev.Done {
				res.E2E = ev.At - sq.arrival
				res.OutputTokens = ev.Tokens
				res.Status = 200
				if !lc.Stream {
					// Read whole, as the client measures it: TTFT is
					// the whole answer's time, and no TPOT or ITL.
					firstByte(sq, ev.At)
					res.TTFT, res.Whole = res.E2E, true
				}
				sq.worker.Release(sq.tokens, sq.prefill, sq.blocks, sq.first)
				if dyn != nil {
					dyn.finished(sq.idx)
				}
				sq.core.Prompt = nil
				inflight--
			}
		}
	}
	stopped := false // --duration passed: no more arrivals
	nextArrival := func() (time.Duration, bool) {
		if stopped || issued >= len(reqs) {
			return 0, false
		}
		switch lc.Arrival {
		case ArrivalPoisson:
			return rngAt, true
		case ArrivalClosed:
			if inflight >= lc.Concurrency {
				return 0, false
			}
			return now, true
		}
		return time.Duration(reqs[issued].Timestamp) * time.Millisecond, true
	}
	if lc.Arrival == ArrivalPoisson {
		rngAt = rng.next()
	}
	for {
		at, ok := nextArrival()
		if ok && lc.Duration > 0 && at > lc.Duration {
			// Stop issuing; the requests never sent are not results (as
			// RunLoad reports only what it sent).
			ok, stopped = false, true
		}
		// Drop stale heap entries.
		for len(q) > 0 && q[0].at != engines[q[0].eng].next {
			heap.Pop(&q)
		}
		if ok && (len(q) == 0 || at <= q[0].at) {
			now = max(now, at)
			arrive(issued, now)
			issued++
			if issued&63 == 0 {
				cfg.Progress.Update(issued, len(reqs), "virtual", now, cachedSum, promptSum)
			}
			if lc.Arrival == ArrivalPoisson {
				rngAt += rng.next()
			}
			continue
		}
		if len(q) == 0 {
			break
		}
		it := heap.Pop(&q).(evItem)
		now = it.at
		e := &engines[it.eng]
		var nx time.Duration
		e.evs, nx = e.core.Step(now, e.evs[:0])
		finishEvents(e.evs)
		e.next = nx
		if nx != engine.Never {
			heap.Push(&q, evItem{at: nx, eng: it.eng})
		}
	}
	cfg.Progress.Done()
	run.Results = results[:issued]
	run.Wall = now
	out := &SimResult{Run: run, Virtual: now, Real: time.Since(realStart), Workers: cfg.Engines, Layers: layers}
	if ix != nil {
		out.IndexBlocks = ix.Stats().Blocks
	}
	return out, nil
}

// firstTokenObserver is implemented by scorers that learn from first
// tokens (kvroute.KVAware.ObserveFirstToken); the simulator calls it where
// the proxy calls fleet.Worker.FirstToken.
type firstTokenObserver interface {
	ObserveFirstToken(w *fleet.Worker, prefillTokens int64, ttft time.Duration)
}

// promptRenderer turns workload requests into the prompt token ids the
// engines see, exactly as a client request of the load's API is rendered by
// the engine (chat: the built-in chat template around one user message).
type promptRenderer struct {
	lc   *LoadConfig
	tok  tokenizer.Simple
	text []byte
	msgs []tokenizer.Message
	// chatFrame is the chat template's length in bytes around the
	// message (-1: not measured yet).
	chatFrame int
}

func newPromptRenderer(lc *LoadConfig) *promptRenderer {
	return &promptRenderer{lc: lc, msgs: make([]tokenizer.Message, 1), chatFrame: -1}
}

// render returns request i's prompt text (what the proxy matches on; valid
// until the next call) and its token ids (a new slice the caller keeps).
func (p *promptRenderer) render(i int, r *TraceRequest) ([]byte, []uint32) {
	p.text = p.lc.Prompt.AppendPrompt(p.text[:0], r.HashIDs, r.InputLength, uint64(i)+1)
	if p.lc.API == "chat" {
		p.msgs[0] = tokenizer.Message{Role: "user", Content: string(p.text)}
		rendered, _ := p.tok.RenderChat(nil, p.msgs, nil, true)
		return p.text, p.tok.Encode(make([]uint32, 0, len(rendered)/4+1), rendered)
	}
	return p.text, p.tok.Encode(make([]uint32, 0, len(p.text)/4+1), p.text)
}

// promptTokens returns the length of render's token ids without rendering:
// the prompt text is InputLength * BytesPerToken bytes, the chat template
// adds a fixed frame around it, and tokenizer.Simple makes one token of
// every 4 bytes (TestPromptTokensMatchesRender).
func (p *promptRenderer) promptTokens(r *TraceRequest) int {
	_, bpt := p.lc.Prompt.norm()
	n := max(r.InputLength*bpt, 0)
	if p.lc.API == "chat" {
		if p.chatFrame < 0 {
			p.msgs[0] = tokenizer.Message{Role: "user"}
			frame, _ := p.tok.RenderChat(nil, p.msgs, nil, true)
			p.chatFrame = len(frame)
		}
		n += p.chatFrame
	}
	return (n + 3) / 4
}

// poisson yields exponential inter-arrival gaps.
type poisson struct {
	s    uint64
	rate float64
}

func newPoisson(seed uint64, rate float64) *poisson { return &poisson{s: seed ^ 0xabcdef, rate: rate} }

func (p *poisson) next() time.Duration {
	if !(p.rate > 0) {
		return 0
	}
	u := float64(splitmix64(&p.s)>>11) / (1 << 53)
	if u <= 0 {
		u = 1e-12
	}
	return time.Duration(-ln(u) / p.rate * float64(time.Second))
}

func ln(x float64) float64 { return math.Log(x) }

// ObservedArrivals returns reqs with each timestamp replaced by the send
// time the client observed in results (matched by Index), for replaying a
// real run in the simulator with the same arrival times. Requests that were
// never sent are dropped.
func ObservedArrivals(reqs []TraceRequest, results []Result) []TraceRequest {
	out := make([]TraceRequest, 0, len(results))
	for i := range results {
		r := &results[i]
		if r.Index < 0 || r.Index >= len(reqs) {
			continue
		}
		t := reqs[r.Index]
		t.Timestamp = r.Start.Milliseconds()
		out = append(out, t)
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Timestamp < out[j].Timestamp })
	return out
}

// simWeight maps a SimConfig weight to the scorer's: 0 is the default 1.0,
// a negative value is 0.
func simWeight(w float64) float64 {
	switch {
	case w == 0:
		return 1
	case w < 0:
		return 0
	}
	return w
}

// ParsePolicy maps a bench policy name to the router's --router-policy and
// whether the config's prefix_cache layer is enabled: a router policy
// (kv-aware, round-robin, least-requests, least-tokens), "prefix" (the
// router's approximate prefix index over least-requests), or "P+prefix".
func ParsePolicy(name string) (routerPolicy string, prefix bool, err error) {
	p := name
	if p == "prefix" {
		return "least-requests", true, nil
	}
	if base, ok := strings.CutSuffix(p, "+prefix"); ok {
		p, prefix = base, true
	}
	if _, ok := sched.ParseBalancer(p); ok || p == "kv-aware" {
		return p, prefix, nil
	}
	return "", false, fmt.Errorf("unknown policy %q: want kv-aware, round-robin, least-requests, least-tokens, prefix or POLICY+prefix", name)
}
