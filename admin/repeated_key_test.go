package admin

import (
	"encoding/json"
	"net/http"
	"testing"
)

// A write through the API that gives a setting twice in one object is
// refused with the setting's path, as the config file is: the body was
// decoded into a map, which kept the last copy, so the first silently did
// nothing (here: decision_header stayed off).
func TestAWriteWithARepeatedSettingIsRefused(t *testing.T) {
	e := newEnv(t, envOpts{file: `{}`})
	f := func(method, path, body, wantPath string) {
		t.Helper()
		r := e.do(method, path, body, "If-Match", "*")
		var got errorJSON
		json.Unmarshal(r.body, &got)
		if r.status != http.StatusBadRequest || got.Error.Path != wantPath {
			t.Fatalf("%s %s %s: %d %s, want 400 at %q", method, path, body, r.status, r.body, wantPath)
		}
		if e.store.Load().Debug.DecisionHeader {
			t.Fatalf("%s %s %s applied a copy", method, path, body)
		}
	}
	f("PUT", "/api/config", `{"debug":{"decision_header":true},"debug":{}}`, "debug")
	f("PUT", "/api/config", `{"debug":{"decision_header":true,"decision_header":false}}`, "debug.decision_header")
	f("PUT", "/api/config/debug", `{"decision_header":true,"decision_header":false}`, "debug.decision_header")
	f("PATCH", "/api/config/debug", `{"decision_header":true,"Decision_Header":false}`, "debug.Decision_Header")
}

// An export edited by hand (the import invites it: remove sha256 to import
// an edited file) with a setting given twice kept the last copy silently,
// as the writes did: refused at its path, nothing imported.
func TestAnImportWithARepeatedSettingIsRefused(t *testing.T) {
	e := newEnv(t, envOpts{file: `{}`})
	snap := `{"format":"` + snapshotFormat + `","format_version":1,"config":{"debug":{"decision_header":true},"debug":{}}}`
	for _, q := range []string{"?dry_run=1", ""} {
		r := e.do("POST", "/api/backup/import"+q, snap)
		var got errorJSON
		json.Unmarshal(r.body, &got)
		if r.status != http.StatusBadRequest || got.Error.Path != "config.debug" || e.store.Version() != 1 {
			t.Fatalf("import%s: %d %s (version %d)", q, r.status, r.body, e.store.Version())
		}
	}
}
