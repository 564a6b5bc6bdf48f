package gateway

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/infera/infera/config"
)

// The configuration center doc's startup configuration of data backup,
// copied into the config file: llm_gateway.persist_snapshot_dir is where
// snapshots go when --persist-snapshot-dir is not given, inside one of the
// storage mounts; a directory outside every mount, or in a read-only one,
// is refused with its path.
func TestE2EStartupConfigSetsTheSnapshotDirectoryAndARebuiltNodeRestoresTheNewest(t *testing.T) {
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

	// A change through the admin API, then the node is rebuilt from its
	// deployment: the same startup file, written before the change. The
	// newest snapshot (the shutdown one) is restored at start.
	ag.patch("session_affinity", `{"enabled":true,"require_session_id":true}`)
	ag.wantChat("a request without a session id", 400)
	ag.stop()
	orig := fmt.Sprintf(`{
		"llm_gateway": {"persist_snapshot_dir": %q},
		"storage": [{"mount_path": %q, "oss": {"path": "oss://bucket/inferx/", "read_only": false, "type": "ossfs"}}]}`, dir, mount)
	writeConfig(t, cfg, orig)
	old := time.Now().Add(-time.Hour)
	if err := os.Chtimes(cfg, old, old); err != nil {
		t.Fatal(err)
	}
	ag2 := startAdminServe(t, "--workers", eng, "--config", cfg)
	ag2.wantChat("after a restart from the deployment's file, a request without a session id", 400)
	ag2.wantChat("with one", 200, "X-Session-Id", "s1")
	if b, err := os.ReadFile(cfg + ".before-restore"); err != nil || string(b) != orig {
		t.Fatalf("the file's previous bytes were not kept beside it: %v", err)
	}

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
