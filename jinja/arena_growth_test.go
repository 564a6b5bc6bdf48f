package jinja

import "testing"

// The string arena grows geometrically up to what a render may build, so
// building strings up to the budget allocates a small multiple of it. Go's
// append grows a large slice by a quarter, copying it whole each time: a
// loop filling the 64 MiB budget (MaxOutput 16 MiB) allocated 385-469 MB,
// about 5.8 times the budget (4 MiB: 25 MB); now 2.2-3.1 times.
func TestStringBuildingUpToTheBudgetAllocatesASmallMultipleOfIt(t *testing.T) {
	const mib = 1 << 20
	for _, src := range []string{
		`{% for i in range(1000) %}{% set s = 'x' * 1000000 %}{% endfor %}`,
		`{% for i in range(1000) %}{% set s = 'xy' * 300000 %}{% endfor %}`,
		`{% set ns = namespace(s='') %}{% for i in range(1000) %}{% for j in range(100) %}{% set ns.s = ns.s ~ ('x' * 1000) %}{% endfor %}{% endfor %}`,
		`{% set ns = namespace(s='') %}{% for i in range(1000) %}{% for j in range(1000) %}{% set ns.s = ns.s + 'yyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyy' %}{% endfor %}{% endfor %}`,
		`{% set s = 'y' * 100000 %}{% for i in range(1000) %}{% set t = [s,s,s,s,s]|join('-') %}{% endfor %}`,
		`{% set s = 'y' * 100000 %}{% for i in range(1000) %}{% set t = s.replace('y', 'zz') %}{% endfor %}`,
	} {
		for _, maxOut := range []int{mib, 4 * mib} {
			alloc, err := renderAlloc(t, src, Options{PythonStrip: true, PythonPrint: true, PythonCompare: true, MaxOutput: maxOut})
			budget := uint64(strBudget * maxOut)
			if !IsLimit(err) {
				t.Fatalf("%s: %v, want the strings budget's refusal", src, err)
			}
			if ratio := float64(alloc) / float64(budget); ratio > 3.5 {
				t.Errorf("%s (MaxOutput %d MiB): allocated %.1f MB, %.1f times the %d MiB budget (want at most 3.5)", src, maxOut/mib, float64(alloc)/mib, ratio, budget/mib)
			} else {
				t.Logf("%s (MaxOutput %d MiB): allocated %.1f MB, %.1f times the budget", src, maxOut/mib, float64(alloc)/mib, ratio)
			}
		}
	}
}

// Upper- and lower-casing, title, capitalize, slicing a string and the
// indent attribute build strings like any other builder, so they are
// charged to the strings budget. They were not: 1000 upper-cased copies of
// a 100 KB string built 100 MB and allocated 450 MB at MaxOutput 1 MiB
// (a 4 MiB budget), bounded only by the 10 million evaluation steps.
func TestEveryStringBuilderIsChargedToTheBudget(t *testing.T) {
	const mib = 1 << 20
	for _, src := range []string{
		`{% set s = 'y' * 100000 %}{% for i in range(1000) %}{% set t = s|upper %}{% endfor %}`,
		`{% set s = 'Y' * 100000 %}{% for i in range(1000) %}{% set t = s.lower() %}{% endfor %}`,
		`{% set s = 'y' * 100000 %}{% for i in range(1000) %}{% set t = s|title %}{% endfor %}`,
		`{% set s = 'y' * 100000 %}{% for i in range(1000) %}{% set t = s|capitalize %}{% endfor %}`,
		`{% set s = 'é' * 50000 %}{% for i in range(1000) %}{% set t = s[::-1] %}{% endfor %}`,
		`{% set s = 'y\n' * 50000 %}{% for i in range(1000) %}{% set t = s.indent %}{% endfor %}`,
	} {
		alloc, err := renderAlloc(t, src, Options{PythonStrip: true, PythonPrint: true, PythonCompare: true, MaxOutput: mib})
		if !IsLimit(err) || alloc > 4*strBudget*mib {
			t.Errorf("%s: %v, allocated %.1f MB (want the strings budget's refusal within %d MB)", src, err, float64(alloc)/mib, 4*strBudget)
		}
	}
}
