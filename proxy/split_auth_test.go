package proxy

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/infera/infera/config"
	"github.com/infera/infera/fleet"
	upstreams "github.com/infera/infera/upstream"
	"github.com/valyala/fasthttp"
)

// An external upstream that refuses the gateway's own credentials (401,
// 403, 407: a revoked or mistyped upstream key) had its answer relayed: the
// client, whose own key was fine, was told its key was wrong, the failover
// entry was never tried, and the body reached the client with whatever the
// upstream echoed of the gateway's key (OpenAI's 401 names the key it got).
// Now it is the upstream's fault: the next entry is tried, the breaker
// counts it, and a client with no entry left gets infera's own 502.
func TestAnExternalUpstreamRefusingTheGatewaysKeyFailsOverAndNeverEchoesIt(t *testing.T) {
	for _, status := range []int{401, 403, 407} {
		refusing := startUpstream(t, func(ctx *fasthttp.RequestCtx) {
			ctx.SetStatusCode(status)
			ctx.SetContentType("application/json")
			ctx.SetBodyString(`{"error":{"message":"Incorrect API key provided: ` + string(ctx.Request.Header.Peek("Authorization")) + `","type":"invalid_request_error","code":"invalid_api_key"}}`)
		})
		good := startUpstream(t, okHandler)
		cfg := splitConfig(config.SplitPrefix,
			config.Proxy{Local: true},
			config.Proxy{Name: "refusing", Address: refusing.url, APIKey: config.NewSecret("sk-revoked-123"), ModelRules: []string{"gpt"}},
			config.Proxy{Name: "good", Address: good.url, Failover: true},
		)
		r := startRouterWith(t, nil, cfg, nil, deadURL(t))
		for i := 0; i < 4; i++ {
			resp, b := postWith(t, r.url+"/v1/chat/completions", gptBody, nil)
			if resp.StatusCode != 200 || resp.Header.Get("X-Infera-Upstream") != "split:good" {
				t.Fatalf("%d: request %d: %d %s %s", status, i, resp.StatusCode, resp.Header.Get("X-Infera-Upstream"), b)
			}
		}
		if refusing.hits.Load() != 3 || good.hits.Load() != 4 {
			t.Fatalf("%d: refusing saw %d (want the breaker threshold, 3), good %d", status, refusing.hits.Load(), good.hits.Load())
		}
		if u := r.srv.ext.splitTable(&r.store.Load().SplitProxy).ups[1]; u.w.Breaker.State() != fleet.BreakerOpen {
			t.Fatalf("%d: the refusing upstream's breaker is %d", status, u.w.Breaker.State())
		}

		// The only entry: infera's own error, nothing of the upstream's.
		only := splitConfig(config.SplitPrefix,
			config.Proxy{Local: true},
			config.Proxy{Name: "refusing", Address: refusing.url, APIKey: config.NewSecret("sk-revoked-123"), ModelRules: []string{"gpt"}},
		)
		r1 := startRouterWith(t, nil, only, nil, deadURL(t))
		resp, b := postWith(t, r1.url+"/v1/chat/completions", gptBody, nil)
		if resp.StatusCode != 502 || strings.Contains(b, "sk-revoked") || strings.Contains(b, "Incorrect API key") || !strings.Contains(b, "upstream_auth_error") {
			t.Fatalf("%d: only entry: %d %s", status, resp.StatusCode, b)
		}
	}
}

