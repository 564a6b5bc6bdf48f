//go:build cgo

package kv

// This is the only file of kv that uses cgo (github.com/pebbe/zmq4).
// Each socket is created, used and closed by one goroutine.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync/atomic"
	"syscall"
	"time"

	zmq "github.com/pebbe/zmq4"
	"golang.org/x/sys/unix"

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

// runZMQ owns the worker's SUB socket: it waits for it in Go's netpoller
// (fdWaiter; stop wakes it), queues every message in order for the worker's goroutine
// (runFeed), and recreates the socket after errors.
func (ws *workerState) runZMQ() {
	ep := connectEndpoint(ws.w.KVEventsEndpoint, ws.w.Addr)
	defer slog.Debug("KV event subscriber stopped", "worker", ws.w.ID, "endpoint", ep)
	for !ws.stopped.Load() {
		slog.Debug("KV event subscriber subscribing", "worker", ws.w.ID, "endpoint", ep, "ranks", max(1, ws.w.DPSize))
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
	// ZMQ retries a refused connection every 100 ms for as long as the
	// engine is down; backing off to 2 s keeps a fleet of dead engines
	// cheap (1000 of them took a sixth of a core at 100 ms). What an engine
	// published before the connection is made is a gap like any other.
	if err := sock.SetReconnectIvlMax(2 * time.Second); err != nil {
		return fmt.Errorf("cannot set RECONNECT_IVL_MAX: %w", err)
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
	wait, err := newFDWaiter(sock)
	if err != nil {
		return err
	}
	ws.wake.Store(wait.f)
	defer func() {
		ws.wake.CompareAndSwap(wait.f, nil)
		wait.close()
	}()
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
				slog.Debug("KV event subscriber reconnecting to a rank", "worker", ws.w.ID, "endpoint", eps[r], "rank", r)
				redial[r], pending = time.Time{}, pending-1
			}
		}
		d := ws.m.cfg.PollInterval
		for _, at := range redial {
			if !at.IsZero() {
				d = min(d, max(time.Until(at), time.Millisecond))
			}
		}
		data, event, err := wait.until(sock, events, d, &ws.stopped)
		if err != nil {
			return err
		}
		if !data && !event {
			continue
		}
		// Queue what has come, bounded so stop stays responsive.
		if err := ws.receive(sock, 1024); err != nil {
			return err
		}
		if event {
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
				slog.Debug("KV event publisher disconnected", "worker", ws.w.ID, "endpoint", eps[r], "rank", r)
				ws.logf("KV event publisher disconnected (it stopped, or sent a message over the size limit), reconnecting", "endpoint", eps[r], "max_bytes", maxMessageBytes)
				_ = sock.Disconnect(eps[r]) // gone already when ZMQ dropped it
				redial[r], pending = time.Now().Add(ws.m.cfg.ReconnectDelay), pending+1
			}
		}
	}
	return nil
}

// fdWaiter waits for a SUB socket in Go's netpoller, on a duplicate of the
// socket's notification descriptor (ZMQ_FD): a subscriber that waits holds
// no OS thread. zmq_poll held one per followed worker, each waking every
// PollInterval in cgo: 1000 idle workers took 1009 threads and about half a
// core. The descriptor only says that the socket's state may have changed
// (ZMQ reads it itself when it processes its commands), so the state is
// read with ZMQ_EVENTS after every wake and before every wait.
type fdWaiter struct {
	f  *os.File
	rc syscall.RawConn
}

func newFDWaiter(sock *zmq.Socket) (*fdWaiter, error) {
	fd, err := sock.GetFd()
	if err != nil {
		return nil, fmt.Errorf("cannot get the SUB socket's descriptor: %w", err)
	}
	// A duplicate: the netpoller's file is closed with it, ZMQ's is not.
	dup, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("cannot duplicate the SUB socket's descriptor: %w", err)
	}
	// ZMQ's signaller is non-blocking already; os.NewFile polls only a
	// non-blocking descriptor.
	if err := unix.SetNonblock(dup, true); err != nil {
		_ = unix.Close(dup)
		return nil, fmt.Errorf("cannot set the SUB socket's descriptor non-blocking: %w", err)
	}
	f := os.NewFile(uintptr(dup), "zmq-sub")
	rc, err := f.SyscallConn()
	if err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("cannot poll the SUB socket's descriptor: %w", err)
	}
	return &fdWaiter{f: f, rc: rc}, nil
}

// until waits at most d for a message on sock or a monitor event on
// events (read when the wait ends: the monitor's own descriptor is not
// watched, so an event waits for sock's next wake or the timeout).
// A stop (stopped set, then the deadline moved to the past) ends it early.
func (w *fdWaiter) until(sock, events *zmq.Socket, d time.Duration, stopped *atomic.Bool) (data, event bool, err error) {
	if err := w.f.SetReadDeadline(time.Now().Add(d)); err != nil {
		return false, false, fmt.Errorf("cannot wait for the SUB socket: %w", err)
	}
	if stopped.Load() {
		// Set after stop moved the deadline: it would have been missed.
		return false, false, nil
	}
	var serr error
	rerr := w.rc.Read(func(uintptr) bool {
		s, err := sock.GetEvents()
		if err != nil {
			serr = fmt.Errorf("cannot read the SUB socket's state: %w", err)
			return true
		}
		m, err := events.GetEvents()
		if err != nil {
			serr = fmt.Errorf("cannot read the monitor socket's state: %w", err)
			return true
		}
		data, event = s&zmq.POLLIN != 0, m&zmq.POLLIN != 0
		return data || event
	})
	if serr != nil {
		return false, false, serr
	}
	if rerr != nil && !errors.Is(rerr, os.ErrDeadlineExceeded) {
		return false, false, fmt.Errorf("cannot wait for the SUB socket: %w", rerr)
	}
	if rerr != nil {
		// The deadline: the monitor may have an event for a publisher
		// that went away without waking sock.
		m, err := events.GetEvents()
		if err != nil {
			return false, false, fmt.Errorf("cannot read the monitor socket's state: %w", err)
		}
		event = m&zmq.POLLIN != 0
	}
	return data, event, nil
}

func (w *fdWaiter) close() { _ = w.f.Close() }

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
