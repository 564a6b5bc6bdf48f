package fleet

import (
	"slices"
	"testing"
)

// publishRecorder records, when told a View is published, which workers it
// holds, and whether a removal was told before.
type publishRecorder struct {
	f       *Fleet
	removed []string
	views   [][]string
}

func (p *publishRecorder) WorkerAdded(*Worker) error { return nil }
func (p *publishRecorder) WorkerRemoved(w *Worker)   { p.removed = append(p.removed, w.ID) }
func (p *publishRecorder) Published() {
	var ids []string
	for _, w := range p.f.view.Load().All {
		ids = append(ids, w.ID)
	}
	p.views = append(p.views, ids)
}

// A change's removals are told before its View is published, and a
// PublishHook is told once that View (with the workers the same change
// added) is the fleet's: the governor wakes requests waiting on a removed
// worker there, and they picked from the View before the change when woken
// from WorkerRemoved (a reload replacing a service's only worker answered
// them no_workers).
func TestAPublishHookSeesTheChangesView(t *testing.T) {
	f := NewFleet(BreakerConfig{})
	defer f.Close()
	p := &publishRecorder{f: f}
	f.AddHook(p)
	rec := func(id string) Record {
		return Record{ID: id, URL: "http://" + id + ".test:1", Models: []string{"m"}, Service: "B"}
	}
	if errs := f.Sync([]Record{rec("e1"), rec("e2")}); len(errs) > 0 {
		t.Fatal(errs)
	}
	p.views = nil
	if errs := f.Sync([]Record{rec("e1"), rec("e3")}); len(errs) > 0 {
		t.Fatal(errs)
	}
	if !slices.Equal(p.removed, []string{"e2"}) || len(p.views) != 1 || !slices.Equal(p.views[0], []string{"e1", "e3"}) {
		t.Fatalf("removed %v, views published %v: want e2 removed, then one view of e1 and e3", p.removed, p.views)
	}
}
