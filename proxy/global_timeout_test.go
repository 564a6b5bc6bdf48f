package proxy

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
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

// A member region that answers its capacity polls but never answers a
// forwarded request stays out for global_scheduling.forward_failure_backoff_ms
// after a failed forward, whatever its polls say, and is then tried with
// one request: under steady traffic it holds about one request per backoff
// window. Its good polls used to readmit it a poll interval after each
// failure, so every poll interval another request waited out the forward
// bound on it (here up to --breaker-failure-threshold of them before its
// breaker opened; one per poll with the breaker off). A member that recovers
// is used again once its trial succeeds.
func TestAMemberWhoseForwardsFailStaysOutForItsBackoffDespiteGoodPolls(t *testing.T) {
	for _, threshold := range []int{3, 0} {
		t.Run(fmt.Sprintf("breaker_threshold_%d", threshold), func(t *testing.T) {
			var healthy atomic.Bool
			release := make(chan struct{})
			eng := startUpstream(t, func(ctx *fasthttp.RequestCtx) {
				if healthy.Load() {
					okHandler(ctx)
					return
				}
				select {
				case <-release:
				case <-time.After(10 * time.Second):
				}
			})
			t.Cleanup(func() { close(release) }) // before the servers stop (LIFO)
			// b reports the most room (no limit: 256), c 100 seats.
			b := startRouterWith(t, nil, config.Default(), nil, eng.url)
			engC := startUpstream(t, okHandler)
			cfgC := config.Default()
			cfgC.RateLimit.OverallConcurrency = 100
			c := startRouterWith(t, nil, cfgC, nil, engC.url)

			cfgA := globalConfig(config.Member{Name: "b", URL: b.url}, config.Member{Name: "c", URL: c.url})
			g := &cfgA.GlobalScheduling
			g.ForwardNonStreamFirstByteMS = 150
			g.ForwardFailureBackoffMS, g.ForwardFailureMaxBackoffMS = 1500, 1500
			pa := startPoller(t, g)
			fa := defaultFlags()
			fa.BreakerFailureThreshold = threshold
			a := startRouterWith(t, fa, cfgA, func(o *Options) { o.Poller = pa }, deadURL(t))
			a.fl.Remove("w0") // no local worker: every request is forwarded
			waitFor(t, func() bool {
				_, _, ok1 := pa.Members()[0].Report()
				_, _, ok2 := pa.Members()[1].Report()
				return ok1 && ok2
			}, "A's reports of b and c")

			cl := &http.Client{Timeout: 5 * time.Second}
			send := func() string {
				t.Helper()
				resp, err := cl.Post(a.url+"/v1/chat/completions", "application/json", strings.NewReader(chatBody))
				if err != nil {
					t.Fatal(err)
				}
				got, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 {
					t.Fatalf("%d %s", resp.StatusCode, got)
				}
				return resp.Header.Get("X-Infera-Upstream")
			}
			// Steady traffic for 2 s (b's polls come every 20 ms): b is
			// tried first, then again once its backoff (1.5 s) is over.
			start := time.Now()
			for i := 0; i < 400 && time.Since(start) < 2*time.Second; i++ {
				send()
				time.Sleep(10 * time.Millisecond)
			}
			if n := eng.hits.Load(); n < 1 || n > 2 {
				t.Fatalf("the hung member took %d requests in 2 s of traffic, want 1 and its trial after the 1.5 s backoff", n)
			}
			// Recovered: its next trial succeeds and it takes the traffic
			// again (it reports the most room).
			healthy.Store(true)
			deadline := time.Now().Add(5 * time.Second)
			for send() != "global:b" {
				if time.Now().After(deadline) {
					t.Fatal("the recovered member was not used again")
				}
				time.Sleep(20 * time.Millisecond)
			}
			for i := 0; i < 5; i++ {
				if got := send(); got != "global:b" {
					t.Fatalf("after its trial, request %d went to %q", i, got)
				}
			}
		})
	}
}

