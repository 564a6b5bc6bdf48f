package admin

import (
	"net/http"
	"testing"
)

// A dry-run import answers the ETag of the config its changes were listed
// against; the import sent with it is refused if the config changed since,
// so what the operator approved is what gets applied (the console sends it).
func TestAnImportPreviewedOnAnOlderConfigIsRefused(t *testing.T) {
	e := newEnv(t, envOpts{file: `{}`})
	e.put("session_affinity", `{"enabled":true}`, 200)
	exp := e.do("GET", "/api/backup/export", "")
	if exp.status != 200 {
		t.Fatalf("export: %d %s", exp.status, exp.body)
	}
	dry := e.do("POST", "/api/backup/import?dry_run=1", string(exp.body))
	if dry.status != 200 || dry.etag == "" || dry.etag != e.etag() {
		t.Fatalf("dry run: %d, ETag %q (current %q)", dry.status, dry.etag, e.etag())
	}
	e.put("load_balancing", `{"algorithm":"round-robin"}`, 200) // someone else, meanwhile
	if r := e.do("POST", "/api/backup/import", string(exp.body), "If-Match", dry.etag); r.status != http.StatusConflict {
		t.Fatalf("import with the preview's stale ETag: %d %s", r.status, r.body)
	}
	dry = e.do("POST", "/api/backup/import?dry_run=1", string(exp.body))
	if r := e.do("POST", "/api/backup/import", string(exp.body), "If-Match", dry.etag); r.status != 200 {
		t.Fatalf("import with a fresh preview's ETag: %d %s", r.status, r.body)
	}
}
