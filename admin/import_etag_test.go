package admin

import (
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"
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

// The current ETag is computed once per If-Match, however many tags the
// header lists: computing it encodes the whole config, and it was computed
// again for every tag, so one request whose If-Match was 60,000 commas kept
// a core busy for 5 s on a default config (longer the more users).
func TestAnIfMatchListingManyTagsCostsOneETag(t *testing.T) {
	var doc strings.Builder
	doc.WriteString(`{"users":[`)
	for i := range 500 {
		if i > 0 {
			doc.WriteByte(',')
		}
		fmt.Fprintf(&doc, `{"name":"user-%d","template":"","enabled":true}`, i)
	}
	doc.WriteString(`]}`)
	e := newEnv(t, envOpts{file: doc.String()})
	tags := strings.Repeat(`"1-000000000000",`, 3000) + e.etag()
	start := time.Now()
	r := e.do("PATCH", "/api/config/debug", `{"decision_header":true}`, "If-Match", tags)
	if took := time.Since(start); r.status != 200 || took > 3*time.Second {
		t.Fatalf("If-Match of 3001 tags: %d in %v: %s", r.status, took, r.body)
	}
}

// A dry run asked for under another name (?dryrun=1, ?DRY_RUN=1, ?dry-run)
// or twice, and a query parameter on any other write, is refused: it was
// ignored and the import (or the write) applied for real.
func TestAMisspeltDryRunParameterNeverImports(t *testing.T) {
	e := newEnv(t, envOpts{file: `{}`})
	e.put("session_affinity", `{"enabled":true}`, 200)
	exp := e.do("GET", "/api/backup/export", "")
	e.put("session_affinity", `{"enabled":false}`, 200)
	before := e.etag()
	for _, q := range []string{"dryrun=1", "DRY_RUN=1", "dry-run", "dryRun=true", "dry_run=1&dry_run=0", "dry_run=1&force=1"} {
		r := e.do("POST", "/api/backup/import?"+q, string(exp.body))
		if path, _ := r.errPath(t); r.status != 400 || path == "" || e.etag() != before || e.store.Load().SessionAffinity.Enabled {
			t.Fatalf("%s: %d %s, the config changed: %v", q, r.status, r.body, e.etag() != before)
		}
	}
	if r := e.do("PATCH", "/api/config/session_affinity?dry_run=1", `{"enabled":true}`, "If-Match", "*"); r.status != 400 || e.etag() != before {
		t.Fatalf("PATCH ?dry_run=1: %d %s, the config changed: %v", r.status, r.body, e.etag() != before)
	}
	if r := e.do("POST", "/api/users?dry_run=1", `{"name":"ann"}`); r.status != 400 || e.etag() != before {
		t.Fatalf("POST /api/users?dry_run=1: %d %s, the config changed: %v", r.status, r.body, e.etag() != before)
	}
	if r := e.do("POST", "/api/backup/import?dry_run=1", string(exp.body)); r.status != 200 || e.etag() != before {
		t.Fatalf("dry_run=1: %d %s", r.status, r.body)
	}
}

// An import's answer gives its ETag in the header and in the body, and
// computes it from the redacted encoding its audit entry made of the new
// config, which is what an ETag digests: encoding the whole config again
// for the ETag was one more encoding of the import's size (50,000 users:
// 9.5 MB in a buffer of 1.125 times that). The next GET /api/version
// takes it from there too, and one of a config the audit never encoded
// (the config at start) encodes it once, for every GET after it.
func TestAnImportsETagIsComputedFromItsAuditEncoding(t *testing.T) {
	e := newEnv(t, envOpts{file: `{}`})
	f := func(method, path, body string, computed uint64) string {
		t.Helper()
		before := e.a.etags.Load()
		r := e.do(method, path, body)
		var got struct {
			ETag string `json:"etag"`
		}
		if r.status != 200 || json.Unmarshal(r.body, &got) != nil || got.ETag == "" || got.ETag != r.etag {
			t.Fatalf("%s %s: %d, ETag %q, body %s", method, path, r.status, r.etag, r.body)
		}
		if n := e.a.etags.Load() - before; n != computed {
			t.Errorf("%s %s: %d ETags computed by encoding the config, want %d", method, path, n, computed)
		}
		// The ETag is the digest of the config's redacted encoding.
		c, v := e.store.Current()
		data, err := e.a.seal.encodeRedacted(c)
		if err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(data)
		if want := fmt.Sprintf(`"%d-%x"`, v, sum[:6]); got.ETag != want {
			t.Fatalf("%s %s: ETag %s, want %s", method, path, got.ETag, want)
		}
		return got.ETag
	}
	f("GET", "/api/version", "", 1) // the config at start
	f("GET", "/api/version", "", 0)
	exp := e.do("GET", "/api/backup/export", "")
	e.put("session_affinity", `{"enabled":true}`, 200)
	e.a.audit.drain()
	f("GET", "/api/version", "", 0)
	f("POST", "/api/backup/import", string(exp.body), 0)
	f("GET", "/api/version", "", 0)
}
