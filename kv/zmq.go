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

// endSeq is the sequence number of the replay end marker (all ones).
const endSeq = ^uint64(0)

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
		if seq == endSeq {
			return nil
		}
		fn(seq, msg[1])
	}
}
