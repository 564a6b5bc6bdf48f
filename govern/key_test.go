package govern

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/alecthomas/kong"
	"github.com/infera/infera/config"
)

func TestNewKeyHashesVerifyAndIdentifyTheUser(t *testing.T) {
	key, hash := mintKey(t)
	if !config.LooksLikeKey(key) || len(key) != config.KeyLen {
		t.Fatalf("key %q has not the documented shape", key)
	}
	if strings.Contains(hash, key) || strings.Contains(hash, key[len(config.KeyPrefix)+config.KeyIDLen+1:]) {
		t.Fatal("the stored hash contains the secret")
	}
	key2, hash2 := mintKey(t)
	c := parseConfig(t, fmt.Sprintf(`{"users":[{"name":"alice","keys":[%q]},{"name":"bob","keys":[%q],"enabled":false}]}`, hash, hash2))
	g := newGov(t, Options{}, c)
	if !g.AuthRequired() {
		t.Fatal("users are configured: auth must be required")
	}
	if u := identify(t, g, key); u.Name() != "alice" {
		t.Fatalf("user %q", u.Name())
	}
	if _, rej := g.Identify([]byte(key2)); rej == nil || rej.Status != 403 || rej.Code != CodeUserDisabled {
		t.Fatalf("disabled user: %+v", rej)
	}
	// A second hash of the same key (another salt) verifies too.
	h3, err := HashKey(key)
	if err != nil || h3 == hash {
		t.Fatalf("rehash: %v (same salt twice)", err)
	}
}

func TestUnknownOrForgedKeysAre401AndNeverEchoed(t *testing.T) {
	key, hash := mintKey(t)
	g := newGov(t, Options{}, parseConfig(t, fmt.Sprintf(`{"users":[{"name":"alice","keys":[%q]}]}`, hash)))
	forged := []byte(key)
	forged[len(forged)-1] ^= 1 // same key id, wrong secret
	other, _ := mintKey(t)
	for _, k := range [][]byte{forged, []byte(other), nil, []byte("sk-abc"), []byte(key + "x"), []byte(strings.ToUpper(key))} {
		u, rej := g.Identify(k)
		if u != nil || rej == nil || rej.Status != 401 || rej.Code != CodeInvalidKey {
			t.Fatalf("key %q: user %v rejection %+v", k, u, rej)
		}
		if len(k) > 8 && strings.Contains(rej.Error()+string(rej.AppendBody(nil)), string(k[8:])) {
			t.Fatal("the rejection echoes the key")
		}
	}
	var body map[string]map[string]any
	if err := json.Unmarshal(rejInvalidKey.AppendBody(nil), &body); err != nil || body["error"]["code"] != "invalid_api_key" || body["error"]["type"] != "authentication_error" {
		t.Fatalf("body %v: %v", body, err)
	}
}

func TestConfigRefusesKeysInClearWithoutEchoingThem(t *testing.T) {
	key, hash := mintKey(t)
	f := func(js, wantPath string) {
		t.Helper()
		_, err := config.Parse([]byte(js))
		var fe *config.FieldError
		if !errors.As(err, &fe) || fe.Path != wantPath {
			t.Fatalf("%s: got %v, want an error at %s", js, err, wantPath)
		}
		if strings.Contains(err.Error(), key) {
			t.Fatal("the error echoes the key")
		}
	}
	f(fmt.Sprintf(`{"users":[{"name":"a","keys":[%q]}]}`, key), "users[0].keys[0]")
	f(`{"users":[{"name":"a","keys":["ifr1$zz$a$b"]}]}`, "users[0].keys[0]")
	f(fmt.Sprintf(`{"users":[{"name":"a","keys":[%q]},{"name":"b","keys":[%q]}]}`, hash, hash), "users[1].keys[0]")
	f(`{"users":[{"name":"a"},{"name":"a"}]}`, "users[1].name")
	f(`{"users":[{"name":"a b"}]}`, "users[0].name")
	f(`{"users":[{"name":"a","template":"nope"}]}`, "users[0].template")
	f(`{"users":[{"name":"a","bogus":1}]}`, "users[0].bogus")
}

