package jinja

import (
	"fmt"
	"runtime"
	"strings"
	"testing"
)

// A render stopped by a bound of Options is told apart from one the
// template or its data refused: the router routes the first without block
// hashes and answers the second as the client's error.
func TestRenderLimitsAreToldApartFromTemplateErrors(t *testing.T) {
	for _, tc := range []struct {
		src   string
		opts  Options
		limit bool
	}{
		{`{% for i in range(100000) %}x{% endfor %}`, Options{MaxSteps: 1000}, true},
		{`{% for i in range(100) %}xxxxxxxxxx{% endfor %}`, Options{MaxOutput: 1 << 16}, false},
		{`{% for i in range(3000000) %}xxxxxxxxxx{% endfor %}`, Options{}, true}, // past MaxOutput
		{`{{ raise_exception("no user turn") }}`, Options{}, false},
		{`{{ 1 / 0 }}`, Options{}, false},
	} {
		tpl, err := ParseWithOptions(tc.src, tc.opts)
		if err != nil {
			t.Fatalf("%s: %v", tc.src, err)
		}
		_, err = tpl.Render(nil, nil)
		if tc.limit != IsLimit(err) || (tc.limit && err == nil) {
			t.Fatalf("%s: err %v, IsLimit %v, want %v", tc.src, err, IsLimit(err), tc.limit)
		}
		if IsLimit(fmt.Errorf("wrapped: %w", err)) != tc.limit {
			t.Fatalf("%s: IsLimit does not see through wrapping", tc.src)
		}
	}
}

// Memory is bounded with steps: an empty nested loop (78 bytes of template)
// built a loop object of nine keys every iteration, charged one step, and
// reached 4 GB before the default 10-million-step bound stopped it. Here a
// million steps may allocate at most 64 MB.
func TestEmptyNestedLoopsAreBoundedInMemory(t *testing.T) {
	src := "{% for i in range(65536) %}{% for j in range(65536) %}{% endfor %}{% endfor %}"
	if alloc, err := renderAlloc(t, src, Options{MaxSteps: 1_000_000}); !IsLimit(err) || alloc > 64<<20 {
		t.Fatalf("1 million steps of empty loop iterations: %v, allocated %d MB", err, alloc>>20)
	}
}

// A template that keeps its loop objects gets a fresh one each iteration,
// and what they hold is charged to the values budget (4 x MaxOutput), not
// only to the step count.
func TestLoopObjectsATemplateKeepsAreBoundedInMemory(t *testing.T) {
	src := "{% for i in range(65536) %}{% for j in range(65536) %}{% set x = loop %}{% endfor %}{% endfor %}"
	alloc, err := renderAlloc(t, src, Options{MaxOutput: 1 << 20})
	if !IsLimit(err) || !strings.Contains(err.Error(), "bytes of values") || alloc > 16<<20 {
		t.Fatalf("kept loop objects under a 4 MB values budget: %v, allocated %d MB", err, alloc>>20)
	}
}

func renderAlloc(t *testing.T, src string, opts Options) (uint64, error) {
	t.Helper()
	tpl, err := ParseWithOptions(src, opts)
	if err != nil {
		t.Fatal(err)
	}
	runtime.GC()
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	_, err = tpl.Render(nil, nil)
	runtime.ReadMemStats(&m1)
	return m1.TotalAlloc - m0.TotalAlloc, err
}

// One loop object serves every iteration of a loop only where no reference
// to it can outlive the iteration; a template that keeps one, directly or
// through a macro (macros see their caller's scope), sees each iteration's
// own values.
func TestLoopObjectsKeepTheirIterationsValues(t *testing.T) {
	for _, tc := range []struct{ src, want string }{
		{`{% for i in ['a','b'] %}{% for j in [1,2] %}{{ loop.index }}{% endfor %}{{ loop.index }}{% endfor %}`, "121122"},
		{`{% for i in [1,2] %}{% for j in [] %}{% else %}{{ loop.index }}{% endfor %}{% endfor %}`, "12"},
		{`{% set ns = namespace(a=none) %}{% for i in [1,2,3] %}{% if loop.first %}{% set ns.a = loop %}{% endif %}{% endfor %}{{ ns.a.index }}`, "1"},
		{`{% set ns = namespace(a=[]) %}{% for i in [1,2,3] %}{% set ns.a = ns.a + [loop] %}{% endfor %}{% for l in ns.a %}{{ l.index }}{% endfor %}`, "123"},
		{`{% macro keep() %}{% set ns.a = loop %}{% endmacro %}{% set ns = namespace(a=none) %}{% for i in [1,2,3] %}{% if loop.first %}{{ keep() }}{% endif %}{% endfor %}{{ ns.a.index }}`, "1"},
		{`{% for i in [1,2] %}{% for j in [3] %}{% endfor %}{{ loop.last }}{% endfor %}`, "falsetrue"},
	} {
		tpl, err := Parse(tc.src)
		if err != nil {
			t.Fatalf("%s: %v", tc.src, err)
		}
		for range 2 { // warm: the second render reuses the pooled state
			out, err := tpl.Render(nil, nil)
			if err != nil || string(out) != tc.want {
				t.Fatalf("%s: %q, %v; want %q", tc.src, out, err, tc.want)
			}
		}
	}
}

