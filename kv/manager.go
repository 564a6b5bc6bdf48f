package kv

import (
	"context"
	"encoding/binary"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/zeebo/xxh3"

	"github.com/infera/infera/fleet"
	"github.com/infera/infera/radix"
)

// ManagerConfig configures a Manager. Zero fields take the defaults noted.
type ManagerConfig struct {
	// Index receives the updates (required).
	Index *radix.Index
	// Transport is "zmq" to open one SUB socket per worker that advertises
	// a KV events endpoint; anything else means events arrive through Feed.
	Transport string
	// QueueSize bounds the per-worker queue of frames received (from the
	// SUB socket, or delivered by Feed) and not yet applied (default
	// 4096); frames beyond it are dropped and counted.
	QueueSize int
	// QueueBytes bounds the payload bytes in that queue (default 256 MiB):
	// a frame that does not fit is dropped and counted, unless the queue
	// is empty. The gap is then recovered or resynced.
	QueueBytes int64
	// RcvHWM is the ZMQ receive high-water mark per SUB socket, in messages
	// (default 100000); ZMQ drops beyond it and the gap is recovered.
	RcvHWM int
	// PollInterval bounds how long a ZMQ subscriber waits before it looks
	// at its socket's monitor again (a publisher's disconnection, when the
	// socket itself did not wake it; default 500ms). Stopping wakes it at
	// once.
	PollInterval time.Duration
	// ReplayTimeout bounds one replay request (default 2s).
	ReplayTimeout time.Duration
	// ReconnectDelay is the pause after a socket error (default 1s).
	ReconnectDelay time.Duration
	// BlockSize is used when neither the event nor the worker record gives
	// one (default 16).
	BlockSize int
	// PublisherTakeover paces changes of publisher when several share one
	// worker id over NATS (publisher.go; default 10s): a worker follows a
	// newer publisher instance at once unless it changed less than this
	// ago, and an older one only after the followed one has been silent
	// this long.
	PublisherTakeover time.Duration
}

// Manager keeps the index in step with every worker's KV events. It is a
// fleet.Hook: a worker gets one goroutine that applies its queued frames
// once it has something to apply (the first frame starts it), and one more
// that owns its ZMQ socket and queues what it receives when Transport is
// zmq and the worker has an endpoint; WorkerRemoved stops them and purges
// the worker's entries before returning. A worker that sends no events
// costs no goroutine and no queue.
type Manager struct {
	cfg ManagerConfig
	ms  *metrics.Set

	mu   sync.RWMutex
	byID map[string]*workerState
	wg   sync.WaitGroup

	// loras holds the LoRA adapter names the engines' BlockStored events
	// named (copied on write: new names are rare), for IsLora.
	loras  atomic.Pointer[map[string]string] // name -> name
	loraMu sync.Mutex
}

// maxLoraNames bounds the adapter names kept (a hostile publisher could
// send a new one in every event), maxLoraNameLen their length: a longer
// name is no model a worker may serve (fleet bounds model names at 512
// bytes), and names are kept for the router's lifetime: 256 names of 1 MiB
// held 516 MiB after their worker left.
const (
	maxLoraNames   = 4096
	maxLoraNameLen = 512
)

// IsLora returns the LoRA adapter name model is, when some engine stored
// blocks for it (vLLM's lora_name), else "": such a prompt's blocks are
// hashed with the adapter's seed, as the engine keys them. Safe from any
// goroutine; no allocation (the name returned is the kept one).
func (m *Manager) IsLora(model []byte) string {
	p := m.loras.Load()
	if p == nil || len(model) == 0 {
		return ""
	}
	return (*p)[string(model)]
}

// sawLora records an adapter name from an event.
func (m *Manager) sawLora(name []byte) {
	if len(name) > maxLoraNameLen {
		return
	}
	if p := m.loras.Load(); p != nil {
		if _, ok := (*p)[string(name)]; ok {
			return
		}
	}
	m.loraMu.Lock()
	defer m.loraMu.Unlock()
	old := m.loras.Load()
	n := 0
	if old != nil {
		if _, ok := (*old)[string(name)]; ok {
			return
		}
		n = len(*old)
	}
	if n >= maxLoraNames {
		return
	}
	next := make(map[string]string, n+1)
	if old != nil {
		for k, v := range *old {
			next[k] = v
		}
	}
	k := string(name)
	next[k] = k
	m.loras.Store(&next)
}

var _ fleet.Hook = (*Manager)(nil)

