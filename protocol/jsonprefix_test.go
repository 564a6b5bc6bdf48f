package protocol

import (
	"encoding/json"
	"math/rand"
	"strings"
	"testing"
)

// escapeArgs is the raw form of arguments: the body of the JSON string a
// chat chunk carries them in.
func escapeArgs(s string) string {
	b, _ := json.Marshal(s)
	return string(b[1 : len(b)-1])
}

// prefixFeedSplit feeds raw to a fresh jsonPrefix in pieces cut at random and
// returns how many bytes it accepted and whether the object is whole.
func prefixFeedSplit(r *rand.Rand, raw string) (int, bool) {
	var p jsonPrefix
	n := 0
	for len(raw) > 0 {
		k := 1 + r.Intn(len(raw))
		got := p.feed([]byte(raw[:k]))
		n += got
		if got < k {
			return n, false
		}
		raw = raw[k:]
	}
	return n, p.state == psDone
}

// A JSON object is accepted whole however it is cut (escapes included),
// and the cut of one that is not JSON falls where its first wrong
// character starts, never inside one of the raw form's escapes.
func TestJSONPrefixAcceptsObjectsAndCutsAtTheFirstWrongCharacter(t *testing.T) {
	r := rand.New(rand.NewSource(1))
	good := []string{
		`{}`, ` { } `, `{"a":1}`, `{"city": "Paris"}`, `{"a":[1,2.5,-3e+7,0,0.0,1E2],"b":{"c":null,"d":true,"e":false}}`,
		`{"q":"say \"hi\"\n\ttab \\ back \u00e9 \ud83d\ude00 /"}`, "{\n  \"k\": [ ]\n}", `{"k":[[[[{}]]]]}`, `{"é":"日本"}`,
	}
	for _, s := range good {
		for i := 0; i < 50; i++ {
			if n, whole := prefixFeedSplit(r, escapeArgs(s)); n != len(escapeArgs(s)) || !whole {
				t.Fatalf("%s: accepted %d of %d bytes, whole %v", s, n, len(escapeArgs(s)), whole)
			}
		}
	}
	for _, c := range []struct{ args, kept string }{
		{`I will call it`, ``},
		{`{"city": "Paris"} and then`, `{"city": "Paris"} `},
		{`[1,2]`, ``},
		{`{"a":tru`, `{"a":tru`},
		{`{"a":trux}`, `{"a":tru`},
		{`{"a":1.}`, `{"a":1.`},
		{`{"a":01}`, `{"a":0`},
		{`{"a":-}`, `{"a":-`},
		{`{a:1}`, `{`},
		{`{"a" 1}`, `{"a" `},
		{`{"a":1,}`, `{"a":1,`},
		{`{"a":[1,]}`, `{"a":[1,`},
		{`{"a":"x` + "\n" + `"}`, `{"a":"x`},
		{`{"a":"\q"}`, `{"a":"\`},
		{`{"a":"\u12G4"}`, `{"a":"\u12`},
		{`{"a":1]`, `{"a":1`},
		{`{"a":{"b":2}}}`, `{"a":{"b":2}}`},
	} {
		raw := escapeArgs(c.args)
		var p jsonPrefix
		n := p.feed([]byte(raw))
		if raw[:n] != escapeArgs(c.kept) {
			t.Errorf("%q: kept %q, want %q", c.args, raw[:n], escapeArgs(c.kept))
		}
		if n < len(raw) && p.feed([]byte(`"`)) != 0 {
			t.Errorf("%q: accepted more after its cut", c.args)
		}
	}
	deep := strings.Repeat(`{"a":`, maxPrefixDepth+1)
	var p jsonPrefix
	if n := p.feed([]byte(escapeArgs(deep))); n >= len(escapeArgs(deep)) {
		t.Errorf("nesting past %d accepted", maxPrefixDepth)
	}
}

// The prefix check agrees with encoding/json on whole documents: what it
// accepts whole is a valid JSON object, and a valid JSON object is
// accepted whole.
func FuzzJSONPrefix(f *testing.F) {
	for _, s := range []string{`{}`, `{"a":[1,{"b":"c\"d"}]}`, `{"a":1e5}`, `I said`, `{"a":"\u00e9"}`, `{"a":nul}`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, args string) {
		raw := escapeArgs(args)
		var p jsonPrefix
		n := p.feed([]byte(raw))
		whole := n == len(raw) && p.state == psDone
		var v any
		isObject := json.Unmarshal([]byte(args), &v) == nil && strings.HasPrefix(strings.TrimLeft(args, " \t\r\n"), "{")
		if isObject && !strings.ContainsRune(args, '\ufffd') && depthOf(args) <= maxPrefixDepth && whole != isObject {
			t.Fatalf("%q: whole %v (kept %d of %d), but encoding/json says object %v", args, whole, n, len(raw), isObject)
		}
		if whole && !json.Valid([]byte(args)) {
			t.Fatalf("%q accepted whole but not valid JSON", args)
		}
		if n > len(raw) {
			t.Fatalf("kept %d of %d", n, len(raw))
		}
	})
}

// depthOf is the bracket nesting of s outside strings (a bound for the
// fuzz check: the prefix check stops at maxPrefixDepth).
func depthOf(s string) int {
	d, m, in, esc := 0, 0, false, false
	for _, c := range s {
		switch {
		case esc:
			esc = false
		case in && c == '\\':
			esc = true
		case c == '"':
			in = !in
		case !in && (c == '{' || c == '['):
			d++
			m = max(m, d)
		case !in && (c == '}' || c == ']'):
			d--
		}
	}
	return m
}
