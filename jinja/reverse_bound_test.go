package jinja

import (
	"testing"
)

// The reverse filter's copy is charged a step an element, as a[::-1] is: a
// 90-byte template reversing a 65,536-element array in a loop allocated
// 3.6 GB in 1,000 iterations and returned no error.
func TestTheReverseFilterIsChargedLikeASlice(t *testing.T) {
	for _, expr := range []string{"a[::-1]", "a|reverse"} {
		src := "{% set a = range(65536)|list %}{% for i in range(20) %}{% set t = " + expr + " %}{% endfor %}"
		tpl, err := ParseWithOptions(src, Options{MaxSteps: 100_000})
		if err != nil {
			t.Fatal(err)
		}
		_, err = tpl.Render(nil, nil)
		if !IsLimit(err) {
			t.Errorf("%s: 20 copies of 65,536 elements under MaxSteps 100,000 rendered with %v, want a limit error", expr, err)
		}
	}
}