// NewManager returns a manager writing to cfg.Index and registers its
// metrics (per worker, plus infera_kv_index_{blocks,entries,bytes}).
func NewManager(cfg ManagerConfig) (*Manager, error) {
	if cfg.Index == nil {
		return nil, fmt.Errorf("kv: ManagerConfig.Index is required")
	}
	if cfg.QueueSize <= 0 {
		cfg.QueueSize = 4096
	}
	if cfg.QueueBytes <= 0 {
		cfg.QueueBytes = 256 << 20
	}
	if cfg.RcvHWM <= 0 {
		cfg.RcvHWM = 100000
	}
	if cfg.PollInterval <= 0 {
		cfg.PollInterval = 500 * time.Millisecond
	}
	if cfg.ReplayTimeout <= 0 {
		cfg.ReplayTimeout = 2 * time.Second
	}
	if cfg.ReconnectDelay <= 0 {
		cfg.ReconnectDelay = time.Second
	}
	if cfg.BlockSize <= 0 {
		cfg.BlockSize = 16
	}
	if cfg.PublisherTakeover <= 0 {
		cfg.PublisherTakeover = 10 * time.Second
	}
	m := &Manager{cfg: cfg, ms: metrics.NewSet(), byID: map[string]*workerState{}}
	idx := cfg.Index
	var statsMu sync.Mutex
	var stats radix.Stats
	var statsAt time.Time
	snap := func() radix.Stats { // one walk serves the three gauges of a scrape
		statsMu.Lock()
		defer statsMu.Unlock()
		if time.Since(statsAt) > time.Second {
			stats, statsAt = idx.Stats(), time.Now()
		}
		return stats
	}
	m.ms.NewGauge(`infera_kv_index_blocks`, func() float64 { return float64(snap().Blocks) })
	m.ms.NewGauge(`infera_kv_index_entries`, func() float64 { return float64(snap().Entries) })
	m.ms.NewGauge(`infera_kv_index_bytes`, func() float64 { return float64(snap().Bytes) })
	metrics.RegisterSet(m.ms)
	return m, nil
}

// Close stops every subscriber, waits for them and unregisters metrics.
// Index entries are left in place.
func (m *Manager) Close() {
	m.mu.Lock()
	for id, ws := range m.byID {
		ws.stop()
		delete(m.byID, id)
	}
	m.mu.Unlock()
	m.wg.Wait()
	metrics.UnregisterSet(m.ms, true)
}

// WorkerAdded starts following w's KV events.
func (m *Manager) WorkerAdded(w *fleet.Worker) error {
	if w.Idx < 0 || w.Idx >= radix.MaxWorkers {
		// Still routable, just not KV-aware: never refuse a worker here.
		slog.Error("worker id beyond the KV index capacity; its KV events are ignored",
			"worker", w.ID, "idx", w.Idx, "max", radix.MaxWorkers)
		return nil
	}
	ws := m.newWorkerState(w)
	m.mu.Lock()
	if old := m.byID[w.ID]; old != nil {
		old.stop()
	}
	m.byID[w.ID] = ws
	m.mu.Unlock()
	if m.cfg.Transport == "zmq" && w.KVEventsEndpoint != "" {
		// The socket is read as fast as it fills, into the queue bounded
		// in bytes: what ZMQ holds itself is bounded only in messages
		// (RcvHWM), and applying a batch is slower than receiving it.
		m.wg.Add(1)
		go func() {
			defer m.wg.Done()
			ws.runZMQ()
		}()
	}
	return nil
}

// WorkerRemoved stops following w and removes all its index entries before
// returning, so w.Idx may be reused at once.
func (m *Manager) WorkerRemoved(w *fleet.Worker) {
	m.mu.Lock()
	ws := m.byID[w.ID]
	if ws != nil && ws.w == w {
		delete(m.byID, w.ID)
	} else {
		ws = nil
	}
	m.mu.Unlock()
	if ws != nil {
		ws.stop() // waits for an in-flight apply, then no more writes
		ws.unregisterMetrics()
	}
	m.cfg.Index.RemoveWorker(w.Idx)
}

// Feed delivers one frame received by a non-ZMQ transport (the NATS relay):
// workerID is fleet.Worker.ID, instance the relay's instance id (0 when it
// stamps none; frames of instances other than the one the worker follows
// are dropped, see publisher.go), topic/seq/payload the three ZMQ frames.
// It never blocks: when the worker's queue is full the frame is dropped and
// counted (the sequence gap is then recovered or resynced). Feed copies
// payload. It reports whether the frame was queued.
func (m *Manager) Feed(workerID string, instance uint64, topic []byte, seq uint64, payload []byte) bool {
	m.mu.RLock()
	ws := m.byID[workerID]
	m.mu.RUnlock()
	if ws == nil {
		return false
	}
	return ws.enqueue(frame{instance: instance, seq: seq, payload: append([]byte(nil), payload...)})
}

