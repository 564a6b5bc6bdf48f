package config

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"reflect"
	"runtime"
	"strings"
	"testing"
	"time"
	"unsafe"
)

// decodeWithDecoder is decodeConfig as it was: a json.Decoder with
// DisallowUnknownFields, which decides what decodeConfig accepts.
func decodeWithDecoder(data []byte) (*Config, error) {
	c := Default()
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(c); err != nil {
		return nil, decodeError(err, data, reflect.TypeFor[Config]())
	}
	if dec.More() || dec.InputOffset() != int64(len(data)) {
		return nil, &FieldError{Msg: fmt.Sprintf("unexpected data after the JSON object at byte %d", dec.InputOffset())}
	}
	return c, nil
}

// agreeWithDecoder fails t unless decodeConfig and the json.Decoder take
// data alike: the same error, or configs that encode alike.
func agreeWithDecoder(t *testing.T, data []byte) {
	t.Helper()
	data = bytes.TrimSpace(data)
	if len(data) == 0 || data[0] != '{' {
		return // ParseWith refuses these before decoding
	}
	got, gerr := decodeConfig(data, Default)
	want, werr := decodeWithDecoder(data)
	if (gerr == nil) != (werr == nil) || gerr != nil && gerr.Error() != werr.Error() {
		t.Fatalf("%q:\n got error %v\nwant error %v", data, gerr, werr)
	}
	if gerr != nil {
		return
	}
	ge, err1 := EncodeJSON(got, nil)
	we, err2 := EncodeJSON(want, nil)
	if err1 != nil || err2 != nil || !bytes.Equal(ge, we) {
		t.Fatalf("%q: decoded unlike the Decoder (%v, %v):\n%s\n---\n%s", data, err1, err2, ge, we)
	}
}

func TestAConfigIsDecodedAsTheStrictDecoderDecodesIt(t *testing.T) {
	f := func(doc string) {
		t.Helper()
		agreeWithDecoder(t, []byte(doc))
	}
	f(`{}`)
	f(`{"workers":[{"id":"a","url":"http://127.0.0.1:1","models":["m"]}]}`)
	// Unknown keys at every depth, in another case, escaped, twice.
	f(`{"nope":1}`)
	f(`{"Workers":[]}`)
	f(`{"work\u0065rs":[]}`)
	f(`{"session_affinity":{"ttl_s":5,"nope":true}}`)
	f(`{"session_affinity":{"TTL_S":5}}`)
	f(`{"workers":[{"id":"a","url":"http://127.0.0.1:1","models":["m"],"nope":1}]}`)
	f(`{"split_proxy":{"proxies":[{"name":"x","url":"http://127.0.0.1:9","api_key":"k","nope":1}]}}`)
	f(`{"users":[{"name":"a","nope":1}]}`)
	f(`{"user_limit":{"templates":[{"name":"t","nope":1}]}}`)
	// An unknown key and a type error: whichever comes first is told.
	f(`{"nope":1,"session_affinity":{"ttl_s":"x"}}`)
	f(`{"session_affinity":{"ttl_s":"x"},"nope":1}`)
	f(`{"session_affinity":{"ttl_s":"x","nope":1}}`)
	// Values of another kind, null, nesting, trailing data, bad UTF-8.
	f(`{"session_affinity":[]}`)
	f(`{"session_affinity":null,"workers":null}`)
	f(`{"workers":{}}`)
	f(`{"session_affinity":{"ttl_s":{"a":[[[[1]]]]}}}`)
	f(`{} {}`)
	f(`{}]`)
	f(`{"users":[{"name":"\xff"}]}`)
	f(`{"nope\xff":1}`)
	f(strings.Repeat(`{"a":`, 100) + strings.Repeat(`}`, 100))
	full, err := MarshalFile(Default())
	if err != nil {
		t.Fatal(err)
	}
	f(string(full))
}

