package engine

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// EventLayout is the msgpack shape of published KV event batches.
type EventLayout string

// Layouts of published events.
const (
	// LayoutLegacy encodes the batch as [ts, events, dp_rank] and events as
	// positional arrays (vLLM's array_like structs).
	LayoutLegacy EventLayout = "legacy"
	// LayoutMap encodes the batch as {"ts", "events", "data_parallel_rank"}
	// and events as maps tagged with "type" (vLLM since mid-2026).
	LayoutMap EventLayout = "map"
)

// endSeq is the replay end marker: the all-ones 8-byte sequence.
const endSeq = ^uint64(0)

// PublisherConfig configures a Publisher.
type PublisherConfig struct {
	// Endpoint is the ZMQ PUB bind address, e.g. tcp://*:5557 or
	// tcp://127.0.0.1:* (an ephemeral port; see Publisher.Endpoint).
	Endpoint string
	// ReplayEndpoint is the optional ROUTER bind address for replay.
	ReplayEndpoint string
	// Layout is LayoutLegacy (default when empty) or LayoutMap.
	Layout EventLayout
	// Topic is the first frame of every message (default empty).
	Topic string
	// DPRank is the data-parallel rank stamped on every batch.
	DPRank int
	// FlushInterval is the longest an event waits before its batch is sent
	// (default 5ms); MaxBatchEvents sends earlier (default 256).
	FlushInterval  time.Duration
	MaxBatchEvents int
	// BufferSteps is how many past batches replay can serve (default 10000).
	BufferSteps int
	// MaxPendingEvents bounds events waiting for the publisher goroutine
	// (default 1<<20); beyond it events are dropped and counted.
	MaxPendingEvents int
}

// Publisher emits KV cache events in vLLM's wire format (ZMQ PUB multipart
// [topic, 8-byte big-endian seq, msgpack batch], plus a ROUTER replay
// server). Its event methods implement KVEventSink and may be called from
// one goroutine at a time (the cache owner); a background goroutine owns
// the sockets (zmq.go).
type Publisher struct {
	cfg    PublisherConfig
	topic  []byte
	isMap  bool
	mu     sync.Mutex
	events []byte // encoded events not yet sent
	n      int
	kick   chan struct{}
	done   chan struct{}
	exited chan struct{}
	closed atomic.Bool

	// sent and dropped count batches sent and events dropped.
	sent, dropped atomic.Uint64
	// lost is set when an event was dropped: the next batch skips a
	// sequence number, leaving a gap no replay can fill, so subscribers
	// clear this engine's entries and rebuild instead of drifting.
	lost atomic.Bool

	// owned by the publisher goroutine
	seq  uint64
	ring []batchRec
	head int // index of the oldest record when the ring is full

	endpoint, replayEndpoint string

	// dropNext > 0 makes the next batches go to the replay ring without
	// being published (DropNext).
	dropNext atomic.Int32
}

var _ KVEventSink = (*Publisher)(nil)

type batchRec struct {
	seq     uint64
	payload []byte
}

func (c *PublisherConfig) setDefaults() error {
	switch c.Layout {
	case "":
		c.Layout = LayoutLegacy
	case LayoutLegacy, LayoutMap:
	default:
		return fmt.Errorf("kv publisher: layout %q: want legacy or map", c.Layout)
	}
	if c.Endpoint == "" {
		return fmt.Errorf("kv publisher: endpoint is required")
	}
	if c.FlushInterval <= 0 {
		c.FlushInterval = 5 * time.Millisecond
	}
	if c.MaxBatchEvents <= 0 {
		c.MaxBatchEvents = 256
	}
	if c.BufferSteps <= 0 {
		c.BufferSteps = 10000
	}
	if c.MaxPendingEvents <= 0 {
		c.MaxPendingEvents = 1 << 20
	}
	return nil
}

func newPublisher(cfg PublisherConfig) (*Publisher, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	return &Publisher{
		cfg: cfg, topic: []byte(cfg.Topic), isMap: cfg.Layout == LayoutMap,
		kick: make(chan struct{}, 1), done: make(chan struct{}), exited: make(chan struct{}),
	}, nil
}

