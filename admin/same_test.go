package admin

import (
	"encoding/json"
	"math/rand/v2"
	"reflect"
	"testing"
)

// noEmptyLists is the model of sameEncoding: every empty list in v made
// null, but for the settings in nilMeansDefault.
func noEmptyLists(v any) any {
	switch t := v.(type) {
	case []any:
		if len(t) == 0 {
			return nil
		}
		for i := range t {
			t[i] = noEmptyLists(t[i])
		}
	case map[string]any:
		for k, e := range t {
			if nilMeansDefault[k] {
				continue
			}
			t[k] = noEmptyLists(e)
		}
	}
	return v
}

// sameEncoding compares encodings in one pass; it must agree with decoding
// both and comparing them with empty lists made null (as same did), on
// random documents and on their variants: a [] made null or back, a
// value changed, strings that hold "[]", "null", quotes and escapes.
func TestSameEncodingIsDecodedEqualityUpToEmptyLists(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 5))
	keys := []string{"a", "b", "users", "thinking_off_efforts", "keys", "x[]", "null"}
	strs := []string{"", "[]", "null", `"`, `\`, `\"[]`, "a\u2028", "ok"}
	var gen func(depth int) any
	gen = func(depth int) any {
		switch n := rng.IntN(8); {
		case depth > 3 || n < 2:
			return strs[rng.IntN(len(strs))]
		case n == 2:
			return nil
		case n == 3:
			return []any{}
		case n == 4:
			return float64(rng.IntN(3))
		case n == 5:
			l := make([]any, rng.IntN(3))
			for i := range l {
				l[i] = gen(depth + 1)
			}
			return l
		default:
			m := map[string]any{}
			for range rng.IntN(4) {
				m[keys[rng.IntN(len(keys))]] = gen(depth + 1)
			}
			return m
		}
	}
	// vary changes one node of v (a copy): [] <-> null, or another value.
	var vary func(v any) any
	vary = func(v any) any {
		switch t := v.(type) {
		case map[string]any:
			if len(t) > 0 && rng.IntN(3) != 0 {
				m := map[string]any{}
				for k, e := range t {
					m[k] = e
				}
				for k := range m {
					m[k] = vary(m[k])
					break
				}
				return m
			}
		case []any:
			if len(t) == 0 {
				return nil
			}
			if rng.IntN(3) != 0 {
				l := append([]any(nil), t...)
				i := rng.IntN(len(l))
				l[i] = vary(l[i])
				return l
			}
		case nil:
			if rng.IntN(2) == 0 {
				return []any{}
			}
		}
		return gen(2)
	}
	enc := func(v any) []byte {
		data, err := json.Marshal(map[string]any{"doc": v})
		if err != nil {
			t.Fatal(err)
		}
		return data
	}
	model := func(x, y []byte) bool {
		var vx, vy any
		json.Unmarshal(x, &vx)
		json.Unmarshal(y, &vy)
		return reflect.DeepEqual(noEmptyLists(vx), noEmptyLists(vy))
	}
	sameCount := 0
	for range 20000 {
		v := gen(0)
		w := vary(v)
		x, y := enc(v), enc(w)
		want := model(x, y)
		if got := sameEncoding(x, y); got != want {
			t.Fatalf("sameEncoding(%s, %s) = %v, decoded equality %v", x, y, got, want)
		}
		if got := sameEncoding(y, x); got != want {
			t.Fatalf("sameEncoding(%s, %s) = %v, decoded equality %v", y, x, got, want)
		}
		if want && string(x) != string(y) {
			sameCount++
		}
	}
	if sameCount < 100 {
		t.Fatalf("only %d pairs equal up to empty lists: the variants test too little", sameCount)
	}
}