// enqueue queues f for the worker's goroutine without blocking: a frame
// beyond QueueSize frames or QueueBytes bytes is dropped and counted (one
// frame fits whatever its size when nothing is queued).
func (ws *workerState) enqueue(f frame) bool {
	n := int64(len(f.payload))
	if q := ws.queued.Add(n); q > n && q > ws.m.cfg.QueueBytes {
		ws.queued.Add(-n)
		ws.mDropped.Inc()
		return false
	}
	ws.qmu.Lock()
	if ws.stopped.Load() || len(ws.q)-ws.qhead >= ws.m.cfg.QueueSize {
		ws.qmu.Unlock()
		ws.queued.Add(-n)
		ws.mDropped.Inc()
		return false
	}
	ws.q = append(ws.q, f)
	if !ws.running {
		// The first frame starts the goroutine that applies them. Under
		// qmu and before stop's barrier on it, so Close's Wait follows
		// this Add.
		ws.running = true
		ws.m.wg.Add(1)
		go func() {
			defer ws.m.wg.Done()
			ws.runFeed()
		}()
	}
	ws.qmu.Unlock()
	select {
	case ws.sig <- struct{}{}:
	default:
	}
	return true
}

// dequeue takes the oldest queued frame; ok is false when none is queued.
func (ws *workerState) dequeue() (f frame, ok bool) {
	ws.qmu.Lock()
	defer ws.qmu.Unlock()
	if ws.qhead == len(ws.q) {
		return frame{}, false
	}
	f = ws.q[ws.qhead]
	ws.q[ws.qhead] = frame{}
	ws.qhead++
	if ws.qhead == len(ws.q) {
		// Drained: a burst's backing array (up to QueueSize frames) is
		// not kept for a worker that has gone quiet.
		ws.qhead = 0
		if cap(ws.q) > 64 {
			ws.q = nil
		} else {
			ws.q = ws.q[:0]
		}
	}
	return f, true
}

// queuedFrames returns how many frames wait to be applied.
func (ws *workerState) queuedFrames() int {
	ws.qmu.Lock()
	defer ws.qmu.Unlock()
	return len(ws.q) - ws.qhead
}

// WorkerStats are one worker's event counters. Duplicates counts frames
// dropped because another publisher is followed, PublisherChanges the
// changes of publisher (publisher.go).
type WorkerStats struct {
	Applied, Dropped, Malformed, Unknown, Stale, Gaps, Recoveries, Resyncs uint64
	Duplicates, PublisherChanges, CatchUps                                 uint64
}

// Stats returns the counters of the worker with id (zero when unknown).
func (m *Manager) Stats(workerID string) WorkerStats {
	m.mu.RLock()
	ws := m.byID[workerID]
	m.mu.RUnlock()
	if ws == nil {
		return WorkerStats{}
	}
	return WorkerStats{
		Applied: ws.mApplied.Get(), Dropped: ws.mDropped.Get(), Malformed: ws.mMalformed.Get(),
		Unknown: ws.mUnknown.Get(), Stale: ws.mStale.Get(), Gaps: ws.mGaps.Get(),
		Recoveries: ws.mRecoveries.Get(), Resyncs: ws.mResyncs.Get(),
		Duplicates: ws.mDuplicate.Get(), PublisherChanges: ws.mChanges.Get(),
		CatchUps: ws.mCatchUps.Get(),
	}
}

// duplicatePublisher is the gauge of worker id (0 when unknown): the gauge
// is registered once per id and outlives a workerState replaced by
// WorkerAdded, so it looks the current one up.
func (m *Manager) duplicatePublisher(id string) float64 {
	m.mu.RLock()
	ws := m.byID[id]
	m.mu.RUnlock()
	if ws == nil {
		return 0
	}
	return ws.duplicatePublisher()
}

type frame struct {
	instance uint64
	seq      uint64
	payload  []byte
}

// blockRef maps an engine hash to the router's hash and its chain's root;
// n is how many times the engine stored the hash and has not removed it
// yet (vLLM may hold two physical blocks under one hash and announce each).
type blockRef struct {
	hash, root uint64
	n          uint32
}

type rankState struct {
	started bool
	next    uint64
	blocks  map[uint64]blockRef // engine hash -> router hash
	// refs counts, per router hash, the engine blocks stored and not yet
	// removed that map to it (the sum of their n): blocks with the same
	// tokens but other engine hashes (vLLM keys cache_salt, multimodal
	// extra_keys and lora_id into its hash; the router does not) are one
	// router block, which leaves the index with the last of them.
	refs map[uint64]uint32
	// lastClear is when the rank's index entries were last cleared; dirty
	// says a clear was put off (clears come at most every minClearEvery:
	// each one walks the whole index, so a publisher that clears or
	// restarts in a loop must not make every batch a full scan).
	lastClear time.Time
	dirty     bool
	// lastTS is the timestamp of the last batch applied: a repeat of the
	// last batch has it too.
	lastTS float64
	// clearArmed says a timer will do the clear put off (dirty) if no
	// batch comes first: a rank that goes quiet after a clear must not
	// keep its stale entries.
	clearArmed bool
	// since holds, while a clear is put off, what the rank stored and
	// removed after it, in order: written to the index at once (on top of
	// the stale entries), and again after the index clear, which would
	// otherwise take them too. sinceBlocks counts their hashes.
	since       []indexOp
	sinceBlocks int
}

