package fleet

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
)

// At debug level a worker whose record changed in place (its status, its
// version, its max_model_len) logs "worker updated"; a record listed again
// unchanged (every discovery refresh) logs nothing.
func TestAWorkerUpdatedInPlaceIsLoggedAtDebugLevel(t *testing.T) {
	var buf bytes.Buffer
	old := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})))
	defer slog.SetDefault(old)
	f := NewFleet(BreakerConfig{})
	defer f.Close()
	rec := Record{ID: "a", URL: "http://10.0.0.1:8000", Models: []string{"m"}, Version: "v1"}
	for i := 0; i < 2; i++ {
		if err := f.Upsert(rec); err != nil {
			t.Fatal(err)
		}
	}
	if strings.Contains(buf.String(), "worker updated") {
		t.Fatalf("an unchanged record logged an update:\n%s", buf.String())
	}
	rec.Status, rec.Version = StatusDraining, "v2"
	if err := f.Upsert(rec); err != nil {
		t.Fatal(err)
	}
	if want := `level=DEBUG msg="worker updated" id=a status=DRAINING version=v2 max_model_len=0`; !strings.Contains(buf.String(), want) {
		t.Fatalf("no %q in:\n%s", want, buf.String())
	}
}
