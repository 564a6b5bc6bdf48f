package jinja

import (
	"encoding/json"
	"os"
	"testing"
)

// TestPythonReprAndComparisonMatchPythonJinja renders lists, dicts and
// tuples and compares strings with numbers as Python's jinja2 3.1.6 does
// (testdata/pyrepr.json holds its renders): a container prints as its repr
// ("{'k': \"it's\"}"), not JSON, and '1' == 1 is false. The router rendered
// JSON and JavaScript's ==, so such prompts (Hammer2.1's tools|string,
// LFM2.5's tool-call arguments) differed from the engine's.
func TestPythonReprAndComparisonMatchPythonJinja(t *testing.T) {
	data, err := os.ReadFile("testdata/pyrepr.json")
	if err != nil {
		t.Fatal(err)
	}
	var ref struct {
		Vars  json.RawMessage `json:"vars"`
		Cases [][2]string     `json:"cases"`
	}
	if err := json.Unmarshal(data, &ref); err != nil {
		t.Fatal(err)
	}
	vars, err := FromJSON(ref.Vars)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range ref.Cases {
		tpl, err := ParseWithOptions(c[0], Options{PythonStrip: true, PythonPrint: true, PythonCompare: true})
		if err != nil {
			t.Fatalf("%s: %v", c[0], err)
		}
		got, err := tpl.Render(nil, vars.Object())
		if err != nil {
			t.Errorf("%s: %v", c[0], err)
			continue
		}
		if string(got) != c[1] {
			t.Errorf("%s:\n got %s\nwant %s", c[0], got, c[1])
		}
	}
}
