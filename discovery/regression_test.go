package discovery

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/infera/infera/fleet"
)

func review2Pod(name, id, url string) kubeEvent {
	rec := fmt.Sprintf(`{"id":%q,"url":%q,"models":["m"],"role":"mixed","status":"ACTIVE"}`, id, url)
	obj := map[string]any{
		"metadata": map[string]any{"name": name, "namespace": "ns", "resourceVersion": "1",
			"annotations": map[string]string{DefaultAnnotation: rec}},
		"status": map[string]any{"phase": "Running", "conditions": []map[string]string{{"type": "Ready", "status": "True"}}},
	}
	b, _ := json.Marshal(obj)
	return kubeEvent{Type: "ADDED", Object: b}
}

// TestKubeDuplicateWorkerIDStaysRoutableWhenOldPodLeaves: two Pods advertising the same worker id (e.g.
// INFERA_WORKER_ID set in a Deployment template during a rollout). When the
// old Pod goes away the new, still Ready Pod must stay routable.
func TestKubeDuplicateWorkerIDStaysRoutableWhenOldPodLeaves(t *testing.T) {
	sink := newMemSink()
	w := &KubeWatcher{cfg: KubeWatcherConfig{Annotation: DefaultAnnotation}, sink: sink,
		st: statsFor(BackendKubernetes), h: newHealth(), byPod: map[string]fleet.Record{}}
	if err := w.apply(ptr(review2Pod("old", "w", "http://10.0.0.1:8100"))); err != nil {
		t.Fatal(err)
	}
	if err := w.apply(ptr(review2Pod("new", "w", "http://10.0.0.2:8100"))); err != nil {
		t.Fatal(err)
	}
	del := review2Pod("old", "w", "http://10.0.0.1:8100")
	del.Type = "DELETED"
	if err := w.apply(&del); err != nil {
		t.Fatal(err)
	}
	r, ok := sink.get("w")
	if !ok || r.URL != "http://10.0.0.2:8100" {
		t.Fatalf("after the old Pod left: worker w = %+v, present %v; want the new Pod's record", r, ok)
	}
}

func ptr[T any](v T) *T { return &v }
