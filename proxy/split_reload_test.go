package proxy

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/infera/infera/config"
	"github.com/valyala/fasthttp"
)

// A request that read a config with the split proxy on and reaches its
// dispatch after a reload turned it off (or removed the entry it was
// routed to) goes to the local fleet, where the config in force sends it:
// it was answered 503 no_upstreams, the local engines idle.
func TestARequestRoutedToASplitEntryAReloadRemovedIsServedLocally(t *testing.T) {
	for _, tc := range []struct {
		name   string
		reload func(c *config.Config)
	}{
		{"split proxy disabled", func(c *config.Config) { c.SplitProxy.Enabled = false }},
		{"entry removed", func(c *config.Config) {
			c.SplitProxy.Proxies = []config.Proxy{{Local: true}}
		}},
		{"local entry disabled", func(c *config.Config) {
			c.SplitProxy.Proxies = []config.Proxy{{Local: true, Status: config.ProxyDisabled}, {Name: "b", Address: deadURL(t), ModelRules: []string{"x"}}}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hold := make(chan struct{})
			cls := startUpstream(t, func(ctx *fasthttp.RequestCtx) {
				if strings.Contains(string(ctx.PostBody()), "hold me") {
					<-hold
				}
				ctx.SetBodyString(`{"tier":"L3"}`)
			})
			local := startUpstream(t, okHandler)
			ext := startUpstream(t, okHandler)
			cfg := splitConfig(config.SplitPrefix,
				config.Proxy{Local: true},
				config.Proxy{Name: "a", Address: ext.url, ModelRules: []string{"m"}},
			)
			cfg.SmartModelSelection = config.SmartModelSelection{Enabled: true, ClassifierURL: cls.url + "/v1/classify",
				TimeoutMS: 10000, FallbackTier: "L3", MatchModels: []string{"auto"},
				Tiers: config.TierModels{L1: "m", L2: "m", L3: "m"}, MaxTextBytes: 8192}
			r := startRouterWith(t, nil, cfg, nil, local.url)
			late := make(chan string, 1)
			go func() {
				resp, err := http.Post(r.url+"/v1/chat/completions", "application/json",
					strings.NewReader(`{"model":"auto","messages":[{"role":"user","content":"hold me"}],"max_tokens":4}`))
				if err != nil {
					late <- err.Error()
					return
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 {
					late <- resp.Status + " " + string(b)
					return
				}
				late <- ""
			}()
			waitFor(t, func() bool { return cls.hits.Load() == 1 }, "the request reached the classifier")
			c := *cfg
			c.SplitProxy.Proxies = append([]config.Proxy(nil), cfg.SplitProxy.Proxies...)
			tc.reload(&c)
			if err := c.Validate(); err != nil {
				t.Fatal(err)
			}
			r.store.Set(&c)
			close(hold)
			e := <-late
			if tc.name == "local entry disabled" {
				// The config in force sends nothing to the local fleet.
				if e == "" || local.hits.Load() != 0 {
					t.Fatalf("the local fleet, disabled, took the request: %q, %d", e, local.hits.Load())
				}
				return
			}
			if e != "" {
				t.Fatalf("the request routed to a before the reload: %s", e)
			}
			if local.hits.Load() != 1 || ext.hits.Load() != 0 {
				t.Fatalf("local served %d, the removed entry %d", local.hits.Load(), ext.hits.Load())
			}
		})
	}
}

// A /metrics scrape while reloads add and remove split entries reads each
// entry's gauges only once the entry is whole. They were registered
// before the entry's worker was set: a scrape in between read it
// unsynchronized (a data race) and could find it nil, a panic in the
// /metrics handler, which has no recover.
func TestScrapesDuringReloadsThatAddSplitEntriesSeeWholeEntries(t *testing.T) {
	ext := startUpstream(t, okHandler)
	with := splitConfig(config.SplitWeight,
		config.Proxy{Local: true, Weight: 1},
		config.Proxy{Name: "a", Address: ext.url, Weight: 1},
	)
	without := *with
	without.SplitProxy.Enabled = false
	r := startRouterWith(t, nil, with, nil, ext.url)
	stop := make(chan struct{})
	scraped := make(chan int)
	go func() {
		n := 0
		defer func() { scraped <- n }()
		for {
			select {
			case <-stop:
				return
			default:
			}
			resp, err := http.Get(r.url + "/metrics")
			if err != nil {
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			n++
		}
	}()
	for i := 0; i < 2000; i++ {
		if i%2 == 0 {
			r.store.Set(&without)
		} else {
			r.store.Set(with)
		}
	}
	close(stop)
	if n := <-scraped; n == 0 {
		t.Fatal("no scrape answered")
	}
}
