package govern

import (
	"net/netip"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// A shared lockout table counts an address's wrong keys up to the limit,
// reports the key that locked it once, does not count a locked address
// further, and lists the lockouts in force, the latest to end first, up
// to its bound.
func TestSharedLockoutsCountLockAndListTheLatestFirst(t *testing.T) {
	rd := startRedis(t)
	g := newGov(t, Options{State: rd.url()}, nil)
	l := g.Lockouts("t")
	a := netip.MustParseAddr("192.0.2.1")
	for i := 0; i < 2; i++ {
		if left, began, err := l.Failed(a, 3, 10*time.Second); err != nil || began || left != 0 {
			t.Fatalf("wrong key %d: %v %v %v", i+1, left, began, err)
		}
	}
	left, began, err := l.Failed(a, 3, 10*time.Second)
	if err != nil || !began || left != 10*time.Second {
		t.Fatalf("the third wrong key: %v %v %v", left, began, err)
	}
	left, began, err = l.Failed(a, 3, 10*time.Second)
	if err != nil || began || left <= 9*time.Second || left > 10*time.Second {
		t.Fatalf("a wrong key of a locked address: %v %v %v", left, began, err)
	}
	c := rd.client(t)
	if n, _ := c.Get(t.Context(), "infera:lockout:t:192.0.2.1").Int(); n != 3 {
		t.Fatalf("count %d after a locked address's wrong key, want 3", n)
	}
	b, d := netip.MustParseAddr("2001:db8::"), netip.MustParseAddr("192.0.2.3")
	l.Failed(b, 1, 30*time.Second)
	l.Failed(d, 1, 20*time.Second)
	l.maxRead = 2
	var got []netip.Addr
	if err := l.Locked(func(a netip.Addr, left time.Duration) {
		got = append(got, a)
		if left <= 0 || left > 30*time.Second {
			t.Fatalf("%v: %v left", a, left)
		}
	}); err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0] != b || got[1] != d {
		t.Fatalf("lockouts read %v, want the two latest to end, %v then %v", got, b, d)
	}
}

func TestALockoutMessageIsAnAddressAndItsTimeLeft(t *testing.T) {
	a, left, err := parseLockout("2001:db8:1:2:: 1500")
	if err != nil || a != netip.MustParseAddr("2001:db8:1:2::") || left != 1500*time.Millisecond {
		t.Fatalf("%v %v %v", a, left, err)
	}
	for _, bad := range []string{"", "192.0.2.1", "192.0.2.1 0", "192.0.2.1 -5", "host 100", "192.0.2.1 1e3"} {
		if _, _, err := parseLockout(bad); err == nil {
			t.Fatalf("%q parsed", bad)
		}
	}
}

// Wrong keys sent to Redis wait in a bounded queue: while Redis does not
// answer, at most the queue and one script call's batch are held, the
// rest refused at once (the caller counts them by itself); each one held
// is answered once Redis answers or fails.
func TestWrongKeysWaitingForRedisAreBoundedAndTheRestRefused(t *testing.T) {
	rd := startRedis(t)
	g := newGov(t, Options{State: rd.url()}, nil)
	l := g.Lockouts("t")
	l.queue = 4
	var answered atomic.Int64
	l.Start(1000, time.Minute, func(Counted) { answered.Add(1) })
	rd.cmd.Process.Signal(syscall.SIGSTOP)
	stopped := true
	defer func() {
		if stopped {
			rd.cmd.Process.Signal(syscall.SIGCONT)
		}
	}()
	accepted := 0
	for i := 0; i < 1000; i++ {
		if l.Send(Guess{Addr: netip.AddrFrom4([4]byte{192, 0, byte(i >> 8), byte(i)})}) {
			accepted++
		}
	}
	if accepted > l.queue+sendBatch || accepted == 0 {
		t.Fatalf("%d of 1000 wrong keys held while Redis does not answer, want 1 to %d", accepted, l.queue+sendBatch)
	}
	rd.cmd.Process.Signal(syscall.SIGCONT)
	stopped = false
	for deadline := time.Now().Add(10 * time.Second); answered.Load() < int64(accepted) && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	if n := answered.Load(); n != int64(accepted) {
		t.Fatalf("%d answers for %d wrong keys held", n, accepted)
	}
}

