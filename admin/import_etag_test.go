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

// dry_run takes the usual spellings of true; one it does not know is
// refused rather than read as "import for real".
func TestADryRunImportInAnySpellingChangesNothing(t *testing.T) {
	e := newEnv(t, envOpts{file: `{}`})
	e.put("session_affinity", `{"enabled":true}`, 200)
	exp := e.do("GET", "/api/backup/export", "")
	e.put("session_affinity", `{"enabled":false}`, 200)
	before := e.etag()
	for _, q := range []string{"dry_run=1", "dry_run=true", "dry_run=TRUE", "dry_run=yes", "dry_run=on", "dry_run", "dry_run="} {
		r := e.do("POST", "/api/backup/import?"+q, string(exp.body))
		if r.status != 200 || e.etag() != before || e.store.Load().SessionAffinity.Enabled {
			t.Fatalf("%s: %d %s, the config changed: %v", q, r.status, r.body, e.etag() != before)
		}
	}
	for _, q := range []string{"dry_run=maybe", "dry_run=2", "dry_run=tru"} {
		r := e.do("POST", "/api/backup/import?"+q, string(exp.body))
		if path, _ := r.errPath(t); r.status != 400 || path != "dry_run" || e.etag() != before {
			t.Fatalf("%s: %d %s", q, r.status, r.body)
		}
	}
	if r := e.do("POST", "/api/backup/import?dry_run=false", string(exp.body)); r.status != 200 || !e.store.Load().SessionAffinity.Enabled {
		t.Fatalf("dry_run=false imports: %d %s", r.status, r.body)
	}
}
