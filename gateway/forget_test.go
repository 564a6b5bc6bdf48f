package gateway

import (
	"context"
	"fmt"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/infera/infera/broker"
	"github.com/infera/infera/fleet"
	"github.com/infera/infera/internal/testsrv"
)

// A request dispatched to a worker as it is removed (it took the worker from
// the previous view) re-creates the admission counter the removal dropped:
// with pod-name ids churning, those counters must not pile up.
func TestNATSAdmissionCountersOfChurnedWorkersArePruned(t *testing.T) {
	ns := testsrv.StartNATS(t)
	nc, err := nats.Connect(ns.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	bc, err := broker.NewClient(broker.ClientConfig{Conn: nc, MaxPending: 8})
	if err != nil {
		t.Fatal(err)
	}
	defer bc.Close()
	f := fleet.NewFleet(fleet.BreakerConfig{})
	defer f.Close()
	f.AddHook(&forgetHook{bc: bc})
	done, cancel := context.WithCancel(context.Background())
	cancel()
	const n = 500
	for i := 0; i < n; i++ {
		id := fmt.Sprintf("pod-%d", i)
		if err := f.Upsert(fleet.Record{ID: id, URL: "http://127.0.0.1:1", Models: []string{"m"}}); err != nil {
			t.Fatal(err)
		}
		f.Remove(id)
		// The late dispatch: it fails (its context is over), the counter stays.
		if s, err := bc.Do(done, id, &broker.Request{Path: "/v1/completions"}); err == nil {
			s.Close()
		}
	}
	if got := bc.Counters(); got > 1 {
		t.Fatalf("after %d churned workers the client holds %d admission counters", n, got)
	}
}
