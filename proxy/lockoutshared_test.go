package proxy

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/redis/go-redis/v9"

	"github.com/infera/infera/config"
	"github.com/infera/infera/govern"
	"github.com/infera/infera/internal/testsrv"
)

// sharedLockoutRouter starts a router with the lockout flags f whose
// governor keeps its state in the Redis at url; it returns the router and
// its governor.
func sharedLockoutRouter(t *testing.T, f *config.Serve, url, upstream string) (*testRouter, *govern.Governor) {
	t.Helper()
	g := newGovernorAt(t, url, config.Default())
	r := startRouterWith(t, f, nil, func(o *Options) { o.Governor = g }, upstream)
	return r, g
}

// waitStatus sends chat requests with key from ip to url until one answers
// want, for up to five seconds (a lockout another router began reaches
// this one through Redis's pub/sub; one missed is read again a second
// after the subscription is made anew), and returns the last answer.
func waitStatus(t *testing.T, ip, url, key string, want int) srcAnswer {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		a := chatFrom(t, ip, url, key)
		if a.status == want || time.Now().After(deadline) {
			return a
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Wrong keys from one address spread over two routers sharing Redis count
// together: the address is locked out on both once their sum reaches
// --auth-lockout-failures (each router alone saw half, and locked
// nothing), its right key refused on both; other addresses are served.
// The lockout began once (one router counts it). A right key costs no
// Redis round trip, nor does a refused request of a locked address.
func TestWrongKeysSpreadOverRoutersSharingRedisLockTheAddressOnEvery(t *testing.T) {
	rd := testsrv.StartRedis(t)
	up := startUpstream(t, okHandler)
	f := lockoutFlags(4, 30*time.Second)
	a, _ := sharedLockoutRouter(t, f, rd.URL, up.url)
	b, _ := sharedLockoutRouter(t, f, rd.URL, up.url)
	const guesser, other = "127.9.4.1", "127.9.4.2"
	locks := mLockouts.Get()
	for i := 0; i < 4; i++ {
		r := a
		if i%2 == 1 {
			r = b
		}
		if got := chatFrom(t, guesser, r.url, fmt.Sprintf("sk-guess-%d", i)); got.status != 401 {
			t.Fatalf("wrong key %d: %d %s", i+1, got.status, got.body)
		}
	}
	for name, r := range map[string]*testRouter{"the router of the last wrong key": b, "the other router": a} {
		got := waitStatus(t, guesser, r.url, f.APIKey, 429)
		if got.status != 429 || !strings.Contains(got.body, "auth_lockout") {
			t.Fatalf("%s answers the locked address's right key %d %s", name, got.status, got.body)
		}
		if ra, _ := strconv.Atoi(got.hdr.Get("Retry-After")); ra < 25 || ra > 30 {
			t.Fatalf("%s: Retry-After %q, want the rest of the 30 s lockout", name, got.hdr.Get("Retry-After"))
		}
		if got := chatFrom(t, other, r.url, f.APIKey); got.status != 200 {
			t.Fatalf("%s: another address got %d %s", name, got.status, got.body)
		}
	}
	if got := mLockouts.Get() - locks; got != 1 {
		t.Fatalf("%d lockouts begun, want 1", got)
	}
	trips := metrics.GetOrCreateCounter("infera_governance_state_round_trips_total")
	before := trips.Get()
	for _, r := range []*testRouter{a, b} {
		for i := 0; i < 5; i++ {
			if got := chatFrom(t, other, r.url, f.APIKey); got.status != 200 {
				t.Fatalf("a right key: %d %s", got.status, got.body)
			}
			if got := chatFrom(t, guesser, r.url, "sk-guess-more"); got.status != 429 {
				t.Fatalf("the locked address: %d %s", got.status, got.body)
			}
		}
	}
	if got := trips.Get() - before; got != 0 {
		t.Fatalf("right keys and a locked address's requests cost %d Redis round trips, want 0", got)
	}
}

// A router started while an address is locked out (a restart, or a new
// replica) refuses it from its first request, its right key included.
func TestARestartedRouterStillRefusesALockedAddress(t *testing.T) {
	rd := testsrv.StartRedis(t)
	up := startUpstream(t, okHandler)
	f := lockoutFlags(3, 30*time.Second)
	a, ga := sharedLockoutRouter(t, f, rd.URL, up.url)
	const guesser = "127.9.4.3"
	for i := 0; i < 3; i++ {
		chatFrom(t, guesser, a.url, fmt.Sprintf("sk-guess-%d", i))
	}
	if got := chatFrom(t, guesser, a.url, f.APIKey); got.status != 429 {
		t.Fatalf("not locked: %d %s", got.status, got.body)
	}
	a.srv.Shutdown()
	ga.Close()
	restarted, _ := sharedLockoutRouter(t, f, rd.URL, up.url)
	if got := chatFrom(t, guesser, restarted.url, f.APIKey); got.status != 429 || !strings.Contains(got.body, "auth_lockout") {
		t.Fatalf("the restarted router answers the locked address's right key %d %s", got.status, got.body)
	}
	if got := chatFrom(t, "127.9.4.4", restarted.url, f.APIKey); got.status != 200 {
		t.Fatalf("another address: %d %s", got.status, got.body)
	}
}

// Redis holds the addresses and their counts, never a key nor anything
// made of one, and each entry for no longer than the window.
func TestRedisHoldsTheAddressAndItsCountNeverTheKey(t *testing.T) {
	rd := testsrv.StartRedis(t)
	up := startUpstream(t, okHandler)
	f := lockoutFlags(3, 20*time.Second)
	a, _ := sharedLockoutRouter(t, f, rd.URL, up.url)
	const guesser = "127.9.4.5"
	wrong := []string{"sk-secret-guess-alpha", "sk-secret-guess-bravo"}
	for _, k := range wrong {
		chatFrom(t, guesser, a.url, k)
	}
	sendFrom(t, "127.9.4.6", a.url, "POST", "/v1/chat/completions", chatBody, "x-api-key", "sk-secret-guess-other")
	for i := 0; i < 3; i++ {
		sendFrom(t, "127.9.4.7", a.url, "POST", "/v1/chat/completions", chatBody, "x-api-key", "sk-secret-guess-locks")
	}
	c := redis.NewClient(&redis.Options{Addr: rd.Addr, MaxRetries: -1})
	defer c.Close()
	ctx := context.Background()
	// The wrong keys reach Redis a moment after their 401s: wait for the
	// last address's third.
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if c.Get(ctx, "infera:lockout:api:127.9.4.7").Val() == "3" {
			break
		}
	}
	keys, err := c.Keys(ctx, "*lockout*").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != 5 {
		t.Fatalf("lockout keys %q, want three counts, the count of addresses and the set of lockouts", keys)
	}
	var dump strings.Builder
	for _, k := range keys {
		dump.WriteString(k + "\n")
		switch typ := c.Type(ctx, k).Val(); typ {
		case "string":
			dump.WriteString(c.Get(ctx, k).Val() + "\n")
		case "zset":
			dump.WriteString(strings.Join(c.ZRange(ctx, k, 0, -1).Val(), "\n") + "\n")
		default:
			t.Fatalf("%s is a %s", k, typ)
		}
		if ttl := c.PTTL(ctx, k).Val(); ttl <= 0 || ttl > 20*time.Second {
			t.Fatalf("%s lives %v, want at most the 20 s window", k, ttl)
		}
	}
	for _, want := range []string{"lockout:api:127.9.4.5\n2\n", "lockout:api:127.9.4.6\n1\n", "lockout:api:127.9.4.7\n3\n", "lockout:api:locked\n127.9.4.7\n", "lockout:api:addresses\n3\n"} {
		if !strings.Contains(dump.String(), want) {
			t.Fatalf("Redis holds\n%s\nwithout %q", dump.String(), want)
		}
	}
	if strings.Contains(dump.String(), "secret") || strings.Contains(dump.String(), "sk-") {
		t.Fatalf("Redis holds a key:\n%s", dump.String())
	}
}

// With Redis down each router counts the wrong keys it sees by itself, as
// without Redis (an address is locked out by the router that saw
// --auth-lockout-failures of them, the other still serves it), and each
// wrong key Redis could not count is counted in the metric.
func TestWithRedisDownEachRouterLocksOutByItself(t *testing.T) {
	rd := testsrv.StartStoppableRedis(t)
	up := startUpstream(t, okHandler)
	f := lockoutFlags(3, 30*time.Second)
	a, _ := sharedLockoutRouter(t, f, rd.URL, up.url)
	b, _ := sharedLockoutRouter(t, f, rd.URL, up.url)
	rd.Stop()
	const guesser = "127.9.4.8"
	errs := mLockoutStateCountErrors.Get()
	for i := 0; i < 3; i++ {
		if got := chatFrom(t, guesser, a.url, fmt.Sprintf("sk-guess-%d", i)); got.status != 401 {
			t.Fatalf("wrong key %d: %d %s", i+1, got.status, got.body)
		}
	}
	// Sent to Redis without waiting: the failures are counted a moment
	// after the 401s.
	for deadline := time.Now().Add(5 * time.Second); mLockoutStateCountErrors.Get()-errs < 3 && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	if got := mLockoutStateCountErrors.Get() - errs; got != 3 {
		t.Fatalf("%d wrong keys counted as not shared, want 3", got)
	}
	if got := chatFrom(t, guesser, a.url, f.APIKey); got.status != 429 {
		t.Fatalf("the router that saw the wrong keys: %d %s", got.status, got.body)
	}
	if got := chatFrom(t, guesser, b.url, f.APIKey); got.status != 200 {
		t.Fatalf("the other router: %d %s", got.status, got.body)
	}
}

// A router whose subscription to the lockouts broke (Redis unreachable a
// moment, a connection killed) reads the lockouts in force again once it
// is made anew: one begun meanwhile, whose message it missed, is refused
// too.
func TestARouterReadsTheLockoutsAgainWhenItsSubscriptionIsMadeAnew(t *testing.T) {
	rd := testsrv.StartRedis(t)
	up := startUpstream(t, okHandler)
	f := lockoutFlags(3, 30*time.Second)
	a, _ := sharedLockoutRouter(t, f, rd.URL, up.url)
	const guesser = "127.9.4.9"
	if _, err := rd.Do("CLIENT", "KILL", "TYPE", "pubsub"); err != nil {
		t.Fatal(err)
	}
	// A lockout no message tells (as one published while the
	// subscription was down): only the set of lockouts holds it.
	now, err := rd.Do("EVAL", "local t = redis.call('TIME') return t[1] * 1000 + math.floor(t[2] / 1000)", "0")
	if err != nil {
		t.Fatal(err)
	}
	ms, _ := strconv.ParseInt(now, 10, 64)
	if _, err := rd.Do("ZADD", "infera:lockout:api:locked", strconv.FormatInt(ms+30_000, 10), guesser); err != nil {
		t.Fatal(err)
	}
	got := waitStatus(t, guesser, a.url, f.APIKey, 429)
	if got.status != 429 {
		t.Fatalf("a lockout begun while the subscription was down: %d %s", got.status, got.body)
	}
}

// busyRedis keeps the redis-server rd busy for d (a Lua loop: every other
// client waits, as in a stall), from a goroutine; it returns once the
// loop runs, and the returned channel is closed when it ended.
func busyRedis(t *testing.T, rd *testsrv.Redis, d time.Duration) <-chan struct{} {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		rd.Do("EVAL", `local s = redis.call('TIME')
repeat local n = redis.call('TIME') until (n[1] - s[1]) * 1000000 + (n[2] - s[2]) > tonumber(ARGV[1])
return 1`, "0", strconv.FormatInt(d.Microseconds(), 10))
	}()
	// Wait until a PING on a fresh connection goes unanswered.
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		c := redis.NewClient(&redis.Options{Addr: rd.Addr, MaxRetries: -1, ReadTimeout: 20 * time.Millisecond})
		err := c.Ping(context.Background()).Err()
		c.Close()
		if err != nil {
			return done
		}
	}
	t.Fatal("redis-server never became busy")
	return done
}

