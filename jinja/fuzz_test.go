package jinja

import (
	"os"
	"testing"
	"time"
)

// FuzzTemplate checks that parsing and rendering arbitrary templates never
// panics or hangs.
func FuzzTemplate(f *testing.F) {
	if src, err := os.ReadFile("testdata/qwen3.jinja"); err == nil {
		f.Add(string(src))
	}
	for _, s := range []string{
		"{{ x }}", "{% for a in xs %}{{ loop.index }}{% endfor %}", "{% set ns = namespace(a=1) %}{% set ns.a = 2 %}{{ ns.a }}",
		"{% macro m(a, b=2) %}{{ a ~ b }}{{ m(a) }}{% endmacro %}{{ m(1) }}", "{{ 'a'|tojson(indent=2) }}", "{{ xs[::-1] }}",
		"{%- if a -%}x{%- elif b -%}y{%- else -%}z{%- endif -%}", "{# c #}{{ (1, 2) }}", "{{ {'a': [1, {'b': none}]}|tojson }}",
		"{% for x in range(100000) %}{{ x }}{% endfor %}",
		"{% set ns = namespace(a=none) %}{% for x in xs %}{% if loop.first %}{% set ns.a = loop %}{% endif %}{% for y in xs %}{% endfor %}{% endfor %}{{ ns.a.index }}",
		"{% macro k() %}{{ loop.index }}{% endmacro %}{% for x in xs %}{% for y in [1] %}{% endfor %}{{ k() }}{% else %}{{ loop }}{% endfor %}", "{{ 'abc'.split('b')[-1].strip().upper() }}",
	} {
		f.Add(s)
	}
	vars, err := FromJSON([]byte(`{"x": "s", "xs": [1, 2.5, "t", null, true, {"k": [1]}], "a": true, "b": 0,
		"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "<think>r</think>a", "tool_calls": [{"function": {"name": "f", "arguments": {"q": 1}}}]}]}`))
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, src string) {
		tpl, err := ParseWithOptions(src, Options{MaxSteps: 100_000, MaxOutput: 1 << 20, Now: func() time.Time { return time.Unix(0, 0) }})
		if err != nil {
			return
		}
		out, err := tpl.Render(nil, vars.Object())
		if err == nil && len(out) > 1<<20 {
			t.Fatalf("output of %d bytes exceeds MaxOutput", len(out))
		}
		// A second render reuses the arena the first one filled: it must
		// not see any of it.
		out2, err2 := tpl.Render(nil, vars.Object())
		if string(out2) != string(out) || (err == nil) != (err2 == nil) || (err != nil && err.Error() != err2.Error()) {
			t.Fatalf("second render differs: %q, %v; first %q, %v", out2, err2, out, err)
		}
		// Where the template keeps no loop object (loopref.go), sharing one
		// across iterations renders what a fresh object each would.
		if !tpl.keepsLoop {
			fresh := &Template{body: tpl.body, opts: tpl.opts, keepsLoop: true}
			out3, err3 := fresh.Render(nil, vars.Object())
			if IsLimit(err) && IsLimit(err3) {
				return // the two spend the values budget differently
			}
			if string(out3) != string(out) || (err == nil) != (err3 == nil) || (err != nil && err.Error() != err3.Error()) {
				t.Fatalf("fresh loop objects render %q, %v; a shared one %q, %v", out3, err3, out, err)
			}
		}
	})
}

// FuzzFromJSON checks that JSON conversion never panics and that valid
// documents survive a tojson round trip.
func FuzzFromJSON(f *testing.F) {
	for _, s := range []string{`{"a": 1}`, `[1, 2.5, "x", null, true]`, `{"2": 1, "1": 2, "b": {"c": []}}`, `"\u00e9\ud83d\ude00"`, `[[[[]]]]`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		v, err := FromJSON(data)
		if err != nil {
			return
		}
		enc := appendJSON(nil, v, jsonOptions{}, 0, true)
		v2, err := FromJSON(enc)
		if err != nil {
			t.Fatalf("tojson output %q of %q does not parse: %v", enc, data, err)
		}
		if enc2 := appendJSON(nil, v2, jsonOptions{}, 0, true); string(enc2) != string(enc) {
			t.Fatalf("tojson not stable: %q then %q", enc, enc2)
		}
	})
}
