package proxy

import (
	"testing"

	"github.com/infera/infera/config"
	"github.com/infera/infera/fleet"
	"github.com/infera/infera/internal/testsrv"
)

// Two routers sharing Redis keep one engine per response id, the first
// recorded, as one router does (TestAResponseIDKeepsTheEngineThatAnsweredItFirst):
// an id another client plants through the second router on another
// engine keeps the first engine and user there too. An id the first
// router learned is found by the second, which then knows it without
// Redis; a table without Redis never asks it.
func TestRoutersSharingRedisKeepAResponsesFirstEngine(t *testing.T) {
	rd := testsrv.StartRedis(t)
	var a, b respAffinity
	a.records = newGovernorAt(t, rd.URL, config.Default()).Records()
	b.records = newGovernorAt(t, rd.URL, config.Default()).Records()
	first := &fleet.Worker{ID: "a", URL: "http://10.0.0.1:8000", Addr: "10.0.0.1:8000"}
	other := &fleet.Worker{ID: "b", URL: "http://10.0.0.2:8000", Addr: "10.0.0.2:8000"}
	a.learn([]byte(`{"id":"resp_victim"}`), first, respCred{user: "victim"}, 0)
	b.learn([]byte(`{"id":"resp_victim"}`), other, respCred{user: "other"}, 0)
	want := respEntry{ref: first.Ref(), user: "victim"}
	if e, ok := b.local([]byte("resp_victim")); !ok || e != want {
		t.Fatalf("the second router keeps %+v %v, want the first record %+v", e, ok, want)
	}
	a.learn([]byte(`{"id":"resp_shared"}`), other, respCred{user: "u"}, 0)
	found := mRespSharedFound.Get()
	if e, ok := b.find([]byte("resp_shared")); !ok || e.ref != other.Ref() || e.user != "u" {
		t.Fatalf("the second router finds %+v %v", e, ok)
	}
	if _, ok := b.local([]byte("resp_shared")); !ok {
		t.Fatal("an id found in Redis is not kept in memory")
	}
	var buf [respIDDecodeMax]byte
	if e, _, _ := b.lookup(&buf, []byte(`{"previous_response_id":"resp_shared"}`)); e.ref != other.Ref() {
		t.Fatalf("a follow-up's lookup: %+v", e)
	}
	if got := mRespSharedFound.Get() - found; got != 1 {
		t.Fatalf("%d ids found in Redis, want 1 (then from memory)", got)
	}
	var alone respAffinity
	if e, ok := alone.find([]byte("resp_shared")); ok {
		t.Fatalf("a table without Redis found %+v", e)
	}
}

// With Redis down, an id is learned into the router's memory (its record
// failed, counted) and a lookup of an id not there is unknown (counted).
func TestARouterWhoseRedisIsDownKeepsItsOwnResponses(t *testing.T) {
	rd := testsrv.StartStoppableRedis(t)
	var a respAffinity
	a.records = newGovernorAt(t, rd.URL, config.Default()).Records()
	rd.Stop()
	w := &fleet.Worker{ID: "a", URL: "http://10.0.0.1:8000", Addr: "10.0.0.1:8000"}
	records, lookups := mRespSharedRecordErrors.Get(), mRespSharedLookupErrors.Get()
	a.learn([]byte(`{"id":"resp_mine"}`), w, respCred{user: "u"}, 0)
	if e, ok := a.find([]byte("resp_mine")); !ok || e.ref != w.Ref() {
		t.Fatalf("its own id: %+v %v", e, ok)
	}
	if e, ok := a.find([]byte("resp_elsewhere")); ok {
		t.Fatalf("an id it did not learn: %+v", e)
	}
	if got := mRespSharedRecordErrors.Get() - records; got != 1 {
		t.Fatalf("%d record errors, want 1", got)
	}
	if got := mRespSharedLookupErrors.Get() - lookups; got != 1 {
		t.Fatalf("%d lookup errors, want 1", got)
	}
}