// A wrong key is answered 401 at once, from this router's table, even
// while Redis stalls: its count is sent to Redis without the client
// waiting for the answer. The count still reaches Redis once it answers.
func TestAWrongKeyIsAnsweredWithoutWaitingForRedis(t *testing.T) {
	rd := testsrv.StartRedis(t)
	up := startUpstream(t, okHandler)
	f := lockoutFlags(5, 30*time.Second)
	a, _ := sharedLockoutRouter(t, f, rd.URL, up.url)
	const guesser = "127.9.4.10"
	done := busyRedis(t, rd, 1500*time.Millisecond)
	start := time.Now()
	got := chatFrom(t, guesser, a.url, "sk-guess-stalled")
	if took := time.Since(start); got.status != 401 || took > 300*time.Millisecond {
		t.Fatalf("a wrong key while Redis stalls: %d after %v, want 401 at once", got.status, took)
	}
	<-done
	// Redis counts wrong keys again once the stall's hold ended (a second
	// after the timeout).
	for i := 0; ; i++ {
		ip := fmt.Sprintf("127.9.5.%d", 10+i)
		if got := chatFrom(t, ip, a.url, "sk-guess-after"); got.status != 401 {
			t.Fatalf("a wrong key after the stall: %d %s", got.status, got.body)
		}
		time.Sleep(100 * time.Millisecond)
		if n, _ := rd.Do("GET", "infera:lockout:api:"+ip); n == "1" {
			break
		}
		if i == 50 {
			t.Fatal("Redis counts no wrong key 5 s after the stall")
		}
	}
}

