package config

import (
	"encoding/base64"
	"errors"
	"strings"
	"testing"
)

// parseKeyHashAsBefore is ParseKeyHash as it was before it cut the hash
// and decoded the digest in place: a split, and both parts decoded.
func parseKeyHashAsBefore(s string) (KeyHash, error) {
	var h KeyHash
	rest, ok := strings.CutPrefix(s, KeyHashPrefix)
	if !ok {
		return h, errors.New("prefix")
	}
	parts := strings.Split(rest, "$")
	if len(parts) != 3 {
		return h, errors.New("parts")
	}
	if !validKeyID(parts[0]) {
		return h, errors.New("id")
	}
	h.ID = parts[0]
	salt, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil || len(salt) != KeySaltBytes {
		return h, errors.New("salt")
	}
	h.Salt = salt
	sum, err := base64.RawURLEncoding.DecodeString(parts[2])
	if err != nil || len(sum) != len(h.Sum) {
		return h, errors.New("sum")
	}
	copy(h.Sum[:], sum)
	return h, nil
}

// agreeOnKeyHash fails t unless ParseKeyHash and parseKeyHashAsBefore
// take s alike, with the same key id, salt and digest.
func agreeOnKeyHash(t *testing.T, s string) {
	t.Helper()
	got, err := ParseKeyHash(s)
	want, werr := parseKeyHashAsBefore(s)
	if (err == nil) != (werr == nil) {
		t.Fatalf("%q: ParseKeyHash: %v, before: %v", s, err, werr)
	}
	if err == nil && (got.ID != want.ID || string(got.Salt) != string(want.Salt) || got.Sum != want.Sum) {
		t.Fatalf("%q: ParseKeyHash: %+v, before: %+v", s, got, want)
	}
}

// TestParseKeyHashTakesWhatItTookBefore changes every character of a key
// hash, drops one and adds one, and breaks its lines (base64 skips line
// breaks, so a digest longer than 43 characters may decode to 32 bytes):
// ParseKeyHash takes and refuses what it did with a split and two decodes.
func TestParseKeyHashTakesWhatItTookBefore(t *testing.T) {
	salt, sum := "AAECAwQFBgcICQoLDA0ODw", "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8"
	good := KeyHashPrefix + "0123456789abcdef$" + salt + "$" + sum
	if _, err := ParseKeyHash(good); err != nil {
		t.Fatal(err)
	}
	for i := range len(good) {
		for _, c := range []byte("0aAzZ_-$+/=\n\r ") {
			b := []byte(good)
			b[i] = c
			agreeOnKeyHash(t, string(b))
		}
		agreeOnKeyHash(t, good[:i]+good[i+1:])
		agreeOnKeyHash(t, good[:i]+"x"+good[i:])
		agreeOnKeyHash(t, good[:i]+"\n"+good[i:])
		agreeOnKeyHash(t, good[:i]+"$"+good[i:])
	}
	for _, n := range []int{1, 20, 21, 40, 100} {
		agreeOnKeyHash(t, good+strings.Repeat("\n", n))
		agreeOnKeyHash(t, good+strings.Repeat("\r\n", n))
		agreeOnKeyHash(t, good+strings.Repeat("A", n))
	}
	agreeOnKeyHash(t, KeyHashPrefix+"0123456789abcdef$"+salt+"$")
	agreeOnKeyHash(t, KeyHashPrefix+"0123456789abcdef$"+salt)
	agreeOnKeyHash(t, KeyHashPrefix)
	agreeOnKeyHash(t, "")
}

func FuzzParseKeyHashTakesWhatItTookBefore(f *testing.F) {
	f.Add(KeyHashPrefix + "0123456789abcdef$AAECAwQFBgcICQoLDA0ODw$AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8")
	f.Add(KeyHashPrefix + "0123456789abcdef$AAECAwQFBgcICQoLDA0ODw$AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8\n\n")
	f.Fuzz(func(t *testing.T, s string) { agreeOnKeyHash(t, s) })
}

// TestParsingAKeyHashAllocatesItsSaltAlone: the salt it returns is the one
// allocation of a parse (a split and the digest's decoded copy were two
// more, 80 bytes a key, a sixth of what compiling a user allocated).
func TestParsingAKeyHashAllocatesItsSaltAlone(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector changes what is allocated")
	}
	s := KeyHashPrefix + "0123456789abcdef$AAECAwQFBgcICQoLDA0ODw$AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8"
	if n := testing.AllocsPerRun(100, func() {
		if _, err := ParseKeyHash(s); err != nil {
			t.Fatal(err)
		}
	}); n != 1 {
		t.Fatalf("%v allocations a parse: want 1 (the salt)", n)
	}
}
