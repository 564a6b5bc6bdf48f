//go:build cgo && linux

package kv

import (
	"encoding/binary"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/infera/infera/fleet"
	"github.com/infera/infera/radix"
	zmq "github.com/pebbe/zmq4"
)

// rss returns the process's resident set size in bytes.
func rss(t *testing.T) int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		t.Skip(err)
	}
	f := strings.Fields(string(b))
	pages, _ := strconv.ParseInt(f[1], 10, 64)
	return pages * int64(os.Getpagesize())
}

// A publisher that sends faster than the router applies (big batches, or
// a router busy with a replay) must not make ZMQ queue its messages in
// the router's memory: ZMQ bounds its queue only in messages (RcvHWM,
// 100000), and 8 MB batches sent for 15 s grew a router to 5.4 GB. The
// socket is read into a queue bounded in bytes; what does not fit is
// dropped and counted.
func TestAPublisherFasterThanTheRouterIsBoundedInMemory(t *testing.T) {
	x := radix.New()
	const budget = 16 << 20
	m, err := NewManager(ManagerConfig{Index: x, Transport: "zmq", PollInterval: 20 * time.Millisecond,
		ReplayTimeout: time.Second, ReconnectDelay: 50 * time.Millisecond, QueueBytes: budget})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	pub, err := zmq.NewSocket(zmq.PUB)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	_ = pub.SetLinger(0)
	if err := pub.Bind("tcp://127.0.0.1:*"); err != nil {
		t.Fatal(err)
	}
	ep, _ := pub.GetLastEndpoint()
	w := &fleet.Worker{Load: new(fleet.Load), Idx: 1, ID: "w", KVEventsEndpoint: ep, BlockSize: bs}
	if err := m.WorkerAdded(w); err != nil {
		t.Fatal(err)
	}
	seq := uint64(0)
	send := func(payload []byte) {
		t.Helper()
		var s [8]byte
		binary.BigEndian.PutUint64(s[:], seq)
		seq++
		if _, err := pub.SendMessage([]byte{}, s[:], payload); err != nil {
			t.Fatal(err)
		}
	}
	probe := tokensFor(999, 1)
	deadline := time.Now().Add(5 * time.Second)
	for overlap(x, w.Idx, probe) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("subscriber never received the probe")
		}
		b := appendBatchHeader(nil, false, 1, 1)
		b = appendStored(b, false, engineHashes(999, 1), 0, false, probe, bs)
		send(appendBatchTrailer(b, false, 0))
		time.Sleep(20 * time.Millisecond)
	}
	m.mu.RLock()
	ws := m.byID[w.ID]
	m.mu.RUnlock()
	ws.mu.Lock() // the worker's goroutine stalls at its next batch
	unlocked := false
	unlock := func() {
		if !unlocked {
			unlocked = true
			ws.mu.Unlock()
		}
	}
	defer unlock()
	stall := appendBatchHeader(nil, false, 1, 1)
	stall = appendStored(stall, false, engineHashes(997, 1), 0, false, tokensFor(997, 1), bs)
	send(appendBatchTrailer(stall, false, 0)) // applied under ws.mu: waits
	before := rss(t)
	const n, size = 64, 8 << 20
	big := make([]byte, size) // garbage: malformed once applied
	for i := 0; i < n; i++ {
		send(big)
	}
	// Every message received: queued or dropped.
	deadline = time.Now().Add(5 * time.Second)
	for int(ws.mDropped.Get())+ws.queuedFrames() < n && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	grew := rss(t) - before
	t.Logf("%d messages of %d MiB sent while the worker's goroutine was stalled: RSS grew %d MiB, %d dropped, %d queued (%d bytes)",
		n, size>>20, grew>>20, ws.mDropped.Get(), ws.queuedFrames(), ws.queued.Load())
	if grew > n*size*3/5 {
		t.Fatalf("the router's memory grew by %d MiB for %d MiB sent (a queue bound of %d MiB)", grew>>20, n*size>>20, budget>>20)
	}
	if q := ws.queued.Load(); q > budget+size {
		t.Fatalf("%d bytes queued, over the %d-byte bound", q, budget)
	}
	unlock()
	probe2 := tokensFor(998, 1)
	deadline = time.Now().Add(5 * time.Second)
	for overlap(x, w.Idx, probe2) == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the worker is not followed after the flood (stats %+v)", m.Stats(w.ID))
		}
		b := appendBatchHeader(nil, false, 2, 1)
		b = appendStored(b, false, engineHashes(998, 1), 0, false, probe2, bs)
		send(appendBatchTrailer(b, false, 0))
		time.Sleep(20 * time.Millisecond)
	}
}
