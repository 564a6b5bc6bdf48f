package kv

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// TestWriteFuzzCorpus regenerates testdata/fuzz/FuzzDecode from the
// hand-encoded vectors when KV_WRITE_CORPUS=1.
func TestWriteFuzzCorpus(t *testing.T) {
	if os.Getenv("KV_WRITE_CORPUS") != "1" {
		t.Skip("set KV_WRITE_CORPUS=1 to regenerate the seed corpus")
	}
	dir := filepath.Join("testdata", "fuzz", "FuzzDecode")
	for name, v := range map[string]string{"legacy": vecLegacy, "legacy_no_rank": vecLegacyNoRank, "legacy_full": vecLegacyFull, "map": vecMap} {
		b := hx(t, v)
		body := fmt.Sprintf("go test fuzz v1\n[]byte(%q)\n", b)
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
