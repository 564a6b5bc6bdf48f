package lockout

import (
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"
)

// clock is a settable time for a Guard.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func newGuard(max, tracked int) (*Guard, *clock) {
	c := &clock{t: time.Unix(1_700_000_000, 0)}
	return New(Options{Max: max, Window: time.Minute, Tracked: tracked, Now: c.now}), c
}

func addr(i int) netip.Addr {
	return netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)})
}

func TestMaxWrongKeysLockAnAddressOutForAWindow(t *testing.T) {
	g, c := newGuard(3, 0)
	a, other := addr(1), addr(2)
	for i := 0; i < 2; i++ {
		if g.Failed(a) {
			t.Fatalf("locked after %d wrong keys", i+1)
		}
		if _, locked := g.Locked(a); locked {
			t.Fatalf("locked after %d wrong keys", i+1)
		}
	}
	c.add(30 * time.Second) // the third within the window, counted from the first
	if !g.Failed(a) {
		t.Fatal("the third wrong key did not lock")
	}
	left, locked := g.Locked(a)
	if !locked || left != time.Minute {
		t.Fatalf("locked %v for %v, want a whole minute from the third key", locked, left)
	}
	if _, locked := g.Locked(other); locked {
		t.Fatal("another address is locked")
	}
	c.add(59 * time.Second)
	if left, locked := g.Locked(a); !locked || left != time.Second {
		t.Fatalf("a second before the end: locked %v for %v", locked, left)
	}
	c.add(time.Second)
	if _, locked := g.Locked(a); locked {
		t.Fatal("still locked after the window")
	}
	// A fresh window: max-1 wrong keys pass again.
	for i := 0; i < 2; i++ {
		if g.Failed(a) {
			t.Fatalf("locked again after %d wrong keys", i+1)
		}
	}
}

func TestWrongKeysSpreadOverMoreThanAWindowDoNotLock(t *testing.T) {
	g, c := newGuard(3, 0)
	a := addr(1)
	for i := 0; i < 10; i++ {
		if g.Failed(a) {
			t.Fatalf("locked by wrong key %d, %d s apart", i, 31)
		}
		c.add(31 * time.Second) // two per window at most
	}
}

// However many other addresses guess, an address's wrong keys within its
// window all count: it cannot have its window pushed out of the table and
// start counting again (admin's table gave its oldest open window up to a
// new address, so that 4097 addresses taking turns guessed without end).
func TestManyAddressesTakingTurnsAreAllLimited(t *testing.T) {
	const max, tracked = 10, 64
	g, _ := newGuard(max, tracked)
	n := 4 * tracked
	passed := make([]int, n) // wrong keys checked, per address
	for round := 0; round < 3*max; round++ {
		for i := 0; i < n; i++ {
			if _, locked := g.Locked(addr(i)); !locked {
				passed[i]++
				g.Failed(addr(i))
			}
		}
	}
	// A tracked address has max wrong keys checked (the last one locks
	// it); an untracked one shares its bucket's max with others.
	for i, p := range passed {
		if p > max {
			t.Fatalf("address %d of %d taking turns had %d wrong keys checked in a window, want at most %d", i, n, p, max)
		}
	}
	if l := g.Len(); l > tracked+nShards {
		t.Fatalf("%d addresses tracked, bound %d", l, tracked)
	}
}

// The table stays bounded under a flood of addresses, each with one wrong
// key, and the addresses' lockouts still hold.
func TestTheTableIsBoundedUnderManyAddresses(t *testing.T) {
	const tracked = 256
	g, c := newGuard(10, tracked)
	locked := addr(1 << 20)
	for i := 0; i < 10; i++ {
		g.Failed(locked)
	}
	per := (tracked + nShards - 1) / nShards
	for i := 0; i < 100_000; i++ {
		g.Failed(addr(i))
		if i%20_000 == 0 {
			c.add(10 * time.Second) // within the lockout's minute
		}
	}
	if l := g.Len(); l > per*nShards {
		t.Fatalf("%d addresses tracked, bound %d", l, per*nShards)
	}
	if _, ok := g.Locked(locked); !ok {
		t.Fatal("the flood freed a locked address")
	}
	// Once the windows ended, new addresses are tracked one by one again.
	c.add(2 * time.Minute)
	fresh := addr(1 << 21)
	g.Failed(fresh)
	h := g.hash(fresh)
	s := &g.shards[h&(nShards-1)]
	s.mu.Lock()
	_, tracked1 := s.m[fresh]
	s.mu.Unlock()
	if !tracked1 {
		t.Fatal("a full shard whose windows all ended did not make room")
	}
}

