package fleet

import (
	"testing"
)

func loadCounts(w *Worker) [5]int64 {
	return [5]int64{w.Load.Requests.Load(), w.Load.Tokens.Load(), w.Load.PrefillTokens.Load(), w.Load.Blocks.Load(), w.Load.Pending.Load()}
}

// A worker a reload replaces (the same ID and address, another model
// list) or removes and adds again while requests it took still run
// starts with their load: the engine still serves them, and the balancer
// picks by it. Their releases, on the worker they were taken on, land on
// the counters the new worker is read by, so every counter is back to
// zero once they end. Before, the new worker started at zero: with 5
// streams in flight on each of two engines, the next 4 requests all went
// to the re-added one (9 running there, 5 on the other), and
// infera_router_worker_active_requests said 0.
func TestAReAddedWorkerCarriesItsInFlightLoad(t *testing.T) {
	f := NewFleet(BreakerConfig{})
	defer f.Close()
	rec := func(id string, models ...string) Record {
		return Record{ID: id, URL: "http://" + id + ".test:1", Models: models}
	}
	if errs := f.Sync([]Record{rec("a", "m"), rec("b", "m")}); len(errs) > 0 {
		t.Fatal(errs)
	}
	old := f.Get("a")
	for range 5 {
		old.Acquire(100, 60, 7)
	}
	old.FirstToken(60)
	want := [5]int64{5, 500, 240, 35, 4}

	// Replaced: another model list.
	if errs := f.Sync([]Record{rec("a", "m", "m2"), rec("b", "m")}); len(errs) > 0 {
		t.Fatal(errs)
	}
	repl := f.Get("a")
	if repl == old {
		t.Fatal("the changed record did not replace the worker")
	}
	if got := loadCounts(repl); got != want {
		t.Fatalf("replaced worker's load %v, want the in-flight %v", got, want)
	}
	repl.Acquire(10, 6, 1) // a new request on the new worker

	// Removed, then added again, while the requests still run.
	if errs := f.Sync([]Record{rec("b", "m")}); len(errs) > 0 {
		t.Fatal(errs)
	}
	if errs := f.Sync([]Record{rec("a", "m"), rec("b", "m")}); len(errs) > 0 {
		t.Fatal(errs)
	}
	again := f.Get("a")
	if got, want := loadCounts(again), [5]int64{6, 510, 246, 36, 5}; got != want {
		t.Fatalf("re-added worker's load %v, want the in-flight %v", got, want)
	}

	old.Release(100, 60, 7, true)
	for range 4 {
		old.Release(100, 60, 7, false)
	}
	repl.Release(10, 6, 1, false)
	for _, w := range []*Worker{old, repl, again} {
		if got := loadCounts(w); got != [5]int64{} {
			t.Fatalf("worker %p's load %v after every request ended, want zero", w, got)
		}
	}
	if len(f.retired) != 0 {
		t.Fatalf("%d retired loads kept after their requests ended", len(f.retired))
	}

	// A worker added again at another address is another engine: it
	// starts at zero.
	again.Acquire(1, 1, 1)
	if errs := f.Sync([]Record{{ID: "a", URL: "http://elsewhere.test:1", Models: []string{"m"}}, rec("b", "m")}); len(errs) > 0 {
		t.Fatal(errs)
	}
	if got := loadCounts(f.Get("a")); got != [5]int64{} {
		t.Fatalf("worker at a new address starts with load %v, want zero", got)
	}
	again.Release(1, 1, 1, false)
}

// A worker moved to another engine and back while requests it took on
// the first still run carries them again on its return: they run on that
// engine. The move forgot them, and the worker came back at 0.
func TestAWorkerMovedAwayAndBackCarriesItsInFlightLoad(t *testing.T) {
	f := NewFleet(BreakerConfig{})
	defer f.Close()
	at := func(host string) []Record {
		return []Record{{ID: "a", URL: "http://" + host + ".test:1", Models: []string{"m"}}}
	}
	if errs := f.Sync(at("one")); len(errs) > 0 {
		t.Fatal(errs)
	}
	first := f.Get("a")
	for range 3 {
		first.Acquire(100, 60, 7)
	}
	if errs := f.Sync(at("two")); len(errs) > 0 {
		t.Fatal(errs)
	}
	moved := f.Get("a")
	if got := loadCounts(moved); got != ([5]int64{}) {
		t.Fatalf("the worker on another engine carries %v, want nothing", got)
	}
	moved.Acquire(10, 6, 1)
	if errs := f.Sync(at("one")); len(errs) > 0 {
		t.Fatal(errs)
	}
	back := f.Get("a")
	if got, want := loadCounts(back), [5]int64{3, 300, 180, 21, 3}; got != want {
		t.Fatalf("the worker back on its first engine carries %v, want the in-flight %v", got, want)
	}
	if errs := f.Sync(at("two")); len(errs) > 0 {
		t.Fatal(errs)
	}
	if got, want := loadCounts(f.Get("a")), [5]int64{1, 10, 6, 1, 1}; got != want {
		t.Fatalf("the worker back on the second engine carries %v, want the in-flight %v", got, want)
	}
}
