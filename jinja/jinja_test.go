package jinja

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"
)

func mustVars(t *testing.T, js string) *Object {
	t.Helper()
	if js == "" {
		return nil
	}
	v, err := FromJSON([]byte(js))
	if err != nil {
		t.Fatal(err)
	}
	return v.Object()
}

func TestRender(t *testing.T) {
	f := func(src, vars, want string) {
		t.Helper()
		tpl, err := Parse(src)
		if err != nil {
			t.Fatalf("Parse(%q): %v", src, err)
		}
		got, err := tpl.Render([]byte("prefix:"), mustVars(t, vars))
		if err != nil {
			t.Fatalf("Render(%q): %v", src, err)
		}
		if string(got) != "prefix:"+want {
			t.Fatalf("Render(%q) = %q, want %q", src, got[len("prefix:"):], want)
		}
	}
	f("", "", "")
	f("plain text\n", "", "plain text") // one trailing newline is dropped
	f("{{ a }}", `{"a": "x"}`, "x")
	// Undefined is lenient: printing, attributes, items, tests.
	f("[{{ nope }}][{{ nope.x.y }}][{{ nope is defined }}][{{ a.missing }}]", `{"a": {}}`, "[][][false][]")
	f("{{ none }}{{ null_value }}", `{"null_value": null}`, "")
	// Whitespace control and trim_blocks/lstrip_blocks.
	f("a\n  {% if true %}\n  b\n  {% endif %}\nc", "", "a\n  b\nc")
	f("a  {{- 'b' -}}  c", "", "abc")
	f("a\n{#- c -#}\nb", "", "ab")
	f("{% for x in xs -%}\n{{ x }}\n{%- endfor %}", `{"xs": [1, 2]}`, "12")
	// Loop variables.
	f("{% for x in xs %}{{ loop.index0 }}/{{ loop.length }}{{ '|' if not loop.last }}{% endfor %}", `{"xs": ["a", "b", "c"]}`, "0/3|1/3|2/3")
	f("{% for x in xs %}{{ loop.previtem }}>{{ x }};{% endfor %}", `{"xs": [1, 2]}`, ">1;1>2;")
	f("{% for x in xs if x.ok %}{{ x.n }}{% else %}none{% endfor %}", `{"xs": [{"ok": false, "n": 1}]}`, "none")
	// Scoping: loop-local sets do not leak; namespaces do.
	f("{% set v = 1 %}{% for x in [1] %}{% set v = 2 %}{% endfor %}{{ v }}", "", "1")
	f("{% set ns = namespace(v=1) %}{% for x in [1] %}{% set ns.v = 2 %}{% endfor %}{{ ns.v }}", "", "2")
	// Numbers print as JavaScript does, floats keep one decimal.
	f("{{ 1 }} {{ 1.0 }} {{ 2.50 }} {{ 10 / 4 }} {{ 1000 }} {{ 7 // 2 }} {{ -7 % 3 }}", "", "1 1.0 2.5 2.5 1000 3 -1")
	// A float of the data prints as Python's repr (vLLM renders with
	// Python): 1.5e-07, 100000.0 for 1E5, 1.0 for 1.0.
	f("{{ big }} {{ small }} {{ neg }} {{ e5 }} {{ one }} {{ nz }}", `{"big": 1e21, "small": 1.5e-7, "neg": -0.5, "e5": 1E5, "one": 1.0, "nz": -0.0}`, "1e+21 1.5e-07 -0.5 100000.0 1.0 -0.0")
	f("{{ o|tojson }}", `{"o": {"min": 0.0, "max": 1.0, "step": 0.25, "n": 3, "tiny": 1e-05, "huge": 1.5e16, "mid": 123456.789}}`,
		`{"min": 0.0, "max": 1.0, "step": 0.25, "n": 3, "tiny": 1e-05, "huge": 1.5e+16, "mid": 123456.789}`)
	// tojson: key order, non-ASCII kept, separators, indent.
	f("{{ o|tojson }}", `{"o": {"b": 1, "a": [true, null], "é": "ü\u2028"}}`, "{\"b\": 1, \"a\": [true, null], \"é\": \"ü\u2028\"}")
	f("{{ o|tojson(indent=2) }}", `{"o": {"a": [1, {}], "b": []}}`, "{\n  \"a\": [\n    1,\n    {}\n  ],\n  \"b\": []\n}")
	f("{{ '<&>'|tojson }}{{ '\\x01'|tojson }}{{ '😀'|tojson(ensure_ascii=true) }}", "", "\"<&>\"\"\\u0001\"\"\\ud83d\\ude00\"")
	// Strings: JavaScript's strip ignores its argument by default.
	f("[{{ s.strip('x') }}][{{ s.lstrip() }}][{{ s.rstrip('\\n') }}]", `{"s": " \nxa \n"}`, "[xa][xa \n][ \nxa]")
	f("{{ 'a-b-c'.split('-', 1) }}{{ 'Hello'[1:3] }}{{ 'abc'[-1] }}{{ 'ab'|length }}{{ '😀'|length }}", "", "[\"a\", \"b-c\"]elc22")
	// Macros, call blocks and filters.
	f("{% macro m(a, b='B') %}{{ a }}{{ b }}{{ kwargs }}{% endmacro %}{{ m(1) }}|{{ m(1, c=3) }}", "", "1B{}|1B{\"c\": 3}")
	f("{% macro list() %}[{{ caller('x') }}]{% endmacro %}{% call(v) list() %}<{{ v }}>{% endcall %}", "", "[<x>]")
	f("{% filter upper %}a{{ 'b' }}{% endfilter %}", "", "AB")
	// Equality is JavaScript's loose equality, but lists and dicts compare by value.
	f("{{ '1' == 1 }}{{ true == 1 }}{{ none == nope }}{{ [] == [] }}{{ 0 == '' }}", "", "truetruetruetruetrue") // [] == [] by value, as Python compares lists
	f("{{ strftime_now('%Y-%m-%d %H:%M %b %B %%') }}", "", time.Now().Format("2006-01-02 15:04 Jan January %"))
}

