package proxy

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/infera/infera/config"
	"github.com/infera/infera/fleet"
	"github.com/valyala/fasthttp"
)

// A member region that answers its capacity polls but hangs on forwarded
// requests holds a forwarded request only for the forward's own first-byte
// bound (forward_stream_first_packet_ms for a stream,
// forward_non_stream_first_byte_ms otherwise): then the request fails over
// to the next member, and the hanging member is dropped as a failed poll
// drops it. Forwards had only the general timeouts (300 s to a stream's
// first packet, 900 s for a non-streamed answer), so each client waited
// that long on the hung member.
func TestAForwardToAMemberThatHangsFailsOverAfterItsFirstByteBound(t *testing.T) {
	release := make(chan struct{})
	hung := startUpstream(t, func(ctx *fasthttp.RequestCtx) {
		select {
		case <-release:
		case <-time.After(20 * time.Second):
		}
		okHandler(ctx)
	})
	t.Cleanup(func() { close(release) }) // before the servers stop (LIFO)
	// b reports the most room (no limit: 256 per worker), c two seats.
	b := startRouterWith(t, nil, config.Default(), nil, hung.url)
	engC := startUpstream(t, func(ctx *fasthttp.RequestCtx) {
		if strings.Contains(string(ctx.PostBody()), `"stream":true`) {
			(&sseUpstream{n: 2}).handler(ctx)
			return
		}
		okHandler(ctx)
	})
	cfgC := config.Default()
	cfgC.RateLimit.OverallConcurrency = 2
	c := startRouterWith(t, nil, cfgC, nil, engC.url)

	cfgA := globalConfig(config.Member{Name: "b", URL: b.url}, config.Member{Name: "c", URL: c.url})
	cfgA.GlobalScheduling.PollIntervalMS, cfgA.GlobalScheduling.StaleAfterMS = 60000, 120000 // one poll in this test
	cfgA.GlobalScheduling.ForwardStreamFirstPacketMS = 300
	cfgA.GlobalScheduling.ForwardNonStreamFirstByteMS = 300
	pa := startPoller(t, &cfgA.GlobalScheduling)
	a := startRouterWith(t, nil, cfgA, func(o *Options) { o.Poller = pa }, deadURL(t))
	a.fl.Remove("w0")
	engA := startUpstream(t, okHandler)
	if err := a.fl.Upsert(fleet.Record{ID: "wa", URL: engA.url, Models: []string{"a-only"}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool {
		_, _, ok1 := pa.Members()[0].Report()
		_, _, ok2 := pa.Members()[1].Report()
		return ok1 && ok2
	}, "A's reports of b and c")

	cl := &http.Client{Timeout: 5 * time.Second}
	send := func(body string) (*http.Response, string, time.Duration) {
		t.Helper()
		start := time.Now()
		resp, err := cl.Post(a.url+"/v1/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatalf("after %v: %v", time.Since(start), err)
		}
		got, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp, string(got), time.Since(start)
	}
	resp, body, took := send(streamBody)
	if resp.StatusCode != 200 || resp.Header.Get("X-Infera-Upstream") != "global:c" || !strings.Contains(body, "[DONE]") {
		t.Fatalf("stream: %d %v %s", resp.StatusCode, resp.Header, body)
	}
	if took < 300*time.Millisecond || took > 3*time.Second {
		t.Fatalf("stream answered in %v, want the 300 ms bound and a little", took)
	}
	if hung.hits.Load() != 1 {
		t.Fatalf("the hung member's engine got %d requests, want 1", hung.hits.Load())
	}
	if v := metricValue(t, a.url, `infera_global_forward_failures_total{member="b"}`); v != "1" {
		t.Fatalf("b's forward failures %q, want 1", v)
	}
	// Dropped until its next good poll, as a failed poll drops it: the
	// next request goes to c at once.
	if v := metricValue(t, a.url, `infera_global_member_free{member="b"}`); v != "-1" {
		t.Fatalf("b's free capacity as Pick sees it: %q, want -1", v)
	}
	resp, body, took = send(chatBody)
	if resp.StatusCode != 200 || resp.Header.Get("X-Infera-Upstream") != "global:c" || took > time.Second || hung.hits.Load() != 1 {
		t.Fatalf("next request: %d %s in %v (hung member's engine %d)", resp.StatusCode, body, took, hung.hits.Load())
	}

	// A non-streamed request has its own bound: b back in the running
	// (its next poll), it is tried first, and dropped after 300 ms.
	cfgA2 := *cfgA
	cfgA2.GlobalScheduling.PollIntervalMS = 20
	a.store.Set(&cfgA2)
	if err := pa.Update(&cfgA2.GlobalScheduling); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return metricValue(t, a.url, `infera_global_member_free{member="b"}`) != "-1" }, "b polled again")
	resp, body, took = send(chatBody)
	if resp.StatusCode != 200 || resp.Header.Get("X-Infera-Upstream") != "global:c" || body != okJSON {
		t.Fatalf("non-stream: %d %v %s", resp.StatusCode, resp.Header, body)
	}
	if took < 300*time.Millisecond || took > 3*time.Second || hung.hits.Load() != 2 {
		t.Fatalf("non-stream answered in %v (hung member's engine %d), want the 300 ms bound and a little", took, hung.hits.Load())
	}
}
