package proxy

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/infera/infera/config"
	"github.com/infera/infera/fleet"
	"github.com/valyala/fasthttp"
)

// A member region a reload added while a request was in flight (held by
// the classifier) takes that request, and stays chosen for the next ones:
// the request's older snapshot did not list it, so it was marked failed
// until its next poll (a minute here), and that request and every one
// after it until then was answered 503 global_capacity_exhausted while
// the new member was healthy and idle.
func TestAMemberAddedByAReloadTakesTheRequestsInFlight(t *testing.T) {
	hold := make(chan struct{})
	cls := startUpstream(t, func(ctx *fasthttp.RequestCtx) {
		if strings.Contains(string(ctx.PostBody()), "hold me") {
			<-hold
		}
		ctx.SetBodyString(`{"tier":"L2"}`)
	})
	engB := startUpstream(t, okHandler)
	b := startRouterWith(t, nil, config.Default(), nil, engB.url) // serves "m"

	cfgA := globalConfig(config.Member{Name: "gone", URL: deadURL(t)})
	cfgA.GlobalScheduling.PollIntervalMS, cfgA.GlobalScheduling.StaleAfterMS = 60000, 120000
	cfgA.SmartModelSelection = config.SmartModelSelection{Enabled: true, ClassifierURL: cls.url + "/v1/classify",
		TimeoutMS: 10000, FallbackTier: "L2", MatchModels: []string{"auto"},
		Tiers: config.TierModels{L1: "m", L2: "m", L3: "m"}, MaxTextBytes: 8192}
	pa := startPoller(t, &cfgA.GlobalScheduling)
	a := startRouterWith(t, nil, cfgA, func(o *Options) { o.Poller = pa }, deadURL(t))
	a.fl.Remove("w0")
	engA := startUpstream(t, okHandler)
	if err := a.fl.Upsert(fleet.Record{ID: "wa", URL: engA.url, Models: []string{"a-only"}}); err != nil {
		t.Fatal(err)
	}

	late := make(chan *http.Response, 1)
	go func() {
		resp, err := http.Post(a.url+"/v1/chat/completions", "application/json",
			strings.NewReader(`{"model":"auto","messages":[{"role":"user","content":"hold me"}],"max_tokens":4}`))
		if err != nil {
			late <- nil
			return
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		late <- resp
	}()
	waitFor(t, func() bool { return cls.hits.Load() == 1 }, "the request reached the classifier")

	// The reload adds member b; the poller follows it (as the gateway's
	// OnChange does) and gets b's first report.
	c := *cfgA
	c.GlobalScheduling.Members = append([]config.Member{{Name: "b", URL: b.url}}, cfgA.GlobalScheduling.Members...)
	a.store.Set(&c)
	if err := pa.Update(&c.GlobalScheduling); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { _, _, ok := pa.Members()[0].Report(); return ok }, "A's report of b")

	close(hold)
	resp := <-late
	if resp == nil || resp.StatusCode != 200 || resp.Header.Get("X-Infera-Upstream") != "global:b" {
		t.Fatalf("the request in flight across the reload: %+v", resp)
	}
	for i := 0; i < 3; i++ {
		resp, body := postWith(t, a.url+"/v1/chat/completions", chatBody, nil)
		if resp.StatusCode != 200 || resp.Header.Get("X-Infera-Upstream") != "global:b" {
			t.Fatalf("request %d after it: %d %s", i, resp.StatusCode, body)
		}
	}
	if n := engB.hits.Load(); n != 4 {
		t.Fatalf("b's engine got %d requests, want 4", n)
	}
	if v := metricValue(t, a.url, `infera_global_forward_failures_total{member="b"}`); v != "0" {
		t.Fatalf("b's forward failures %q, want 0", v)
	}
}
