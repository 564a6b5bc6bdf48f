package discovery

import (
	"fmt"
	"testing"

	"github.com/infera/infera/fleet"
)

func TestAgrees(t *testing.T) {
	f := func(id, reqT, kvT, kvEP, srvReq, srvKV string, want bool) {
		t.Helper()
		r := fleet.Record{ID: id, URL: "http://127.0.0.1:1", RequestTransport: reqT, KVEventTransport: kvT, KVEventsEndpoint: kvEP}
		ok, reason := Agrees(r, srvReq, srvKV)
		if ok != want {
			t.Fatalf("Agrees(%s %s/%s vs %s/%s) = %v (%s), want %v", id, reqT, kvT, srvReq, srvKV, ok, reason, want)
		}
		if !ok && reason == "" {
			t.Fatal("no reason given")
		}
	}
	f("w1", "", "", "", "nats", "nats", true) // unspecified: whatever the server uses
	f("w1", "http", "zmq", "tcp://h:5557", "http", "zmq", true)
	f("w1", "nats", "nats", "", "nats", "nats", true)
	f("w1", "nats", "", "", "http", "zmq", false)
	f("w1", "http", "", "", "nats", "zmq", false)
	f("w1", "", "nats", "", "http", "zmq", false)
	f("w1", "", "zmq", "", "http", "zmq", true) // zmq without an endpoint: routable, no KV events
	f("a.b", "", "", "", "nats", "zmq", false)  // id cannot be a subject token
	f("a.b", "", "", "", "http", "zmq", true)
}

// Pods come and go under new names: the hook must not keep one entry per id
// it ever saw (neither for excluded workers nor for warned ones).
func TestAgreementHookForgetsChurnedWorkers(t *testing.T) {
	f := fleet.NewFleet(fleet.BreakerConfig{})
	defer f.Close()
	h := &AgreementHook{RequestTransport: "http", KVTransport: "zmq", KVAware: true, BlockSize: 16}
	f.AddHook(h)
	const n = 5000
	for i := 0; i < n; i++ {
		good := fleet.Record{ID: fmt.Sprintf("pod-%d", i), URL: "http://127.0.0.1:1", Models: []string{"m"}, BlockSize: 32}
		bad := fleet.Record{ID: fmt.Sprintf("bad-%d", i), URL: "http://127.0.0.1:2", Models: []string{"m"}, RequestTransport: "nats"}
		f.Sync([]fleet.Record{good, bad})
	}
	f.Sync(nil)
	if got := len(h.warned) + len(h.rejected); got > maxRejectedLogged+1 {
		t.Fatalf("after %d churned ids the hook holds %d entries", n, got)
	}
	if len(h.warned) != 0 {
		t.Fatalf("warned holds %d entries with no worker left", len(h.warned))
	}
}
