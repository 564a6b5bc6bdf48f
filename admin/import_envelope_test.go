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
