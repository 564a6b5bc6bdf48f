package fleet

import (
	"slices"
	"testing"
)

// With OneWorkerPerEngine, a record whose url names the engine of a live
// worker of another id is left out, and joins once that engine is free,
// whichever way it becomes free: the holder removed, moved to another
// engine, or gone from a relist that lists the other first. Before, both
// were workers: the engine took two shares of the traffic.
func TestOneEngineRegisteredUnderTwoIDsIsRoutedOnce(t *testing.T) {
	f := NewFleet(BreakerConfig{})
	defer f.Close()
	f.OneWorkerPerEngine()
	rec := func(id, url string) Record { return Record{ID: id, URL: url, Models: []string{"m"}} }
	ids := func() []string {
		var s []string
		for _, w := range f.View().All {
			s = append(s, w.ID)
		}
		return s
	}
	want := func(what string, w ...string) {
		t.Helper()
		if got := ids(); !slices.Equal(got, w) {
			t.Fatalf("%s: workers %v, want %v", what, got, w)
		}
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(f.Upsert(rec("a", "http://10.0.0.1:8000")))
	must(f.Upsert(rec("b", "http://10.0.0.1:8000/v1"))) // the same engine, spelt another way
	want("b names a's engine", "a")
	a := f.Get("a")
	must(f.Upsert(rec("b", "http://10.0.0.1:8000")))
	want("b again", "a")
	if f.Get("a") != a {
		t.Fatal("a was made anew")
	}
	f.Remove("a")
	want("a removed: b joins", "b")

	// The holder moving to another engine frees its first one.
	must(f.Upsert(rec("a", "http://10.0.0.1:8000")))
	want("a names b's engine", "b")
	must(f.Upsert(rec("b", "http://10.0.0.2:8000")))
	want("b moved: a joins", "a", "b")

	// A worker moving onto another's engine is left out.
	must(f.Upsert(rec("b", "http://10.0.0.1:8000")))
	want("b moved onto a's engine", "a")

	// The holder draining lets the other serve the engine meanwhile; the
	// holder back to ACTIVE is then left out.
	d := rec("a", "http://10.0.0.1:8000")
	d.Status = StatusDraining
	must(f.Upsert(d))
	if v := f.View(); len(v.All) != 2 || len(v.Routable) != 1 || v.Routable[0].ID != "b" {
		t.Fatalf("a draining: all %d, routable %v", len(v.All), v.Routable)
	}
	must(f.Upsert(rec("a", "http://10.0.0.1:8000")))
	want("a active again, b holds the engine", "b")
	f.Remove("b")
	want("b removed: a joins", "a")
	must(f.Upsert(rec("b", "http://10.0.0.1:8000")))
	want("b names a's engine again", "a")

	// A left-out worker removed is forgotten: a's removal adds nothing.
	f.Remove("b")
	f.Remove("a")
	want("both removed")

	// A relist: the listed holder stays whatever the order; a relist
	// without the holder routes the other one at once.
	if errs := f.Sync([]Record{rec("a", "http://10.0.0.1:8000"), rec("c", "http://10.0.0.3:8000")}); len(errs) > 0 {
		t.Fatal(errs)
	}
	if errs := f.Sync([]Record{rec("b", "http://10.0.0.1:8000"), rec("a", "http://10.0.0.1:8000"), rec("c", "http://10.0.0.3:8000")}); len(errs) > 0 {
		t.Fatal(errs)
	}
	want("relist with b first", "a", "c")
	if errs := f.Sync([]Record{rec("b", "http://10.0.0.1:8000"), rec("c", "http://10.0.0.3:8000")}); len(errs) > 0 {
		t.Fatal(errs)
	}
	want("relist without a", "b", "c")
	// A relist (a static reload) swapping two workers' engines converges
	// in the one sync.
	if errs := f.Sync([]Record{rec("b", "http://10.0.0.3:8000"), rec("c", "http://10.0.0.1:8000")}); len(errs) > 0 {
		t.Fatal(errs)
	}
	want("swapped", "b", "c")
	if f.Get("b").URL != "http://10.0.0.3:8000" || f.Get("c").URL != "http://10.0.0.1:8000" {
		t.Fatalf("swap: b at %s, c at %s", f.Get("b").URL, f.Get("c").URL)
	}
	if errs := f.Sync(nil); len(errs) > 0 || len(f.shadow) != 0 || len(f.engines) != 0 {
		t.Fatalf("empty relist: errs %v, shadow %v, engines %v", errs, f.shadow, f.engines)
	}

	// Without OneWorkerPerEngine (NATS: a url is a sidecar's view of its
	// engine) both are workers.
	g := NewFleet(BreakerConfig{})
	defer g.Close()
	must(g.Upsert(rec("a", "http://127.0.0.1:8000")))
	must(g.Upsert(rec("b", "http://127.0.0.1:8000")))
	if n := len(g.View().All); n != 2 {
		t.Fatalf("without OneWorkerPerEngine: %d workers, want 2", n)
	}
}

func TestEngineKey(t *testing.T) {
	f := func(a, b string, same bool) {
		t.Helper()
		if got := EngineKey(a) == EngineKey(b); got != same {
			t.Fatalf("EngineKey(%q)=%q, EngineKey(%q)=%q: same %v, want %v", a, EngineKey(a), b, EngineKey(b), got, same)
		}
	}
	f("http://H:80", "http://h", true)
	f("http://h:8000/v1/", "http://h:8000", true)
	f("https://h", "https://h:443", true)
	f("http://h:443", "https://h", false)
	f("http://h:8000", "http://h:8001", false)
	f("http://[::1]:8000", "http://[::1]:8000/", true)
}
