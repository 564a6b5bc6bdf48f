package proxy

import (
	"strings"
	"testing"

	"github.com/valyala/fasthttp"
)

// benchClient sends chat requests to a router over loopback.
func benchClient(b testing.TB, url string, stream bool) (*fasthttp.HostClient, *fasthttp.Request) {
	hc := &fasthttp.HostClient{Addr: strings.TrimPrefix(url, "http://"), MaxConns: 1024}
	req := fasthttp.AcquireRequest()
	req.SetRequestURI(url + "/v1/chat/completions")
	req.Header.SetMethod("POST")
	req.Header.SetContentType("application/json")
	if stream {
		req.SetBodyString(streamBody)
	} else {
		req.SetBodyString(chatBody)
	}
	return hc, req
}

// benchNonStream sends b.N small chat requests to url, reporting allocs.
func benchNonStream(b *testing.B, url string) { benchNonStreamBody(b, url, chatBody) }

// benchNonStreamBody sends b.N chat requests of body to url.
func benchNonStreamBody(b *testing.B, url, body string) {
	hc, req := benchClient(b, url, false)
	req.SetBodyString(body)
	resp := fasthttp.AcquireResponse()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := hc.Do(req, resp); err != nil || resp.StatusCode() != 200 {
			b.Fatal(err, resp.StatusCode())
		}
	}
}

// BenchmarkProxyNonStream measures one non-streaming request through the
// router, client, router and upstream all in this process: allocs/op counts
// all three (the fasthttp client and server are zero-alloc themselves).
func BenchmarkProxyNonStream(b *testing.B) {
	up := startUpstream(b, okHandler)
	r := startRouter(b, nil, nil, up.url)
	benchNonStream(b, r.url)
}

// BenchmarkProxyNonStreamKV is the same through the kv-aware path (the
// default policy): the chat prompt is rendered, tokenized and hashed.
func BenchmarkProxyNonStreamKV(b *testing.B) {
	up := startUpstream(b, okHandler)
	f := defaultFlags()
	f.RouterPolicy = "kv-aware"
	r := startRouter(b, f, nil, up.url)
	benchNonStream(b, r.url)
}

// BenchmarkDirectNonStream is the same load straight to the upstream.
func BenchmarkDirectNonStream(b *testing.B) {
	up := startUpstream(b, okHandler)
	benchNonStream(b, up.url)
}

// BenchmarkSSERelay relays a long stream of small events.
func BenchmarkSSERelay(b *testing.B) {
	const events = 1000
	su := &sseUpstream{n: events}
	up := startUpstream(b, su.handler)
	r := startRouter(b, nil, nil, up.url)
	hc, req := benchClient(b, r.url, true)
	resp := fasthttp.AcquireResponse()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := hc.Do(req, resp); err != nil || resp.StatusCode() != 200 {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(events*b.N)/b.Elapsed().Seconds(), "events/s")
}
