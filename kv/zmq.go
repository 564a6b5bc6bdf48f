//go:build cgo

package kv

// This is the only file of kv that uses cgo (github.com/pebbe/zmq4).
// Each socket is created, used and closed by one goroutine.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	zmq "github.com/pebbe/zmq4"
)

// ZMQAvailable reports whether this binary was built with ZMQ support.
const ZMQAvailable = true

// runZMQ owns the worker's SUB socket: it polls with a timeout so it can
// stop, handles every message in order, drains frames queued by Feed, and
// recreates the socket after errors.
func (ws *workerState) runZMQ() {
	ep := connectEndpoint(ws.w.KVEventsEndpoint, ws.w.Addr)
	for !ws.stopped.Load() {
		err := ws.subscribeOnce(ep)
		if err == nil || ws.stopped.Load() {
			return
		}
		ws.logf("KV event subscriber error, reconnecting", "endpoint", ep, "err", err)
		select {
		case <-ws.done:
			return
		case <-time.After(ws.m.cfg.ReconnectDelay):
		}
	}
}

func (ws *workerState) subscribeOnce(ep string) error {
	sock, err := zmq.NewSocket(zmq.SUB)
	if err != nil {
		return fmt.Errorf("cannot create SUB socket: %w", err)
	}
	defer sock.Close()
	_ = sock.SetLinger(0)
	if err := sock.SetRcvhwm(ws.m.cfg.RcvHWM); err != nil {
		return fmt.Errorf("cannot set RCVHWM: %w", err)
	}
	if err := sock.SetSubscribe(""); err != nil {
		return fmt.Errorf("cannot subscribe: %w", err)
	}
	// One SUB socket follows every data-parallel rank: rank r publishes on
	// the base port + r; batches carry their rank, tracked separately.
	for r := 0; r < max(1, ws.w.DPSize); r++ {
		if err := sock.Connect(rankEndpoint(ep, r)); err != nil {
			return fmt.Errorf("cannot connect SUB to %q: %w", rankEndpoint(ep, r), err)
		}
	}
	poller := zmq.NewPoller()
	poller.Add(sock, zmq.POLLIN)
	for !ws.stopped.Load() {
		ws.drainFeed()
		polled, err := poller.Poll(ws.m.cfg.PollInterval)
		if err != nil {
			if errors.Is(err, zmq.Errno(4)) { // EINTR
				continue
			}
			return fmt.Errorf("cannot poll SUB socket: %w", err)
		}
		if len(polled) == 0 {
			continue
		}
		// Handle what is queued now, bounded so stop stays responsive.
		for i := 0; i < 1024 && !ws.stopped.Load(); i++ {
			msg, err := sock.RecvMessageBytes(zmq.DONTWAIT)
			if err != nil {
				if zmq.AsErrno(err) == zmq.Errno(11) { // EAGAIN
					break
				}
				return fmt.Errorf("cannot receive: %w", err)
			}
			ws.handleFrames(msg)
		}
	}
	return nil
}

// Replay asks the ROUTER at endpoint for every buffered batch from start on
// and calls fn for each (seq, payload) pair until the all-ones end marker.
// It speaks vLLM's protocol: the request is [empty delimiter, 8-byte
// big-endian start] from a DEALER (what a REQ socket sends), each reply
// [empty delimiter, seq, payload]. timeout bounds the whole exchange.
func Replay(endpoint string, start uint64, timeout time.Duration, fn func(seq uint64, payload []byte)) error {
	sock, err := zmq.NewSocket(zmq.DEALER)
	if err != nil {
		return fmt.Errorf("cannot create DEALER socket: %w", err)
	}
	defer sock.Close()
	_ = sock.SetLinger(0)
	if err := sock.Connect(endpoint); err != nil {
		return fmt.Errorf("cannot connect to replay endpoint %q: %w", endpoint, err)
	}
	var req [8]byte
	binary.BigEndian.PutUint64(req[:], start)
	if _, err := sock.SendMessage([]byte{}, req[:]); err != nil {
		return fmt.Errorf("cannot send replay request to %q: %w", endpoint, err)
	}
	poller := zmq.NewPoller()
	poller.Add(sock, zmq.POLLIN)
	deadline := time.Now().Add(timeout)
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return fmt.Errorf("replay from %q timed out after %s", endpoint, timeout)
		}
		polled, err := poller.Poll(left)
		if err != nil {
			return fmt.Errorf("cannot poll replay socket: %w", err)
		}
		if len(polled) == 0 {
			continue
		}
		msg, err := sock.RecvMessageBytes(0)
		if err != nil {
			return fmt.Errorf("cannot receive replay: %w", err)
		}
		if len(msg) > 0 && len(msg[0]) == 0 {
			msg = msg[1:] // the REQ envelope delimiter
		}
		if len(msg) != 2 || len(msg[0]) != 8 {
			return fmt.Errorf("malformed replay message from %q (%d frames)", endpoint, len(msg))
		}
		seq := binary.BigEndian.Uint64(msg[0])
		if seq == EndSeq {
			return nil
		}
		fn(seq, msg[1])
	}
}

