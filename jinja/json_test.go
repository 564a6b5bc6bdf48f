package jinja

import (
	"encoding/json"
	"os"
	"strings"
	"testing"
)

// FromJSONMax decodes a document within its bound of values, and stops with
// a limit error past it; a document nested past maxJSONDepth is a limit
// error too (the package's bound, not the document's fault), where it was a
// plain error that callers answered as the client's.
func TestFromJSONBoundsAreLimitErrors(t *testing.T) {
	arr := "[" + strings.TrimSuffix(strings.Repeat("0,", 99), ",") + "]" // 100 values and the array
	if v, err := FromJSONMax([]byte(arr), 100); err != nil || len(v.Items()) != 99 {
		t.Fatalf("within the bound: %v", err)
	}
	if _, err := FromJSONMax([]byte(arr), 99); err == nil || !IsLimit(err) {
		t.Fatalf("past the bound: %v, want a limit error", err)
	}
	if _, err := FromJSON([]byte(arr)); err != nil {
		t.Fatalf("no bound: %v", err)
	}
	deep := strings.Repeat("[", maxJSONDepth+2) + strings.Repeat("]", maxJSONDepth+2)
	if _, err := FromJSON([]byte(deep)); err == nil || !IsLimit(err) {
		t.Fatalf("nested past %d: %v, want a limit error", maxJSONDepth, err)
	}
	if _, err := FromJSON([]byte(`[1,`)); err == nil || IsLimit(err) {
		t.Fatalf("broken JSON: %v, want a plain error", err)
	}
}

// Floats print as Python's repr does (str, and json.dumps in tojson), as
// the engine's template renders them (vLLM runs Python): checked against
// 600 values Python printed (testdata/pyfloat.json: the float as JSON, then
// its repr). A tool schema's "minimum": 0.0 rendered "0" and 1E5
// "100000", so the prompt's blocks after the tools differed from the
// engine's.
func TestFloatsPrintAsPythonsRepr(t *testing.T) {
	data, err := os.ReadFile("testdata/pyfloat.json")
	if err != nil {
		t.Fatal(err)
	}
	var pairs [][2]string
	if err := json.Unmarshal(data, &pairs); err != nil {
		t.Fatal(err)
	}
	for _, p := range pairs {
		v, err := FromJSON([]byte(p[0]))
		if err != nil {
			t.Fatalf("%s: %v", p[0], err)
		}
		if got := string(appendString(nil, v)); got != p[1] {
			t.Errorf("%s printed %q, Python %q", p[0], got, p[1])
		}
	}
}

// Integers of a JSON document that a float64 does not hold exactly print
// whole, as Python's json.loads reads them and vLLM's template prints them
// (str, and json.dumps in tojson): a tool schema's "maximum":
// 9223372036854775807 printed 9223372036854775808 and the blocks after the
// tools differed from the engine's. testdata/pyint.json holds the value,
// Python's str and json.dumps of {"m": value}.
func TestLargeIntegersPrintAsPythonPrintsThem(t *testing.T) {
	data, err := os.ReadFile("testdata/pyint.json")
	if err != nil {
		t.Fatal(err)
	}
	var cases [][3]string
	if err := json.Unmarshal(data, &cases); err != nil {
		t.Fatal(err)
	}
	tojson, err := Parse("{{ d|tojson }}|{{ d.m }}|{{ d.m ~ '' }}")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cases {
		v, err := FromJSON([]byte(c[0]))
		if err != nil {
			t.Fatalf("%s: %v", c[0], err)
		}
		if got := string(appendString(nil, v)); got != c[1] {
			t.Errorf("%s printed %q, Python %q", c[0], got, c[1])
		}
		d, err := FromJSON([]byte(`{"m":` + c[0] + `}`))
		if err != nil {
			t.Fatal(err)
		}
		vars := NewObject(1)
		vars.Set("d", d)
		out, err := tojson.Render(nil, vars)
		if err != nil {
			t.Fatal(err)
		}
		if want := c[2] + "|" + c[1] + "|" + c[1]; string(out) != want {
			t.Errorf("%s rendered %q, want %q", c[0], out, want)
		}
	}
}

// With PythonPrint, None and booleans become text as Python's str writes
// them (output, ~, join, the string filter), as vLLM's templates print
// them: Qwen3-Coder's and Qwen3.5's tool calls write a boolean argument
// with |string (True, where @huggingface/jinja writes true), and a tool
// without a description printed nothing where vLLM prints None. The want
// text is what Python's jinja2 printed; without the option the output
// stays @huggingface/jinja's.
func TestPythonPrintWritesNoneAndBooleansAsPython(t *testing.T) {
	const src = "{{ none }}|{{ true }}|{{ false }}|{{ 'a' ~ none ~ true }}|{{ [true, none, 1]|join(',') }}|{{ true|string }}|{{ none|string }}|{{ x }}|{{ d.flag }}|{{ 'v=' + d.flag|string }}|{{ u }}|{{ [1, true]|tojson }}"
	vars := NewObject(2)
	vars.Set("x", Null())
	d := NewObject(1)
	d.Set("flag", Bool(false))
	vars.Set("d", ObjectValue(d))
	for _, c := range []struct {
		py        bool
		src, want string
	}{
		{true, src, "None|True|False|aNoneTrue|True,None,1|True|None|None|False|v=False||[1, true]"},
		{false, "{{ none }}|{{ true }}|{{ [true, none, 1]|join(',') }}|{{ true|string }}|{{ x }}|{{ d.flag }}", "|true|true,,1|true||false"},
	} {
		tpl, err := ParseWithOptions(c.src, Options{PythonPrint: c.py})
		if err != nil {
			t.Fatal(err)
		}
		out, err := tpl.Render(nil, vars)
		if err != nil {
			t.Fatalf("PythonPrint %v: %v", c.py, err)
		}
		if string(out) != c.want {
			t.Errorf("PythonPrint %v:\n got %s\nwant %s", c.py, out, c.want)
		}
	}
}