// A lockout one router's own count begins is told to every router, with
// the same end, even when Redis's count has not reached the limit: Redis
// counts the window from the address's first wrong key on any router, a
// router from its own first, so the two windows differ. Here the first
// wrong key, on router b, opens Redis's window; the next, on a, opens a's
// own a little later; once Redis's window ended, two more through a lock
// the address on a (three in a's window) while Redis counts two.
func TestALockoutOneRoutersCountBeginsHoldsOnEveryRouter(t *testing.T) {
	rd := testsrv.StartRedis(t)
	up := startUpstream(t, okHandler)
	const window = 3 * time.Second
	f := lockoutFlags(3, window)
	a, _ := sharedLockoutRouter(t, f, rd.URL, up.url)
	b, _ := sharedLockoutRouter(t, f, rd.URL, up.url)
	const guesser = "127.9.4.11"
	key := "infera:lockout:api:" + guesser
	count := func(want string) {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			n, _ := rd.Do("GET", key)
			if n == want {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("Redis counts %q, want %q", n, want)
			}
		}
	}
	first := time.Now()
	chatFrom(t, guesser, b.url, "sk-guess-0")
	count("1")
	time.Sleep(window / 2)
	chatFrom(t, guesser, a.url, "sk-guess-1")
	count("2")
	time.Sleep(time.Until(first.Add(window + 200*time.Millisecond)))
	count("") // Redis's window ended; a's has half of it to go
	locks := mLockouts.Get()
	for i := 2; i < 4; i++ {
		if got := chatFrom(t, guesser, a.url, fmt.Sprintf("sk-guess-%d", i)); got.status != 401 {
			t.Fatalf("wrong key %d: %d %s", i+1, got.status, got.body)
		}
	}
	if got := chatFrom(t, guesser, a.url, f.APIKey); got.status != 429 {
		t.Fatalf("the router whose own count reached the limit: %d %s", got.status, got.body)
	}
	got := waitStatus(t, guesser, b.url, f.APIKey, 429)
	if got.status != 429 || !strings.Contains(got.body, "auth_lockout") {
		t.Fatalf("the other router answers the address router a locked out %d %s", got.status, got.body)
	}
	if ra, _ := strconv.Atoi(got.hdr.Get("Retry-After")); ra < 1 || ra > 3 {
		t.Fatalf("the other router: Retry-After %q, want the rest of router a's %v lockout", got.hdr.Get("Retry-After"), window)
	}
	if n, _ := rd.Do("ZSCORE", "infera:lockout:api:locked", guesser); n == "" {
		t.Fatal("the lockout is not in Redis's set of lockouts in force (a router started now would not know it)")
	}
	for deadline := time.Now().Add(5 * time.Second); mLockouts.Get()-locks < 1 && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	if got := mLockouts.Get() - locks; got != 1 {
		t.Fatalf("%d lockouts begun, want 1", got)
	}
}