// A left-deep chain (a + b + c ..., a and b ..., a.b.c ..., a|f|g ...)
// nests as deep as it is long in the tree that rendering recurses through:
// its links count against the parser's nesting bound as parentheses do. A
// tokenizer_config.json whose template summed 400,000 terms (8 MB) parsed,
// and its first render overflowed the goroutine stack: a fatal error that
// killed the router on its first chat request (25,000 terms took 240 MB of
// stack a render). Chains as long as real templates hold still render.
func TestLongOperatorChainsAreBoundedAsNestingIs(t *testing.T) {
	for _, link := range []string{" + 1", " ~ 'a'", " and true", " or false", " == 1", " * 1", " ** 1",
		" is defined", "|string", ".real", "[0]"} {
		long := "{{ 1" + strings.Repeat(link, 100_000) + " }}"
		if _, err := Parse(long); err == nil || !strings.Contains(err.Error(), "nested too deeply") {
			t.Fatalf("a chain of 100,000 %q parsed (err %v)", link, err)
		}
	}
	for _, src := range []string{
		"{{ 1" + strings.Repeat(" + 1", 100) + " }}",
		"{{ ('a' ~ 'b'" + strings.Repeat(" ~ 'b'", 60) + ")|length }}",
		"{% for m in messages %}{% if m.role == 'user' and m.content and not m.content.startswith('x') and m.content|length > 0 %}{{ m.content ~ '|' ~ m.role ~ '|' ~ loop.index }}{% endif %}{% endfor %}",
	} {
		tpl, err := Parse(src)
		if err != nil {
			t.Fatalf("%.60s: %v", src, err)
		}
		m := NewObject(2)
		m.Set("role", String("user"))
		m.Set("content", String("hi"))
		vars := NewObject(1)
		vars.Set("messages", Array(ObjectValue(m)))
		out, err := tpl.Render(nil, vars)
		if err != nil || len(out) == 0 {
			t.Fatalf("%.60s: %q %v", src, out, err)
		}
	}
}

// Strings a render builds are refused before (or while) they are built,
// not once they are: replace, indent and join make results many times
// their operands, and printing a container (Python's repr, tojson) is
// bounded by MaxOutput, not by a 64 MiB hard limit. All strings together
// are bounded by strBudget x MaxOutput (4; it was 16). With the default
// 16 MiB MaxOutput, before: 10 million newlines indented by 100 took
// 21.7 s and 5.4 GB, a replace of 20 characters by a 10 MB string built
// 1.1 GB, a join of ten 10 MB strings 4.8 s and 1.1 GB, printing a list
// sharing its sublists 1 s and 310 MB, and a loop of string building up to
// 256 MiB 1.4 GB and up to 5 s, on every request.
func TestHostileStringBuildingIsRefusedBeforeItIsBuilt(t *testing.T) {
	const mib = 1 << 20
	for _, tc := range []struct {
		src      string
		maxAlloc uint64
	}{
		{`{{ ('x' * 1000).replace('x', 'y' * 100000)|length }}`, 4 * mib},
		{`{{ ('x' * 1000).replace('', 'y' * 100000)|length }}`, 4 * mib},
		{`{{ ('\n' * 100000)|indent(1000, true, true)|length }}`, 4 * mib},
		{`{% set s = 'y' * 500000 %}{{ [s,s,s,s,s,s,s,s,s,s,s,s,s,s,s,s,s,s,s,s]|join(s)|length }}`, 8 * mib},
		{`{% set s = 'y' * 500000 %}{{ (s ~ s ~ s)|join('-')|length }}`, 8 * mib},
		{`{% set s = 'y' * 100000 %}{% set a = [s,s,s,s,s,s,s,s,s,s] %}{% set b = [a,a,a,a,a,a,a,a,a,a] %}{{ [b,b,b,b,b,b,b,b,b,b] }}`, 8 * mib},
		{`{% set s = 'y' * 100000 %}{% set a = [s,s,s,s,s,s,s,s,s,s] %}{% set b = [a,a,a,a,a,a,a,a,a,a] %}{{ [b,b,b,b,b,b,b,b,b,b]|string|length }}`, 8 * mib},
		{`{% set s = 'y' * 100000 %}{% set a = [s,s,s,s,s,s,s,s,s,s] %}{% set b = [a,a,a,a,a,a,a,a,a,a] %}{{ [b,b,b,b,b,b,b,b,b,b]|tojson|length }}`, 8 * mib},
		{`{% for i in range(1000) %}{% set s = 'x' * 1000000 %}{% endfor %}`, 32 * mib},
	} {
		alloc, err := renderAlloc(t, tc.src, Options{PythonStrip: true, PythonPrint: true, PythonCompare: true, MaxOutput: mib})
		if !IsLimit(err) || alloc > tc.maxAlloc {
			t.Errorf("%s: %v, allocated %.1f MB (want a bound's refusal within %d MB)", tc.src, err, float64(alloc)/mib, tc.maxAlloc/mib)
		}
	}
}