// Endpoint returns the bound PUB address (with the real port).
func (p *Publisher) Endpoint() string { return p.endpoint }

// ReplayEndpoint returns the bound ROUTER address, or "".
func (p *Publisher) ReplayEndpoint() string { return p.replayEndpoint }

// Sent returns the number of batches published.
func (p *Publisher) Sent() uint64 { return p.sent.Load() }

// Dropped returns the number of events dropped because the queue was full.
func (p *Publisher) Dropped() uint64 { return p.dropped.Load() }

// DropNext is fault injection for subscribers: the next n batches keep
// their sequence numbers and stay in the replay ring but never reach the
// PUB socket, as if the network lost them. A subscriber sees a sequence gap
// and must replay it (or resync when there is no replay endpoint).
func (p *Publisher) DropNext(n int) { p.dropNext.Add(int32(n)) }

// Pending returns how many batches DropNext still has to drop.
func (p *Publisher) Pending() int { return int(p.dropNext.Load()) }

// begin locks p for appending one event; it returns false (unlocked) when
// the event must be dropped.
func (p *Publisher) begin() bool {
	if p.closed.Load() {
		return false
	}
	p.mu.Lock()
	if p.n >= p.cfg.MaxPendingEvents {
		p.mu.Unlock()
		p.dropped.Add(1)
		p.lost.Store(true)
		return false
	}
	return true
}

// end counts the appended event, unlocks p and wakes the sender when a
// batch is full.
func (p *Publisher) end() {
	p.n++
	full := p.n >= p.cfg.MaxBatchEvents
	p.mu.Unlock()
	if full {
		select {
		case p.kick <- struct{}{}:
		default:
		}
	}
}

// BlockStored queues a BlockStored event (medium GPU, no LoRA).
func (p *Publisher) BlockStored(hashes []uint64, parent uint64, hasParent bool, tokens []uint32, blockSize int) {
	if p.begin() {
		p.events = appendStored(p.events, p.isMap, hashes, parent, hasParent, tokens, blockSize)
		p.end()
	}
}

// BlockRemoved queues a BlockRemoved event.
func (p *Publisher) BlockRemoved(hashes []uint64) {
	if p.begin() {
		p.events = appendRemoved(p.events, p.isMap, hashes)
		p.end()
	}
}

// AllCleared queues an AllBlocksCleared event.
func (p *Publisher) AllCleared() {
	if p.begin() {
		p.events = appendCleared(p.events, p.isMap)
		p.end()
	}
}

// Close flushes pending events, stops the goroutine and closes the sockets.
func (p *Publisher) Close() error {
	if p.closed.Swap(true) {
		return nil
	}
	close(p.done)
	<-p.exited
	return nil
}

// takeBatch encodes the pending events as one payload (nil when none).
func (p *Publisher) takeBatch(ts float64) []byte {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.n == 0 {
		return nil
	}
	out := make([]byte, 0, len(p.events)+48)
	out = appendBatchHeader(out, p.isMap, ts, p.n)
	out = append(out, p.events...)
	out = appendBatchTrailer(out, p.isMap, p.cfg.DPRank)
	p.events, p.n = p.events[:0], 0
	return out
}

// record stores a sent batch in the replay ring.
func (p *Publisher) record(seq uint64, payload []byte) {
	if len(p.ring) < p.cfg.BufferSteps {
		p.ring = append(p.ring, batchRec{seq, payload})
		return
	}
	p.ring[p.head] = batchRec{seq, payload}
	p.head = (p.head + 1) % len(p.ring)
}

// replayFrom calls fn for every buffered batch with seq >= start, in order.
func (p *Publisher) replayFrom(start uint64, fn func(seq uint64, payload []byte)) {
	for i := range p.ring {
		r := p.ring[(p.head+i)%len(p.ring)]
		if r.seq >= start {
			fn(r.seq, r.payload)
		}
	}
}
