//go:build !race

package proxy

import (
	"testing"

	"github.com/infera/infera/config"
	upstreams "github.com/infera/infera/upstream"
	"github.com/valyala/fasthttp"
)

// The external paths allocate nothing per request in infera's code either:
// a split proxy's external upstream (plan, lease, header block, our HTTP/1.1
// transport), and a request forwarded to a member gateway (saturation
// check, member pick, the same transport). The bound is fasthttp's one
// server allocation per request (see TestNonStreamZeroAlloc), per router
// the request crosses.
func TestExternalPathsZeroAlloc(t *testing.T) {
	ext := startUpstream(t, okHandler)
	t.Run("split", func(t *testing.T) {
		cfg := splitConfig(config.SplitPrefix,
			config.Proxy{Local: true, ModelRules: []string{"none"}},
			config.Proxy{Name: "ext", Address: ext.url + "/v1", APIKey: config.NewSecret("sk-1"), ModelRules: []string{"m"}},
		)
		r := startRouterWith(t, nil, cfg, nil, deadURL(t))
		checkAllocs(t, r.url, "split:ext", 200, 2000, 1.05)
	})
	t.Run("global", func(t *testing.T) {
		member := startRouterWith(t, nil, nil, nil, ext.url)
		cfg := globalConfig(config.Member{Name: "b", URL: member.url})
		// One poll (at start): a poll's allocations would count here.
		cfg.GlobalScheduling.PollIntervalMS, cfg.GlobalScheduling.StaleAfterMS = 60000, 60000
		p := upstreams.NewPoller()
		t.Cleanup(p.Close)
		if err := p.Update(&cfg.GlobalScheduling); err != nil {
			t.Fatal(err)
		}
		r := startRouterWith(t, nil, cfg, func(o *Options) { o.Poller = p }, ext.url)
		r.fl.Remove("w0")
		waitFor(t, func() bool { _, _, ok := p.Members()[0].Report(); return ok }, "member report")
		// The member reports 256 free (no limit): stay below it, as Pick
		// counts forwards against the report. Two routers: fasthttp's
		// server allocation in each.
		checkAllocs(t, r.url, "global:b", 20, 200, 2.05)
	})
}

// checkAllocs sends warm, then runs measured requests to url, each answered
// through upstream label, and checks the allocations per request.
func checkAllocs(t *testing.T, url, label string, warm, runs int, bound float64) {
	t.Helper()
	hc, req := benchClient(t, url, false)
	resp := fasthttp.AcquireResponse()
	do := func() {
		if err := hc.Do(req, resp); err != nil || resp.StatusCode() != 200 {
			t.Fatal(err, resp.StatusCode())
		}
	}
	do()
	if got := string(resp.Header.Peek("X-Infera-Upstream")); got != label {
		t.Fatalf("answered by %q, want %q", got, label)
	}
	for i := 0; i < warm; i++ {
		do()
	}
	if n := testing.AllocsPerRun(runs, do); n > bound {
		t.Fatalf("%.2f allocs per request, want at most %v", n, bound)
	}
}
