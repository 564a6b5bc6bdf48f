package worker

import (
	"context"
	"encoding/binary"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/infera/infera/broker"
	"github.com/infera/infera/internal/testsrv"
	"github.com/nats-io/nats.go"
	zmq "github.com/pebbe/zmq4"
)

// TestKVRelayNATS: with --kv-event-transport nats the sidecar relays the
// engine's ZMQ KV events to infera.kv.events.<id> byte for byte.
func TestKVRelayNATS(t *testing.T) {
	e := testsrv.StartEtcd(t)
	ns := testsrv.StartNATS(t)
	eng := &fakeEngine{}
	eng.healthy.Store(true)
	url := serveEngine(t, eng)
	sink := watchEtcd(t, e.Endpoint)

	pub, err := zmq.NewSocket(zmq.PUB)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	pub.SetLinger(0)
	port := testsrv.BindZMQ(t, pub)
	nc, err := nats.Connect(ns.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	var got atomic.Value
	var n atomic.Int64
	sub, err := broker.SubscribeKVEvents(nc, func(id string, _ uint64, topic []byte, seq uint64, payload []byte) {
		if seq == 42 {
			got.Store(fmt.Sprintf("%s|%s|%x", id, topic, payload))
		}
		n.Add(1)
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	nc.Flush()

	c := parse(t, "--id", "wk1", "--engine-url", url, "--discovery-backend", "etcd", "--etcd-endpoint", e.Endpoint, "--models", "m",
		"--request-transport", "http", "--kv-event-transport", "nats", "--nats-url", ns.URL, "--kv-events-endpoint", fmt.Sprintf("tcp://*:%d", port),
		"--drain-propagation", "0s", "--drain-grace", "0s")
	s, err := c.Start(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Drain(context.Background())
	waitFor(t, 5*time.Second, "registered", func() bool {
		r, ok := sink.get("wk1")
		return ok && r.KVEventTransport == "nats" && r.KVEventsEndpoint == fmt.Sprintf("tcp://127.0.0.1:%d", port)
	})
	payload := []byte{0x92, 0xcb, 0, 1, 0xff, '\n'}
	var seq [8]byte
	binary.BigEndian.PutUint64(seq[:], 42)
	waitFor(t, 5*time.Second, "relayed frame", func() bool {
		pub.SendMessage([]byte("kv@wk1"), seq[:], payload) // repeated: ZMQ slow joiner
		time.Sleep(20 * time.Millisecond)
		return got.Load() != nil
	})
	if want := "wk1|kv@wk1|92cb0001ff0a"; got.Load().(string) != want {
		t.Fatalf("got %q, want %q", got.Load(), want)
	}
}