// A global scheduling member that refuses the gateway's key for forwards
// (here: a key that may read capacity but not use the model) is treated as
// an external entry refusing it is: 502 upstream_auth_error, nothing of
// its body.
func TestAMemberRefusingTheGatewaysKeyIsNotRelayed(t *testing.T) {
	member := startUpstream(t, func(ctx *fasthttp.RequestCtx) {
		if string(ctx.Path()) == upstreams.CapacityPath {
			ctx.SetBodyString(`{"free":8,"inflight":0,"queued":0,"workers":1,"models":[{"name":"m","free":8}]}`)
			return
		}
		ctx.SetStatusCode(403)
		ctx.SetBodyString(`{"error":{"message":"key ` + string(ctx.Request.Header.Peek("Authorization")) + ` may not use model m"}}`)
	})
	cfg := globalConfig(config.Member{Name: "b", URL: member.url, APIKey: config.NewSecret("key-for-b")})
	p := startPoller(t, &cfg.GlobalScheduling)
	r := startRouterWith(t, nil, cfg, func(o *Options) { o.Poller = p }, deadURL(t))
	r.fl.Remove("w0")
	waitFor(t, func() bool { _, _, ok := p.Members()[0].Report(); return ok }, "the member's report")
	resp, b := postWith(t, r.url+"/v1/chat/completions", chatBody, nil)
	if resp.StatusCode != 502 || strings.Contains(b, "key-for-b") || !strings.Contains(b, "upstream_auth_error") {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	if member.hits.Load() < 2 { // a poll and the forward
		t.Fatalf("the member saw %d requests", member.hits.Load())
	}
}

// An external upstream's other error answers (400, 429, 5xx: relayed as
// the upstream sent them, directly or as the last failure) never carry the
// gateway's key to the client, though an upstream echoes it.
func TestAnExternalUpstreamsErrorAnswerNeverEchoesTheGatewaysKey(t *testing.T) {
	for _, status := range []int{400, 429, 500} {
		echo := startUpstream(t, func(ctx *fasthttp.RequestCtx) {
			ctx.SetStatusCode(status)
			ctx.SetContentType("application/json")
			ctx.SetBodyString(`{"error":{"message":"bad request with ` + string(ctx.Request.Header.Peek("Authorization")) + `, again sk-echo-9876","type":"x"}}`)
		})
		cfg := splitConfig(config.SplitPrefix,
			config.Proxy{Local: true},
			config.Proxy{Name: "echo", Address: echo.url, APIKey: config.NewSecret("sk-echo-9876"), ModelRules: []string{"gpt"}},
		)
		r := startRouterWith(t, nil, cfg, nil, deadURL(t))
		resp, b := postWith(t, r.url+"/v1/chat/completions", gptBody, nil)
		if resp.StatusCode != status || strings.Contains(b, "sk-echo-9876") || !strings.Contains(b, "Bearer ***, again ***") {
			t.Fatalf("%d: %d %s", status, resp.StatusCode, b)
		}
	}
}

// An upstream whose JSON encoder escapes characters of the echoed key
// (Go's encoding/json writes & as \u0026, .NET's + as \u002B, PHP's / as
// \/) still has the key scrubbed: the client decodes the escapes and would
// read the key.
func TestAnEscapedEchoOfTheGatewaysKeyIsScrubbed(t *testing.T) {
	const key = "sk-Ab/Cd+Ef&Gh"
	for name, echoed := range map[string]string{
		"go":         `sk-Ab/Cd+Ef\u0026Gh`,
		"dotnet":     `sk-Ab/Cd\u002BEf\u0026Gh`,
		"php":        `sk-Ab\/Cd+Ef&Gh`,
		"every char": `\u0073\u006b\u002d\u0041\u0062\u002f\u0043\u0064\u002b\u0045\u0066\u0026\u0047\u0068`,
	} {
		echo := startUpstream(t, func(ctx *fasthttp.RequestCtx) {
			if string(ctx.Request.Header.Peek("Authorization")) != "Bearer "+key {
				ctx.SetStatusCode(500)
				return
			}
			ctx.SetStatusCode(400)
			ctx.SetContentType("application/json")
			ctx.SetBodyString(`{"error":{"message":"Incorrect API key provided: ` + echoed + ` (\u0041)","type":"invalid_request_error"}}`)
		})
		cfg := splitConfig(config.SplitPrefix,
			config.Proxy{Local: true},
			config.Proxy{Name: "echo", Address: echo.url, APIKey: config.NewSecret(key), ModelRules: []string{"gpt"}},
		)
		r := startRouterWith(t, nil, cfg, nil, deadURL(t))
		resp, b := postWith(t, r.url+"/v1/chat/completions", gptBody, nil)
		var v struct {
			Error struct {
				Message string `json:"message"`
			} `json:"error"`
		}
		if err := json.Unmarshal([]byte(b), &v); err != nil || resp.StatusCode != 400 ||
			v.Error.Message != "Incorrect API key provided: *** (A)" {
			t.Fatalf("%s: %d %s (message %q, %v)", name, resp.StatusCode, b, v.Error.Message, err)
		}
	}
}
