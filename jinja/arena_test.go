package jinja

import (
	"fmt"
	"sync"
	"testing"
)

// arenaCases exercise every path that builds strings, arrays or objects in
// the render arena; the outputs are @huggingface/jinja 0.5.11's for the same
// templates and arenaVars.
var arenaCases = []struct{ src, want string }{
	{"{{ \"a,b,c\".split(\",\", -2) }}|{{ \"a,b,c\".split(\",\", -9) }}|{{ \"a,b,c\".split(\",\", 0) }}|{{ \"a,b,c\".split(\",\", 5) }}|{{ \",\".split(\",\") }}|{{ \"\".split(\",\") }}", "[\"a\", \"b,c\"]|[\"a,b,c\"]|[\"a,b,c\"]|[\"a\", \"b\", \"c\"]|[\"\", \"\"]|[\"\"]"},
	{"{{ \" a  b\tc \".split() }}|{{ \" a  b c \".split(none, 1) }}|{{ \"\".split() }}", "[\"a\", \"b\", \"c\"]|[\"a\", \"b c \"]|[]"},
	{"{{ s[1:4] }}|{{ s[::-1] }}|{{ s[-3:] }}|{{ s[::2] }}|{{ s[1] }}|{{ s[-1] }}|{{ s[20] }}|{{ \"abc\"[1:] }}|{{ \"abcdef\"[4:1:-1] }}", "éll|dlröw olléh|rld|hlowrd|é|d||bc|edc"},
	{"{{ s.upper() }}|{{ s.title() }}|{{ s.capitalize() }}|{{ \"ÉCOLE\".lower() }}|{{ \"abc\".upper() }}|{{ \"ABC\".upper() }}", "HÉLLO WÖRLD|HéLlo WöRld|Héllo wörld|école|ABC|ABC"},
	{"{{ \"aaa\".replace(\"a\", \"b\", 2) }}|{{ \"abc\".replace(\"\", \"-\") }}|{{ \"abc\".replace(\"\", \"-\", 2) }}|{{ \"x.y.z\".replace(\".\", \"::\") }}|{{ \"abc\"|replace(\"b\", \"B\") }}", "bba|-a-b-c-|-a-bc|x::y::z|aBc"},
	{"{{ ml|indent }}|{{ ml|indent(2, true) }}|{{ ml|indent(3, first=true, blank=true) }}", "one\n\n    two\n    three|  one\n\n  two\n  three|   one\n   \n   two\n   three"},
	{"{{ \"héllo\"|join(\"-\") }}|{{ xs|join(\", \") }}|{{ xs|reverse|join }}|{{ xs|sort|join }}|{{ xs|sort(reverse=true)|join }}", "h-é-l-l-o|3, 1, 2|213|123|321"},
	{"{% for k, v in o|dictsort %}{{ k }}={{ v }};{% endfor %}|{% for k, v in o.items() %}{{ k }}{{ v }}{% endfor %}|{{ o.keys()|join }}|{{ o.values()|join }}", "a=2;b=1;c=0;|b1a2c0|bac|120"},
	{"{{ objs|selectattr(\"ok\")|map(attribute=\"n\")|join }}|{{ objs|rejectattr(\"ok\")|map(attribute=\"n\")|join }}|{{ objs|map(attribute=\"v\", default=9)|join }}|{{ objs|sort(attribute=\"n\")|map(attribute=\"n\")|join }}", "bc|a|219|abc"},
	{"{{ range(5)|join }}|{{ range(5, 0, -2)|join }}|{{ range(0.5, 3)|join(\",\") }}|{{ [1, 2] + [3] }}", "01234|531|0.5,1.5,2.5|[1, 2, 3]"},
	{"{% set ns = namespace(a=1, b=\"x\") %}{% for i in range(3) %}{% set ns.a = ns.a * 2 %}{% set ns.b = ns.b ~ i %}{% endfor %}{{ ns.a }}{{ ns.b }}", "8x012"},
	{"{% set a = \"x\" + \"1\" %}{% set b = a + \"2\" %}{% set c = a + \"3\" %}{{ a }}|{{ b }}|{{ c }}|{{ b + a }}|{{ a ~ a }}", "x1|x12|x13|x12x1|x1x1"},
	{"{% macro m(x, y=\"d\") %}<{{ x }}{{ y }}{{ varargs }}>{% endmacro %}{{ m(1) }}{{ m(2, 3, 4) }}{{ m(x=5) }}", "<1d[]><23[4]><5d[]>"},
	{"{% set t %}A{{ s|upper }}B{% endset %}{{ t }}|{{ t|length }}|{{ {\"k\": [1, \"é\"]}|tojson }}|{{ xs|tojson(indent=1) }}|{{ o|tojson(sort_keys=true) }}", "AHÉLLO WÖRLDB|13|{\"k\": [1, \"é\"]}|[\n 3,\n 1,\n 2\n]|{\"a\": 2, \"b\": 1, \"c\": 0}"},
	{"{{ \"Hello\"|lower is lower }}{{ \"ABC\" is upper }}{{ \"aBC\" is upper }}{{ \"é\" is lower }}{{ \"É\" is upper }}", "truetruefalsetruetrue"},
	{"{{ xs|first }}{{ xs|last }}{{ xs|length }}{{ [1, 1, \"1\", 2]|unique|join(\",\") }}{{ 5|string ~ true|string ~ 1.5|string }}", "3231,1,25true1.5"},
}