// Redis counts at most maxAddrs new addresses per window: past it a new
// address's wrong key is not counted there (Full: the caller counts it by
// itself) and leaves no key, while the addresses counted already go on
// counting; a lockout the caller began for an uncounted address is still
// published to the other routers.
func TestRedisCountsABoundedNumberOfAddressesPerWindow(t *testing.T) {
	rd := startRedis(t)
	g := newGov(t, Options{State: rd.url()}, nil)
	l := g.Lockouts("t")
	l.maxAddrs = 2
	a, b, c := netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("192.0.2.2"), netip.MustParseAddr("192.0.2.3")
	for _, x := range []netip.Addr{a, b} {
		if got := l.fail(nil, []Guess{{Addr: x}}, 3, time.Minute)[0]; got.Err != nil || got.Full {
			t.Fatalf("%v: %+v", x, got)
		}
	}
	cl := rd.client(t)
	ps := cl.Subscribe(t.Context(), "infera:lockout:t")
	defer ps.Close()
	if _, err := ps.Receive(t.Context()); err != nil {
		t.Fatal(err)
	}
	until := time.Now().Add(time.Minute).UnixNano()
	got := l.fail(nil, []Guess{{Addr: c}, {Addr: c, Until: until}, {Addr: a}}, 3, time.Minute)
	if got[0].Err != nil || !got[0].Full || got[1].Err != nil || !got[1].Full {
		t.Fatalf("a third address: %+v, want not counted (full)", got[:2])
	}
	if n := cl.Exists(t.Context(), "infera:lockout:t:192.0.2.3").Val(); n != 0 {
		t.Fatal("Redis holds a count for the address past the bound")
	}
	if got[2].Err != nil || got[2].Full {
		t.Fatalf("an address counted already: %+v", got[2])
	}
	if n, _ := cl.Get(t.Context(), "infera:lockout:t:192.0.2.1").Int(); n != 2 {
		t.Fatalf("an address counted already counts %d, want 2", n)
	}
	m, err := ps.ReceiveMessage(t.Context())
	if err != nil || !strings.HasPrefix(m.Payload, "192.0.2.3 ") {
		t.Fatalf("the lockout of an address past the bound published %v %v", m, err)
	}
}

// A router that closes right after the wrong key that began a lockout
// (a restart, a rolling upgrade) leaves its wrong keys counted and the
// lockout in Redis, for the other routers and for its successor: the
// keys still waiting to be sent are sent when the governor closes.
func TestWrongKeysQueuedWhenTheGovernorClosesAreCountedInRedis(t *testing.T) {
	rd := startRedis(t)
	c := rd.client(t)
	for i := 0; i < 10; i++ {
		g := newGov(t, Options{State: rd.url()}, nil)
		l := g.Lockouts("t")
		l.Start(3, time.Minute, func(Counted) {})
		a := netip.AddrFrom4([4]byte{192, 0, 2, byte(i)})
		for k := 0; k < 3; k++ {
			x := Guess{Addr: a}
			if k == 2 {
				x.Until = time.Now().Add(time.Minute).UnixNano()
			}
			if !l.Send(x) {
				t.Fatal("a wrong key refused by an empty queue")
			}
		}
		g.Close()
		if n, _ := c.Get(t.Context(), "infera:lockout:t:"+a.String()).Int(); n != 3 {
			t.Fatalf("round %d: Redis counts %d wrong keys of %v after the governor closed, want 3", i, n, a)
		}
		if err := c.ZScore(t.Context(), "infera:lockout:t:locked", a.String()).Err(); err != nil {
			t.Fatalf("round %d: the lockout of %v is not in Redis: %v", i, a, err)
		}
	}
}

// A lockout this router's table began with a wrong key that Send dropped
// (the queue full while Redis does not answer) is kept as one Redis could
// not count: once Redis answers and the queue drains, it reaches the set
// of lockouts in force (read by a router that starts) with its end.
func TestALockoutWhoseWrongKeyTheFullQueueDroppedReachesRedis(t *testing.T) {
	rd := startRedis(t)
	g := newGov(t, Options{State: rd.url()}, nil)
	l := g.Lockouts("t")
	l.queue = 4
	l.Start(1000, time.Minute, func(Counted) {})
	rd.cmd.Process.Signal(syscall.SIGSTOP)
	stopped := true
	defer func() {
		if stopped {
			rd.cmd.Process.Signal(syscall.SIGCONT)
		}
	}()
	// Fill the queue, then send the wrong key that began a lockout: it is
	// dropped (a key accepted would be kept after its call failed, which
	// is not what this test checks, so try again until one is dropped).
	var dropped netip.Addr
	until := time.Now().Add(time.Minute).UnixNano()
	for i := 0; i < 20 && !dropped.IsValid(); i++ {
		for k := 0; k < 1000 && l.Send(Guess{Addr: netip.AddrFrom4([4]byte{198, 51, byte(k >> 8), byte(k)})}); k++ {
		}
		a := netip.AddrFrom4([4]byte{192, 0, 2, byte(i)})
		if !l.Send(Guess{Addr: a, Until: until}) {
			dropped = a
		}
	}
	if !dropped.IsValid() {
		t.Fatal("a full queue never dropped a wrong key")
	}
	rd.cmd.Process.Signal(syscall.SIGCONT)
	stopped = false
	c := rd.client(t)
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		end, err := c.ZScore(t.Context(), "infera:lockout:t:locked", dropped.String()).Result()
		if err == nil {
			if left := time.Until(time.UnixMilli(int64(end))); left < 50*time.Second || left > time.Minute+time.Second {
				t.Fatalf("the lockout reached Redis with %v left, want the rest of the caller's minute", left)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the lockout begun with a dropped wrong key is not in Redis 5 s after it answers again: %v", err)
		}
	}
}

