package bench

import (
	"container/heap"
	"errors"
	"fmt"
	"strconv"
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

// PDSimConfig configures a simulation of a prefill-decode disaggregated
// fleet: Prefill engines that only prefill and Decode engines that only
// decode, the KV moving between them in the engine's TransferTime.
type PDSimConfig struct {
	Prefill, Decode int
	// Mode is the connector: sglang (push: the decode engine reserves its
	// blocks, then the prefill engine computes the prompt and its first
	// token and pushes the KV) or vllm (pull: the prefill engine computes
	// the prompt and one token, the router then sends the decode leg, whose
	// engine reads the blocks it lacks and recomputes the last prompt
	// token in a decode step).
	Mode string
	// Core is every engine's configuration, as in SimConfig; its
	// TimeModel's TransferBase/TransferPerBlock time the KV transfers.
	Core engine.CoreConfig
	// Policy is the primary pipeline's policy (it picks the prefill
	// engine); DecodePolicy is pd.decode_policy; IndependentPairing is
	// pd.sglang_independent_pairing.
	Policy             string
	DecodePolicy       string
	IndependentPairing bool
	Model              string
	Load               LoadConfig
	// MaxITLSamples caps the recorded inter-token gaps (0: 4 million).
	MaxITLSamples int
	// KVOverlapWeight is the kv-aware cost weight, as SimConfig's (0: 1.0,
	// negative: 0); KVLoadBound its bounded load, as SimConfig's.
	KVOverlapWeight float64
	KVLoadBound     float64
}

// pdSimReq is one request in flight: its two legs on two engines.
type pdSimReq struct {
	idx     int
	arrival time.Duration
	pre     engine.Request
	dec     engine.Request
	pEng    int
	dEng    int
	pl, dl  sched.Lease
	sr      sched.Request // the router's view, kept for both legs as the proxy keeps it
	blocks  int           // blocks the transfer moves
	first   bool
	lastTok time.Duration
	res     *Result
}

// pdEvent is a timed event: an engine's step end (lazy: valid only while it
// is the engine's next event) or a transfer's end.
type pdEvent struct {
	at  time.Duration
	eng int       // step end of engine eng, or -1
	req *pdSimReq // transfer end
	seq uint64
}

type pdEvents []pdEvent

func (q pdEvents) Len() int { return len(q) }
func (q pdEvents) Less(i, j int) bool {
	if q[i].at != q[j].at {
		return q[i].at < q[j].at
	}
	return q[i].seq < q[j].seq
}
func (q pdEvents) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *pdEvents) Push(x any)   { *q = append(*q, x.(pdEvent)) }
func (q *pdEvents) Pop() any {
	old := *q
	it := old[len(old)-1]
	*q = old[:len(old)-1]
	return it
}

