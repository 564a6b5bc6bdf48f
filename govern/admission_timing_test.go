package govern

import (
	"context"
	"testing"
)

// allChecksConfig enables every rule with limits no benchmark reaches: the
// allowed period covers the whole week, four quota windows, user
// concurrency, RPM and TPM, and the three seat counters.
const allChecksTemplate = `{"name":"t",
	"periods":{"enabled":true,"segments":[{"start":"00:00","end":"23:59"}]},
	"quota":{"enabled":true,"weights":{"input":1,"output":2,"cached":0.1},"windows":[
		{"period":"5h","max_requests":1000000000000,"max_tokens":1000000000000},
		{"period":"day","max_requests":1000000000000,"max_tokens":1000000000000},
		{"period":"week","max_requests":1000000000000,"max_tokens":1000000000000},
		{"period":"month","max_requests":1000000000000,"max_tokens":1000000000000}]},
	"concurrency":{"enabled":true,"limit":100000},
	"rate":{"enabled":true,"rpm":1000000000000,"tpm":1000000000000}}`

const allChecksRateLimit = `"rate_limit":{"overall_concurrency":100000,"prefill_concurrency":100000,"decode_concurrency":100000}`

var benchTargets = []Target{{Instance: "w1", Service: "s"}, {Instance: "w2", Service: "s"}}

// admissionCycle is what the proxy does for one request: identify the key,
// admit the user, take a seat, first token, end with usage.
func admissionCycle(g *Governor, key []byte) bool {
	u, rej := g.Identify(key)
	if rej != nil {
		return false
	}
	return admitCycle(g, u)
}

// admitCycle is admissionCycle after Identify.
func admitCycle(g *Governor, u *User) bool {
	tk, rej := g.Admit(context.Background(), u, Request{PromptTokens: 200, MaxTokens: 100})
	if rej != nil {
		return false
	}
	s, _, rej := g.TryAcquire(benchTargets, PhaseMixed)
	if rej != nil {
		tk.Done(Usage{})
		return false
	}
	tk.FirstToken()
	s.FirstToken()
	s.Done()
	tk.Done(Usage{PromptTokens: 200, CachedTokens: 150, CompletionTokens: 80, Known: true})
	return true
}

func benchAdmission(b *testing.B, g *Governor, key []byte) {
	u := identify(b, g, string(key))
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if !admitCycle(g, u) {
			b.Fatal("refused")
		}
	}
}

// BenchmarkAdmissionNoLimits is the path without governance: no users, no
// limits (Admit(nil) and a zero Seat).
func BenchmarkAdmissionNoLimits(b *testing.B) {
	g := newGov(b, Options{}, parseConfig(b, `{}`))
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		tk, _ := g.Admit(context.Background(), nil, Request{})
		s, _, _ := g.TryAcquire(benchTargets, PhaseMixed)
		tk.FirstToken()
		s.FirstToken()
		s.Done()
		tk.Done(Usage{})
	}
}

// BenchmarkIdentify is the key lookup and salted hash check alone.
func BenchmarkIdentify(b *testing.B) {
	key, hash := mintKey(b)
	g := newGov(b, Options{}, userConfig(b, hash, allChecksTemplate, ""))
	k := []byte(key)
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		if _, rej := g.Identify(k); rej != nil {
			b.Fatal(rej)
		}
	}
}

// BenchmarkAdmissionAllChecks is a request passing every enabled check, in
// process (admit, seat, first token, done), after Identify.
func BenchmarkAdmissionAllChecks(b *testing.B) {
	key, hash := mintKey(b)
	g := newGov(b, Options{}, userConfig(b, hash, allChecksTemplate, allChecksRateLimit))
	benchAdmission(b, g, []byte(key))
}

// BenchmarkRequestAllChecks is BenchmarkAdmissionAllChecks with Identify.
func BenchmarkRequestAllChecks(b *testing.B) {
	key, hash := mintKey(b)
	g := newGov(b, Options{}, userConfig(b, hash, allChecksTemplate, allChecksRateLimit))
	k := []byte(key)
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		if !admissionCycle(g, k) {
			b.Fatal("refused")
		}
	}
}

