package jsonscan

import (
	"bytes"
	"encoding/json"
	"testing"
	"unicode/utf8"
)

// maxLevels bounds the fuzzed documents' nesting: deeper valid documents
// are the one place the scanner refuses what encoding/json accepts.
const maxLevels = 64

func tooDeep(d []byte) bool {
	depth := 0
	inStr, esc := false, false
	for _, c := range d {
		switch {
		case esc:
			esc = false
		case inStr && c == '\\':
			esc = true
		case c == '"':
			inStr = !inStr
		case inStr:
		case c == '[' || c == '{':
			if depth++; depth > maxLevels {
				return true
			}
		case c == ']' || c == '}':
			depth--
		}
	}
	return false
}

// FuzzSkipValue checks the scanner against encoding/json: it never panics,
// and accepts exactly the valid JSON documents in valid UTF-8 (encoding/json
// tolerates invalid UTF-8; the scanner refuses it) within its depth bound.
// Where it accepts an object, WalkObject sees the members encoding/json
// decodes, keys decoded alike, the last duplicate winning.
func FuzzSkipValue(f *testing.F) {
	f.Fuzz(func(t *testing.T, d []byte) {
		end, err := SkipValue(d, 0, maxLevels)
		ok := err == nil && SkipSpace(d, end) == len(d)
		valid := json.Valid(d) && utf8.Valid(d)
		if ok != valid && !(valid && tooDeep(d)) {
			t.Fatalf("accepted %v, encoding/json and utf8 say %v: %q", ok, valid, d)
		}
		// The walkers that let a caller consume values accept what
		// SkipValue accepts.
		skip := func(vs int) (int, error) { return SkipValue(d, vs, maxLevels-1) }
		var wok bool
		switch i := SkipSpace(d, 0); {
		case i < len(d) && d[i] == '{':
			end, err := WalkObjectInline(d, 0, maxLevels, func([]byte, int) (int, error) { return -1, nil })
			wok = err == nil && SkipSpace(d, end) == len(d)
			end, err = WalkMembers(d, 0, func(_ []byte, vs int) (int, error) { return skip(vs) })
			if mok := err == nil && SkipSpace(d, end) == len(d); mok != wok {
				t.Fatalf("WalkMembers accepted %v, WalkObjectInline %v: %q", mok, wok, d)
			}
		case i < len(d) && d[i] == '[':
			end, err := WalkElements(d, 0, skip)
			wok = err == nil && SkipSpace(d, end) == len(d)
		default:
			wok = ok
		}
		if wok != ok {
			t.Fatalf("SkipValue accepted %v, the inline walkers %v: %q", ok, wok, d)
		}
		if !ok {
			return
		}
		i := SkipSpace(d, 0)
		if d[i] != '{' {
			return
		}
		var want map[string]json.RawMessage
		if err := json.Unmarshal(d, &want); err != nil {
			t.Fatalf("encoding/json: %v", err)
		}
		got := map[string]string{}
		if _, err := WalkObject(d, 0, maxLevels, func(key []byte, vs, ve int) error {
			got[string(key)] = string(d[vs:ve])
			return nil
		}); err != nil {
			t.Fatalf("WalkObject refused what SkipValue accepted: %v", err)
		}
		if len(got) != len(want) {
			t.Fatalf("%d keys, encoding/json %d", len(got), len(want))
		}
		for k, v := range want {
			if got[k] != string(v) {
				t.Fatalf("key %q: %q, encoding/json %q", k, got[k], v)
			}
		}
	})
}

// FuzzScanString checks one string literal: ScanString accepts it exactly
// when encoding/json does (and it is valid UTF-8), Unescape decodes it as
// encoding/json does, and AppendString of the decoded text decodes back to
// it.
func FuzzScanString(f *testing.F) {
	f.Fuzz(func(t *testing.T, body []byte) {
		lit := append(append([]byte{'"'}, body...), '"')
		raw, next, err := ScanString(lit, 0)
		ok := err == nil && next == len(lit)
		var want string
		valid := utf8.Valid(lit) && json.Unmarshal(lit, &want) == nil
		if ok != valid {
			t.Fatalf("accepted %v, encoding/json and utf8 say %v: %q", ok, valid, lit)
		}
		if !ok {
			return
		}
		got := Unescape(nil, raw)
		if string(got) != want {
			t.Fatalf("%q decodes to %q, encoding/json %q", lit, got, want)
		}
		out := AppendString(nil, string(got))
		var back string
		if err := json.Unmarshal(out, &back); err != nil || back != want {
			t.Fatalf("AppendString(%q) = %s: decodes to %q (%v)", got, out, back, err)
		}
	})
}

// IndexTail (IndexKey's search) is bytes.Index: it finds the first whole
// key, not its tail after other bytes, and nothing in a text too short.
func FuzzIndexKeyIsBytesIndex(f *testing.F) {
	for _, s := range []string{`{"usage":1}`, `xusage""usage"`, `"usage`, `usage"`, ``, `""usage""usage"`} {
		f.Add([]byte(s), []byte(`"usage"`))
	}
	f.Add([]byte(`"er"error"`), []byte(`"error"`))
	f.Fuzz(func(t *testing.T, b, key []byte) {
		if len(key) < 2 {
			return
		}
		want := bytes.Index(b, key)
		for k := 1; k < len(key); k++ {
			if got := IndexTail(b, key, k); got != want {
				t.Fatalf("IndexTail(%q, %q, %d) = %d, want %d", b, key, k, got, want)
			}
		}
	})
}
