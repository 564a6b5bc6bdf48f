package discovery

import (
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