// A locked address is never given up to make room: others' wrong keys
// cannot free it within its window.
func TestALockedAddressStaysLockedWhateverOthersSend(t *testing.T) {
	const tracked = 32
	g, c := newGuard(5, tracked)
	a := addr(1 << 20)
	for i := 0; i < 5; i++ {
		g.Failed(a)
	}
	for i := 0; i < 50*tracked; i++ {
		g.Failed(addr(i))
	}
	c.add(59 * time.Second)
	if _, ok := g.Locked(a); !ok {
		t.Fatal("others' wrong keys freed a locked address within its window")
	}
}

func TestAnOffGuardLocksNothing(t *testing.T) {
	var g *Guard = New(Options{})
	if g != nil {
		t.Fatal("Max 0 made a guard")
	}
	if g.Failed(addr(1)) || g.Len() != 0 {
		t.Fatal("a nil guard counted")
	}
	if _, ok := g.Locked(addr(1)); ok {
		t.Fatal("a nil guard locked")
	}
}

// Every address of an IPv6 /64 is one client; IPv4-mapped addresses are
// their IPv4 address.
func TestAnIPv6SlashSixtyFourIsOneAddressToTheLockout(t *testing.T) {
	f := func(s string, want string) {
		t.Helper()
		k, ok := KeyOfString(s)
		if !ok || k.String() != want {
			t.Fatalf("%q: %v %v, want %s", s, k, ok, want)
		}
	}
	f("[2001:db8:1:2::1]:5000", "2001:db8:1:2::")
	f("[2001:db8:1:2:ffff:ffff:ffff:ffff]:6000", "2001:db8:1:2::")
	f("[fe80::1%eth0]:80", "fe80::")
	f("2001:db8:1:3::1", "2001:db8:1:3::")
	f("127.0.0.1:80", "127.0.0.1")
	f("[::ffff:10.1.2.3]:80", "10.1.2.3")
	k, ok := KeyOf(&net.TCPAddr{IP: net.ParseIP("10.1.2.3"), Port: 9}) // a 16-byte IPv4
	if !ok || k != netip.MustParseAddr("10.1.2.3") {
		t.Fatalf("TCPAddr: %v %v", k, ok)
	}
	k, ok = KeyOf(&net.TCPAddr{IP: net.ParseIP("2001:db8:1:2::9"), Port: 9})
	if !ok || k != netip.MustParseAddr("2001:db8:1:2::") {
		t.Fatalf("TCPAddr v6: %v %v", k, ok)
	}
	if _, ok := KeyOfString("pipe"); ok {
		t.Fatal("a non-IP address has a key")
	}
}

func TestConcurrentGuessesAndChecks(t *testing.T) {
	g, _ := newGuard(10, 128)
	var wg sync.WaitGroup
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := 0; i < 5000; i++ {
				a := addr(w*1000 + i%700)
				if _, ok := g.Locked(a); !ok {
					g.Failed(a)
				}
			}
		}(w)
	}
	wg.Wait()
	if l := g.Len(); l > 128+nShards {
		t.Fatalf("%d tracked", l)
	}
}

// sameShard returns n addresses that fall in one shard.
func sameShard(g *Guard, n int) []netip.Addr {
	var out []netip.Addr
	want := g.hash(addr(0)) & (nShards - 1)
	for i := 0; len(out) < n; i++ {
		if g.hash(addr(i))&(nShards-1) == want {
			out = append(out, addr(i))
		}
	}
	return out
}

// A shard that filled up again after a sweep emptied it makes room again
// once its windows end: an emptied shard noted no end to wait for, and
// was never swept again, so every later address counted in a shared
// window.
func TestAShardRefilledAfterASweepIsSweptAgain(t *testing.T) {
	g, c := newGuard(5, nShards) // one tracked address per shard
	as := sameShard(g, 3)
	g.Failed(as[0])
	c.add(2 * time.Minute)
	g.Failed(as[1]) // the shard is full: a sweep empties it, as[1] is tracked
	c.add(2 * time.Minute)
	g.Failed(as[2]) // full again, of an ended window
	s := &g.shards[g.hash(as[2])&(nShards-1)]
	s.mu.Lock()
	_, tracked := s.m[as[2]]
	s.mu.Unlock()
	if !tracked {
		t.Fatal("a shard full of ended windows did not make room")
	}
}