// indexOp is one index write: a Store (remove false) or a Remove.
type indexOp struct {
	remove       bool
	hasParent    bool
	root, parent uint64
	hashes       []uint64
}

// maxSinceBlocks bounds the blocks kept in since: past it the clear put
// off is done at once (one walk of the index per that many blocks).
var maxSinceBlocks = 1 << 16 // a var for tests

// maxRankBlocks bounds the engine blocks one (worker, rank) may hold in the
// router (its index entries and the engine-hash maps, about 130 bytes a
// block): 8Mi, more blocks than any GPU's KV cache holds (128Mi tokens
// in 16-token blocks, 8Mi in SGLang's 1-token pages). A publisher that
// stores without ever removing grew the router by gigabytes a minute;
// past the bound its BlockStored events are dropped. A var for tests.
var maxRankBlocks = 1 << 23

// minClearEvery is the least time between two index clears of one rank.
const minClearEvery = 100 * time.Millisecond

// workerState follows one worker. Everything below mu is owned by the
// worker's goroutine; mu is held while a batch is applied so that stop can
// wait for the last write.
type workerState struct {
	m         *Manager
	w         *fleet.Worker
	idx       int
	blockSize int
	// q[qhead:] holds the frames received and not yet applied (at most
	// QueueSize, allocated as they come); running says the goroutine that
	// applies them was started (by the first frame). Under qmu. sig wakes
	// that goroutine.
	qmu     sync.Mutex
	q       []frame
	qhead   int
	running bool
	sig     chan struct{}
	queued  atomic.Int64 // payload bytes in q
	done    chan struct{}

	mu      sync.Mutex
	stopped atomic.Bool
	// wake is the file a ZMQ subscriber waits on (nil when none): stop
	// moves its deadline to the past.
	wake atomic.Pointer[os.File]

	dec     Decoder
	ranks   map[int]*rankState
	scratch []uint64
	pub     publisherState
	lastLog atomic.Int64
	// lastDupLog and lastDuplicate (unix ns) are read by other goroutines
	// (the duplicate warning's throttle, the gauge at scrape time).
	lastDupLog, lastDuplicate atomic.Int64

	labels                                                  string
	mApplied, mDropped, mMalformed, mUnknown, mStale, mGaps *metrics.Counter
	mRecoveries, mResyncs, mDuplicate, mChanges, mCatchUps  *metrics.Counter
	replayFn                                                func(rank int, start uint64, fn func(seq uint64, payload []byte)) error
	metricNames                                             []string
}

func (m *Manager) newWorkerState(w *fleet.Worker) *workerState {
	ws := &workerState{
		m: m, w: w, idx: w.Idx, blockSize: w.BlockSize,
		sig: make(chan struct{}, 1), done: make(chan struct{}),
		ranks: map[int]*rankState{},
	}
	if ws.blockSize <= 0 {
		ws.blockSize = m.cfg.BlockSize
	}
	ws.labels = `{worker=` + fleet.QuoteLabel(w.ID) + `}`
	c := func(name string) *metrics.Counter {
		full := name + ws.labels
		ws.metricNames = append(ws.metricNames, full)
		return m.ms.GetOrCreateCounter(full)
	}
	ws.mApplied = c("infera_kv_events_applied_total")
	ws.mDropped = c("infera_kv_events_dropped_total")
	ws.mMalformed = c("infera_kv_events_malformed_total")
	ws.mUnknown = c("infera_kv_events_unknown_total")
	ws.mStale = c("infera_kv_batches_stale_total")
	ws.mGaps = c("infera_kv_seq_gaps_total")
	ws.mRecoveries = c("infera_kv_seq_recoveries_total")
	ws.mResyncs = c("infera_kv_resyncs_total")
	ws.mDuplicate = c("infera_kv_duplicate_publisher_batches_total")
	ws.mChanges = c("infera_kv_publisher_changes_total")
	ws.mCatchUps = c("infera_kv_catchups_total")
	gauge := "infera_kv_duplicate_publisher" + ws.labels
	ws.metricNames = append(ws.metricNames, gauge)
	id := w.ID
	m.ms.GetOrCreateGauge(gauge, func() float64 { return m.duplicatePublisher(id) })
	// Replay reaches the engine's ROUTER socket directly, so only when the
	// events themselves come over ZMQ; over NATS a gap resyncs instead of
	// blocking the feed on an engine the router may not reach.
	if w.KVReplayEndpoint != "" && m.cfg.Transport == "zmq" {
		// Given as the engine binds it (tcp://*:5558), as the events
		// endpoint may be: connected to on the worker's host.
		ep, timeout := connectEndpoint(w.KVReplayEndpoint, w.Addr), m.cfg.ReplayTimeout
		ws.replayFn = func(rank int, start uint64, fn func(uint64, []byte)) error {
			return Replay(rankEndpoint(ep, rank), start, timeout, fn)
		}
	}
	return ws
}