func TestKeyCommandsPrintAKeyAndAHashThatVerify(t *testing.T) {
	var out bytes.Buffer
	if err := (&KeyNewCmd{User: "carol", JSON: true, Stdout: &out}).Run(); err != nil {
		t.Fatal(err)
	}
	var v struct {
		Key, Hash string
		User      config.User
	}
	if err := json.Unmarshal(out.Bytes(), &v); err != nil {
		t.Fatal(err)
	}
	if v.User.Name != "carol" || len(v.User.Keys) != 1 || v.User.Keys[0] != v.Hash || !v.User.Enabled {
		t.Fatalf("user entry %+v", v.User)
	}
	out.Reset()
	if err := (&KeyHashCmd{Stdin: strings.NewReader(v.Key + "\n"), Stdout: &out}).Run(); err != nil {
		t.Fatal(err)
	}
	hash2 := strings.TrimSpace(out.String())
	for _, h := range []string{v.Hash, hash2} {
		g := newGov(t, Options{}, parseConfig(t, fmt.Sprintf(`{"users":[{"name":"carol","keys":[%q]}]}`, h)))
		if u := identify(t, g, v.Key); u.Name() != "carol" {
			t.Fatal(u.Name())
		}
	}
	out.Reset()
	if err := (&KeyNewCmd{Stdout: &out}).Run(); err != nil || !strings.Contains(out.String(), "hash: ifr1$") {
		t.Fatalf("%v %q", err, out.String())
	}
	if err := (&KeyHashCmd{Stdin: strings.NewReader("sk-not-ours\n"), Stdout: &out}).Run(); err == nil || strings.Contains(err.Error(), "sk-not-ours") {
		t.Fatalf("foreign key: %v", err)
	}
}

func TestBearerToken(t *testing.T) {
	f := func(in, want string) {
		t.Helper()
		if got := string(BearerToken([]byte(in))); got != want {
			t.Fatalf("%q: %q, want %q", in, got, want)
		}
	}
	f("Bearer abc", "abc")
	f("bearer abc", "abc")
	f("Basic abc", "")
	f("Bearer", "")
	f("", "")
}

func FuzzIdentify(f *testing.F) {
	key, hash, err := NewKey()
	if err != nil {
		f.Fatal(err)
	}
	f.Add([]byte(key))
	f.Add([]byte("ifr_0123456789abcdef_" + strings.Repeat("A", 43)))
	f.Add([]byte(""))
	g, err := New(Options{})
	if err != nil {
		f.Fatal(err)
	}
	defer g.Close()
	c, err := config.Parse([]byte(fmt.Sprintf(`{"users":[{"name":"alice","keys":[%q]}]}`, hash)))
	if err != nil {
		f.Fatal(err)
	}
	if err := g.Apply(c); err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		u, rej := g.Identify(b)
		if (u == nil) == (rej == nil) {
			t.Fatal("exactly one of user and rejection")
		}
		if u != nil && string(b) != key {
			t.Fatalf("accepted %q", b)
		}
	})
}

func FuzzParseKeyHash(f *testing.F) {
	_, hash, err := NewKey()
	if err != nil {
		f.Fatal(err)
	}
	f.Add(hash)
	f.Add("ifr1$$$")
	f.Add("ifr1$0123456789abcdef$$")
	f.Fuzz(func(t *testing.T, s string) {
		h, err := config.ParseKeyHash(s)
		if err != nil {
			if strings.Contains(err.Error(), s) && len(s) > 12 {
				t.Fatalf("error quotes the input: %v", err)
			}
			return
		}
		if len(h.ID) != config.KeyIDLen || len(h.Salt) != config.KeySaltBytes {
			t.Fatalf("accepted malformed %q", s)
		}
	})
}

func FuzzParseClock(f *testing.F) {
	for _, s := range []string{"00:00", "23:59", "24:00", "9:00", "+1:00", "12:-1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		m, ok := config.ParseClock(s)
		if !ok {
			return
		}
		if m < 0 || m >= 1440 || fmt.Sprintf("%02d:%02d", m/60, m%60) != s {
			t.Fatalf("%q -> %d", s, m)
		}
	})
}

func TestKeyCommandMountsInKong(t *testing.T) {
	var cli struct {
		Key KeyCmd `cmd:"" help:"API keys."`
	}
	var out bytes.Buffer
	cli.Key.New.Stdout = &out
	p, err := kong.New(&cli, kong.Name("infera"), kong.Exit(func(int) { t.Fatal("exit") }))
	if err != nil {
		t.Fatal(err)
	}
	ctx, err := p.Parse([]string{"key", "new", "--json", "--user", "erin"})
	if err != nil {
		t.Fatal(err)
	}
	if err := ctx.Run(); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), `"name":"erin"`) {
		t.Fatalf("%q", out.String())
	}
}
