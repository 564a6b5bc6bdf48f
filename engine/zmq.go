//go:build cgo

package engine

// This is the only file of engine that uses cgo (github.com/pebbe/zmq4).
// Each socket is created, used and closed by one goroutine.

import (
	"encoding/binary"
	"fmt"
	"time"

	zmq "github.com/pebbe/zmq4"
)

// ZMQAvailable reports whether this binary was built with ZMQ support.
const ZMQAvailable = true

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
		if p.dropNext.Load() > 0 {
			p.dropNext.Add(-1)
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
// identity and (when the client sent one) the empty delimiter. It speaks
// vLLM's protocol: the request is [identity, empty delimiter, 8-byte
// big-endian start] from a REQ socket (or [identity, start] from a DEALER).
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
	send(endSeq, []byte{})
}
