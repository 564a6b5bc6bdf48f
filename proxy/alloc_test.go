//go:build !race

package proxy

import (
	"testing"

	"github.com/valyala/fasthttp"
)

// TestNonStreamZeroAlloc proves the steady-state non-streaming request path
// (client -> router -> upstream -> router -> client, all in this process)
// allocates nothing per request.
func TestNonStreamZeroAlloc(t *testing.T) {
	up := startUpstream(t, okHandler)
	r := startRouter(t, nil, nil, up.url)
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
	if n := testing.AllocsPerRun(2000, do); n > 0.05 {
		t.Fatalf("%.2f allocs per proxied request, want 0", n)
	}
}