// FuzzDecodeAgreesWithTheStrictDecoder holds decodeConfig (json.Unmarshal
// and a walk for unknown keys, the Decoder only when either fails) to the
// json.Decoder with DisallowUnknownFields it stands for: on any object,
// the same error or the same config.
func FuzzDecodeAgreesWithTheStrictDecoder(f *testing.F) {
	full, err := MarshalFile(Default())
	if err != nil {
		f.Fatal(err)
	}
	for _, s := range []string{
		"{}", string(full), `{"nope":1}`, `{"Session_Affinity":{"Ttl_S":3}}`,
		`{"workers":[{"id":"a","url":"http://127.0.0.1:1","models":["m"],"role":"prefill","bootstrap_port":8998}],"pd":{"mode":"sglang"}}`,
		`{"users":[{"name":"a","keys":["k"],"template":"t"}],"user_limit":{"templates":[{"name":"t"}]}}`,
		`{"split_proxy":{"enabled":true,"proxies":[{"name":"x","url":"http://127.0.0.1:9","api_key":"sk-secret","models":["gpt-*"]}]}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		tm := time.AfterFunc(10*time.Second, func() { panic(fmt.Sprintf("HANG %q", data)) })
		defer tm.Stop()
		agreeWithDecoder(t, data)
	})
}

// TestParseDoesNotCopyTheDocument parses a config of 20,000 users and
// bounds what it allocates: a json.Decoder copied the whole document into
// a buffer grown by doubling first (up to twice the document live, and
// about as much again as garbage).
func TestParseDoesNotCopyTheDocument(t *testing.T) {
	data := usersDoc(20000)
	parse := func() uint64 {
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		c, err := Parse(data)
		runtime.ReadMemStats(&after)
		if err != nil {
			t.Fatal(err)
		}
		runtime.KeepAlive(c)
		return after.TotalAlloc - before.TotalAlloc
	}
	parse()
	total := parse()
	n := uint64(len(data))
	t.Logf("document %d bytes: Parse allocated %d (%.2fx)", n, total, float64(total)/float64(n))
	// Measured: 2.05x (the users' list, their strings and key slices,
	// validation's maps of names and key ids); 2.94x while validation
	// parsed every key hash, 5.05x while each user was decoded by a
	// json.Unmarshal of its own into a heap copy, 7.0x while the list was
	// grown as it was read, 9.7x with the Decoder's buffer.
	if total > 25*n/10 && !raceEnabled {
		t.Errorf("Parse allocated %.2fx the document: want at most 2.5x", float64(total)/float64(n))
	}
}

// usersDoc is a config document of n users, each with one key and the
// one quota template.
func usersDoc(n int) []byte {
	salt := base64.RawURLEncoding.EncodeToString(make([]byte, KeySaltBytes))
	sum := base64.RawURLEncoding.EncodeToString(make([]byte, 32))
	var sb strings.Builder
	sb.WriteString(`{"user_limit":{"templates":[{"name":"standard"}]},"users":[`)
	for i := range n {
		if i > 0 {
			sb.WriteByte(',')
		}
		fmt.Fprintf(&sb, `{"name":"user-%05d@example.com","template":"standard","keys":["%s%016x$%s$%s"]}`, i, KeyHashPrefix, i, salt, sum)
	}
	sb.WriteString(`]}`)
	return []byte(sb.String())
}

// A users list is decoded into a slice of its own length, made once: it
// was grown a quarter at a time from nil, which for 20,000 users
// allocated about five times the list during the decode and kept room
// for up to a quarter more users than the list holds.
func TestAUsersListIsDecodedIntoASliceOfItsLength(t *testing.T) {
	doc := usersDoc(20000)
	c, err := Parse(doc)
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Users) != 20000 || cap(c.Users) != len(c.Users) {
		t.Fatalf("%d users in a slice of %d", len(c.Users), cap(c.Users))
	}
	if !raceEnabled {
		list := uint64(len(c.Users)) * uint64(unsafe.Sizeof(User{}))
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		if _, err := Parse(doc); err != nil {
			t.Fatal(err)
		}
		runtime.ReadMemStats(&after)
		total := after.TotalAlloc - before.TotalAlloc
		t.Logf("Parse of %d bytes (%d users, a list of %d bytes) allocated %d", len(doc), len(c.Users), list, total)
	}
	for _, c := range []struct{ doc, want string }{
		{`{}`, "nil"},
		{`{"users":null}`, "nil"},
		{`{"users":[]}`, "empty"},
		{`{"users":[{"name":"a"}],"users":[{"name":"a"},{"name":"b"}]}`, "repeated"},
	} {
		got, err := decodeConfig([]byte(c.doc), Default)
		switch {
		case err != nil:
			t.Fatalf("%s: %v", c.doc, err)
		case c.want == "nil" && got.Users != nil,
			c.want == "empty" && (got.Users == nil || len(got.Users) != 0),
			c.want == "repeated" && len(got.Users) != 2:
			t.Fatalf("%s: users %#v", c.doc, got.Users)
		}
	}
}