// A lockout the caller's table began for an address Redis does not count
// (maxAddrs new addresses in the window already) is stored in the set of
// lockouts in force, so that a router started afterwards reads it, while
// the set holds fewer than maxStored lockouts in force: the set stays
// bounded (past it the lockout is only published). An address stored
// already keeps the later end.
func TestALockoutPastTheAddressBoundIsStoredWhileTheSetHasRoom(t *testing.T) {
	rd := startRedis(t)
	g := newGov(t, Options{State: rd.url()}, nil)
	l := g.Lockouts("t")
	l.maxAddrs, l.maxStored = 1, 2
	if got := l.fail(nil, []Guess{{Addr: netip.MustParseAddr("192.0.2.1")}}, 3, time.Minute)[0]; got.Err != nil || got.Full {
		t.Fatalf("the first address: %+v", got)
	}
	c, d, e := netip.MustParseAddr("192.0.2.3"), netip.MustParseAddr("192.0.2.4"), netip.MustParseAddr("192.0.2.5")
	soon, later := time.Now().Add(20*time.Second).UnixNano(), time.Now().Add(time.Minute).UnixNano()
	got := l.fail(nil, []Guess{{Addr: c, Until: soon}, {Addr: d, Until: soon}, {Addr: c, Until: later}, {Addr: e, Until: later}}, 3, time.Minute)
	for _, x := range got {
		if x.Err != nil || !x.Full {
			t.Fatalf("an address past the bound: %+v, want not counted (full)", x)
		}
	}
	// A router started now reads the lockouts in force.
	started := newGov(t, Options{State: rd.url()}, nil).Lockouts("t")
	read := map[netip.Addr]time.Duration{}
	if err := started.Locked(func(a netip.Addr, left time.Duration) { read[a] = left }); err != nil {
		t.Fatal(err)
	}
	if left := read[c]; left < 50*time.Second || left > time.Minute {
		t.Fatalf("a router started later reads %v left for %v, want the later end (a minute); it read %v", left, c, read)
	}
	if left := read[d]; left < 10*time.Second || left > 20*time.Second {
		t.Fatalf("a router started later reads %v left for %v, want 20 s; it read %v", left, d, read)
	}
	if _, ok := read[e]; ok || len(read) != 2 {
		t.Fatalf("the set holds %v, want at most 2 lockouts in force (%v not stored)", read, e)
	}
	if ttl := rd.client(t).PTTL(t.Context(), "infera:lockout:t:locked").Val(); ttl < 50*time.Second {
		t.Fatalf("the set of lockouts expires in %v, before its latest lockout ends", ttl)
	}
}

// When Redis fails the governor's last calls (it closes while Redis
// stalls), every wrong key still queued is answered, with the error:
// none is left waiting (the caller's table holds an address's next
// request until its key is answered).
func TestEveryQueuedWrongKeyIsAnsweredWhenTheGovernorClosesWhileRedisFails(t *testing.T) {
	rd := startRedis(t)
	g := newGov(t, Options{State: rd.url()}, nil)
	l := g.Lockouts("t")
	var answered, failed atomic.Int64
	l.Start(3, time.Minute, func(c Counted) {
		answered.Add(1)
		if c.Err != nil {
			failed.Add(1)
		}
	})
	rd.cmd.Process.Signal(syscall.SIGSTOP)
	defer rd.cmd.Process.Signal(syscall.SIGCONT)
	const n = 1000
	for i := 0; i < n; i++ {
		if !l.Send(Guess{Addr: netip.AddrFrom4([4]byte{192, 0, byte(i >> 8), byte(i)})}) {
			t.Fatalf("wrong key %d refused by a queue of %d", i+1, sendQueue)
		}
	}
	g.Close()
	if a, f := answered.Load(), failed.Load(); a != n || f == 0 {
		t.Fatalf("%d of %d wrong keys answered (%d failed) when the governor closed while Redis stalled", a, n, f)
	}
}