// A lockout a router began by itself while Redis was unreachable is sent
// to Redis once it answers again: the other routers, and the set of
// lockouts in force (read by a router that starts), then hold it too.
func TestALockoutBegunWhileRedisWasDownReachesEveryRouterOnceItIsBack(t *testing.T) {
	rd := testsrv.StartStoppableRedis(t)
	up := startUpstream(t, okHandler)
	f := lockoutFlags(3, 30*time.Second)
	a, _ := sharedLockoutRouter(t, f, rd.URL, up.url)
	b, _ := sharedLockoutRouter(t, f, rd.URL, up.url)
	const guesser = "127.9.4.12"
	rd.Stop()
	errs := mLockoutStateCountErrors.Get()
	for i := 0; i < 3; i++ {
		if got := chatFrom(t, guesser, a.url, fmt.Sprintf("sk-guess-%d", i)); got.status != 401 {
			t.Fatalf("wrong key %d: %d %s", i+1, got.status, got.body)
		}
	}
	if got := chatFrom(t, guesser, a.url, f.APIKey); got.status != 429 {
		t.Fatalf("the router that saw the wrong keys: %d %s", got.status, got.body)
	}
	for deadline := time.Now().Add(5 * time.Second); mLockoutStateCountErrors.Get()-errs < 3 && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	if got := chatFrom(t, guesser, b.url, f.APIKey); got.status != 200 {
		t.Fatalf("the other router while Redis is down: %d %s", got.status, got.body)
	}
	rd.Start() // empty: no persistence
	got := waitStatus(t, guesser, b.url, f.APIKey, 429)
	if got.status != 429 || !strings.Contains(got.body, "auth_lockout") {
		t.Fatalf("the other router once Redis is back answers the address router a locked out %d %s", got.status, got.body)
	}
	if ra, _ := strconv.Atoi(got.hdr.Get("Retry-After")); ra < 20 || ra > 30 {
		t.Fatalf("the other router: Retry-After %q, want the rest of router a's 30 s lockout", got.hdr.Get("Retry-After"))
	}
	if n, _ := rd.Do("ZSCORE", "infera:lockout:api:locked", guesser); n == "" {
		t.Fatal("the lockout is not in Redis's set of lockouts in force")
	}
	if got := chatFrom(t, "127.9.4.13", b.url, f.APIKey); got.status != 200 {
		t.Fatalf("another address: %d %s", got.status, got.body)
	}
}

