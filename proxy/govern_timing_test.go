package proxy

import (
	"context"
	"fmt"
	"syscall"
	"testing"

	"github.com/VictoriaMetrics/metrics"
	"github.com/infera/infera/fleet"
	"github.com/infera/infera/govern"
	"github.com/infera/infera/internal/testsrv"
	"github.com/infera/infera/sched"
	"github.com/redis/go-redis/v9"
	"github.com/valyala/fasthttp"
)

// allChecks enables every governance rule with limits no benchmark
// reaches: the allowed period covers the whole week, four quota windows,
// user concurrency, RPM and TPM, and the overall and prefill seats of two
// engine instances.
const allChecks = `{
	"rate_limit": {"scope": "instance", "overall_concurrency": 100000, "prefill_concurrency": 100000},
	"user_limit": {"templates": [{"name": "t", "default": true,
		"periods": {"enabled": true, "segments": [{"start": "00:00", "end": "23:59"}]},
		"quota": {"enabled": true, "weights": {"input": 1, "output": 2, "cached": 0.1}, "windows": [
			{"period": "5h", "max_requests": 1000000000000, "max_tokens": 1000000000000},
			{"period": "day", "max_requests": 1000000000000, "max_tokens": 1000000000000},
			{"period": "week", "max_requests": 1000000000000, "max_tokens": 1000000000000},
			{"period": "month", "max_requests": 1000000000000, "max_tokens": 1000000000000}]},
		"concurrency": {"enabled": true, "limit": 100000},
		"rate": {"enabled": true, "rpm": 1000000000000, "tpm": 1000000000000}}]},
	"users": [{"name": "bench", "keys": [%q], "models": ["other-model", "m*"]}]}`

// startGovernedBench starts a router with every check on in front of two
// upstreams answering with usage; state is "" (in process) or a Redis URL.
// It returns the router and the user's key.
func startGovernedBench(t testing.TB, policy, state string) (*testRouter, string) {
	key, hash := mintKey(t)
	cfg := govConfig(t, fmt.Sprintf(allChecks, hash))
	g, err := govern.New(govern.Options{State: state})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Close() })
	if err := g.Apply(cfg); err != nil {
		t.Fatal(err)
	}
	f := defaultFlags()
	f.RouterPolicy = policy
	a, b := startUpstream(t, okHandler), startUpstream(t, okHandler)
	return startRouterGov(t, f, cfg, g, a.url, b.url), key
}

// BenchmarkGovernNonStream is BenchmarkProxyNonStream with every
// governance check passing, counters in process. Compare side by side
// with BenchmarkGovernNonStreamNoLimits (the same two upstreams, no
// governance): the difference is the admission path's cost per request.
func BenchmarkGovernNonStream(b *testing.B) {
	r, key := startGovernedBench(b, "round-robin", "")
	benchGoverned(b, r.url, key)
}

// BenchmarkGovernNonStreamNoLimits is the baseline of BenchmarkGovernNonStream.
func BenchmarkGovernNonStreamNoLimits(b *testing.B) {
	a, c := startUpstream(b, okHandler), startUpstream(b, okHandler)
	r := startRouter(b, nil, nil, a.url, c.url)
	benchGoverned(b, r.url, "")
}

// BenchmarkGovernNonStreamRedis is BenchmarkGovernNonStream with the
// counters in a real redis-server on loopback: one round trip per request
// (admission and seat in one script; the previous request's ends ride in
// the same pipeline).
func BenchmarkGovernNonStreamRedis(b *testing.B) {
	rd := testsrv.StartRedis(b)
	r, key := startGovernedBench(b, "round-robin", rd.URL)
	benchGoverned(b, r.url, key)
}

func benchGoverned(b *testing.B, url, key string) {
	hc, req := benchClient(b, url, false)
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp := fasthttp.AcquireResponse()
	for i := 0; i < 100; i++ { // warm pools and connections
		if err := hc.Do(req, resp); err != nil || resp.StatusCode() != 200 {
			b.Fatal(err, resp.StatusCode(), string(resp.Body()))
		}
	}
	b.ReportAllocs()
	t0 := stateTrips()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := hc.Do(req, resp); err != nil || resp.StatusCode() != 200 {
			b.Fatal(err, resp.StatusCode(), string(resp.Body()))
		}
	}
	b.StopTimer()
	if t := stateTrips() - t0; t > 0 {
		b.ReportMetric(float64(t)/float64(b.N), "trips/op")
	}
}

