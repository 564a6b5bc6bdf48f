//go:build cgo

package broker

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/infera/infera/internal/testsrv"
	zmq "github.com/pebbe/zmq4"
)

type kvFrame struct {
	worker   string
	instance uint64
	topic    []byte
	seq      uint64
	payload  []byte
}

func TestKVRelay(t *testing.T) {
	ns := testsrv.StartNATS(t)
	wnc, rnc := connect(t, ns.URL), connect(t, ns.URL)

	pub, err := zmq.NewSocket(zmq.PUB)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	pub.SetLinger(0)
	port := testsrv.BindZMQ(t, pub)

	var mu sync.Mutex
	var got []kvFrame
	sub, err := SubscribeKVEvents(rnc, func(id string, instance uint64, topic []byte, seq uint64, payload []byte) {
		mu.Lock()
		got = append(got, kvFrame{id, instance, topic, seq, payload})
		mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	rnc.Flush()

	relay, err := StartKVRelay(KVRelayConfig{Conn: wnc, WorkerID: "w-7", Endpoint: fmt.Sprintf("tcp://*:%d", port)})
	if err != nil {
		t.Fatal(err)
	}
	defer relay.Close()

	send := func(topic string, seq uint64, payload []byte) {
		var sb [8]byte
		binary.BigEndian.PutUint64(sb[:], seq)
		if _, err := pub.SendMessage([]byte(topic), sb[:], payload); err != nil {
			t.Fatal(err)
		}
	}
	count := func() int { mu.Lock(); defer mu.Unlock(); return len(got) }
	// ZMQ slow joiner: probe until the relay's subscription is live.
	deadline := time.Now().Add(5 * time.Second)
	for count() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("relay never delivered a probe frame")
		}
		send("probe", 0, []byte("p"))
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(50 * time.Millisecond)
	mu.Lock()
	got = got[:0]
	mu.Unlock()

	// Payloads with bytes a re-encoder would mangle (msgpack-ish, NUL, high bytes).
	inst := relay.Instance()
	if inst == 0 {
		t.Fatal("relay instance id is 0")
	}
	want := []kvFrame{
		{"w-7", inst, []byte("kv-events"), 1, []byte{0x93, 0xcb, 0x41, 0xd9, 0x00, 0xff, 0x0a, 0x0d}},
		{"w-7", inst, []byte(""), 2, bytes.Repeat([]byte{0, 1, 2, 0xfe}, 50000)},
		{"w-7", inst, []byte("kv-events"), 1<<63 + 5, []byte{}},
	}
	send("bad", 9, nil) // will be valid: 3 parts; keep a malformed one too
	pub.SendMessage([]byte("two-parts-only"), []byte("x"))
	mu.Lock()
	got = got[:0]
	mu.Unlock()
	for _, f := range want {
		send(string(f.topic), f.seq, f.payload)
	}
	deadline = time.Now().Add(5 * time.Second)
	for {
		mu.Lock()
		// drop a late "bad" frame if it raced the reset
		var fs []kvFrame
		for _, f := range got {
			if string(f.topic) != "bad" {
				fs = append(fs, f)
			}
		}
		mu.Unlock()
		if len(fs) >= len(want) {
			for i, w := range want {
				g := fs[i]
				if g.worker != w.worker || g.instance != w.instance || !bytes.Equal(g.topic, w.topic) || g.seq != w.seq || !bytes.Equal(g.payload, w.payload) {
					t.Fatalf("frame %d: got worker %q instance %x topic %q seq %d payload %d bytes; want %q %x %q %d %d bytes",
						i, g.worker, g.instance, g.topic, g.seq, len(g.payload), w.worker, w.instance, w.topic, w.seq, len(w.payload))
				}
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("got %d frames, want %d", len(fs), len(want))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A data-parallel engine publishes rank r on port + r: the relay forwards
// every rank.
func TestKVRelayDataParallel(t *testing.T) {
	ns := testsrv.StartNATS(t)
	wnc, rnc := connect(t, ns.URL), connect(t, ns.URL)
	var pubs [2]*zmq.Socket
	var base int
	for try := 0; ; try++ {
		if try > 20 {
			t.Fatal("no two consecutive free ports")
		}
		base = 20000 + int(time.Now().UnixNano()%30000)
		ok := true
		for r := 0; r < 2; r++ {
			s, err := zmq.NewSocket(zmq.PUB)
			if err != nil {
				t.Fatal(err)
			}
			s.SetLinger(0)
			if err := s.Bind(fmt.Sprintf("tcp://127.0.0.1:%d", base+r)); err != nil {
				s.Close()
				ok = false
				break
			}
			pubs[r] = s
		}
		if ok {
			break
		}
		for r := range pubs {
			if pubs[r] != nil {
				pubs[r].Close()
				pubs[r] = nil
			}
		}
	}
	defer pubs[0].Close()
	defer pubs[1].Close()
	var mu sync.Mutex
	seen := map[string]bool{}
	sub, err := SubscribeKVEvents(rnc, func(id string, _ uint64, topic []byte, seq uint64, payload []byte) {
		mu.Lock()
		seen[string(payload)] = true
		mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	rnc.Flush()
	relay, err := StartKVRelay(KVRelayConfig{Conn: wnc, WorkerID: "dp", Endpoint: fmt.Sprintf("tcp://127.0.0.1:%d", base), DPSize: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer relay.Close()
	deadline := time.Now().Add(5 * time.Second)
	for {
		mu.Lock()
		both := seen["rank0"] && seen["rank1"]
		mu.Unlock()
		if both {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("relayed %v, want both ranks", seen)
		}
		var sb [8]byte
		for r, p := range pubs {
			p.SendMessage([]byte(""), sb[:], []byte(fmt.Sprintf("rank%d", r)))
		}
		time.Sleep(20 * time.Millisecond)
	}
}
