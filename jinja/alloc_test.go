//go:build !race

package jinja

import (
	"os"
	"testing"
)

// TestRenderAllocs proves that a warm render allocates nothing: the Qwen3
// chat template on a conversation with a tool call, and every arena case
// (string building, slicing, splitting, filters, namespaces, macros).
func TestRenderAllocs(t *testing.T) {
	src, err := os.ReadFile("testdata/qwen3.jinja")
	if err != nil {
		t.Fatal(err)
	}
	f := func(name, src string, vars *Object) {
		t.Helper()
		tpl, err := Parse(src)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		out, err := tpl.Render(nil, vars)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if n := testing.AllocsPerRun(50, func() { out, _ = tpl.Render(out[:0], vars) }); n != 0 {
			t.Errorf("%s: Render allocates %.1f times per call, want 0", name, n)
		}
	}
	f("qwen3", string(src), qwen3Vars(t))
	vars := mustVars(t, arenaVars)
	for _, c := range arenaCases {
		f(c.src, c.src, vars)
	}
}
