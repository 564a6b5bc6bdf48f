package fleet

import (
	"strings"
	"testing"
)

// A discovery record is input from the network: fields routing and the KV
// subscriber would trust are bounded, and credentials never enter the
// fleet (they would be logged and shown).
func TestAHostileRecordIsRefused(t *testing.T) {
	ok := Record{ID: "w1", URL: "http://127.0.0.1:8000", Models: []string{"m"}}
	if err := ok.Validate(); err != nil {
		t.Fatalf("a plain record: %v", err)
	}
	for name, edit := range map[string]func(r *Record){
		"block_size 2^62":             func(r *Record) { r.BlockSize = 1 << 62 },
		"negative block_size":         func(r *Record) { r.BlockSize = -5 },
		"id with a newline":           func(r *Record) { r.ID = "d\n\x00" },
		"id with a space":             func(r *Record) { r.ID = "a b" },
		"id too long":                 func(r *Record) { r.ID = strings.Repeat("x", 300) },
		"url with credentials":        func(r *Record) { r.URL = "http://admin:s3cret@127.0.0.1:8000" },
		"kv endpoint not zmq":         func(r *Record) { r.KVEventsEndpoint = "http://127.0.0.1:5557" },
		"kv port past 65535":          func(r *Record) { r.KVEventsEndpoint = "tcp://127.0.0.1:65535"; r.DPSize = 2 },
		"kv replay port not number":   func(r *Record) { r.KVReplayEndpoint = "tcp://127.0.0.1:x" },
		"too many models":             func(r *Record) { r.Models = make([]string, 2000) },
		"an empty model name":         func(r *Record) { r.Models = []string{"m", ""} },
		"a model name with a newline": func(r *Record) { r.Models = []string{"m\nlevel=ERROR"} },
		"a model name of 1 KB":        func(r *Record) { r.Models = []string{strings.Repeat("m", 1024)} },
	} {
		r := ok
		edit(&r)
		err := r.Validate()
		if err == nil {
			t.Errorf("%s: accepted", name)
			continue
		}
		if strings.Contains(err.Error(), "s3cret") {
			t.Errorf("%s: the error shows the password: %v", name, err)
		}
	}
	for _, ep := range []string{"tcp://*:5557", "tcp://127.0.0.1:5557", "ipc:///tmp/kv"} {
		r := ok
		r.KVEventsEndpoint, r.DPSize = ep, 4
		if err := r.Validate(); err != nil {
			t.Errorf("endpoint %s: %v", ep, err)
		}
	}
}

// A model listed twice in a record counts once: the worker is one
// candidate for it, not two.
func TestAModelListedTwiceMakesOneCandidate(t *testing.T) {
	f := NewFleet(BreakerConfig{})
	defer f.Close()
	if errs := f.Sync([]Record{{ID: "w1", URL: "http://127.0.0.1:8000", Models: []string{"m", "m", "n", "m"}}}); len(errs) > 0 {
		t.Fatal(errs)
	}
	if n := len(f.View().ByModel["m"]); n != 1 {
		t.Fatalf("the worker is %d candidates for m", n)
	}
}
