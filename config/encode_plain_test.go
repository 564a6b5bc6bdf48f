package config

import (
	"bytes"
	"encoding/json"
	"math"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// encodeValue hands the types without secrets (plainType) to
// encoding/json whole. For every such type the config holds, random values
// must encode exactly as the walk encodes them: the encoding is compared
// (same), digested (ETags) and written to the file.
func TestPlainTypesEncodeAsTheWalkDoes(t *testing.T) {
	var plain []reflect.Type
	seen := map[reflect.Type]bool{}
	var collect func(t reflect.Type)
	collect = func(t reflect.Type) {
		if seen[t] {
			return
		}
		seen[t] = true
		if plainType(t) {
			plain = append(plain, t)
		}
		switch t.Kind() {
		case reflect.Pointer, reflect.Slice, reflect.Array, reflect.Map:
			collect(t.Elem())
		case reflect.Struct:
			for i := 0; i < t.NumField(); i++ {
				collect(t.Field(i).Type)
			}
		}
	}
	collect(reflect.TypeFor[Config]())
	if plainType(reflect.TypeFor[Config]()) || plainType(secretType) {
		t.Fatal("a type holding a secret counts as plain")
	}
	for _, want := range []reflect.Type{reflect.TypeFor[[]User](), reflect.TypeFor[[]QuotaTemplate](), reflect.TypeFor[[]WorkerSpec]()} {
		if !plainType(want) {
			t.Fatalf("%v is not plain", want)
		}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for _, typ := range plain {
		for range 200 {
			v := reflect.New(typ).Elem()
			fill(rng, v, 0)
			plainEncoding = false
			walked, err1 := encodeValue(nil, v, "", nil)
			plainEncoding = true
			whole, err2 := encodeValue(nil, v, "", nil)
			if (err1 == nil) != (err2 == nil) || !bytes.Equal(walked, whole) {
				t.Fatalf("%v encodes differently:\nwalk: %s (%v)\njson: %s (%v)", typ, walked, err1, whole, err2)
			}
		}
	}
	if len(plain) < 10 {
		t.Fatalf("only %d plain types: %v", len(plain), plain)
	}
}

// fill sets v to a random value: strings with characters JSON escapes,
// numbers of every size, nil and empty lists and maps.
func fill(rng *rand.Rand, v reflect.Value, depth int) {
	strs := []string{"", "a", "<b>&", "\"q\"\\", "\u2028\u2029", "\x00\x1f", "\xff\xfe", "日本", "qwen3-*", "ifr1$ab$cd$ef"}
	switch v.Kind() {
	case reflect.Bool:
		v.SetBool(rng.IntN(2) == 1)
	case reflect.String:
		v.SetString(strs[rng.IntN(len(strs))] + strs[rng.IntN(len(strs))])
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		v.SetInt(rng.Int64() >> rng.IntN(64))
		if rng.IntN(2) == 0 {
			v.SetInt(-v.Int())
		}
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		v.SetUint(rng.Uint64() >> rng.IntN(64))
	case reflect.Float32, reflect.Float64:
		f := []float64{0, math.Copysign(0, -1), 1, -1.5, 1e21, 1e-7, 123456789.125, math.MaxFloat32, math.SmallestNonzeroFloat64, rng.Float64() * 1e6}[rng.IntN(10)]
		v.SetFloat(f)
	case reflect.Pointer:
		if depth > 4 || rng.IntN(3) == 0 {
			return
		}
		p := reflect.New(v.Type().Elem())
		fill(rng, p.Elem(), depth+1)
		v.Set(p)
	case reflect.Slice:
		switch n := rng.IntN(4); {
		case depth > 4 || n == 0:
		case n == 1:
			v.Set(reflect.MakeSlice(v.Type(), 0, 0))
		default:
			s := reflect.MakeSlice(v.Type(), n, n)
			for i := range n {
				fill(rng, s.Index(i), depth+1)
			}
			v.Set(s)
		}
	case reflect.Array:
		for i := range v.Len() {
			fill(rng, v.Index(i), depth+1)
		}
	case reflect.Map:
		switch n := rng.IntN(4); {
		case depth > 4 || n == 0:
		case n == 1:
			v.Set(reflect.MakeMap(v.Type()))
		default:
			m := reflect.MakeMap(v.Type())
			for range n {
				k := reflect.New(v.Type().Key()).Elem()
				fill(rng, k, depth+1)
				e := reflect.New(v.Type().Elem()).Elem()
				fill(rng, e, depth+1)
				m.SetMapIndex(k, e)
			}
			v.Set(m)
		}
	case reflect.Struct:
		for i := range v.NumField() {
			if v.Type().Field(i).IsExported() {
				fill(rng, v.Field(i), depth+1)
			}
		}
	}
}

// User decodes without a Decoder of its own when every key is a field's
// name as written: the list must be exactly User's JSON names, or a key
// of a removed field would be taken without a word.
func TestUserFieldNamesAreUsersJSONNames(t *testing.T) {
	var names []string
	typ := reflect.TypeFor[User]()
	for i := range typ.NumField() {
		name, _, _ := strings.Cut(typ.Field(i).Tag.Get("json"), ",")
		names = append(names, name)
	}
	if !slices.Equal(names, userFieldNames[:]) {
		t.Fatalf("User's JSON names %v, userFieldNames %v", names, userFieldNames)
	}
	for _, c := range []struct {
		doc  string
		want string // error, "" for none
	}{
		{`{"name":"a","keys":[],"template":"","models":["m"],"enabled":false}`, ""},
		{`{"name":"a","Enabled":false}`, ""},
		{`{"name":"a","bogus":1}`, `unknown field "bogus"`},
		{`{"name":"a","name":"b"}`, ""},
		{`{"name":"a","models":[["x"]]}`, "cannot unmarshal"},
	} {
		var u User
		err := json.Unmarshal([]byte(c.doc), &u)
		if (err == nil) != (c.want == "") || err != nil && !strings.Contains(err.Error(), c.want) {
			t.Fatalf("%s: %v, want %q", c.doc, err, c.want)
		}
		if c.want == "" && strings.Contains(c.doc, "false") == u.Enabled {
			t.Fatalf("%s: enabled %v", c.doc, u.Enabled)
		}
	}
}
