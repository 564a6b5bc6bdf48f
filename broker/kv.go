package broker

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/infera/infera/internal/logx"
	"github.com/nats-io/nats.go"
)

var (
	mKVRecv = metrics.NewCounter(`infera_nats_kv_events_received_total`)
	mKVBad  = metrics.NewCounter(`infera_nats_kv_events_bad_total`)
)

// KVFunc receives one KV-event frame exactly as the engine published it:
// the worker id (from the subject), the relay's instance id (0 when the
// relay stamps none), the ZMQ topic, the sequence number and the payload.
// The slices are the callback's to keep. It is called from one goroutine,
// in arrival order (so per worker in order); keep it short.
type KVFunc func(workerID string, instance uint64, topic []byte, seq uint64, payload []byte)

var badKVLog = &logx.Throttle{Every: 5 * time.Second}

// SubscribeKVEvents subscribes infera.kv.events.> once for the whole fleet
// and calls fn for every well-formed frame. Malformed ones are counted in
// infera_nats_kv_events_bad_total and logged (rate-limited).
func SubscribeKVEvents(nc *nats.Conn, fn KVFunc) (*nats.Subscription, error) {
	sub, err := nc.Subscribe(KVEventsPrefix+">", func(m *nats.Msg) {
		id := m.Subject[len(KVEventsPrefix):]
		seqStr := m.Header.Get(HdrSeq)
		seq, err := strconv.ParseUint(seqStr, 10, 64)
		inst, instOK := parseInstance(m.Header[HdrInstance])
		if err != nil || !instOK || !ValidWorkerID(id) {
			// Which part was malformed, never the publisher's bytes
			// (STYLE): the worker id only once it is a valid one.
			mKVBad.Inc()
			switch {
			case !ValidWorkerID(id):
				badKVLog.Warn("dropping malformed KV event", "reason", "worker id in subject", "subject_bytes", len(m.Subject))
			case err != nil:
				badKVLog.Warn("dropping malformed KV event", "reason", HdrSeq+" header", "worker", id)
			default:
				badKVLog.Warn("dropping malformed KV event", "reason", HdrInstance+" header", "worker", id)
			}
			return
		}
		mKVRecv.Inc()
		fn(id, inst, []byte(m.Header.Get(HdrTopic)), seq, m.Data)
	})
	if err != nil {
		return nil, fmt.Errorf("cannot subscribe %s>: %w", KVEventsPrefix, err)
	}
	sub.SetPendingLimits(-1, 256<<20)
	return sub, nil
}

// parseInstance reads the Infera-Instance header's values: none is
// instance 0 (a relay older than the header); one must be 1-16 hex digits
// and not zero.
func parseInstance(vs []string) (uint64, bool) {
	switch len(vs) {
	case 0:
		return 0, true
	case 1:
		if len(vs[0]) > 16 {
			return 0, false
		}
		id, err := strconv.ParseUint(vs[0], 16, 64)
		return id, err == nil && id != 0
	default:
		return 0, false
	}
}

// newInstanceID returns the id of a relay started at now: the Unix time in
// milliseconds above 22 random bits, so that a relay started later has
// the larger id (the router prefers the newer of two publishers of one
// worker id), and two started in the same millisecond still differ. Never
// zero.
func newInstanceID(now time.Time) uint64 {
	ms := max(now.UnixMilli(), 0)
	return max(uint64(ms)<<instanceRandBits|uint64(rand.Uint32())&(1<<instanceRandBits-1), 1)
}

// instanceRandBits is the random low part of a relay instance id; the
// 42 bits above it hold milliseconds until the year 2109.
const instanceRandBits = 22

// FormatInstance renders a relay instance id as its header value (16
// lowercase hex digits), the form logs use on both sides.
func FormatInstance(id uint64) string { return fmt.Sprintf("%016x", id) }

// KVRelayConfig configures the worker-side KV-event relay.
type KVRelayConfig struct {
	// Conn is the worker's NATS connection (not closed by the relay).
	Conn *nats.Conn
	// WorkerID names the subject infera.kv.events.<WorkerID>.
	WorkerID string
	// Endpoint is the engine's ZMQ PUB address, e.g. tcp://127.0.0.1:5557
	// (a bind address like tcp://*:5557 is connected at 127.0.0.1).
	Endpoint string
	// Topic is the ZMQ subscription prefix; empty takes everything.
	Topic string
	// DPSize is the engine's data-parallel size: rank r publishes on the
	// endpoint's port + r, and every rank is relayed (batches carry their rank).
	DPSize int
}

// KVRelay subscribes to the engine's ZMQ KV-event PUB socket and publishes
// every frame to NATS without re-encoding it. One goroutine owns the socket.
type KVRelay struct {
	cfg       KVRelayConfig
	subject   string
	instance  uint64
	stop      chan struct{}
	done      chan struct{}
	once      sync.Once
	published atomic.Uint64
}

// Instance returns the relay's instance id (header Infera-Instance).
func (r *KVRelay) Instance() uint64 { return r.instance }

// Published returns the frames relayed so far.
func (r *KVRelay) Published() uint64 { return r.published.Load() }

// Close stops the relay and closes the socket.
func (r *KVRelay) Close() {
	r.once.Do(func() { close(r.stop) })
	<-r.done
}
