package config

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
)

// repeatedKeyByTokens is RepeatedKey as the decoder's tokens tell it (the
// model of the scan).
func repeatedKeyByTokens(data []byte, prefix string) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	return walkRepeated(dec, prefix)
}

// RepeatedKey scans without allocating; it must find what the decoder's
// tokens find, at the same path with the same message, on random
// documents: keys repeated in another case, through a Unicode fold (the
// Kelvin sign is k) or an escape, in lists and deep objects, in objects
// of many keys; and in documents the scanner refuses (invalid UTF-8),
// where the tokens decide.
func TestRepeatedKeyScanFindsWhatTheTokensFind(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 4))
	keys := []string{`a`, `A`, `b`, `k`, `\u212a`, `\u006b`, `K`, `users`, `Users`, `ß`, `ẞ`, "x\xff", `é`, `É`}
	var gen func(sb *strings.Builder, depth int)
	gen = func(sb *strings.Builder, depth int) {
		switch n := rng.IntN(6); {
		case depth > 4 || n == 0:
			sb.WriteString([]string{`1`, `"s"`, `null`, `true`, `"\u00e9"`, `-2.5e3`}[rng.IntN(6)])
		case n == 1:
			sb.WriteString("[")
			for i := range rng.IntN(4) {
				if i > 0 {
					sb.WriteString(", ")
				}
				gen(sb, depth+1)
			}
			sb.WriteString("]")
		default:
			sb.WriteString("{")
			m := rng.IntN(4)
			if rng.IntN(8) == 0 {
				m = 30 + rng.IntN(10) // past the small-object scan
				depth = 4
			}
			used := map[string]bool{}
			for i := range m {
				if i > 0 {
					sb.WriteString(",")
				}
				k := keys[rng.IntN(len(keys))]
				if m > 4 && rng.IntN(6) != 0 {
					k = fmt.Sprintf("f%d", i)
				}
				if used[k] && rng.IntN(2) == 0 {
					k += "x"
				}
				used[k] = true
				sb.WriteString(` "` + k + `" : `)
				gen(sb, depth+1)
			}
			sb.WriteString("}")
		}
	}
	found := 0
	for range 3000 {
		var sb strings.Builder
		gen(&sb, 0)
		data := []byte(sb.String())
		if !json.Valid(data) && !bytes.Contains(data, []byte("\xff")) {
			t.Fatalf("generated invalid JSON: %s", data)
		}
		if !json.Valid(data) {
			continue
		}
		want := repeatedKeyByTokens(data, "p")
		got := RepeatedKey(data, "p")
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("RepeatedKey(%s):\n got %v\nwant %v", data, got, want)
		}
		if got != nil {
			found++
		}
	}
	if found < 300 {
		t.Fatalf("only %d documents with a repeated key", found)
	}
}
