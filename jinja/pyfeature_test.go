package jinja

import (
	"encoding/json"
	"os"
	"testing"
)

// pyFeature renders the case name of testdata/pyref_features.json (written
// by scripts/jinjaref/pyref.py with Python's jinja2 in transformers'
// environment) and compares it with what Python printed.
func pyFeature(t *testing.T, name string) {
	t.Helper()
	data, err := os.ReadFile("testdata/pyref_features.json")
	if err != nil {
		t.Fatal(err)
	}
	var cases []struct {
		Name     string          `json:"name"`
		Template string          `json:"template"`
		Vars     json.RawMessage `json:"vars"`
		Out      *string         `json:"out"`
		Error    *string         `json:"error"`
	}
	if err := json.Unmarshal(data, &cases); err != nil {
		t.Fatal(err)
	}
	for _, c := range cases {
		if c.Name != name {
			continue
		}
		vars, err := FromJSON(c.Vars)
		if err != nil {
			t.Fatal(err)
		}
		tpl, err := ParseWithOptions(c.Template, Options{PythonStrip: true})
		var got []byte
		if err == nil {
			got, err = tpl.Render(nil, vars.Object())
		}
		switch {
		case c.Error != nil && err == nil:
			t.Fatalf("%q: got %q, want error %q", c.Template, got, *c.Error)
		case c.Error == nil && err != nil:
			t.Fatalf("%q: %v, want %q", c.Template, err, *c.Out)
		case c.Out != nil && string(got) != *c.Out:
			t.Fatalf("%q:\n got %q\nwant %q", c.Template, got, *c.Out)
		}
		return
	}
	t.Fatalf("no case %q in testdata/pyref_features.json", name)
}

func TestSetInALoopBodyDoesNotOutliveItsIteration(t *testing.T) {
	pyFeature(t, "set_in_loop_body_does_not_outlive_its_iteration")
}

func TestForUnpacksTupleLiterals(t *testing.T) {
	pyFeature(t, "for_unpacks_tuple_literals")
}

func TestEqualComparesDictsAndListsByValue(t *testing.T) {
	pyFeature(t, "equal_compares_dicts_and_lists_by_value")
}

func TestStringFiltersOfUndefinedAreEmpty(t *testing.T) {
	pyFeature(t, "string_filters_of_undefined_are_empty")
}

func TestDictBuildsAMapping(t *testing.T) {
	pyFeature(t, "dict_builds_a_mapping")
}

func TestConcatAndJoinWriteFloatsAsPythonStr(t *testing.T) {
	pyFeature(t, "concat_and_join_write_floats_as_python_str")
}

func TestStarRepeatsAString(t *testing.T) {
	pyFeature(t, "star_repeats_a_string")
	// Bounded as any string the template builds.
	tpl, err := Parse("{{ 'xy' * 1000000000000 }}")
	if err != nil {
		t.Fatal(err)
	}
	if out, err := tpl.Render(nil, nil); err == nil {
		t.Fatalf("a 2 TB string rendered (%d bytes)", len(out))
	}
}

func TestSelectattrTestsAMissingAttributeAsUndefined(t *testing.T) {
	pyFeature(t, "selectattr_tests_a_missing_attribute_as_undefined")
}