func (ws *workerState) unregisterMetrics() {
	for _, n := range ws.metricNames {
		ws.m.ms.UnregisterMetric(n)
	}
}

// stop makes the goroutine exit and waits for any batch being applied.
func (ws *workerState) stop() {
	if ws.stopped.Swap(true) {
		return
	}
	if f := ws.wake.Load(); f != nil {
		_ = f.SetReadDeadline(time.Unix(1, 0)) // closed already: nothing to wake
	}
	ws.mu.Lock()
	//lint:ignore SA2001 a barrier: once we hold mu, the in-flight apply is done
	ws.mu.Unlock()
	ws.qmu.Lock()
	ws.q, ws.qhead = nil, 0 // no enqueue after stopped (checked under qmu)
	ws.qmu.Unlock()
	close(ws.done)
}

// logf logs at most once per 10 seconds per worker at warning level; the
// lines that throttle holds back go out at debug level (--log-level debug
// shows every gap and decode error).
func (ws *workerState) logf(msg string, args ...any) {
	now := time.Now().UnixNano()
	last := ws.lastLog.Load()
	if now-last < int64(10*time.Second) || !ws.lastLog.CompareAndSwap(last, now) {
		if slog.Default().Enabled(context.Background(), slog.LevelDebug) {
			slog.Debug(msg, append([]any{"worker", ws.w.ID}, args...)...)
		}
		return
	}
	slog.Warn(msg, append([]any{"worker", ws.w.ID}, args...)...)
}

func (ws *workerState) runFeed() {
	for {
		select {
		case <-ws.done:
			return
		case <-ws.sig:
		}
		for !ws.stopped.Load() {
			f, ok := ws.dequeue()
			if !ok {
				break
			}
			ws.handleFrame(&f)
			ws.queued.Add(-int64(len(f.payload)))
		}
	}
}

// handleFrame handles one queued frame if it comes from the publisher the
// worker follows (the ZMQ socket's frames have instance 0: its one
// publisher).
func (ws *workerState) handleFrame(f *frame) {
	if ws.follow(f.instance) {
		ws.handle(f.seq, f.payload)
	}
}

// enqueueFrames queues one ZMQ multipart message.
func (ws *workerState) enqueueFrames(msg [][]byte) {
	if len(msg) != 3 || len(msg[1]) != 8 {
		ws.mMalformed.Inc()
		ws.logf("malformed KV event message", "frames", len(msg))
		return
	}
	ws.enqueue(frame{seq: binary.BigEndian.Uint64(msg[1]), payload: msg[2]})
}

func (ws *workerState) rank(r int) *rankState {
	rs := ws.ranks[r]
	if rs == nil {
		rs = &rankState{blocks: map[uint64]blockRef{}, refs: map[uint64]uint32{}}
		ws.ranks[r] = rs
	}
	return rs
}

// handle runs the sequence logic for one batch.
func (ws *workerState) handle(seq uint64, payload []byte) {
	b, err := ws.dec.Decode(payload)
	if err != nil {
		ws.mMalformed.Inc()
		ws.logf("cannot decode KV event batch", "seq", seq, "err", err)
		// Skipped, not a gap: with one rank followed the batch is that
		// rank's, so the next one must not look like a gap (whose replay
		// would bring the same batch back and end in a resync).
		if len(ws.ranks) == 1 && ws.w.DPSize <= 1 {
			for _, rs := range ws.ranks {
				if rs.started && seq == rs.next {
					rs.next = seq + 1
				}
			}
		}
		return
	}
	if ws.ranks[b.DPRank] == nil && len(ws.ranks) >= max(1, ws.w.DPSize) {
		// Each rank may hold maxRankBlocks: a worker follows as many as
		// its dp_size (whichever numbers they have: one vLLM rank may be
		// a worker of its own).
		ws.mDropped.Inc()
		ws.logf("KV event batch of more data-parallel ranks than the worker's dp_size, dropped", "rank", b.DPRank, "dp_size", ws.w.DPSize)
		return
	}
	rs := ws.rank(b.DPRank)
	switch {
	case !rs.started || seq == rs.next:
		if !rs.started {
			if b = ws.catchUpBefore(b, rs, seq, payload); b == nil {
				return
			}
		}
		rs.started = true
		ws.apply(b, rs)
		rs.next = seq + 1
		return
	case seq < rs.next:
		// PUB/SUB and the NATS relay never reorder or redeliver, and replayed
		// batches are filtered below: a backward sequence means the publisher
		// restarted, whether or not its batch 0 reached us (slow joiner,
		// relay reconnect). Only a repeat of the last batch counts as stale.
		// A batch 0 again is a restart after one batch; so is a batch
		// numbered as the last one but made at another time (a restart
		// whose earlier batches were lost). The new publisher's batches
		// before this one are in its replay buffer: it is caught up from
		// them, as on first contact.
		if seq != rs.next-1 || seq == 0 || b.TS != rs.lastTS {
			ws.logf("KV event publisher restarted, resyncing", "rank", b.DPRank, "seq", seq, "want", rs.next)
			ws.resync(b.DPRank, rs)
			if b = ws.catchUpBefore(b, rs, seq, payload); b == nil {
				return
			}
			ws.apply(b, rs)
			rs.next = seq + 1
			return
		}
		ws.mStale.Inc()
		return
	}
	// Gap: [rs.next, seq) is missing.
	ws.mGaps.Inc()
	rank := b.DPRank
	var replayErr error
	if ws.replayFn != nil && !ws.stopped.Load() {
		err := ws.replayFn(rank, rs.next, func(s uint64, p []byte) {
			if s < rs.next || s >= seq {
				return
			}
			if s != rs.next {
				return
			}
			rb, err := ws.dec.Decode(p)
			if err != nil {
				// The rank's replay endpoint sent it: skip it as the
				// live feed does.
				ws.mMalformed.Inc()
				rs.next = s + 1
				return
			}
			if rb.DPRank != rank {
				return
			}
			ws.apply(rb, rs)
			rs.next = s + 1
		})
		replayErr = err
		if rs.next == seq {
			ws.mRecoveries.Inc()
			if b, err = ws.dec.Decode(payload); err == nil { // the decoder was reused
				ws.apply(b, rs)
				rs.next = seq + 1
			}
			return
		}
	}
	if replayErr != nil {
		ws.logf("KV event gap not filled by the replay, resyncing", "rank", rank, "want", rs.next, "got", seq, "err", replayErr)
	} else if ws.replayFn != nil {
		ws.logf("KV event gap not filled by the replay (the engine no longer holds the batches), resyncing", "rank", rank, "want", rs.next, "got", seq)
	} else {
		ws.logf("KV event gap without replay, resyncing", "rank", rank, "want", rs.next, "got", seq)
	}
	ws.resync(rank, rs)
	if b, err = ws.dec.Decode(payload); err == nil {
		ws.apply(b, rs)
	}
	rs.next = seq + 1
}