// A lockout learned from elsewhere (another router) locks the address for
// the time it was given, not longer than one in force already, and ends
// like any other: its wrong keys count again from zero after it.
func TestALockoutLearnedFromElsewhereHoldsForItsTime(t *testing.T) {
	g, c := newGuard(3, 0)
	a := addr(1)
	if !g.Lock(a, 20*time.Second) {
		t.Fatal("a fresh lockout reported as one in force")
	}
	if left, ok := g.Locked(a); !ok || left != 20*time.Second {
		t.Fatalf("locked %v for %v, want 20s", ok, left)
	}
	if g.Lock(a, 10*time.Second) {
		t.Fatal("a shorter lockout over one in force reported as fresh")
	}
	if left, _ := g.Locked(a); left != 20*time.Second {
		t.Fatalf("a shorter lockout shortened it to %v", left)
	}
	g.Lock(a, 30*time.Second)
	if left, _ := g.Locked(a); left != 30*time.Second {
		t.Fatalf("a longer lockout left it at %v", left)
	}
	if g.Failed(a) {
		t.Fatal("a wrong key during the lockout began another")
	}
	c.add(30 * time.Second)
	if _, ok := g.Locked(a); ok {
		t.Fatal("still locked after its time")
	}
	for i := 0; i < 2; i++ {
		if g.Failed(a) {
			t.Fatalf("locked again after %d wrong keys", i+1)
		}
	}
	if !g.Failed(a) {
		t.Fatal("the third wrong key after the lockout did not lock")
	}
	var off *Guard
	if off.Lock(a, time.Second) {
		t.Fatal("an off guard locked")
	}
}

// Lockouts learned in a full shard, past its tracked addresses, lock the
// addresses' shared windows, as their wrong keys would.
func TestALockoutLearnedInAFullShardLocksItsBucket(t *testing.T) {
	g, _ := newGuard(5, nShards) // one tracked address per shard
	as := sameShard(g, 2)
	g.Failed(as[0]) // the shard's one tracked window, open
	if !g.Lock(as[1], time.Minute) {
		t.Fatal("not locked")
	}
	if _, ok := g.Locked(as[1]); !ok {
		t.Fatal("an untracked address learned locked is not refused")
	}
	if _, ok := g.Locked(as[0]); ok {
		t.Fatal("the tracked address was locked with it")
	}
}

// An address whose wrong key was sent to a shared table (Hold) has its
// next request wait (Await) until the answer came (Release), for at most
// the time given; other addresses do not wait. Hold and Release pair up,
// Hold only for an address tracked one by one.
func TestAnAddressWaitsForTheAnswerAboutItsWrongKeySentElsewhere(t *testing.T) {
	g, _ := newGuard(3, 0)
	a, b, other := addr(1), addr(2), addr(3)
	g.Failed(a)
	if !g.Hold(a) {
		t.Fatal("a tracked address was not held")
	}
	go func() {
		time.Sleep(100 * time.Millisecond)
		g.Lock(a, time.Minute)
		g.Release(a)
	}()
	start := time.Now()
	g.Await(other, 5*time.Second)
	if took := time.Since(start); took > 50*time.Millisecond {
		t.Fatalf("another address waited %v", took)
	}
	g.Await(a, 5*time.Second)
	if took := time.Since(start); took < 100*time.Millisecond || took > 2*time.Second {
		t.Fatalf("the held address waited %v, want until its answer (100 ms)", took)
	}
	if _, locked := g.Locked(a); !locked {
		t.Fatal("the lockout the answer told does not hold for the request that waited")
	}
	g.Failed(b)
	g.Hold(b) // its answer never comes
	start = time.Now()
	g.Await(b, 50*time.Millisecond)
	if took := time.Since(start); took < 50*time.Millisecond || took > time.Second {
		t.Fatalf("an address whose answer never comes waited %v, want 50 ms", took)
	}
	g.Release(b)
	g.Release(b) // once too often: no effect
	if n := g.held.Load(); n != 0 {
		t.Fatalf("%d keys held after their answers", n)
	}
	if g.Hold(addr(99)) {
		t.Fatal("an address with no window was held")
	}
}

// A window whose keys are held is not dropped when it ends until their
// answer comes, and a sweep of its full shard drops it with its count.
func TestAHeldWindowOutlivesItsEndUntilTheAnswerOrASweep(t *testing.T) {
	g, c := newGuard(5, nShards) // one tracked address per shard
	as := sameShard(g, 2)
	g.Failed(as[0])
	g.Hold(as[0])
	c.add(2 * time.Minute)
	g.Locked(as[0]) // drops an ended window, not this one
	if !g.isHeld(as[0]) {
		t.Fatal("an ended window with a key held was dropped before its answer")
	}
	g.Failed(as[1]) // the shard is full: the sweep drops the ended window
	if g.isHeld(as[0]) || g.held.Load() != 0 {
		t.Fatalf("after a sweep: held %v, %d keys held", g.isHeld(as[0]), g.held.Load())
	}
}