// A member that answers its capacity polls but hangs on forwarded requests
// is skipped for new requests once a forward has waited
// forward_stall_ms for its first byte with none answered, long before the
// forward's own bound; once it answers again it takes requests again. It
// took every request its report had room for until the first forward
// reached its bound (here 10 s; 30 s for a stream, 300 s otherwise by
// default), each good poll making room again.
func TestAStalledMemberTakesNoNewForwardsUntilItAnswers(t *testing.T) {
	var healthy atomic.Bool
	release := make(chan struct{})
	hung := startUpstream(t, func(ctx *fasthttp.RequestCtx) {
		if !healthy.Load() {
			select {
			case <-release:
			case <-time.After(15 * time.Second):
			}
		}
		okHandler(ctx)
	})
	t.Cleanup(func() {
		if !healthy.Swap(true) {
			close(release)
		}
	}) // before the servers stop (LIFO)
	// b reports the most room (no limit: 256 per worker), c 100 seats.
	b := startRouterWith(t, nil, config.Default(), nil, hung.url)
	engC := startUpstream(t, okHandler)
	cfgC := config.Default()
	cfgC.RateLimit.OverallConcurrency = 100
	c := startRouterWith(t, nil, cfgC, nil, engC.url)

	cfgA := globalConfig(config.Member{Name: "b", URL: b.url}, config.Member{Name: "c", URL: c.url})
	g := &cfgA.GlobalScheduling
	g.PollIntervalMS = 20 // b's good polls keep coming
	g.ForwardNonStreamFirstByteMS = 10000
	g.ForwardStallMS = 200
	pa := startPoller(t, g)
	a := startRouterWith(t, nil, cfgA, func(o *Options) { o.Poller = pa }, deadURL(t))
	a.fl.Remove("w0") // no local worker: every request is forwarded
	waitFor(t, func() bool {
		_, _, ok1 := pa.Members()[0].Report()
		_, _, ok2 := pa.Members()[1].Report()
		return ok1 && ok2
	}, "A's reports of b and c")

	send := func(cl *http.Client) (string, error) {
		resp, err := cl.Post(a.url+"/v1/chat/completions", "application/json", strings.NewReader(chatBody))
		if err != nil {
			return "", err
		}
		got, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || string(got) != okJSON {
			return "", fmt.Errorf("%d %s", resp.StatusCode, got)
		}
		return resp.Header.Get("X-Infera-Upstream"), nil
	}
	first := make(chan string, 1)
	go func() {
		up, err := send(&http.Client{Timeout: 20 * time.Second})
		if err != nil {
			up = err.Error()
		}
		first <- up
	}()
	waitFor(t, func() bool { return hung.hits.Load() == 1 }, "the first forward on the hung member")
	waitFor(t, func() bool {
		return metricValue(t, a.url, `infera_global_member_stalled{member="b"}`) == "1"
	}, "b stalled")
	cl := &http.Client{Timeout: 3 * time.Second}
	for i := range 5 {
		start := time.Now()
		up, err := send(cl)
		if err != nil || up != "global:c" || time.Since(start) > time.Second {
			t.Fatalf("request %d after b stalled: %q %v in %v (the hung member's engine got %d)", i, up, err, time.Since(start), hung.hits.Load())
		}
	}
	if n := hung.hits.Load(); n != 1 {
		t.Fatalf("the hung member's engine got %d requests, want 1", n)
	}
	// b answers its forward: it takes requests again (it reports the most
	// room), and was never put out for a backoff.
	healthy.Store(true)
	close(release)
	if up := <-first; up != "global:b" {
		t.Fatalf("the first request: %q, want global:b", up)
	}
	if up, err := send(cl); err != nil || up != "global:b" {
		t.Fatalf("after b answered: %q %v, want global:b", up, err)
	}
	if v := metricValue(t, a.url, `infera_global_member_stalled{member="b"}`); v != "0" {
		t.Fatalf("b's stalled gauge %q after it answered", v)
	}
}
