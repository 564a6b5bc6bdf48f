package fleet

import (
	"encoding/json"
	"testing"
)

func TestRecordBootstrapIsReadLeniently(t *testing.T) {
	f := func(url, bootstrap string, want PD) {
		t.Helper()
		r := Record{ID: "p", URL: url, Role: "prefill", Bootstrap: json.RawMessage(bootstrap)}
		u := "127.0.0.1"
		switch url {
		case "http://[::1]:8100":
			u = "::1"
		case "http://prefill-0.svc:8100":
			u = "prefill-0.svc"
		}
		if got := parsePD(&r, u); got != want {
			t.Fatalf("%s %s: %+v, want %+v", url, bootstrap, got, want)
		}
	}
	f("http://127.0.0.1:8100", `{"pd_mode":"sglang","bootstrap_host":"10.0.0.5","bootstrap_port":8998}`, PD{Mode: "sglang", BootstrapHost: "10.0.0.5", BootstrapPort: 8998})
	f("http://127.0.0.1:8100", `{"pd_mode":"VLLM"}`, PD{Mode: "vllm", BootstrapHost: "127.0.0.1"})
	f("http://prefill-0.svc:8100", ``, PD{BootstrapHost: "prefill-0.svc"})
	f("http://[::1]:8100", `{"bootstrap_port":"9000"}`, PD{BootstrapHost: "[::1]", BootstrapPort: 9000})
	f("http://127.0.0.1:8100", `{"bootstrap_host":"fd00::5","bootstrap_port":70000}`, PD{BootstrapHost: "[fd00::5]"})
	f("http://127.0.0.1:8100", `{"bootstrap_host":"[fd00::5]","bootstrap_port":1.5}`, PD{BootstrapHost: "[fd00::5]"})
	f("http://127.0.0.1:8100", `{"pd_mode":7,"bootstrap_host":null,"bootstrap_port":null}`, PD{BootstrapHost: "127.0.0.1"})
	f("http://127.0.0.1:8100", `not json`, PD{BootstrapHost: "127.0.0.1"})
}

// The view counts routable prefill and decode workers, and a changed
// bootstrap record builds a new worker (the router must not keep sending
// decode engines to the old KV server).
func TestViewCountsPDWorkersAndBootstrapChangesReplaceTheWorker(t *testing.T) {
	f := NewFleet(BreakerConfig{})
	defer f.Close()
	rec := func(id, role, bootstrap string) Record {
		r := Record{ID: id, URL: "http://127.0.0.1:9", Models: []string{"m"}, Role: role}
		if bootstrap != "" {
			r.Bootstrap = json.RawMessage(bootstrap)
		}
		return r
	}
	f.Sync([]Record{rec("a", "mixed", "")})
	if n := f.View().PD; n != 0 {
		t.Fatalf("mixed fleet PD=%d", n)
	}
	if err := f.Upsert(rec("p", "prefill", `{"bootstrap_port":8998}`)); err != nil {
		t.Fatal(err)
	}
	if err := f.Upsert(rec("d", "decode", "")); err != nil {
		t.Fatal(err)
	}
	if n := f.View().PD; n != 2 {
		t.Fatalf("PD=%d, want 2", n)
	}
	old := f.Get("p")
	if err := f.Upsert(rec("p", "prefill", `{"bootstrap_port":8998}`)); err != nil {
		t.Fatal(err)
	}
	if f.Get("p") != old {
		t.Fatal("an unchanged record replaced the worker")
	}
	if err := f.Upsert(rec("p", "prefill", `{"bootstrap_port":9000}`)); err != nil {
		t.Fatal(err)
	}
	if w := f.Get("p"); w == old || w.PD.BootstrapPort != 9000 || !old.Removed() {
		t.Fatalf("bootstrap change: same worker %v, port %d", w == old, w.PD.BootstrapPort)
	}
	d := rec("d", "decode", "")
	d.Status = StatusDraining
	if err := f.Upsert(d); err != nil {
		t.Fatal(err)
	}
	if n := f.View().PD; n != 1 {
		t.Fatalf("PD=%d with the decode draining, want 1", n)
	}
}

// HandoffFailed blames the side of a failed PD handoff the workers' last
// handoffs point at, and the decode worker when nothing does.
func TestHandoffFailedBlamesTheSideTheLastHandoffsPointAt(t *testing.T) {
	var serial uint32
	w := func() *Worker { serial++; return &Worker{Serial: serial} }
	t.Run("a prefill worker failing two decode workers in a row is blamed, until a handoff of its is taken", func(t *testing.T) {
		p, d0, d1, d2 := w(), w(), w(), w()
		if HandoffFailed(p, d0) {
			t.Fatal("a first failure, with no evidence, blamed the prefill worker")
		}
		if !HandoffFailed(p, d1) {
			t.Fatal("blamed the second decode worker in a row to fail the prefill worker's KV")
		}
		if !HandoffFailed(p, d2) {
			t.Fatal("a blamed prefill worker's next failed handoff blamed the decode worker")
		}
		HandoffTaken(p, d0)
		if HandoffFailed(p, d1) {
			t.Fatal("the blame outlived a handoff that was taken")
		}
	})
	t.Run("a decode worker failing two prefill workers' KV in a row is blamed", func(t *testing.T) {
		p0, p1, d := w(), w(), w()
		if HandoffFailed(p0, d) || HandoffFailed(p1, d) {
			t.Fatal("a decode worker failing two prefill workers' handoffs was not blamed")
		}
		p2 := w()
		if HandoffFailed(p2, d) {
			t.Fatal("a blamed decode worker's next failure blamed the prefill worker")
		}
	})
	t.Run("a prefill worker whose last handoff was taken is not blamed", func(t *testing.T) {
		p, d0, d1 := w(), w(), w()
		HandoffTaken(p, d0)
		if HandoffFailed(p, d1) {
			t.Fatal("blamed the prefill worker whose last handoff was taken")
		}
	})
	t.Run("a decode worker whose last handoff was taken blames the prefill worker", func(t *testing.T) {
		p0, p1, d := w(), w(), w()
		HandoffTaken(p0, d)
		if !HandoffFailed(p1, d) {
			t.Fatal("blamed the decode worker whose last handoff was taken")
		}
	})
	t.Run("both workers failing with others blames the decode worker", func(t *testing.T) {
		p0, p1, d0, d1 := w(), w(), w(), w()
		HandoffFailed(p0, d0)
		HandoffFailed(p1, d1)
		if HandoffFailed(p0, d1) {
			t.Fatal("a decode tier failing as a whole blamed a prefill worker")
		}
	})
	t.Run("the same pair failing again with no other handoff blames the decode worker", func(t *testing.T) {
		p, d := w(), w()
		for i := 0; i < 3; i++ {
			if HandoffFailed(p, d) {
				t.Fatalf("failure %d blamed the prefill worker", i)
			}
		}
	})
}

// HandoffTimedOut judges by the same records, but blames the prefill
// worker (whose deadline passed) when nothing points either way.
func TestHandoffTimedOutBlamesTheDecodeWorkerOnlyOnEvidence(t *testing.T) {
	var serial uint32
	w := func() *Worker { serial++; return &Worker{Serial: serial} }
	p0, p1, d := w(), w(), w()
	if !HandoffTimedOut(p0, d) {
		t.Fatal("a first timeout, with no evidence, blamed the decode worker")
	}
	if HandoffTimedOut(p1, d) {
		t.Fatal("a decode worker that two prefill workers timed out waiting for was not blamed")
	}
	if HandoffTimedOut(p0, d) {
		t.Fatal("a blamed decode worker's next timeout blamed the prefill worker")
	}
}
