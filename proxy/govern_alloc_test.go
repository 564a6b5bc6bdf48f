//go:build !race

package proxy

import (
	"testing"

	"github.com/valyala/fasthttp"
)

// TestGovernedNonStreamZeroAlloc is TestNonStreamZeroAlloc with every
// governance check on, counters in process: a user key identified, its
// models list (a name and a pattern) checked, the
// user's template (allowed period, four quota windows, concurrency, RPM,
// TPM) admitting and reconciling the request with the engine's usage (its
// rate limit headers on the answer), and
// concurrency seats (overall, prefill) taken through the scheduler's
// candidate filter and attached to the lease. The governance adds no
// allocation: the bound is fasthttp's one, as without limits.
func TestGovernedNonStreamZeroAlloc(t *testing.T) {
	for _, policy := range []string{"round-robin", "kv-aware"} {
		t.Run(policy, func(t *testing.T) {
			r, key := startGovernedBench(t, policy, "")
			hc, req := benchClient(t, r.url, false)
			req.Header.Set("Authorization", "Bearer "+key)
			resp := fasthttp.AcquireResponse()
			do := func() {
				if err := hc.Do(req, resp); err != nil || resp.StatusCode() != 200 {
					t.Fatal(err, resp.StatusCode(), string(resp.Body()))
				}
				if len(resp.Header.Peek("X-Ratelimit-Remaining-Tokens")) == 0 {
					t.Fatal("no rate limit headers")
				}
			}
			for i := 0; i < 200; i++ {
				do()
			}
			if n := testing.AllocsPerRun(2000, do); n > 1.05 {
				t.Fatalf("%.2f allocs per governed request, want at most fasthttp's 1", n)
			}
		})
	}
}
