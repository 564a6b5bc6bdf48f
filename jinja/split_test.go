package jinja

import (
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
)

// The Qwen3 template (like DeepSeek-R1's and GLM's) takes
// content.split('</think>')[-1] and [0] of every assistant message. An
// 8 MB assistant message of "</think>" repeated used to build a million
// 56-byte parts per split: 1 CPU-second and 215 MB to render, 2.8 s and
// 336 MB at 16 MB, where a plain message of that size costs milliseconds.
// Indexing a split now finds the part without building the others.
func TestSplitIndexBuildsNoParts(t *testing.T) {
	src, err := os.ReadFile("testdata/qwen3.jinja")
	if err != nil {
		t.Fatal(err)
	}
	tpl, err := Parse(string(src))
	if err != nil {
		t.Fatal(err)
	}
	content := strings.Repeat("<think>", 1<<17) + strings.Repeat("</think>", 1<<17) + "answer" // 1.9 MB
	var msgs List
	for _, m := range [][2]string{{"user", "hi"}, {"assistant", content}} {
		o := NewObject(2)
		o.Set("role", String(m[0]))
		o.Set("content", String(m[1]))
		msgs.Append(ObjectValue(o))
	}
	vars := NewObject(1)
	vars.Set("messages", msgs.Value())
	out, err := tpl.Render(nil, vars) // warm
	if err != nil {
		t.Fatal(err)
	}
	if want := "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nanswer<|im_end|>\n"; string(out) != want {
		t.Fatalf("rendered %q, want %q", out, want)
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	if _, err = tpl.Render(out[:0], vars); err != nil {
		t.Fatal(err)
	}
	runtime.ReadMemStats(&after)
	if got := after.TotalAlloc - before.TotalAlloc; got > uint64(len(content))/8 {
		t.Fatalf("rendering a %d-byte assistant message allocated %d bytes", len(content), got)
	}
}

// s.split(sep)[i] is the i-th part of the JavaScript split, whatever the
// separator (overlapping ones included) and index (negative, out of range).
func TestSplitIndexMatchesSplit(t *testing.T) {
	f := func(s, sep string) {
		t.Helper()
		vars := NewObject(2)
		vars.Set("s", String(s))
		vars.Set("sep", String(sep))
		all, err := Parse(`{% set p = s.split(sep) %}{% for i in range(-6, 6) %}{{ p[i] is defined }}{{ p[i] }}|{% endfor %}`)
		if err != nil {
			t.Fatal(err)
		}
		want, err := all.Render(nil, vars)
		if err != nil {
			t.Fatal(err)
		}
		var b strings.Builder
		for i := -6; i < 6; i++ {
			b.WriteString("{{ s.split(sep)[" + strconv.Itoa(i) + "] is defined }}{{ s.split(sep)[" + strconv.Itoa(i) + "] }}|")
		}
		idx, err := Parse(b.String())
		if err != nil {
			t.Fatal(err)
		}
		got, err := idx.Render(nil, vars)
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != string(want) {
			t.Fatalf("%q.split(%q)[i] = %q, want %q", s, sep, got, want)
		}
	}
	for _, s := range []string{"", "a", "aa", "aaa", "aaaaa", "abab", "xabax", "</think>", "a</think>b</think>c", "<think>r</think>\n\nans"} {
		for _, sep := range []string{"a", "aa", "aba", "</think>", "x", "b"} {
			f(s, sep)
		}
	}
}

// FuzzSplitPart checks splitPart against the parts a full split builds.
func FuzzSplitPart(f *testing.F) {
	f.Add("aaaaa", "aa", -1)
	f.Add("<think>r</think>\n\nans", "</think>", 0)
	f.Add("abab", "bab", -2)
	f.Fuzz(func(t *testing.T, s, sep string, i int) {
		if sep == "" {
			return
		}
		parts := strings.Split(s, sep) // non-overlapping, left to right, as JavaScript
		j := i
		if j < 0 {
			j += len(parts)
		}
		got, ok := splitPart(s, sep, i)
		if in := j >= 0 && j < len(parts); ok != in || (in && got != parts[j]) {
			t.Fatalf("splitPart(%q, %q, %d) = %q, %v; parts %q", s, sep, i, got, ok, parts)
		}
	})
}