// BenchmarkAdmissionAllChecksParallel is the same from every core at once
// (one user: one contended user lock).
func BenchmarkAdmissionAllChecksParallel(b *testing.B) {
	key, hash := mintKey(b)
	g := newGov(b, Options{}, userConfig(b, hash, allChecksTemplate, allChecksRateLimit))
	k := []byte(key)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if !admissionCycle(g, k) {
				b.Error("refused")
				return
			}
		}
	})
}

// BenchmarkAdmissionAllChecksRedis is the same cycle with the counters in a
// local redis-server, through the separate Admit and TryAcquire: two round
// trips (the ends ride in the next one).
func BenchmarkAdmissionAllChecksRedis(b *testing.B) {
	rs := startRedis(b)
	key, hash := mintKey(b)
	g := newGov(b, Options{State: rs.url()}, userConfig(b, hash, allChecksTemplate, allChecksRateLimit))
	trips := mStateRoundTrips.Get()
	benchAdmission(b, g, []byte(key))
	b.ReportMetric(float64(mStateRoundTrips.Get()-trips)/float64(b.N), "trips/op")
}

// admitAcquireCycle is the router's cycle with Redis: the admission and
// the first seat in one step (AdmitAcquire), first token, the ends.
func admitAcquireCycle(g *Governor, u *User) bool {
	a := g.AdmitAcquire(u, Request{PromptTokens: 200, MaxTokens: 100}, benchTargets, PhaseMixed)
	if a.Refused != nil || a.Queue || a.SeatRefused != nil {
		return false
	}
	a.Ticket.FirstToken()
	a.Seat.FirstToken()
	a.Seat.Done()
	a.Ticket.Done(Usage{PromptTokens: 200, CachedTokens: 150, CompletionTokens: 80, Known: true})
	return true
}

// redisBenchUser returns a governor with every check on and its counters
// in a new redis-server, and its user, after one warm-up cycle.
func redisBenchUser(b *testing.B) (*Governor, *User) {
	rs := startRedis(b)
	key, hash := mintKey(b)
	g := newGov(b, Options{State: rs.url()}, userConfig(b, hash, allChecksTemplate, allChecksRateLimit))
	u := identify(b, g, key)
	admitAcquireCycle(g, u)
	return g, u
}

// BenchmarkAdmitAcquireRedis is a request passing every check with the
// counters in a local redis-server, as the router runs it: one round trip
// (admission and seat in one script, the previous request's ends in the
// same pipeline).
func BenchmarkAdmitAcquireRedis(b *testing.B) {
	g, u := redisBenchUser(b)
	trips := mStateRoundTrips.Get()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if !admitAcquireCycle(g, u) {
			b.Fatal("refused")
		}
	}
	b.ReportMetric(float64(mStateRoundTrips.Get()-trips)/float64(b.N), "trips/op")
}

// BenchmarkAdmitAcquireRedisParallel is the same from 32 goroutines at
// once: calls queued while a pipeline is out go together in the next one.
func BenchmarkAdmitAcquireRedisParallel(b *testing.B) {
	g, u := redisBenchUser(b)
	trips := mStateRoundTrips.Get()
	b.ReportAllocs()
	b.SetParallelism(16)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if !admitAcquireCycle(g, u) {
				b.Error("refused")
				return
			}
		}
	})
	b.ReportMetric(float64(mStateRoundTrips.Get()-trips)/float64(b.N), "trips/op")
}

// BenchmarkRedisPing is one bare round trip to the same redis-server, the
// floor of every Redis-backed step.
func BenchmarkRedisPing(b *testing.B) {
	rs := startRedis(b)
	c := rs.client(b)
	ctx := context.Background()
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		if err := c.Ping(ctx).Err(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkAdmitRedis is the user admission alone with Redis (one round
// trip) and its Done (one round trip).
func BenchmarkAdmitRedis(b *testing.B) {
	rs := startRedis(b)
	key, hash := mintKey(b)
	g := newGov(b, Options{State: rs.url()}, userConfig(b, hash, allChecksTemplate, ""))
	u := identify(b, g, key)
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		tk, rej := g.Admit(context.Background(), u, Request{PromptTokens: 200, MaxTokens: 100})
		if rej != nil {
			b.Fatal(rej)
		}
		tk.FirstToken()
		tk.Done(Usage{PromptTokens: 200, CompletionTokens: 80, Known: true})
	}
}
