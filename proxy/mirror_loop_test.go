package proxy

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/infera/infera/config"
	"github.com/infera/infera/mirror"
	"github.com/valyala/fasthttp"
)

// Two gateways that each mirror to the other bounced every copy back and
// forth until their queues dropped them: the mirror marks its copies
// (X-Infera-Mirror) but nothing read the mark. A request carrying it is
// served as any other and never mirrored again.
func TestAMirroredCopyIsNotMirroredAgain(t *testing.T) {
	var copies atomic.Int32
	target := startUpstream(t, func(ctx *fasthttp.RequestCtx) {
		copies.Add(1)
		okHandler(ctx)
	})
	up := startUpstream(t, okHandler)
	cfg := config.Default()
	cfg.Mirror = config.Mirror{Enabled: true, TargetAddress: target.url, SamplingRatio: 100,
		TimeoutMS: 5000, QueueSize: 16, Concurrency: 2, MaxBufferBytes: config.DefaultMirrorBufferBytes}
	m := mirror.New(mirror.Options{})
	t.Cleanup(m.Close)
	r := startRouterWith(t, nil, cfg, func(o *Options) { o.Mirror = m }, up.url)

	resp, b := postWith(t, r.url+"/v1/chat/completions", chatBody, map[string]string{mirror.MirrorHeader: "1"})
	if resp.StatusCode != 200 || b != okJSON {
		t.Fatalf("a mirrored copy: %d %s", resp.StatusCode, b)
	}
	if resp, b := postWith(t, r.url+"/v1/chat/completions", chatBody, nil); resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	waitFor(t, func() bool { return copies.Load() >= 1 }, "the client request's copy")
	time.Sleep(100 * time.Millisecond) // a second copy, if any, would be on its way
	if n := copies.Load(); n != 1 {
		t.Fatalf("the target got %d copies, want 1 (the client request's only)", n)
	}
	if up.hits.Load() != 2 {
		t.Fatalf("the engine served %d requests", up.hits.Load())
	}
}
