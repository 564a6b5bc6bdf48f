package classify

import (
	"strings"
	"testing"
)

func TestHeuristicTiers(t *testing.T) {
	h := Heuristic{L2Bytes: 100, L3Bytes: 1000, Keywords: DefaultKeywords}
	f := func(text string, n int, want Tier) {
		t.Helper()
		if got := h.Classify(text, n); got != want {
			t.Fatalf("Classify(%.40q, %d) = %v, want %v", text, n, got, want)
		}
	}
	f("hi", 0, TierL1)
	f("What is the capital of France?", 0, TierL1)
	f(strings.Repeat("a", 99), 0, TierL1)
	f(strings.Repeat("a", 100), 0, TierL2)
	f(strings.Repeat("a", 1000), 0, TierL3)
	f("short tail", 5000, TierL3) // text_bytes: the length before the router's cut
	f("Please OPTIMIZE this", 0, TierL2)
	f("Prove it, step by step", 0, TierL3)
	f("prove that proof", 0, TierL3) // two distinct keywords
	f("```go\nx := 1\n```", 0, TierL2)
	f("```"+strings.Repeat("x", 100), 0, TierL3)
	if tier := (&Heuristic{L2Bytes: 0, L3Bytes: 0}).Classify("", 0); tier != TierL3 {
		t.Fatalf("zero thresholds: %v", tier)
	}
}

func TestCmdHeuristicFlags(t *testing.T) {
	c := Cmd{L2Bytes: 10, L3Bytes: 5}
	if _, err := c.Heuristic(); err == nil {
		t.Fatal("l3 < l2 accepted")
	}
	c = Cmd{L2Bytes: 10, L3Bytes: 20, Keywords: []string{" a ", "", "b"}}
	h, err := c.Heuristic()
	if err != nil || len(h.Keywords) != 2 || h.Keywords[0] != "a" {
		t.Fatalf("%+v %v", h, err)
	}
	c.Keywords = nil
	if h, _ := c.Heuristic(); len(h.Keywords) != len(DefaultKeywords) {
		t.Fatal("empty keywords should use the built-in list")
	}
	if _, err := (&Cmd{L3Bytes: 1, Delay: -1}).Heuristic(); err == nil {
		t.Fatal("negative delay accepted")
	}
}

// A keyword listed twice (--keywords debug,DEBUG) is one keyword: a text
// holding it is L2, not L3 (it counted once per listing, so one word made
// L3 where the docs ask for two distinct keywords).
func TestAKeywordListedTwiceCountsOnce(t *testing.T) {
	h, err := (&Cmd{L2Bytes: 100, L3Bytes: 1000, Keywords: []string{"debug", "DEBUG", " debug ", "prove"}}).Heuristic()
	if err != nil {
		t.Fatal(err)
	}
	if got := h.Classify("debug this", 0); got != TierL2 {
		t.Fatalf("one keyword listed three times: %v, want L2 (keywords %q)", got, h.Keywords)
	}
	if got := h.Classify("debug and prove this", 0); got != TierL3 {
		t.Fatalf("two distinct keywords: %v, want L3", got)
	}
}
