//go:build cgo

package kv

// This is the only file of kv that uses cgo (github.com/pebbe/zmq4).
// Each socket is created, used and closed by one goroutine.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	zmq "github.com/pebbe/zmq4"

	"github.com/infera/infera/radix"
)

// ZMQAvailable reports whether this binary was built with ZMQ support.
const ZMQAvailable = true

// maxMessageBytes bounds one message a KV event or replay socket accepts
// (ZMQ_MAXMSGSIZE): ZMQ reads a message whole before handing it over, so
// without it one frame of any size from a publisher is held in memory
// (twice: ZMQ's copy and Go's). A peer that sends more is disconnected and
// reconnected; the message is lost, a gap like any other. vLLM's batches
// hold one scheduler step, well under a megabyte. A var for tests.
var maxMessageBytes int64 = 64 << 20

// maxSockets is the ZMQ context's socket limit. Following one worker takes
// three sockets (the SUB, its monitor's and the monitor reader) and a
// fourth while a replay runs; ZMQ's default, 1023, stopped at 341
// workers: the others' subscribers failed with "too many open files" and
// retried forever, their KV events never read. Set before any socket
// exists: ZMQ reads it when the context makes its first socket.
const maxSockets = 4*radix.MaxWorkers + 64

func init() {
	if err := zmq.SetMaxSockets(maxSockets); err != nil {
		slog.Error("cannot raise the ZMQ socket limit; KV events of workers past the default limit are not read", "max_sockets", maxSockets, "err", err)
	}
}

// runZMQ owns the worker's SUB socket: it polls with a timeout so it can
// stop, queues every message in order for the worker's goroutine
// (runFeed), and recreates the socket after errors.
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
	if err := sock.SetMaxmsgsize(maxMessageBytes); err != nil {
		return fmt.Errorf("cannot set MAXMSGSIZE: %w", err)
	}
	if err := sock.SetSubscribe(""); err != nil {
		return fmt.Errorf("cannot subscribe: %w", err)
	}
	// One SUB socket follows every data-parallel rank: rank r publishes on
	// the base port + r; batches carry their rank, tracked separately.
	eps := make([]string, max(1, ws.w.DPSize))
	for r := range eps {
		eps[r] = rankEndpoint(ep, r)
		if err := sock.Connect(eps[r]); err != nil {
			return fmt.Errorf("cannot connect SUB to %q: %w", eps[r], err)
		}
	}
	// ZMQ drops a publisher that sent a message over maxMessageBytes for
	// good (a protocol error: no reconnect), so every disconnection makes
	// the subscriber connect to that rank's endpoint again, ReconnectDelay
	// later (redial); the other ranks' connections stay (a new socket lost
	// what they sent meanwhile: a gap that, without replay, cleared their
	// index entries).
	mon := fmt.Sprintf("inproc://infera-kv-sub-%d", monitorSeq.Add(1))
	if err := sock.Monitor(mon, zmq.EVENT_DISCONNECTED); err != nil {
		return fmt.Errorf("cannot monitor SUB socket: %w", err)
	}
	events, err := zmq.NewSocket(zmq.PAIR)
	if err != nil {
		return fmt.Errorf("cannot create monitor socket: %w", err)
	}
	_ = events.SetLinger(0)
	defer func() {
		_ = sock.Monitor("", 0) // stopped before its reader goes
		_ = events.Close()
	}()
	if err := events.Connect(mon); err != nil {
		return fmt.Errorf("cannot connect monitor socket: %w", err)
	}
	poller := zmq.NewPoller()
	poller.Add(sock, zmq.POLLIN)
	poller.Add(events, zmq.POLLIN)
	redial := make([]time.Time, len(eps)) // when to connect rank r again (zero: connected)
	pending := 0
	for !ws.stopped.Load() {
		if pending > 0 {
			now := time.Now()
			for r, at := range redial {
				if at.IsZero() || now.Before(at) {
					continue
				}
				if err := sock.Connect(eps[r]); err != nil {
					return fmt.Errorf("cannot connect SUB to %q: %w", eps[r], err)
				}
				redial[r], pending = time.Time{}, pending-1
			}
		}
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
		// Queue what has come, bounded so stop stays responsive.
		if err := ws.receive(sock, 1024); err != nil {
			return err
		}
		for _, p := range polled {
			if p.Socket != events {
				continue
			}
			_, addr, _, err := events.RecvEvent(0)
			if err != nil {
				return fmt.Errorf("cannot read monitor event: %w", err)
			}
			r := peerRank(eps, addr)
			if r < 0 {
				// What came before the disconnection is queued first.
				if err := ws.receive(sock, ws.m.cfg.RcvHWM); err != nil {
					return err
				}
				return fmt.Errorf("publisher %s disconnected (it stopped, or sent a message over %d bytes)", addr, maxMessageBytes)
			}
			if redial[r].IsZero() {
				ws.logf("KV event publisher disconnected (it stopped, or sent a message over the size limit), reconnecting", "endpoint", eps[r], "max_bytes", maxMessageBytes)
				_ = sock.Disconnect(eps[r]) // gone already when ZMQ dropped it
				redial[r], pending = time.Now().Add(ws.m.cfg.ReconnectDelay), pending+1
			}
		}
	}
	return nil
}

// peerRank returns the rank whose endpoint in eps (rankEndpoint's, all on
// one host) has the port of addr, a monitor event's peer address; -1 when
// none has.
func peerRank(eps []string, addr string) int {
	i := lastColon(addr)
	if i < 0 {
		return -1
	}
	for r, ep := range eps {
		if j := lastColon(ep); j >= 0 && ep[j:] == addr[i:] {
			return r
		}
	}
	return -1
}

// monitorSeq names the SUB sockets' monitor endpoints.
var monitorSeq atomic.Uint64

// receive queues up to n messages waiting on sock.
func (ws *workerState) receive(sock *zmq.Socket, n int) error {
	for i := 0; i < n && !ws.stopped.Load(); i++ {
		msg, err := sock.RecvMessageBytes(zmq.DONTWAIT)
		if err != nil {
			if zmq.AsErrno(err) == zmq.Errno(11) { // EAGAIN
				return nil
			}
			return fmt.Errorf("cannot receive: %w", err)
		}
		ws.enqueueFrames(msg)
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
	if err := sock.SetMaxmsgsize(maxMessageBytes); err != nil {
		return fmt.Errorf("cannot set MAXMSGSIZE: %w", err)
	}
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
