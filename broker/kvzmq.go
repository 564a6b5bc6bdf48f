//go:build cgo

package broker

// This is the only cgo (zmq4) file of the package.

import (
	"encoding/binary"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	zmq "github.com/pebbe/zmq4"
)

var (
	mRelayFrames = WorkerMetrics.NewCounter(`infera_worker_kv_relay_frames_total`)
	mRelayBad    = WorkerMetrics.NewCounter(`infera_worker_kv_relay_bad_frames_total`)
)

// StartKVRelay connects the SUB socket and starts relaying.
func StartKVRelay(cfg KVRelayConfig) (*KVRelay, error) {
	if cfg.Conn == nil {
		return nil, fmt.Errorf("broker: KVRelayConfig.Conn is nil")
	}
	if !ValidWorkerID(cfg.WorkerID) {
		return nil, fmt.Errorf("broker: worker id %q is not a valid NATS subject token", cfg.WorkerID)
	}
	ep := strings.Replace(cfg.Endpoint, "://*:", "://127.0.0.1:", 1)
	sock, err := zmq.NewSocket(zmq.SUB)
	if err != nil {
		return nil, fmt.Errorf("cannot create ZMQ SUB socket: %w", err)
	}
	if err := sock.SetSubscribe(cfg.Topic); err != nil {
		sock.Close()
		return nil, fmt.Errorf("cannot subscribe ZMQ topic %q: %w", cfg.Topic, err)
	}
	sock.SetLinger(0)
	sock.SetRcvhwm(100000)
	for rank := 0; rank < max(1, cfg.DPSize); rank++ {
		rep := rankEndpoint(ep, rank)
		if err := sock.Connect(rep); err != nil {
			sock.Close()
			return nil, fmt.Errorf("cannot connect ZMQ SUB to %q: %w", rep, err)
		}
	}
	r := &KVRelay{cfg: cfg, subject: KVEventsSubject(cfg.WorkerID), instance: newInstanceID(time.Now()),
		stop: make(chan struct{}), done: make(chan struct{})}
	// The router names the instances it follows and drops by this id when
	// two publishers share a worker id: log it so they can be told apart.
	slog.Info("KV relay started", "worker", cfg.WorkerID, "instance", FormatInstance(r.instance), "subject", r.subject)
	go r.run(sock)
	return r, nil
}

func (r *KVRelay) run(sock *zmq.Socket) {
	defer close(r.done)
	defer sock.Close()
	poller := zmq.NewPoller()
	poller.Add(sock, zmq.POLLIN)
	m := nats.NewMsg(r.subject)
	m.Header.Set(HdrInstance, FormatInstance(r.instance))
	for {
		select {
		case <-r.stop:
			return
		default:
		}
		polled, err := poller.Poll(100 * time.Millisecond)
		if err != nil {
			if zmq.AsErrno(err) == zmq.Errno(4) { // EINTR
				continue
			}
			slog.Error("KV relay poll failed", "endpoint", r.cfg.Endpoint, "err", err)
			time.Sleep(100 * time.Millisecond)
			continue
		}
		if len(polled) == 0 {
			continue
		}
		for i := 0; i < 1024; i++ { // drain what is ready, bounded
			parts, err := sock.RecvMessageBytes(zmq.DONTWAIT)
			if err != nil {
				break
			}
			if len(parts) != 3 || len(parts[1]) != 8 || !validHeaderValue(string(parts[0])) {
				mRelayBad.Inc()
				badKVLog.Warn("KV relay dropping malformed ZMQ frame", "worker", r.cfg.WorkerID, "parts", len(parts))
				continue
			}
			m.Header.Set(HdrTopic, string(parts[0]))
			m.Header.Set(HdrSeq, strconv.FormatUint(binary.BigEndian.Uint64(parts[1]), 10))
			m.Data = parts[2]
			if err := r.cfg.Conn.PublishMsg(m); err != nil {
				badKVLog.Warn("KV relay cannot publish to NATS", "worker", r.cfg.WorkerID, "err", err)
				continue
			}
			mRelayFrames.Inc()
			r.published.Add(1)
		}
	}
}

// rankEndpoint returns data-parallel rank r's endpoint: the port + r.
func rankEndpoint(ep string, r int) string {
	i := strings.LastIndexByte(ep, ':')
	if r == 0 || i < 0 {
		return ep
	}
	port, err := strconv.Atoi(ep[i+1:])
	if err != nil {
		return ep
	}
	return ep[:i+1] + strconv.Itoa(port+r)
}