func TestRenderErrors(t *testing.T) {
	f := func(src, vars, wantErr string) {
		t.Helper()
		tpl, err := ParseWithOptions(src, Options{MaxSteps: 10_000, MaxOutput: 1 << 16})
		if err == nil {
			var out []byte
			out, err = tpl.Render([]byte("keep"), mustVars(t, vars))
			if err != nil && string(out) != "keep" {
				t.Errorf("Render(%q) returned %q with its error, want dst unchanged", src, out)
			}
		}
		if err == nil || !strings.Contains(err.Error(), wantErr) {
			t.Errorf("%q: got error %v, want one containing %q", src, err, wantErr)
		}
	}
	f("{{ x", "", "end of input")
	f("{% if x %}", "", "endif")
	f("{% for %}", "", "parse")
	f("{% unknown %}", "", "unknown statement")
	f("{{ 'abc }}", "", "end of input")
	f("{{ '\\q' }}", "", "escaped character")
	f("{{ raise_exception('bad role') }}", "", "bad role")
	f("{{ nope + 1 }}", "", "undefined")
	f("{{ n ~ 'x' }}", `{"n": null}`, "null")
	f("{% for c in 'abc' %}{% endfor %}", "", "iterable")
	f("{{ (1, 2)|tojson }}", "", "TupleValue")
	f("{% macro m() %}{{ m() }}{% endmacro %}{{ m() }}", "", "call depth")
	f("{% for i in range(100000) %}{% endfor %}", "", "range")
	f("{% for i in range(60000) %}{{ i }}{% endfor %}", "", "steps")
	f("{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}", "", "bytes")
	f(strings.Repeat("{% if true %}", 300)+strings.Repeat("{% endif %}", 300), "", "nested")
	f("{{ "+strings.Repeat("(", 1000)+"1"+strings.Repeat(")", 1000)+" }}", "", "nested")
	f("{% break %}", "", "break")
	var rerr *Error
	tpl, _ := Parse("{{ raise_exception('boom') }}")
	if _, err := tpl.Render(nil, nil); !errors.As(err, &rerr) || rerr.Msg != "boom" {
		t.Errorf("raise_exception error = %#v", err)
	}
}

func TestPythonStrip(t *testing.T) {
	tpl, err := ParseWithOptions("[{{ s.strip('\\n') }}][{{ s.lstrip('\\n') }}][{{ s.rstrip() }}]", Options{PythonStrip: true})
	if err != nil {
		t.Fatal(err)
	}
	got, err := tpl.Render(nil, mustVars(t, `{"s": "\n a \n"}`))
	if err != nil {
		t.Fatal(err)
	}
	if want := "[ a ][ a \n][\n a]"; string(got) != want {
		t.Fatalf("got %q, want %q", got, want)
	}
}

func TestFromJSON(t *testing.T) {
	f := func(in, want string) {
		t.Helper()
		v, err := FromJSON([]byte(in))
		if err != nil {
			t.Fatalf("FromJSON(%q): %v", in, err)
		}
		if got := string(appendJSON(nil, v, jsonOptions{}, 0, true)); got != want {
			t.Fatalf("FromJSON(%q) re-encodes as %q, want %q", in, got, want)
		}
	}
	f(`{"b":1,"a":2}`, `{"b": 1, "a": 2}`)
	f(`{"b":1,"10":2,"2":3,"01":4}`, `{"2": 3, "10": 2, "b": 1, "01": 4}`) // JavaScript key order
	f(`{"a":1,"a":2}`, `{"a": 2}`)
	f(`[1, 1.5, -0, 1e400]`, `[1, 1.5, 0, null]`)
	for _, bad := range []string{``, `{`, `[1,]`, `{"a"}`, `1 2`, strings.Repeat("[", 200) + strings.Repeat("]", 200)} {
		if _, err := FromJSON([]byte(bad)); err == nil {
			t.Errorf("FromJSON(%q): want error", bad)
		}
	}
}

func TestJSNumber(t *testing.T) {
	f := func(x float64, want string) {
		t.Helper()
		if got := string(jsNumber(nil, x)); got != want {
			t.Errorf("jsNumber(%v) = %q, want %q", x, got, want)
		}
	}
	f(0, "0")
	f(math.Copysign(0, -1), "0")
	f(123456789012, "123456789012")
	a, b := 0.1, 0.2
	f(a+b, "0.30000000000000004")
	f(1e21, "1e+21")
	f(1.5e-7, "1.5e-7")
	f(1e-6, "0.000001")
	f(-2.5e-10, "-2.5e-10")
	f(math.NaN(), "NaN")
	f(math.Inf(-1), "-Infinity")
}

func TestConcurrentRender(t *testing.T) {
	tpl, err := Parse("{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{{ m.content }}{% endfor %}{{ ns.n }}")
	if err != nil {
		t.Fatal(err)
	}
	vars := mustVars(t, `{"messages": [{"content": "a"}, {"content": "b"}]}`)
	done := make(chan string, 8)
	for i := 0; i < 8; i++ {
		go func() {
			var out []byte
			for j := 0; j < 200; j++ {
				out, _ = tpl.Render(out[:0], vars)
			}
			done <- string(out)
		}()
	}
	for i := 0; i < 8; i++ {
		if got := <-done; got != "ab2" {
			t.Fatalf("got %q", got)
		}
	}
}
