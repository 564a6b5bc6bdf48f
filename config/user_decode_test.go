package config

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"
)

// decodeUserAsBefore is User.UnmarshalJSON as it was before users were
// decoded by hand: encoding/json over the defaults, unknown fields refused
// by a json.Decoder.
func decodeUserAsBefore(b []byte) (User, error) {
	type plain User
	v := plain{Enabled: true}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&v); err != nil {
		return User{}, err
	}
	if dec.More() {
		return User{}, fmt.Errorf("more after the user")
	}
	return User(v), nil
}

// agreeOnUser fails t unless User.UnmarshalJSON (through json.Unmarshal,
// as a config's users are decoded) and decodeUserAsBefore take doc alike:
// both an error, or the same user (nil and empty lists told apart).
func agreeOnUser(t *testing.T, doc []byte) {
	t.Helper()
	if !json.Valid(doc) {
		return // json.Unmarshal refuses it before any UnmarshalJSON
	}
	var got User
	gerr := json.Unmarshal(doc, &got)
	want, werr := decodeUserAsBefore(doc)
	if (gerr == nil) != (werr == nil) {
		t.Fatalf("%q: error %v, want %v", doc, gerr, werr)
	}
	if gerr == nil && !reflect.DeepEqual(got, want) {
		t.Fatalf("%q: decoded %#v, want %#v", doc, got, want)
	}
}

func TestAUserIsDecodedAsEncodingJSONDecodesIt(t *testing.T) {
	f := func(doc string) {
		t.Helper()
		agreeOnUser(t, []byte(doc))
	}
	f(`{}`)
	f(`null`)
	f(`{"name":"a","keys":["k1","k2"],"template":"t","models":["m","q-*"],"enabled":false}`)
	f(` { "name" : "a" , "keys" : [ ] , "enabled" : true } `)
	f(`{"name":"a","keys":[],"models":[]}`)
	f(`{"name":"a","keys":null,"models":null,"template":null,"enabled":null}`)
	f(`{"name":"é ü 💡","template":"plan ✓"}`)
	// What the hand decoder leaves to encoding/json: escapes, keys in
	// another case or escaped, repeated keys, unknown keys, values of
	// another type, nulls in lists.
	f(`{"name":"a\"b\\c\u00e9\n"}`)
	f(`{"Name":"a","KEYS":["k"]}`)
	f(`{"n\u0061me":"a"}`)
	f(`{"name":"a","name":"b"}`)
	f(`{"keys":["a"],"keys":["b","c"]}`)
	f(`{"keys":["a","b"],"keys":null}`)
	f(`{"name":"a","nope":1}`)
	f(`{"name":1}`)
	f(`{"keys":"k"}`)
	f(`{"keys":[1]}`)
	f(`{"keys":["a",null]}`)
	f(`{"enabled":"true"}`)
	f(`{"enabled":1}`)
	f(`{"models":{}}`)
	f(`[]`)
	f(`"a"`)
}

func FuzzUserDecodeAgreesWithEncodingJSON(f *testing.F) {
	for _, s := range []string{
		`{"name":"a","keys":["k"],"template":"t","models":["m"],"enabled":true}`,
		`{"name":"a","nope":1}`, `{"Name":"a"}`, `{"keys":null,"enabled":false}`, `null`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, doc []byte) {
		agreeOnUser(t, doc)
	})
}

// TestDecodingAUserAllocatesOnlyItsValues decodes configs of 2,000 and
// 4,000 users and bounds what each user adds: its name, template, key
// list and key (four allocations). Each user went through a json.Unmarshal
// of its own into a heap copy of the user (thirteen allocations).
func TestDecodingAUserAllocatesOnlyItsValues(t *testing.T) {
	if raceEnabled {
		t.Skip("counts allocations, which the race detector changes")
	}
	allocs := func(n int) float64 {
		doc := usersDoc(n)
		return testing.AllocsPerRun(3, func() {
			if _, err := decodeConfig(doc, Default); err != nil {
				t.Fatal(err)
			}
		})
	}
	a, b := allocs(2000), allocs(4000)
	per := (b - a) / 2000
	t.Logf("decoding 2,000 users: %.0f allocations, 4,000: %.0f (%.2f per user)", a, b, per)
	if per > 4.05 {
		t.Errorf("%.2f allocations per user decoded: want 4 (its name, template, key list and key)", per)
	}
}

// TestValidatingUsersAllocatesNothingPerUser validates configs of 2,000
// and 4,000 users, each with one key: a user adds no allocation (the
// maps of names and key ids are made at their size). Parsing each key's
// hash (a split and two base64 decodes, three allocations per key) for
// what only needed its checks made every validation of 50,000 users
// allocate about 5 MB, three times per import.
func TestValidatingUsersAllocatesNothingPerUser(t *testing.T) {
	if raceEnabled {
		t.Skip("counts allocations, which the race detector changes")
	}
	allocs := func(n int) float64 {
		c, err := Parse(usersDoc(n))
		if err != nil {
			t.Fatal(err)
		}
		return testing.AllocsPerRun(3, func() {
			if err := c.Validate(); err != nil {
				t.Fatal(err)
			}
		})
	}
	a, b := allocs(2000), allocs(4000)
	per := (b - a) / 2000
	t.Logf("validating 2,000 users: %.0f allocations, 4,000: %.0f (%.3f per user)", a, b, per)
	if per > 0.05 {
		t.Errorf("%.3f allocations per user validated: want none", per)
	}
}

// TestAPlainKeyHashIsOneParseKeyHashTakes: every key hash plainKeyHashID
// takes, ParseKeyHash takes with the same key id (validation relies on
// it to skip the parse).
func TestAPlainKeyHashIsOneParseKeyHashTakes(t *testing.T) {
	f := func(s string) {
		t.Helper()
		id, ok := plainKeyHashID(s)
		if !ok {
			return
		}
		h, err := ParseKeyHash(s)
		if err != nil || h.ID != id {
			t.Fatalf("%q: plain with id %q, ParseKeyHash: %+v, %v", s, id, h, err)
		}
	}
	salt, sum := strings.Repeat("A", 22), strings.Repeat("_", 43)
	good := KeyHashPrefix + "0123456789abcdef$" + salt + "$" + sum
	if _, ok := plainKeyHashID(good); !ok {
		t.Fatalf("%q is not plain", good)
	}
	for i := range len(good) {
		for _, c := range []byte("0aAzZ_-$+/=\n ") {
			b := []byte(good)
			b[i] = c
			f(string(b))
		}
		f(good[:i] + good[i+1:])
		f(good[:i] + "x" + good[i:])
	}
}

func FuzzPlainKeyHashIsOneParseKeyHashTakes(f *testing.F) {
	f.Add(KeyHashPrefix + "0123456789abcdef$" + strings.Repeat("A", 22) + "$" + strings.Repeat("_", 43))
	f.Fuzz(func(t *testing.T, s string) {
		if id, ok := plainKeyHashID(s); ok {
			if h, err := ParseKeyHash(s); err != nil || h.ID != id {
				t.Fatalf("%q: plain with id %q, ParseKeyHash: %+v, %v", s, id, h, err)
			}
		}
	})
}
