package admin

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// clientFrom is an HTTP client whose connections come from source address ip.
func clientFrom(ip string) *http.Client {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: 5 * time.Second}
	return &http.Client{Transport: &http.Transport{DisableKeepAlives: true,
		DialContext: func(ctx context.Context, n, a string) (net.Conn, error) { return d.DialContext(ctx, n, a) }}}
}

func wrongKeyFrom(t *testing.T, url, ip string) int {
	req, _ := http.NewRequest("GET", url+"/api/version", nil)
	req.Header.Set("Authorization", "Bearer wrong-guess")
	res, err := clientFrom(ip).Do(req)
	if err != nil {
		t.Fatalf("from %s: %v", ip, err)
	}
	res.Body.Close()
	return res.StatusCode
}

// The lockout holds for an address however many other addresses sent a
// wrong key in the same minute: one wrong key from each of maxAuthTracked
// addresses used to turn the limit off for every further address.
func TestWrongKeyLockoutHoldsWhenManyAddressesGuess(t *testing.T) {
	e := newEnv(t, envOpts{})
	url := e.srv.URL
	if !strings.HasPrefix(url, "http://127.0.0.1:") {
		t.Skip("needs the IPv4 loopback")
	}
	for i := 0; i < maxAuthTracked; i++ {
		wrongKeyFrom(t, url, fmt.Sprintf("127.2.%d.%d", i/250, i%250+1))
	}
	attacker := "127.3.0.1"
	for i := 1; i <= 3*maxAuthFailures; i++ {
		if wrongKeyFrom(t, url, attacker) == http.StatusTooManyRequests {
			return
		}
	}
	t.Fatalf("%d wrong keys from %s in a minute and never 429", 3*maxAuthFailures, attacker)
}

// An address locked out stays locked until its minute ends: a guesser
// with maxAuthTracked more addresses (one wrong key each) must not evict
// its own locked window and guess again at once.
func TestALockedAddressCannotEvictItsOwnWindow(t *testing.T) {
	e := newEnv(t, envOpts{})
	url := e.srv.URL
	if !strings.HasPrefix(url, "http://127.0.0.1:") {
		t.Skip("needs the IPv4 loopback")
	}
	attacker := "127.5.0.1"
	for i := 0; i < maxAuthFailures; i++ {
		wrongKeyFrom(t, url, attacker)
	}
	if s := wrongKeyFrom(t, url, attacker); s != http.StatusTooManyRequests {
		t.Fatalf("not locked after %d wrong keys: %d", maxAuthFailures, s)
	}
	for i := 0; i < maxAuthTracked; i++ {
		wrongKeyFrom(t, url, fmt.Sprintf("127.6.%d.%d", i/250, i%250+1))
	}
	if s := wrongKeyFrom(t, url, attacker); s != http.StatusTooManyRequests {
		t.Fatalf("the locked address guessed again within its minute after %d other addresses sent one wrong key each: %d", maxAuthTracked, s)
	}
}

// An address's wrong keys within its minute all count, however many other
// addresses guess meanwhile: the table gave its oldest open window up to
// a new address, so that an address whose window others pushed out
// started counting again (4097 addresses taking turns guessed without
// end).
func TestOthersGuessingCannotResetAnAddresssCount(t *testing.T) {
	e := newEnv(t, envOpts{})
	url := e.srv.URL
	if !strings.HasPrefix(url, "http://127.0.0.1:") {
		t.Skip("needs the IPv4 loopback")
	}
	attacker := "127.7.0.1"
	for i := 0; i < maxAuthFailures-1; i++ {
		if s := wrongKeyFrom(t, url, attacker); s != http.StatusUnauthorized {
			t.Fatalf("wrong key %d: %d", i+1, s)
		}
	}
	for i := 0; i < maxAuthTracked; i++ {
		wrongKeyFrom(t, url, fmt.Sprintf("127.8.%d.%d", i/250, i%250+1))
	}
	if s := wrongKeyFrom(t, url, attacker); s != http.StatusUnauthorized {
		t.Fatalf("wrong key %d: %d", maxAuthFailures, s)
	}
	if s := wrongKeyFrom(t, url, attacker); s != http.StatusTooManyRequests {
		t.Fatalf("%d wrong keys from %s within a minute, with %d other addresses guessing meanwhile, and then %d, not 429", maxAuthFailures, attacker, maxAuthTracked, s)
	}
}
