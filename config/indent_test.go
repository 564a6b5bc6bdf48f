package config

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// The store keeps the bytes of the file it wrote (Store.Apply): they are
// held in a slice of their own size. json.Indent makes room for twice the
// compact form: a file of 11 MB (50,000 users) held 25 MB.
func TestMarshalFileHoldsNoMoreThanTheFile(t *testing.T) {
	c := Default()
	for i := range 2000 {
		c.Users = append(c.Users, User{Name: fmt.Sprintf("user-%05d@example.com", i), Template: "standard", Enabled: true})
	}
	c.UserLimit.Templates = []QuotaTemplate{DefaultQuotaTemplate()}
	c.UserLimit.Templates[0].Name = "standard"
	out, err := MarshalFile(c)
	if err != nil {
		t.Fatal(err)
	}
	if cap(out) > len(out)+len(out)/64 {
		t.Fatalf("MarshalFile: %d bytes in a slice of %d", len(out), cap(out))
	}
	compact, err := EncodeJSON(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	var want bytes.Buffer
	json.Indent(&want, compact, "", "  ")
	want.WriteByte('\n')
	if !bytes.Equal(out, want.Bytes()) {
		t.Fatal("MarshalFile does not indent as json.Indent")
	}
}

func TestAppendIndentIndentsAsJSONIndent(t *testing.T) {
	f := func(src string) {
		t.Helper()
		var want bytes.Buffer
		if err := json.Indent(&want, []byte(src), "", "  "); err != nil {
			t.Fatalf("%s: %v", src, err)
		}
		got := appendIndent(nil, []byte(src))
		if !bytes.Equal(got, want.Bytes()) {
			t.Errorf("%s:\ngot  %q\nwant %q", src, got, want.Bytes())
		}
		if n := indentedLen([]byte(src)); n != want.Len() {
			t.Errorf("%s: indentedLen %d, want %d", src, n, want.Len())
		}
	}
	f(`{}`)
	f(`[]`)
	f(`"a"`)
	f(`1`)
	f(`{"a":1}`)
	f(`{"a":[],"b":{},"c":[{}],"d":[[],[1,2]]}`)
	f(`{"s":"x,y:{z}[w] \" \\ \\\" ,"}`)
	f(` { "a" : [ 1 , 2 ] ,` + "\n\t" + `"b" : { } }`)
	f(`{"k\"ey":"\u00e9\\","n":null,"t":true,"f":-1.5e3}`)
	c := Default()
	c.Users = []User{{Name: "a", Keys: []string{"x"}, Models: []string{"m,1", "m:2"}, Enabled: true}, {Name: "b"}}
	data, err := EncodeJSON(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	f(string(data))
}

// Apply indents the config file as it writes it, in chunks, and keeps
// the digest of what it wrote: the file is MarshalFile's, byte for byte,
// and the store takes it for the bytes it wrote (no hand edit).
func TestApplyWritesTheFileMarshalFileRenders(t *testing.T) {
	path := filepath.Join(t.TempDir(), "infera.json")
	if err := os.WriteFile(path, []byte(`{}`), 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	c := Default()
	for i := range 2000 { // several chunks of indentChunk
		c.Users = append(c.Users, User{Name: fmt.Sprintf("user-%05d@example.com", i), Template: "standard", Enabled: true})
	}
	c.UserLimit.Templates = []QuotaTemplate{DefaultQuotaTemplate()}
	c.UserLimit.Templates[0].Name = "standard"
	if _, err := s.Apply(c, 0); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	want, err := MarshalFile(c)
	if err != nil {
		t.Fatal(err)
	}
	if len(want) < 2*indentChunk || !bytes.Equal(got, want) {
		t.Fatalf("the file (%d bytes) is not MarshalFile's (%d bytes)", len(got), len(want))
	}
	if s.lastSum != sumOf(got) || !s.FileServes() {
		t.Fatal("the store does not take the file it wrote for its own")
	}
	v := s.Version()
	if changed, err := s.Reload(); changed || err != nil || s.Version() != v {
		t.Fatalf("reload of the file Apply wrote: changed %v, %v, version %d -> %d", changed, err, v, s.Version())
	}
}

// The store tells a hand edit by the digest of the file's bytes and the
// settings of a config it keeps for them: without shared storage, that is
// the config serving, whatever happened to the file (a config read from a
// rewritten file with the same settings is not kept beside it).
func TestTheStoreKeepsNoConfigBesideTheOneServing(t *testing.T) {
	path := filepath.Join(t.TempDir(), "infera.json")
	write := func(doc string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(doc), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(`{"session_affinity":{"enabled":true}}`)
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	check := func(what string) {
		t.Helper()
		if s.lastCfg != s.Load() {
			t.Fatalf("%s: the store keeps a config beside the one serving", what)
		}
	}
	check("open")
	write(`{"session_affinity": {"enabled": true}}`) // rewritten, same settings
	if changed, err := s.Reload(); changed || err != nil {
		t.Fatalf("rewrite: changed %v, %v", changed, err)
	}
	check("a rewrite")
	write(`{"session_affinity":{"enabled":false}}`)
	if changed, err := s.Reload(); !changed || err != nil {
		t.Fatalf("edit: changed %v, %v", changed, err)
	}
	check("an edit")
	c := *s.Load()
	c.SessionAffinity.Enabled = true
	if _, err := s.Apply(&c, 0); err != nil {
		t.Fatal(err)
	}
	check("an apply")
	write(`{"session_affinity":{"enabled":true} }`) // rewritten behind the store
	c2 := *s.Load()
	if _, err := s.Apply(&c2, 0); err != nil {
		t.Fatal(err)
	}
	check("an apply over a rewrite")
}