// catchUpBefore catches the rank of b (the batch seq, decoded from
// payload) up from the replay buffer (catchUp) when the worker has one and
// seq is not the first batch, and returns b decoded again (catchUp reuses
// the decoder), or nil if that fails.
func (ws *workerState) catchUpBefore(b *Batch, rs *rankState, seq uint64, payload []byte) *Batch {
	if seq == 0 || ws.replayFn == nil || ws.stopped.Load() {
		return b
	}
	ws.catchUp(b.DPRank, rs, seq)
	b, err := ws.dec.Decode(payload)
	if err != nil {
		return nil
	}
	return b
}

// catchUp fills a rank the router starts following mid-stream (the
// router's start, a worker added, a new publisher, a publisher restarted
// at the same endpoint) from the engine's replay buffer, every batch
// before seq: vLLM announces a block once, when it is computed, so blocks
// cached before the router listened (a shared system prompt) would never
// be indexed, and every block stored on their chain later would be
// dropped for its unknown parent. The buffer holds
// the latest batches (10,000 by default in vLLM); whatever it no longer
// holds stays unknown. A replay that fails before reaching seq leaves
// nothing behind (what it applied may have been removed in the batches
// it did not bring).
func (ws *workerState) catchUp(rank int, rs *rankState, seq uint64) {
	next, got := uint64(0), false
	err := ws.replayFn(rank, 0, func(s uint64, p []byte) {
		if s >= seq || (got && s != next) {
			return
		}
		got, next = true, s+1
		rb, err := ws.dec.Decode(p)
		if err != nil {
			ws.mMalformed.Inc()
			return
		}
		if rb.DPRank != rank {
			return
		}
		ws.apply(rb, rs)
	})
	if err == nil && got && next == seq {
		ws.mCatchUps.Inc()
		return
	}
	if err != nil {
		ws.logf("KV event replay on first contact or restart failed; blocks cached before it stay unknown", "rank", rank, "err", err)
	}
	if got {
		ws.resync(rank, rs)
	}
}

// resync forgets everything the worker's rank had cached: the index is
// rebuilt from the events that follow.
func (ws *workerState) resync(rank int, rs *rankState) {
	ws.mResyncs.Inc()
	ws.mu.Lock()
	if !ws.stopped.Load() {
		ws.clearRank(rank, rs)
	}
	ws.mu.Unlock()
}

// clearRank drops the rank's index entries (ws.mu held). A rank with
// nothing indexed costs nothing; a clear within minClearEvery of the last
// one is put off (dirty) to the first batch after that time, or a timer,
// whichever comes first (flushClear).
func (ws *workerState) clearRank(rank int, rs *rankState) {
	if len(rs.blocks) > 0 {
		rs.dirty = true
	}
	rs.blocks = map[uint64]blockRef{} // clear() would keep the peak size
	rs.refs = map[uint64]uint32{}
	rs.since, rs.sinceBlocks = nil, 0 // what came after an earlier clear goes too
	if rs.dirty {
		ws.flushClear(rank, rs, false)
	}
}