// The router whose wrong key brings an address's shared count to
// --auth-lockout-failures answers that key 401 at once, and holds the
// address's next request until Redis's answer arrives: that request is
// refused as locked out, its right key included, even while Redis is slow
// to answer. Another address's right key is not held meanwhile.
func TestTheNextRequestAfterTheKeyThatLocksTheAddressIsRefused(t *testing.T) {
	rd := testsrv.StartRedis(t)
	up := startUpstream(t, okHandler)
	f := lockoutFlags(4, 30*time.Second)
	a, _ := sharedLockoutRouter(t, f, rd.URL, up.url)
	const guesser, other = "127.9.4.14", "127.9.4.15"
	// Three wrong keys counted through other routers.
	if _, err := rd.Do("SET", "infera:lockout:api:"+guesser, "3", "PX", "30000"); err != nil {
		t.Fatal(err)
	}
	done := busyRedis(t, rd, 500*time.Millisecond)
	start := time.Now()
	if got := chatFrom(t, guesser, a.url, "sk-guess-fourth"); got.status != 401 || time.Since(start) > 300*time.Millisecond {
		t.Fatalf("the fourth wrong key: %d after %v, want 401 at once", got.status, time.Since(start))
	}
	if got := chatFrom(t, other, a.url, f.APIKey); got.status != 200 || time.Since(start) > 300*time.Millisecond {
		t.Fatalf("another address's right key: %d after %v, want 200 at once", got.status, time.Since(start))
	}
	got := chatFrom(t, guesser, a.url, f.APIKey)
	if got.status != 429 || !strings.Contains(got.body, "auth_lockout") {
		t.Fatalf("the locked address's next request, its right key, on the router of the key that locked it: %d %s", got.status, got.body)
	}
	if ra, _ := strconv.Atoi(got.hdr.Get("Retry-After")); ra < 25 || ra > 30 {
		t.Fatalf("Retry-After %q, want the rest of the 30 s lockout", got.hdr.Get("Retry-After"))
	}
	<-done
}