// stateTrips is the governance's round trips to Redis so far.
func stateTrips() uint64 {
	return metrics.GetOrCreateCounter("infera_governance_state_round_trips_total").Get()
}

// admissionPath is what the router does for one request besides HTTP and
// the engine: authenticate, admit the user (after parsing), pick a worker
// with a seat (the scheduler with its candidate filter, the seat attached
// to the lease), first token, end of the attempt, end of the request.
func admissionPath(b *testing.B, s *Server, ctx *fasthttp.RequestCtx) {
	user, ok := s.authenticate(ctx)
	if !ok {
		b.Fatal("not authenticated")
	}
	rs := s.acquireState()
	if n := len(s.sched.Fleet.View().All); cap(rs.scratch) < n {
		rs.scratch = make([]*fleet.Worker, 0, 2*n)
	}
	rs.gov.user = user
	r := &rs.sreq
	r.Model, r.MaxTokens, r.PromptTokens = benchModel, 100, 200
	cfg := s.store.Load()
	if !s.admit(ctx, cfg, rs) {
		b.Fatal("not admitted")
	}
	if err := s.acquire(cfg, rs, &rs.lease, &rs.gov.seat); err != nil {
		b.Fatal(err)
	}
	rs.lease.FirstToken()
	rs.gov.committed(200)
	rs.usage = usage{usageState: usageState{prompt: 200, cached: 150, completion: 80, seen: true}}
	rs.lease.Done(sched.OutcomeSuccess)
	s.releaseState(rs, endComplete)
}

var benchModel = []byte("m")

func benchAdmissionPath(b *testing.B, state string, governed bool) {
	var r *testRouter
	key := ""
	if governed {
		r, key = startGovernedBench(b, "round-robin", state)
	} else {
		a, c := startUpstream(b, okHandler), startUpstream(b, okHandler)
		r = startRouter(b, nil, nil, a.url, c.url)
	}
	ctx := &fasthttp.RequestCtx{}
	ctx.Request.Header.SetMethod("POST")
	if key != "" {
		ctx.Request.Header.Set("Authorization", "Bearer "+key)
	}
	for i := 0; i < 100; i++ {
		admissionPath(b, r.srv, ctx)
	}
	b.ReportAllocs()
	c0, t0 := cpuTime(), stateTrips()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		admissionPath(b, r.srv, ctx)
	}
	b.StopTimer()
	if t := stateTrips() - t0; t > 0 {
		b.ReportMetric(float64(t)/float64(b.N), "trips/op")
	}
	// The process's CPU time per request: unlike ns/op, it does not grow
	// while other work on a shared machine holds the CPU.
	b.ReportMetric(float64(cpuTime()-c0)/float64(b.N), "cpu-ns/op")
}

// cpuTime is the process's user and system CPU time in nanoseconds.
func cpuTime() int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}

// BenchmarkAdmissionPathNoLimits is the router's own per-request path
// without governance (no users, no limits): authentication of an open
// router, the scheduler's pick and lease, its end. The baseline of
// BenchmarkAdmissionPathAllChecks.
func BenchmarkAdmissionPathNoLimits(b *testing.B) { benchAdmissionPath(b, "", false) }

// BenchmarkAdmissionPathAllChecks is the same path with a request passing
// every governance check, counters in process: the user key identified
// (salted SHA-256), the template's period, four quota windows, concurrency,
// RPM and TPM, two seat counters on the scheduler's choice (through the
// candidate filter), first token and the reconciliation with usage.
func BenchmarkAdmissionPathAllChecks(b *testing.B) { benchAdmissionPath(b, "", true) }

// BenchmarkAdmissionPathRedis is BenchmarkAdmissionPathAllChecks with the
// counters in a real redis-server on loopback.
func BenchmarkAdmissionPathRedis(b *testing.B) {
	rd := testsrv.StartRedis(b)
	benchAdmissionPath(b, rd.URL, true)
}

// BenchmarkRedisPing is one bare round trip to a local redis-server: the
// unit the Redis benchmarks above are measured in.
func BenchmarkRedisPing(b *testing.B) {
	rd := testsrv.StartRedis(b)
	c := redis.NewClient(&redis.Options{Addr: rd.Addr})
	b.Cleanup(func() { c.Close() })
	ctx := context.Background()
	for i := 0; i < 100; i++ {
		c.Ping(ctx)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := c.Ping(ctx).Err(); err != nil {
			b.Fatal(err)
		}
	}
}