// flushClear does the index clear put off (dirty) once minClearEvery has
// passed since the last one (or now), then writes again what the rank
// stored and removed since the clear (since): a block the engine stored
// after the clear stays indexed. ws.mu held.
func (ws *workerState) flushClear(rank int, rs *rankState, now bool) {
	t := time.Now()
	if wait := minClearEvery - t.Sub(rs.lastClear); wait > 0 && !now {
		if !rs.clearArmed {
			rs.clearArmed = true
			time.AfterFunc(wait, func() {
				ws.mu.Lock()
				defer ws.mu.Unlock()
				rs.clearArmed = false
				if rs.dirty && !ws.stopped.Load() {
					ws.flushClear(rank, rs, false)
				}
			})
		}
		return
	}
	idx := ws.m.cfg.Index
	idx.Clear(ws.idx, rank)
	rs.lastClear, rs.dirty = t, false
	for _, op := range rs.since {
		if op.remove {
			idx.Remove(ws.idx, rank, op.root, op.hashes)
		} else if err := idx.Store(ws.idx, rank, op.root, op.parent, op.hasParent, op.hashes); err != nil {
			ws.logf("cannot index stored blocks", "err", err)
		}
	}
	rs.since, rs.sinceBlocks = nil, 0
}

// noteSince keeps an index write made while a clear is put off (since).
func (ws *workerState) noteSince(rank int, rs *rankState, op indexOp) {
	if !rs.dirty {
		return
	}
	op.hashes = append([]uint64(nil), op.hashes...)
	rs.since = append(rs.since, op)
	if rs.sinceBlocks += len(op.hashes); rs.sinceBlocks > maxSinceBlocks {
		ws.flushClear(rank, rs, true)
	}
}

// apply writes one batch to the index.
func (ws *workerState) apply(b *Batch, rs *rankState) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if ws.stopped.Load() {
		return
	}
	if b.Unknown > 0 {
		ws.mUnknown.Add(b.Unknown)
	}
	rank := b.DPRank
	rs.lastTS = b.TS
	if rs.dirty && time.Since(rs.lastClear) >= minClearEvery {
		ws.flushClear(rank, rs, false) // a clear put off
	}
	for i := range b.Events {
		e := &b.Events[i]
		if !e.IsGPU() || e.GroupIdx != 0 {
			continue // other tiers and KV cache groups are not routed on
		}
		switch e.Kind {
		case KindBlockStored:
			ws.applyStored(e, rank, rs)
		case KindBlockRemoved:
			ws.applyRemoved(e, rank, rs)
		case KindAllBlocksCleared:
			ws.clearRank(rank, rs)
			ws.mApplied.Inc()
		}
	}
}

func (ws *workerState) applyStored(e *Event, rank int, rs *rankState) {
	bs := e.BlockSize
	if bs <= 0 {
		bs = ws.blockSize
	} else if bs != ws.blockSize {
		// The worker's block size (its record's, else --kv-block-size) is
		// the one the router expects (a record other than --kv-block-size
		// is warned about when it is added): these could never match.
		ws.mDropped.Inc()
		ws.logf("BlockStored with a block size other than the worker's (its record's block_size, or --kv-block-size)", "event_block_size", bs, "block_size", ws.blockSize)
		return
	}
	if len(e.Hashes) == 0 || len(e.Tokens) != len(e.Hashes)*bs {
		ws.mMalformed.Inc()
		ws.logf("BlockStored with inconsistent token count", "blocks", len(e.Hashes), "tokens", len(e.Tokens), "block_size", bs)
		return
	}
	if len(rs.blocks)+len(e.Hashes) > maxRankBlocks {
		ws.mDropped.Inc()
		ws.logf("BlockStored beyond the blocks a rank may hold (a publisher that never removes any?), dropped", "rank", rank, "held", len(rs.blocks), "max", maxRankBlocks)
		return
	}
	var seed, root uint64
	if e.HasParent {
		ref, ok := rs.blocks[e.Parent]
		if !ok {
			// The parent was never seen (we joined mid-stream): the prefix of
			// these blocks is unknown, so they can never match a prompt.
			ws.mDropped.Inc()
			return
		}
		seed, root = ref.hash, ref.root
	} else if len(e.LoraName) > 0 {
		seed = xxh3.Hash(e.LoraName)
	}
	if len(e.LoraName) > 0 {
		ws.m.sawLora(e.LoraName)
	}
	ws.scratch = HashBlocksSeed(ws.scratch[:0], e.Tokens, bs, seed)
	if len(ws.scratch) != len(e.Hashes) { // a block size the check's product overflowed
		ws.mMalformed.Inc()
		return
	}
	if !e.HasParent {
		root = ws.scratch[0]
	}
	released := false
	for i, h := range e.Hashes {
		ref, ok := rs.blocks[h]
		if ok && (ref.hash != ws.scratch[i] || ref.root != root) {
			// The engine hash now names other blocks (a collision, or a
			// publisher that lies): the ones it named go.
			ws.release(rank, rs, h, ref, ref.n)
			ok, released = false, true
		}
		if ok {
			ref.n++
		} else {
			ref = blockRef{hash: ws.scratch[i], root: root, n: 1}
		}
		rs.blocks[h] = ref
		rs.refs[ref.hash]++
	}
	stored := ws.scratch
	if released {
		// An engine hash named twice in this event (a publisher that
		// lies) released the block it named first before that block was
		// indexed: the chain is indexed only up to that block, which
		// would otherwise stay indexed for good (no engine hash left to
		// remove it by).
		for i, h := range e.Hashes {
			if rs.blocks[h].hash != stored[i] {
				stored = stored[:i]
				break
			}
		}
	}
	if err := ws.m.cfg.Index.Store(ws.idx, rank, root, seed, e.HasParent, stored); err != nil {
		ws.mDropped.Inc()
		ws.logf("cannot index stored blocks", "err", err)
		return
	}
	ws.noteSince(rank, rs, indexOp{root: root, parent: seed, hasParent: e.HasParent, hashes: stored})
	ws.mApplied.Inc()
}