const arenaVars = "{\"s\": \"h\u00e9llo w\u00f6rld\", \"bad\": \"a\u00e9b\", \"xs\": [3, 1, 2], \"objs\": [{\"n\": \"b\", \"ok\": true, \"v\": 2}, {\"n\": \"a\", \"ok\": false, \"v\": 1}, {\"n\": \"c\", \"ok\": true}], \"o\": {\"b\": 1, \"a\": 2, \"c\": 0}, \"ml\": \"one\\n\\ntwo\\nthree\"}"

// TestArenaPathsMatchReference renders each case twice from the same pooled
// state (the second render reuses the arena the first one filled) and
// compares both outputs with the reference.
func TestArenaPathsMatchReference(t *testing.T) {
	vars := mustVars(t, arenaVars)
	for _, c := range arenaCases {
		tpl, err := Parse(c.src)
		if err != nil {
			t.Fatalf("Parse(%q): %v", c.src, err)
		}
		for round := range 2 {
			got, err := tpl.Render(nil, vars)
			if err != nil {
				t.Fatalf("round %d: Render(%q): %v", round, c.src, err)
			}
			if string(got) != c.want {
				t.Fatalf("round %d: Render(%q)\n got %q\nwant %q", round, c.src, got, c.want)
			}
		}
	}
}

// TestArenaConcurrentRenders renders the arena cases from several
// goroutines at once, each template shared by all of them: pooled states
// must never mix (meaningful under -race).
func TestArenaConcurrentRenders(t *testing.T) {
	vars := mustVars(t, arenaVars)
	tpls := make([]*Template, len(arenaCases))
	for i, c := range arenaCases {
		var err error
		if tpls[i], err = Parse(c.src); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var out []byte
			for n := range 30 {
				i := (n*7 + g*3) % len(arenaCases)
				var err error
				if out, err = tpls[i].Render(out[:0], vars); err != nil || string(out) != arenaCases[i].want {
					errs <- fmt.Errorf("goroutine %d: case %d: got %q, %v", g, i, out, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// TestArenaStringsSurviveGrowth builds many strings in one render, so the
// string arena reallocates while earlier strings are still in use.
func TestArenaStringsSurviveGrowth(t *testing.T) {
	tpl, err := Parse(`{% set ns = namespace(all=[]) %}{% for i in range(300) %}{% set s = "item-" ~ i ~ "-" ~ x %}{% set ns.all = ns.all + [s] %}{% endfor %}{{ ns.all|join(",") }}`)
	if err != nil {
		t.Fatal(err)
	}
	var want []byte
	for i := range 300 {
		if i > 0 {
			want = append(want, ',')
		}
		want = fmt.Appendf(want, "item-%d-%s", i, "xyz")
	}
	for round := range 3 {
		got, err := tpl.Render(nil, mustVars(t, `{"x": "xyz"}`))
		if err != nil || string(got) != string(want) {
			t.Fatalf("round %d: got %.80q... (%d bytes), %v; want %d bytes", round, got, len(got), err, len(want))
		}
	}
}
