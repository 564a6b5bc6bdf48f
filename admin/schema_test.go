package admin

import (
	"encoding/json"
	"strings"
	"testing"
)

// Every setting of config.Config needs a label (and its group a place in
// the navigation): a setting without one would show in the console under
// its raw JSON name.
func TestSchemaCoversEverySetting(t *testing.T) {
	var missing []string
	var walk func(fs []Field)
	walk = func(fs []Field) {
		for _, f := range fs {
			if _, ok := fieldMeta[f.Path]; !ok {
				missing = append(missing, f.Path)
			}
			walk(f.Fields)
		}
	}
	secs := buildSchema()
	walk(secs)
	if len(missing) > 0 {
		t.Fatalf("settings without a label in fieldMeta (admin/schema.go):\n%s", strings.Join(missing, "\n"))
	}
	for _, s := range secs {
		if s.Group == "" {
			t.Fatalf("section %s has no navigation group", s.Key)
		}
	}
	for path := range fieldMeta {
		if !schemaHas(secs, path) {
			t.Errorf("fieldMeta names %q, which is not a setting", path)
		}
	}
}

func schemaHas(fs []Field, path string) bool {
	for _, f := range fs {
		if f.Path == path || schemaHas(f.Fields, path) {
			return true
		}
	}
	return false
}

func TestSchemaKindsDefaultsAndPercentages(t *testing.T) {
	e := newEnv(t, envOpts{})
	r := e.do("GET", "/api/schema", "")
	var out struct{ Sections []Field }
	if err := json.Unmarshal(r.body, &out); err != nil || r.status != 200 {
		t.Fatalf("%d %v", r.status, err)
	}
	find := func(path string) Field {
		t.Helper()
		var got *Field
		var walk func(fs []Field)
		walk = func(fs []Field) {
			for i := range fs {
				if fs[i].Path == path {
					got = &fs[i]
				}
				walk(fs[i].Fields)
			}
		}
		walk(out.Sections)
		if got == nil {
			t.Fatalf("no %s in the schema", path)
		}
		return *got
	}
	f := func(path, kind string, def any) {
		t.Helper()
		got := find(path)
		if got.Kind != kind || (def != nil && got.Default != def) {
			t.Fatalf("%s: kind %s default %v, want %s %v", path, got.Kind, got.Default, kind, def)
		}
	}
	f("session_affinity.ttl_s", "float", float64(1800))
	f("session_affinity.mode", "enum", "soft")
	f("session_affinity.require_session_id", "bool", false)
	f("session_affinity.max_entries", "int", float64(100000))
	f("workers", "list", nil)
	f("canary.rules[].targets", "list", nil)
	f("split_proxy.proxies[].api_key", "secret", nil)
	f("model_routing.mappings[].services", "strings", nil)
	if !find("canary.rules[].targets[].weight").Percent || !find("split_proxy.proxies[].weight").Percent {
		t.Fatal("weights not shown as percentages")
	}
	if got := find("session_affinity.ttl_s"); got.Label != "Session TTL" || got.Unit != "s" || got.Help == "" {
		t.Fatalf("doc names: %+v", got)
	}
	// A new quota template starts from the template defaults.
	item := find("user_limit.templates").Item.(map[string]any)
	if item["rate"].(map[string]any)["default_output_tokens"] != float64(1024) {
		t.Fatalf("template item default: %v", item)
	}
}
