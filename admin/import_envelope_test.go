package admin

import (
	"strings"
	"testing"
)

// A snapshot file is one JSON object, and like the config inside it no
// key may come twice: an edited export with a second "config" (or
// "sha256") was imported from the last copy, the first silently ignored.
func TestAnImportWithARepeatedEnvelopeKeyIsRefused(t *testing.T) {
	e := newEnv(t, envOpts{file: `{}`})
	v := e.store.Version()
	for _, c := range []struct{ body, path string }{
		{`{"format":"infera-snapshot","format_version":1,"config":{"debug":{"decision_header":true}},"config":{}}`, "config"},
		{`{"format":"infera-snapshot","format_version":1,"Config":{"debug":{"decision_header":true}},"config":{}}`, "config"},
		{`{"format":"infera-snapshot","format_version":1,"format":"infera-snapshot","config":{}}`, "format"},
		{`{"format":"infera-snapshot","format_version":1,"config":{"debug":{"decision_header":true,"Decision_Header":false}}}`, "config.debug.Decision_Header"},
	} {
		for _, q := range []string{"?dry_run=1", ""} {
			r := e.do("POST", "/api/backup/import"+q, c.body)
			if r.status != 400 {
				t.Fatalf("%s%s: %d %.300s", c.body, q, r.status, r.body)
			}
			if p, msg := r.errPath(t); p != c.path || !strings.Contains(msg, "repeated key") {
				t.Fatalf("%s%s: error at %q %q, want %q repeated key", c.body, q, p, msg, c.path)
			}
		}
	}
	if e.store.Version() != v {
		t.Fatal("a refused import changed the config")
	}
}

// Bytes that are not UTF-8 in the strings of an import are read as
// encoding/json reads them, each as U+FFFD, in the config and in the
// snapshot file's own keys: the import's walk of the bytes, stricter, made
// them a 500.
func TestAnImportReadsBytesThatAreNotUTF8AsEncodingJSONDoes(t *testing.T) {
	e := newEnv(t, envOpts{file: `{}`})
	snap := "{\"format\":\"" + snapshotFormat + "\",\"format_version\":1,\"kind\":\"x\xff\",\"config\":" +
		"{\"users\":[{\"name\":\"u\",\"models\":[\"qwen\xff\xfe-*\"]}]}}"
	for _, q := range []string{"?dry_run=1", ""} {
		if r := e.do("POST", "/api/backup/import"+q, snap); r.status != 200 {
			t.Fatalf("import%s: %d %s", q, r.status, r.body)
		}
	}
	if u := e.store.Load().Users; len(u) != 1 || len(u[0].Models) != 1 || u[0].Models[0] != "qwen\ufffd\ufffd-*" {
		t.Fatalf("imported users: %+v", u)
	}
}

// An export saved by an editor that writes a UTF-8 byte order mark (the
// Windows ones) imports through the API as through the console, whose
// browser drops the mark as it reads the file: the API answered 400 "not
// a snapshot: cannot parse JSON (invalid character 'ï' looking for
// beginning of value)" for the file the console imported. RFC 8259 8.1
// lets a parser ignore the mark.
func TestAnExportSavedWithAByteOrderMarkImports(t *testing.T) {
	e := newEnv(t, envOpts{file: `{}`})
	e.put("session_affinity", `{"enabled":true}`, 200)
	exp := e.do("GET", "/api/backup/export", "").body
	e.put("session_affinity", `{"enabled":false}`, 200)
	withBOM := "\ufeff" + string(exp)
	if r := e.do("POST", "/api/backup/import?dry_run=1", withBOM); r.status != 200 {
		t.Fatalf("dry run of an export with a byte order mark: %d %s", r.status, r.body)
	}
	if r := e.do("POST", "/api/backup/import", withBOM); r.status != 200 || !e.store.Load().SessionAffinity.Enabled {
		t.Fatalf("import of an export with a byte order mark: %d %s", r.status, r.body)
	}
	// Anything else before the document is still refused.
	if r := e.do("POST", "/api/backup/import", "\ufeff\ufeff"+string(exp)); r.status != 400 {
		t.Fatalf("two byte order marks: %d %s", r.status, r.body)
	}
}

// A snapshot file's own keys are format, format_version, created_at, kind,
// version, sha256 and config (any case, as they are read). Another was
// ignored: a misspelt "sha256" ("sha_256", "checksum") imported a file
// whose checksum was never compared, damaged or not, as if the key had
// been removed on purpose. An import refuses it, its dry run too.
func TestAnImportWithAnUnknownEnvelopeKeyIsRefused(t *testing.T) {
	e := newEnv(t, envOpts{file: `{}`})
	v := e.store.Version()
	for _, c := range []struct{ body, path string }{
		{`{"format":"infera-snapshot","format_version":1,"sha_256":"00","config":{"debug":{"decision_header":true}}}`, "sha_256"},
		{`{"format":"infera-snapshot","format_version":1,"config":{},"checksum":"00"}`, "checksum"},
		{`{"format":"infera-snapshot","format_version":1,"config":{},"extra":{"x":[1,2]}}`, "extra"},
	} {
		for _, q := range []string{"?dry_run=1", ""} {
			r := e.do("POST", "/api/backup/import"+q, c.body)
			if r.status != 400 {
				t.Fatalf("%s%s: %d %.300s", c.body, q, r.status, r.body)
			}
			if p, msg := r.errPath(t); p != c.path || !strings.Contains(msg, "unknown key") {
				t.Fatalf("%s%s: error at %q %q, want %q unknown key", c.body, q, p, msg, c.path)
			}
		}
	}
	if e.store.Version() != v {
		t.Fatal("a refused import changed the config")
	}
	// The file's own keys, in any case, and a byte order mark before it.
	ok := "\ufeff" + `{"Format":"infera-snapshot","FORMAT_VERSION":1,"created_at":"2026-12-01T06:00:00Z","kind":"export","version":3,"Sha256":"","config":{}}`
	if r := e.do("POST", "/api/backup/import?dry_run=1", ok); r.status != 200 {
		t.Fatalf("a snapshot file with its own keys: %d %s", r.status, r.body)
	}
}
