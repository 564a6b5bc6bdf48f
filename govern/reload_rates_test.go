package govern

import (
	"fmt"
	"testing"
	"time"

	"github.com/infera/infera/config"
)

// A request admitted before a reload that raised its user's RPM and TPM,
// and ending after it (refunded, or reconciled with its usage), gives its
// request and tokens back to the buckets as they are now: it does not cut
// them down to the limits it was admitted under.
func TestARequestEndingAfterAReloadRaisingTheRatesKeepsTheNewBuckets(t *testing.T) {
	stores(t, func(t *testing.T, o Options) {
		clk := newFakeClock(t0)
		o.Now = clk.Now
		key, hash := mintKey(t)
		rate := func(rpm, tpm int) *config.Config {
			return userConfig(t, hash, fmt.Sprintf(`{"name":"t","rate":{"enabled":true,"rpm":%d,"tpm":%d}}`, rpm, tpm), "")
		}
		g := newGov(t, o, rate(2, 100))
		r := Request{PromptTokens: 10, MaxTokens: 10} // 20 tokens
		failed := admitOK(t, g, identify(t, g, key), r)
		served := admitOK(t, g, identify(t, g, key), r)
		served.FirstToken()

		if err := g.Apply(rate(60, 6000)); err != nil {
			t.Fatal(err)
		}
		clk.Advance(time.Minute) // the buckets refill to the new limits
		u := identify(t, g, key)
		admitOK(t, g, u, r).Done(Usage{})
		failed.Done(Usage{})                                                   // refunded
		served.Done(Usage{Known: true, PromptTokens: 10, CompletionTokens: 5}) // 5 tokens back
		if g.rds != nil {
			syncState(t, g)
		}
		for i := range 3 {
			tk := admitOK(t, g, u, r)
			if l := tk.Limits(); l.Requests != int64(59-i) || l.Tokens != int64(5980-20*i) {
				t.Fatalf("admission %d after the ends: %d requests and %d tokens left, want %d and %d", i, l.Requests, l.Tokens, 59-i, 5980-20*i)
			}
			tk.FirstToken()
			tk.Done(Usage{}) // served: keeps its estimate
		}
	})
}
