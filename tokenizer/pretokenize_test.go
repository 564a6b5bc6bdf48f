package tokenizer

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestSplitWords(t *testing.T) {
	f := func(in string, maxDigits int, want ...string) {
		t.Helper()
		var got []string
		splitWords([]byte(in), maxDigits, func(w []byte) { got = append(got, string(w)) })
		if strings.Join(got, "|") != strings.Join(want, "|") || len(got) != len(want) {
			t.Errorf("splitWords(%q, %d) = %q, want %q", in, maxDigits, got, want)
		}
	}
	f("", 1)
	f("Hello world", 1, "Hello", " world")
	// Contractions are case-insensitive and win over letter runs.
	f("X'LLama", 1, "X", "'LL", "ama")
	f("it'S'rex", 1, "it", "'S", "'re", "x")
	f("'VEry", 1, "'VE", "ry")
	// A space before an apostrophe joins the punctuation alternative.
	f("a 'll", 1, "a", " '", "ll")
	// One optional non-letter, non-digit, non-newline prefix before letters.
	f("\thello", 1, "\thello")
	f("\nhello", 1, "\n", "hello")
	f("$abc", 1, "$abc")
	// Digits one at a time (Qwen2) or in runs of up to three (cl100k).
	f("12345", 1, "1", "2", "3", "4", "5")
	f("12345", 3, "123", "45")
	f("x²³", 1, "x", "²", "³")
	// Punctuation runs take one leading space and trailing newlines.
	f("a ...\n\nb", 1, "a", " ...\n\n", "b")
	f("a!!", 1, "a", "!!")
	// Whitespace: newline runs end at the last newline; a run before a
	// word leaves its last space to the word.
	f("a  \n  b", 1, "a", "  \n", " ", " b")
	f("a   b", 1, "a", "  ", " b")
	f("a \tb", 1, "a", " ", "\tb")
	f("a  ", 1, "a", "  ")
	f("a 1", 1, "a", " ", "1")
	f("a  1", 1, "a", " ", " ", "1")
	f("\u00a0x", 1, "\u00a0x")
	f("x\u3000\u3000y", 1, "x", "\u3000", "\u3000y")
	// JavaScript's \s has U+FEFF but not U+0085.
	f("a\ufeff\ufeffb", 1, "a", "\ufeff", "\ufeffb")
	f("a\u0085b", 1, "a", "\u0085b")
	f("你好，世界", 1, "你好", "，世界")
	f("e\u0301x", 1, "e", "\u0301x")
	f("\xff\xfeab", 1, "\xff\xfe", "ab")
}

func FuzzSplitWords(f *testing.F) {
	for _, s := range []string{"Hello world", "a  \n  b", "X'LLama", "12345", "\xff\xfe", "你好 😀 e\u0301", " \t\r\n"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		var b strings.Builder
		n := 0
		splitWords([]byte(s), 1, func(w []byte) {
			if len(w) == 0 {
				t.Fatalf("empty piece in %q", s)
			}
			if utf8.ValidString(s) && !utf8.Valid(w) {
				t.Fatalf("piece %q of valid %q is not valid UTF-8", w, s)
			}
			b.Write(w)
			n++
		})
		if b.String() != s {
			t.Fatalf("pieces of %q concatenate to %q", s, b.String())
		}
	})
}

// letterRunRef and symbolRunRef are the plain rune-by-rune definitions that
// letterRun and symbolRun (ASCII table fast paths) must agree with.
func letterRunRef(s []byte, i int) int {
	j := i
	for j < len(s) {
		r, sz := decodeAt(s, j)
		if !isLetter(r) {
			break
		}
		j += sz
	}
	return j - i
}

func symbolRunRef(s []byte, i int) int {
	j := i
	for j < len(s) {
		r, sz := decodeAt(s, j)
		if isSpace(r) || isLetter(r) || isNumber(r) {
			break
		}
		j += sz
	}
	return j - i
}

// FuzzRunsMatchDefinition compares the fast letter and symbol runs with
// their definitions at every offset.
func FuzzRunsMatchDefinition(f *testing.F) {
	for _, s := range []string{"Hello, world!", "a\x80b\xffc", "你好,世界 123", "x²³ ½ e\u0301", "\t\v\f\r\n \u00a0\u2028", "$$$abc@@@", strings4K()} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		b := []byte(s)
		for i := range b {
			if got, want := letterRun(b, i), letterRunRef(b, i); got != want {
				t.Fatalf("letterRun(%q, %d) = %d, want %d", s, i, got, want)
			}
			if got, want := symbolRun(b, i), symbolRunRef(b, i); got != want {
				t.Fatalf("symbolRun(%q, %d) = %d, want %d", s, i, got, want)
			}
		}
	})
}

// TestASCIIClassesMatchDefinition checks the class table byte by byte.
func TestASCIIClassesMatchDefinition(t *testing.T) {
	for c := range utf8.RuneSelf {
		b := []byte{byte(c)}
		if letterRun(b, 0) != letterRunRef(b, 0) || symbolRun(b, 0) != symbolRunRef(b, 0) {
			t.Errorf("byte %#x classified differently from its definition", c)
		}
	}
}
