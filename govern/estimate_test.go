package govern

import "testing"

// A request reserves its output for every completion the engine generates
// (n, best_of, the prompts of a batch), with or without max_tokens.
func TestTheEstimateCountsEveryGeneration(t *testing.T) {
	tp := &template{defOut: 100, wOut: 1, wPrompt: 1}
	for _, tc := range []struct {
		r    Request
		want int64
	}{
		{Request{PromptTokens: 10, MaxTokens: 4}, 14},
		{Request{PromptTokens: 10, MaxTokens: 4, Generations: 10}, 50},
		{Request{PromptTokens: 10}, 110},
		{Request{PromptTokens: 10, Generations: 3}, 310},
		{Request{PromptTokens: 10, MaxTokens: 4, Generations: 0}, 14},
	} {
		if got := tp.estimate(tc.r).tpm; got != tc.want {
			t.Errorf("estimate(%+v).tpm = %d, want %d", tc.r, got, tc.want)
		}
	}
}
