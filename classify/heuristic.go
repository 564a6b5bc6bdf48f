package classify

import (
	"strings"
)

// DefaultKeywords are the words and phrases that mark a demanding request
// for the reference heuristic.
var DefaultKeywords = []string{
	"prove", "proof", "derive", "theorem", "step by step", "reasoning",
	"analyze", "analyse", "optimize", "optimise", "algorithm", "complexity",
	"architecture", "refactor", "debug", "trade-off", "tradeoff",
}

// Heuristic is the reference classifier: prompt length and keywords.
//
//   - L3 when the text is at least L3Bytes long, or holds at least two
//     distinct keywords, or holds code (a ``` fence) and is at least
//     L2Bytes long;
//   - else L2 when it is at least L2Bytes long, or holds a keyword, or
//     holds code;
//   - else L1.
//
// Keywords match case-insensitively anywhere in the text. The length is
// text_bytes when the router sent it (the length before its cut), else the
// text's length.
type Heuristic struct {
	L2Bytes  int
	L3Bytes  int
	Keywords []string
}

// Classify returns the tier of a text whose full length is n bytes.
func (h *Heuristic) Classify(text string, n int) Tier {
	if n < len(text) {
		n = len(text)
	}
	lower := strings.ToLower(text)
	kw := 0
	for _, k := range h.Keywords {
		if k != "" && strings.Contains(lower, strings.ToLower(k)) {
			kw++
		}
	}
	code := strings.Contains(text, "```")
	switch {
	case n >= h.L3Bytes || kw >= 2 || code && n >= h.L2Bytes:
		return TierL3
	case n >= h.L2Bytes || kw >= 1 || code:
		return TierL2
	}
	return TierL1
}