// NewPublisher binds the PUB socket (and the ROUTER replay socket when
// configured) and starts the publisher goroutine.
func NewPublisher(cfg PublisherConfig) (*Publisher, error) {
	p, err := newPublisher(cfg)
	if err != nil {
		return nil, err
	}
	ready := make(chan error, 1)
	go p.run(ready)
	if err := <-ready; err != nil {
		return nil, err
	}
	return p, nil
}

func (p *Publisher) run(ready chan<- error) {
	defer close(p.exited)
	pub, err := zmq.NewSocket(zmq.PUB)
	if err != nil {
		ready <- fmt.Errorf("cannot create PUB socket: %w", err)
		return
	}
	defer pub.Close()
	_ = pub.SetSndhwm(100000)
	_ = pub.SetLinger(200 * time.Millisecond)
	if err := pub.Bind(p.cfg.Endpoint); err != nil {
		ready <- fmt.Errorf("cannot bind KV events PUB to %q: %w", p.cfg.Endpoint, err)
		return
	}
	p.endpoint, _ = pub.GetLastEndpoint()
	var rep *zmq.Socket
	poller := zmq.NewPoller()
	if p.cfg.ReplayEndpoint != "" {
		if rep, err = zmq.NewSocket(zmq.ROUTER); err != nil {
			ready <- fmt.Errorf("cannot create ROUTER socket: %w", err)
			return
		}
		defer rep.Close()
		_ = rep.SetLinger(0)
		// A ROUTER silently drops what exceeds its send HWM (default 1000):
		// make room for one full replay (the ring plus the end marker).
		_ = rep.SetSndhwm(p.cfg.BufferSteps + 1)
		if err := rep.Bind(p.cfg.ReplayEndpoint); err != nil {
			ready <- fmt.Errorf("cannot bind KV replay ROUTER to %q: %w", p.cfg.ReplayEndpoint, err)
			return
		}
		p.replayEndpoint, _ = rep.GetLastEndpoint()
		poller.Add(rep, zmq.POLLIN)
	}
	ready <- nil
	flush := func() {
		payload := p.takeBatch(float64(time.Now().UnixNano()) / 1e9)
		if payload == nil {
			return
		}
		if p.lost.Swap(false) {
			p.seq++ // an unfillable hole: subscribers resync
		}
		var seq [8]byte
		binary.BigEndian.PutUint64(seq[:], p.seq)
		p.record(p.seq, payload)
		p.seq++
		if p.skipSend.Load() > 0 {
			p.skipSend.Add(-1)
			return
		}
		// On a send error the batch stays in the ring: subscribers see the
		// gap and replay it.
		if _, err := pub.SendMessage(p.topic, seq[:], payload); err == nil {
			p.sent.Add(1)
		}
	}
	next := time.Now().Add(p.cfg.FlushInterval)
	for {
		select {
		case <-p.done:
			flush()
			return
		case <-p.kick:
			flush()
			next = time.Now().Add(p.cfg.FlushInterval)
		default:
		}
		wait := time.Until(next)
		if wait <= 0 {
			flush()
			next = time.Now().Add(p.cfg.FlushInterval)
			continue
		}
		if rep == nil {
			select {
			case <-p.done:
			case <-p.kick:
				flush()
				next = time.Now().Add(p.cfg.FlushInterval)
			case <-time.After(wait):
			}
			continue
		}
		polled, err := poller.Poll(wait)
		if err == nil && len(polled) > 0 {
			p.serveReplay(rep)
		}
	}
}

// serveReplay answers one replay request: every buffered batch from the
// requested sequence on, then the end marker, each prefixed by the client's
// identity and (when the client sent one) the empty delimiter.
func (p *Publisher) serveReplay(rep *zmq.Socket) {
	msg, err := rep.RecvMessageBytes(zmq.DONTWAIT)
	if err != nil || len(msg) < 2 {
		return
	}
	id := msg[0]
	var env [][]byte
	switch {
	case len(msg) == 3 && len(msg[1]) == 0 && len(msg[2]) == 8:
		env = [][]byte{id, {}}
	case len(msg) == 2 && len(msg[1]) == 8:
		env = [][]byte{id}
	default:
		return
	}
	start := binary.BigEndian.Uint64(msg[len(msg)-1])
	send := func(seq uint64, payload []byte) {
		var s [8]byte
		binary.BigEndian.PutUint64(s[:], seq)
		parts := append(append([][]byte(nil), env...), s[:], payload)
		_, _ = rep.SendMessage(parts)
	}
	p.replayFrom(start, send)
	send(EndSeq, []byte{})
}