func (ws *workerState) applyRemoved(e *Event, rank int, rs *rankState) {
	idx := ws.m.cfg.Index
	run := ws.scratch[:0]
	var root uint64
	for _, eh := range e.Hashes {
		ref, ok := rs.blocks[eh]
		if !ok || !rs.unref(eh, ref, 1) {
			continue // unknown, or the engine still holds a block with its tokens
		}
		if len(run) > 0 && ref.root != root {
			idx.Remove(ws.idx, rank, root, run)
			ws.noteSince(rank, rs, indexOp{remove: true, root: root, hashes: run})
			run = run[:0]
		}
		root = ref.root
		run = append(run, ref.hash)
	}
	if len(run) > 0 {
		idx.Remove(ws.idx, rank, root, run)
		ws.noteSince(rank, rs, indexOp{remove: true, root: root, hashes: run})
	}
	ws.scratch = run
	ws.mApplied.Inc()
}

// unref drops k of the n stored copies of engine hash eh (ref is
// rs.blocks[eh]) from the counts and reports whether no engine block of
// ref's router hash is left: then it leaves the index.
func (rs *rankState) unref(eh uint64, ref blockRef, k uint32) bool {
	if ref.n > k {
		ref.n -= k
		rs.blocks[eh] = ref
	} else {
		k = ref.n
		delete(rs.blocks, eh)
	}
	if c := rs.refs[ref.hash]; c > k {
		rs.refs[ref.hash] = c - k
		return false
	}
	delete(rs.refs, ref.hash)
	return true
}

// release drops k stored copies of engine hash eh (ref is rs.blocks[eh])
// and removes its router block from the index if none is left. ws.mu held.
func (ws *workerState) release(rank int, rs *rankState, eh uint64, ref blockRef, k uint32) {
	if !rs.unref(eh, ref, k) {
		return
	}
	one := [1]uint64{ref.hash}
	ws.m.cfg.Index.Remove(ws.idx, rank, ref.root, one[:])
	ws.noteSince(rank, rs, indexOp{remove: true, root: ref.root, hashes: one[:]})
}

// connectEndpoint turns an advertised bind address (tcp://*:5557,
// tcp://0.0.0.0:5557) into one the router can connect to, using the host of
// the worker's HTTP address.
func connectEndpoint(ep, workerAddr string) string {
	const tcp = "tcp://"
	if len(ep) <= len(tcp) || ep[:len(tcp)] != tcp {
		return ep
	}
	hostport := ep[len(tcp):]
	i := lastColon(hostport)
	if i < 0 {
		return ep
	}
	host := hostport[:i]
	if host != "*" && host != "0.0.0.0" && host != "[::]" && host != "::" {
		return ep
	}
	wh := workerAddr
	if j := lastColon(wh); j >= 0 {
		wh = wh[:j]
	}
	if wh == "" {
		wh = "127.0.0.1"
	}
	return tcp + wh + hostport[i:]
}

// rankEndpoint returns the endpoint of data-parallel rank r: vLLM binds
// rank r's publisher (and replay socket) on the base port + r.
func rankEndpoint(ep string, r int) string {
	if r == 0 {
		return ep
	}
	i := lastColon(ep)
	if i < 0 {
		return ep
	}
	port, err := strconv.Atoi(ep[i+1:])
	if err != nil {
		return ep
	}
	return ep[:i+1] + strconv.Itoa(port+r)
}

func lastColon(s string) int {
	for i := len(s) - 1; i >= 0; i-- {
		if s[i] == ':' {
			return i
		}
	}
	return -1
}
