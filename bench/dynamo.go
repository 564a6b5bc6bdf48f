package bench

import (
	"math/rand/v2"

	"github.com/infera/infera/fleet"
	"github.com/infera/infera/radix"
	"github.com/infera/infera/sched"
)

// PolicyDynamo is the simulator's emulation of NVIDIA Dynamo's KV router
// (its DefaultWorkerSelector, as documented in Dynamo's docs/router: "logit
// = kv_overlap_score_weight x potential_prefill_blocks +
// potential_active_blocks", lowest logit wins, ties at random), run on
// the same KV index, engines and workload as infera's policies, so that
// `infera bench simulate --policies kv-aware,dynamo` compares the two cost
// functions and nothing else. It is a yardstick for the simulator, not a
// router policy of infera serve.
const PolicyDynamo = "dynamo"

// dynamoScorer implements the cost function of Dynamo's KV router: for
// each candidate w, with o_w the prompt blocks w caches (the KV index's
// match) and N the prompt tokens,
//
//	potential_prefill_blocks = (prefill tokens of w's requests without a first token + N - o_w x block_size) / block_size
//	potential_active_blocks  = distinct prompt blocks of w's active requests, this request's included
//	logit = weight x potential_prefill_blocks + potential_active_blocks
//
// It tracks the active requests itself, as Dynamo's router does
// (ActiveSequences: a request's prefill tokens count until its first
// token, its blocks until it ends, a block shared by several active
// requests once). Unlike infera's kv-aware it never defers to the
// load-balancing layer: with no cached prefix anywhere the same logit
// balances load.
type dynamoScorer struct {
	idx    *radix.Index
	bs     int
	weight float64
	rng    *rand.Rand

	workers []dynWorker // by fleet.Worker.Idx
	ov      []radix.Overlap
	overlap []int
	logits  []float64
	reqs    map[int]*dynReq // by simulator request index
	last    *dynReq         // the request of the latest PickKV, bound by dispatched
}

type dynWorker struct {
	prefill int64          // prefill tokens of active requests before their first token
	blocks  map[uint64]int // distinct prompt blocks of active requests -> requests holding them
}

type dynReq struct {
	w       int // fleet.Worker.Idx
	prefill int64
	hashes  []uint64
	first   bool
}

func newDynamoScorer(ix *radix.Index, blockSize int, weight float64) *dynamoScorer {
	return &dynamoScorer{idx: ix, bs: blockSize, weight: weight, rng: rand.New(rand.NewPCG(1, 2)), reqs: map[int]*dynReq{}}
}

func (d *dynamoScorer) worker(idx int) *dynWorker {
	for len(d.workers) <= idx {
		d.workers = append(d.workers, dynWorker{blocks: map[uint64]int{}})
	}
	return &d.workers[idx]
}

// PickKV implements sched.KVScorer.
func (d *dynamoScorer) PickKV(cands []*fleet.Worker, r *sched.Request) *fleet.Worker {
	hashes := r.BlockHashes
	if len(hashes) == 0 || len(cands) == 0 {
		return nil
	}
	bs := int64(d.bs)
	N := max(int64(r.PromptTokens), int64(len(hashes))*bs)
	d.ov = d.idx.Match(d.ov[:0], hashes)
	d.overlap, d.logits = d.overlap[:0], d.logits[:0]
	best, choice, ties := 0.0, -1, 0
	for i, w := range cands {
		o := 0
		for _, x := range d.ov {
			if x.Worker == w.Idx {
				o = x.Blocks
			}
		}
		ws := d.worker(w.Idx)
		newTok := N - int64(o)*bs
		active := len(ws.blocks)
		for _, h := range hashes {
			if ws.blocks[h] == 0 {
				active++
			}
		}
		logit := d.weight*float64(ws.prefill+newTok)/float64(bs) + float64(active)
		d.overlap = append(d.overlap, o)
		d.logits = append(d.logits, logit)
		switch {
		case choice < 0 || logit < best:
			best, choice, ties = logit, i, 1
		case logit == best:
			ties++
			if d.rng.IntN(ties) == 0 {
				choice = i
			}
		}
	}
	w := cands[choice]
	d.last = &dynReq{w: w.Idx, prefill: N - int64(d.overlap[choice])*bs, hashes: append([]uint64(nil), hashes...)}
	return w
}

// dispatched binds the latest pick to simulator request i and accounts it
// on its worker; a pick by another layer (w differs) is accounted too, as
// Dynamo's router accounts every request it routes.
func (d *dynamoScorer) dispatched(i int, w *fleet.Worker, r *sched.Request) {
	q := d.last
	d.last = nil
	if q == nil || q.w != w.Idx {
		q = &dynReq{w: w.Idx, prefill: int64(r.PromptTokens), hashes: append([]uint64(nil), r.BlockHashes...)}
	}
	ws := d.worker(q.w)
	ws.prefill += q.prefill
	for _, h := range q.hashes {
		ws.blocks[h]++
	}
	d.reqs[i] = q
}

func (d *dynamoScorer) firstToken(i int) {
	q := d.reqs[i]
	if q == nil || q.first {
		return
	}
	q.first = true
	d.workers[q.w].prefill -= q.prefill
}

func (d *dynamoScorer) finished(i int) {
	d.firstToken(i)
	q := d.reqs[i]
	if q == nil {
		return
	}
	delete(d.reqs, i)
	ws := &d.workers[q.w]
	for _, h := range q.hashes {
		if ws.blocks[h]--; ws.blocks[h] <= 0 {
			delete(ws.blocks, h)
		}
	}
}
