package gateway

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/infera/infera/config"
)

// The configuration center doc's startup configuration of data backup,
// copied into the config file: llm_gateway.persist_snapshot_dir is where
// snapshots go when --persist-snapshot-dir is not given, inside one of the
// storage mounts; a directory outside every mount, or in a read-only one,
// is refused with its path.
func TestE2EStartupConfigSetsTheSnapshotDirectory(t *testing.T) {
	_, eng := startEngine(t, "--speedup", "50")
	mount := t.TempDir()
	dir := filepath.Join(mount, "state_persist_llm_gateway", "snapshots")
	cfg := filepath.Join(t.TempDir(), "infera.json")
	writeConfig(t, cfg, fmt.Sprintf(`{
		"llm_gateway": {"persist_snapshot_dir": %q},
		"storage": [{"mount_path": %q, "oss": {"path": "oss://bucket/inferx/", "read_only": false, "type": "ossfs"}}]}`, dir, mount))
	ag := startAdminServe(t, "--workers", eng, "--config", cfg)
	r := ag.api("POST", "/api/backup", "")
	var snap snapshotInfo
	if r.status != 201 || json.Unmarshal(r.body, &snap) != nil || snap.Name == "" {
		t.Fatalf("manual snapshot: %s", r)
	}
	if _, err := os.Stat(filepath.Join(dir, snap.Name)); err != nil {
		t.Fatalf("the snapshot is not in llm_gateway.persist_snapshot_dir: %v", err)
	}
	ag.wantChat("serving", 200)

	for _, tc := range []struct{ doc, path string }{
		{fmt.Sprintf(`{"llm_gateway": {"persist_snapshot_dir": %q}, "storage": [{"mount_path": "/mnt/elsewhere"}]}`, dir), "llm_gateway.persist_snapshot_dir"},
		{fmt.Sprintf(`{"llm_gateway": {"persist_snapshot_dir": %q}, "storage": [{"mount_path": %q, "oss": {"read_only": true}}]}`, dir, mount), "storage[0].oss.read_only"},
		{`{"llm_gateway": {"persist_snapshot_dir": "relative/dir"}}`, "llm_gateway.persist_snapshot_dir"},
	} {
		_, err := config.Parse([]byte(tc.doc))
		if err == nil || !strings.Contains(err.Error(), tc.path) {
			t.Errorf("%s: %v, want an error at %s", tc.doc, err, tc.path)
		}
	}
}
