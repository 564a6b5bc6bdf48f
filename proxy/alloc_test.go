//go:build !race

package proxy

import (
	"testing"

	"github.com/valyala/fasthttp"
)

// TestNonStreamZeroAlloc proves the steady-state non-streaming request path
// (client -> router -> upstream -> router -> client, all in this process)
// allocates nothing per request in infera's code. The one allocation the
// bound allows is fasthttp's own: with StreamRequestBody (bodies are read
// incrementally, after authentication) its connection loop discards the
// rest of every request body through io.CopyN, which allocates one 24-byte
// io.LimitedReader (fasthttp v1.78 server.go, requestStream.discard).
func TestNonStreamZeroAlloc(t *testing.T) {
	for _, policy := range []string{"round-robin", "kv-aware"} {
		t.Run(policy, func(t *testing.T) { testZeroAlloc(t, policy) })
	}
}

// testZeroAlloc: under kv-aware (the default policy) the chat prompt is also
// decoded, rendered, tokenized, hashed and matched against the KV index.
func testZeroAlloc(t *testing.T, policy string) {
	up := startUpstream(t, okHandler)
	f := defaultFlags()
	f.RouterPolicy = policy
	r := startRouter(t, f, nil, up.url)
	hc, req := benchClient(t, r.url, false)
	resp := fasthttp.AcquireResponse()
	do := func() {
		if err := hc.Do(req, resp); err != nil || resp.StatusCode() != 200 {
			t.Fatal(err, resp.StatusCode())
		}
	}
	for i := 0; i < 200; i++ { // warm pools and connections
		do()
	}
	if n := testing.AllocsPerRun(2000, do); n > 1.05 {
		t.Fatalf("%.2f allocs per proxied request, want at most fasthttp's 1", n)
	}
}
