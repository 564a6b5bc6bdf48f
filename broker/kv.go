package broker

import (
	"fmt"
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
// the worker id (from the subject), the ZMQ topic, the sequence number and
// the payload. The slices are the callback's to keep. It is called from
// one goroutine, in arrival order (so per worker in order); keep it short.
type KVFunc func(workerID string, topic []byte, seq uint64, payload []byte)

var badKVLog = &logx.Throttle{Every: 5 * time.Second}

// SubscribeKVEvents subscribes infera.kv.events.> once for the whole fleet
// and calls fn for every well-formed frame. Malformed ones are counted in
// infera_nats_kv_events_bad_total and logged (rate-limited).
func SubscribeKVEvents(nc *nats.Conn, fn KVFunc) (*nats.Subscription, error) {
	sub, err := nc.Subscribe(KVEventsPrefix+">", func(m *nats.Msg) {
		id := m.Subject[len(KVEventsPrefix):]
		seqStr := m.Header.Get(HdrSeq)
		seq, err := strconv.ParseUint(seqStr, 10, 64)
		if err != nil || !ValidWorkerID(id) {
			mKVBad.Inc()
			badKVLog.Warn("dropping malformed KV event", "subject", m.Subject, "seq", seqStr)
			return
		}
		mKVRecv.Inc()
		fn(id, []byte(m.Header.Get(HdrTopic)), seq, m.Data)
	})
	if err != nil {
		return nil, fmt.Errorf("cannot subscribe %s>: %w", KVEventsPrefix, err)
	}
	sub.SetPendingLimits(-1, 256<<20)
	return sub, nil
}

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
	stop      chan struct{}
	done      chan struct{}
	once      sync.Once
	published atomic.Uint64
}

// Published returns the frames relayed so far.
func (r *KVRelay) Published() uint64 { return r.published.Load() }

// Close stops the relay and closes the socket.
func (r *KVRelay) Close() {
	r.once.Do(func() { close(r.stop) })
	<-r.done
}
