package govern

import (
	"testing"
	"time"
)

// A request an engine was sent and whose client left before the first
// byte (Usage.Abandoned) keeps its request counts (quota requests, RPM)
// and is charged its estimate's prompt part; only the completion part is
// refunded. It was refunded entirely, so a client that left just before
// each answer was held back by no limit while the engines did the work.
// A request that never reached an engine is still refunded entirely, and
// one already served keeps its estimate, Abandoned or not.
func TestAnAbandonedRequestKeepsItsCountsAndIsChargedItsPrompt(t *testing.T) {
	stores(t, func(t *testing.T, o Options) {
		key, hash := mintKey(t)
		// Mid-minute, mid-day: the buckets do not refill, the window holds.
		clk := newFakeClock(time.Now().UTC().Truncate(time.Minute).Add(30 * time.Second))
		o.Now = clk.Now
		g := newGov(t, o, userConfig(t, hash, `{"name":"t","rate":{"enabled":true,"rpm":2,"tpm":6000},
			"quota":{"enabled":true,"weights":{"input":2,"output":3,"cached":1},
				"windows":[{"period":"day","max_requests":10}]}}`, ""))
		u := identify(t, g, key)
		r := Request{PromptTokens: 500, MaxTokens: 1000} // estimate: 1500 tokens; 500*2 + 1000*3 = 4000 weighted
		check := func(what string, rpm, tpm, requests int64, tokens float64) {
			t.Helper()
			var us UserStatus
			ok := false
			for deadline := time.Now().Add(5 * time.Second); !ok && time.Now().Before(deadline); {
				var err error
				if us, err = g.UserStatus("alice"); err != nil {
					t.Fatal(err)
				}
				ok = us.RPM.Remaining == rpm && us.TPM.Remaining == tpm && us.Quota[0].Requests == requests && us.Quota[0].Tokens == tokens
				if !ok {
					time.Sleep(5 * time.Millisecond)
				}
			}
			if !ok {
				t.Fatalf("%s: rpm %d left, tpm %d left, %d requests, %v tokens; want %d, %d, %d, %v",
					what, us.RPM.Remaining, us.TPM.Remaining, us.Quota[0].Requests, us.Quota[0].Tokens, rpm, tpm, requests, tokens)
			}
		}
		admitOK(t, g, u, r).Done(Usage{Abandoned: true})
		check("abandoned after it was sent", 1, 5500, 1, 1000)
		admitOK(t, g, u, r).Done(Usage{})
		check("failed before its first byte", 1, 5500, 1, 1000)
		// A usage the router learned anyway is charged as for any answer.
		tk := admitOK(t, g, u, Request{PromptTokens: 10, MaxTokens: 1000})
		tk.Done(Usage{PromptTokens: 10, CompletionTokens: 5, Known: true, Abandoned: true})
		check("abandoned with a usage", 0, 5485, 2, 1000+20+15)
		clk.Advance(30 * time.Second) // one request back in the RPM bucket, 3000 tokens in the TPM one
		tk = admitOK(t, g, u, r)
		tk.FirstToken()
		tk.Done(Usage{Abandoned: true})
		check("abandoned after its first byte", 0, 6000-1500, 3, 1035+4000)
		admitRejected(t, g, u, r, CodeRPM)
	})
}