// SimulatePD runs the workload reqs against a simulated PD fleet, routed
// as infera serve routes it: sched.Scheduler.Topology and one lease per
// leg (Acquire, FirstToken, Done, with the proxy's per-leg load
// accounting), the primary pipeline for the prefill leg (kv-aware reads a
// radix index fed by the prefill engines' KV events) and pd.decode_policy
// for the decode leg. Each engine is an engine.Core in virtual time. The
// client's TTFT is the decode engine's first token. Network, router and
// HTTP overheads are not modelled. Deterministic for a given input.
func SimulatePD(reqs []TraceRequest, cfg PDSimConfig) (*SimResult, error) {
	n := cfg.Prefill + cfg.Decode
	if cfg.Prefill <= 0 || cfg.Decode <= 0 || n > radix.MaxWorkers {
		return nil, fmt.Errorf("a PD fleet needs at least one prefill and one decode engine and at most %d in all, got %d and %d", radix.MaxWorkers, cfg.Prefill, cfg.Decode)
	}
	mode, ok := sched.ParsePDMode(cfg.Mode)
	if !ok {
		return nil, fmt.Errorf("unknown PD mode %q: want sglang or vllm", cfg.Mode)
	}
	if err := cfg.Load.Validate(); err != nil {
		return nil, err
	}
	if cfg.Model == "" {
		cfg.Model = "sim-model"
	}
	routerPolicy, prefixOn, err := ParsePolicy(cfg.Policy)
	if err != nil {
		return nil, err
	}
	policy, _ := sched.ParsePolicy(routerPolicy)
	appCfg := config.Default()
	appCfg.PrefixCache.Enabled = prefixOn
	appCfg.PD.Mode = mode.String()
	appCfg.PD.DecodePolicy = cfg.DecodePolicy
	if appCfg.PD.DecodePolicy == "" {
		appCfg.PD.DecodePolicy = "least-requests"
	}
	appCfg.PD.SGLangIndependentPairing = cfg.IndependentPairing && mode == sched.PDModeSGLang
	if err := appCfg.Validate(); err != nil {
		return nil, err
	}
	kvAware := policy == sched.PolicyKVAware
	simMu.Lock()
	defer simMu.Unlock()
	realStart := time.Now()

	fl := sharedSimFleet()
	recs := make([]fleet.Record, n)
	for i := range recs {
		role, id := "prefill", "pd-p-"+strconv.Itoa(i)
		if i >= cfg.Prefill {
			role, id = "decode", "pd-d-"+strconv.Itoa(i-cfg.Prefill)
		}
		recs[i] = fleet.Record{ID: id, URL: "http://10." + strconv.Itoa(i>>8&255) + "." + strconv.Itoa(i&255) + ".1:8100",
			Models: []string{cfg.Model}, Role: role, BlockSize: cfg.Core.BlockSize}
	}
	if errs := fl.Sync(recs); len(errs) > 0 {
		return nil, fmt.Errorf("cannot build simulated fleet: %w", errors.Join(errs...))
	}
	defer fl.Sync(nil)
	view := fl.View()
	engOf := make([]int, view.MaxIdx) // Worker.Idx -> engine index
	for _, w := range view.All {
		for i := range recs {
			if recs[i].ID == w.ID {
				engOf[w.Idx] = i
			}
		}
	}
	s := sched.NewScheduler(fl, policy)
	defer s.Close()
	s.BlockSize = cfg.Core.BlockSize
	var ix *radix.Index
	if kvAware {
		ix = radix.New()
		s.KV = kvroute.NewKVAware(kvroute.KVAwareConfig{Index: ix, OverlapWeight: simWeight(cfg.KVOverlapWeight), BlockSize: cfg.Core.BlockSize, Seed: 1,
			LoadBound: cfg.KVLoadBound})
	}
	var now time.Duration
	base := time.Unix(1_700_000_000, 0).UnixNano()
	s.Now = func() int64 { return base + int64(now) }

	cores := make([]*engine.Core, n)
	next := make([]time.Duration, n)
	tm := cfg.Core.Time
	for i := range cores {
		cc := cfg.Core
		if kvAware && i < cfg.Prefill {
			// KV events come from the prefill engines: they compute and
			// cache the prompts.
			cc.Sink = newSimKVSink(ix, fl.Get(recs[i].ID).Idx)
		}
		c, err := engine.NewCore(cc)
		if err != nil {
			return nil, fmt.Errorf("cannot build simulated engine: %w", err)
		}
		cores[i], next[i] = c, engine.Never
	}

	results := make([]Result, len(reqs))
	layers := map[string]int{}
	run := &Run{}
	maxITL := cfg.MaxITLSamples
	if maxITL <= 0 {
		maxITL = 4 << 20
	}
	var q pdEvents
	var seq uint64
	push := func(ev pdEvent) {
		seq++
		ev.seq = seq
		heap.Push(&q, ev)
	}
	scratch := make([]*fleet.Worker, 0, n)
	lc := cfg.Load
	bs := cfg.Core.BlockSize
	tok := tokenizer.Simple{}
	msgs := make([]tokenizer.Message, 1)
	var text []byte
	issued, inflight := 0, 0
	var rngAt time.Duration
	rng := newPoisson(lc.Seed, lc.Rate)
	bufs := make([][]engine.Event, n) // events of each engine's step (handling them steps other engines)
	var tevs []engine.Event

	// step advances engine i to now and handles its events.
	var step func(i int)
	var handle func(evs []engine.Event)
	step = func(i int) {
		var nx time.Duration
		bufs[i], nx = cores[i].Step(now, bufs[i][:0])
		handle(bufs[i])
		if nx != next[i] {
			next[i] = nx
			if nx != engine.Never {
				push(pdEvent{at: nx, eng: i})
			}
		}
	}
	submit := func(i int, r *engine.Request, res *Result) bool {
		if err := cores[i].Submit(r, now); err != nil {
			res.Err, res.Status = err.Error(), 400
			return false
		}
		step(i)
		return true
	}
	fail := func(sq *pdSimReq, err string) {
		sq.res.Err, sq.res.Status = err, 400
		sq.pl.Done(sched.OutcomeNeutral)
		sq.dl.Done(sched.OutcomeNeutral)
		inflight--
	}
	// startPrefill sends the prefill leg.
	startPrefill := func(sq *pdSimReq) {
		if !submit(sq.pEng, &sq.pre, sq.res) {
			cores[sq.dEng].Abort(&sq.dec, now)
			fail(sq, sq.res.Err)
		}
	}
	// startTransfer moves the KV once both ends are ready.
	startTransfer := func(sq *pdSimReq) {
		push(pdEvent{at: now + tm.TransferTime(sq.blocks), eng: -1, req: sq})
	}
	handle = func(evs []engine.Event) {
		for _, ev := range evs {
			sq := ev.Req.Tag.(*pdSimReq)
			res := sq.res
			switch {
			case ev.Req == &sq.pre:
				// The prefill leg computed the prompt and its token.
				sq.pl.FirstToken()
				res.CachedTokens = ev.Req.CachedTokens
				if mode == sched.PDModeSGLang {
					sq.blocks = cores[sq.pEng].Cache().BlocksFor(len(sq.pre.Prompt))
					startTransfer(sq) // push into the blocks the decode engine reserved
					continue
				}
				// vLLM: the router gets the answer and sends the decode leg.
				if !acquireDecode(s, appCfg, scratch, sq, engOf) {
					cores[sq.pEng].Abort(&sq.pre, now)
					fail(sq, "route: no decode worker")
					continue
				}
				if !submit(sq.dEng, &sq.dec, res) {
					cores[sq.pEng].Abort(&sq.pre, now)
					fail(sq, res.Err)
				}
			case ev.WaitingKV:
				// The decode engine reserved the blocks.
				if mode == sched.PDModeSGLang {
					startPrefill(sq) // SGLang's prefill waits for its decode engine
					continue
				}
				sq.blocks = cores[sq.pEng].Cache().BlocksFor(len(sq.pre.Prompt)) - ev.Req.CachedTokens/bs
				startTransfer(sq)
			default: // a decode engine's token
				if ev.Tokens == 1 {
					res.TTFT = ev.At - sq.arrival
					sq.dl.FirstToken()
					sq.first = true
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
						res.TTFT, res.Whole = res.E2E, true // read whole, as the client measures it
					}
					sq.dl.Done(sched.OutcomeSuccess)
					sq.pre.Prompt, sq.dec.Prompt = nil, nil
					sq.sr = sched.Request{}
					inflight--
				}
			}
		}
	}
	transferDone := func(sq *pdSimReq) {
		// The KV moved: the prefill engine frees its blocks (its lease ends
		// at the transfer), the decode engine decodes.
		cores[sq.pEng].Release(&sq.pre)
		sq.pl.Done(sched.OutcomeSuccess)
		tevs, _ = cores[sq.dEng].TransferDone(&sq.dec, now, tevs[:0])
		handle(tevs)
		step(sq.dEng)
	}
	arrive := func(i int) {
		r := &reqs[i]
		res := &results[i]
		res.Index, res.Start = i, now
		if lc.Arrival != ArrivalClosed && inflight >= lc.InFlight() {
			// As RunLoad: an open-loop arrival past --max-in-flight is
			// refused, never sent.
			res.Err = errOverload
			run.Dropped++
			return
		}
		text = lc.Prompt.AppendPrompt(text[:0], r.HashIDs, r.InputLength, uint64(i)+1)
		var prompt []uint32
		if lc.API == "chat" {
			msgs[0] = tokenizer.Message{Role: "user", Content: string(text)}
			rendered, _ := tok.RenderChat(nil, msgs, nil, true)
			prompt = tok.Encode(make([]uint32, 0, len(rendered)/4+1), rendered)
		} else {
			prompt = tok.Encode(make([]uint32, 0, len(text)/4+1), text)
		}
		res.PromptTokens = len(prompt)
		sq := &pdSimReq{idx: i, arrival: now, res: res}
		sr := &sq.sr
		sr.Model = []byte(cfg.Model)
		sr.Stream = lc.Stream
		sr.MaxTokens = r.OutputLength
		sr.PromptTokens = len(prompt)
		sr.Prompt = text
		if kvAware {
			sr.BlockHashes = kv.HashBlocks(nil, prompt, bs, "")
		}
		if top, err := s.Topology(appCfg, sr, scratch); err != nil || top != sched.TopologyPD {
			res.Err, res.Status = fmt.Sprintf("route: topology %s: %v", top, err), 503
			return
		}
		sr.SetLeg(sched.LegPrefill, nil)
		err := s.Acquire(appCfg, sr, scratch, &sq.pl)
		sr.Prompt = nil // text is the next arrival's buffer; the prompt was indexed
		if err != nil {
			res.Err, res.Status = "route: "+err.Error(), 503
			return
		}
		layers[sq.pl.Layer.String()]++
		sq.pEng = engOf[sq.pl.Worker.Idx]
		sq.pre = engine.Request{Prompt: prompt, MaxTokens: 1, HoldKV: true, Tag: sq}
		transfer := engine.TransferPull
		if mode == sched.PDModeSGLang {
			transfer = engine.TransferPush
		}
		sq.dec = engine.Request{Prompt: prompt, MaxTokens: r.OutputLength, Transfer: transfer, Tag: sq}
		inflight++
		if mode == sched.PDModeVLLM {
			startPrefill(sq)
			return
		}
		// SGLang: both legs at once; the decode engine reserves its blocks,
		// the prefill engine starts once the decode engine has joined.
		if !acquireDecode(s, appCfg, scratch, sq, engOf) {
			sq.pl.Done(sched.OutcomeNeutral)
			res.Err, res.Status = "route: no decode worker", 503
			inflight--
			return
		}
		if !submit(sq.dEng, &sq.dec, res) {
			fail(sq, res.Err)
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
			ok, stopped = false, true // the requests never sent are not results
		}
		for len(q) > 0 && q[0].eng >= 0 && q[0].at != next[q[0].eng] {
			heap.Pop(&q) // a stale step end
		}
		if ok && (len(q) == 0 || at <= q[0].at) {
			now = max(now, at)
			arrive(issued)
			issued++
			if lc.Arrival == ArrivalPoisson {
				rngAt += rng.next()
			}
			continue
		}
		if len(q) == 0 {
			break
		}
		ev := heap.Pop(&q).(pdEvent)
		now = ev.at
		if ev.eng < 0 {
			transferDone(ev.req)
			continue
		}
		next[ev.eng] = engine.Never
		step(ev.eng)
	}
	run.Results = results[:issued]
	run.Wall = now
	out := &SimResult{Run: run, Virtual: now, Real: time.Since(realStart), Workers: n, Layers: layers}
	if ix != nil {
		out.IndexBlocks = ix.Stats().Blocks
	}
	return out, nil
}

// acquireDecode takes the decode leg's lease for sq, paired with its
// prefill worker.
func acquireDecode(s *sched.Scheduler, cfg *config.Config, scratch []*fleet.Worker, sq *pdSimReq, engOf []int) bool {
	sq.sr.SetLeg(sched.LegDecode, sq.pl.Worker)
	if err := s.Acquire(cfg, &sq.sr, scratch, &sq.dl); err != nil {
		return false
	}
	sq.dEng = engOf[sq.dl.Worker.Idx]
	sq.res.Worker = sq.dl.Worker.ID
	return true
}
