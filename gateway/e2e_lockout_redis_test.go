package gateway

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/infera/infera/internal/testsrv"
)

// chatFromAddr posts a chat request with key from the loopback source
// address ip to the router at url, and returns the status and body.
func chatFromAddr(t *testing.T, ip, url, key string) (int, string) {
	t.Helper()
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: 5 * time.Second}
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true,
		DialContext: func(ctx context.Context, n, a string) (net.Conn, error) { return d.DialContext(ctx, n, a) }}}
	req, _ := http.NewRequest("POST", url+"/v1/chat/completions", strings.NewReader(chatJSON("sim-model", "hi", 2, false)))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+key)
	res, err := c.Do(req)
	if err != nil {
		t.Fatalf("from %s: %v", ip, err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b)
}

// Two `infera serve` processes sharing a redis-server count one address's
// wrong keys together: two through each lock it out on both (each alone
// saw two of --auth-lockout-failures 4), its right key refused, another
// address served; a router started afterwards (a restart) refuses it
// from its first request.
func TestE2EWrongKeysThroughTwoRoutersSharingRedisLockTheAddressOut(t *testing.T) {
	rd := testsrv.StartRedis(t)
	_, eng := startEngine(t, "--speedup", "50")
	const key, guesser, other = "sk-right-0123456789abcdef", "127.9.7.1", "127.9.7.2"
	args := []string{"--workers", "e1=" + eng, "--state", rd.URL, "--api-key", key,
		"--auth-lockout-failures", "4", "--auth-lockout-window", "30s"}
	r1 := startChild(t, "serve", 0, args...)
	r2 := startChild(t, "serve", 0, args...)
	for i := 0; i < 4; i++ {
		r := []*child{r1, r2}[i%2]
		if st, body := chatFromAddr(t, guesser, r.url, fmt.Sprintf("sk-guess-%d", i)); st != 401 {
			t.Fatalf("wrong key %d: %d %s", i+1, st, body)
		}
	}
	locked := func(name, url string) {
		t.Helper()
		deadline := time.Now().Add(2 * time.Second)
		for {
			st, body := chatFromAddr(t, guesser, url, key)
			if st == 429 && strings.Contains(body, "auth_lockout") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s answers the locked address's right key %d %s", name, st, body)
			}
			time.Sleep(20 * time.Millisecond)
		}
		if st, body := chatFromAddr(t, other, url, key); st != 200 {
			t.Fatalf("%s: another address got %d %s", name, st, body)
		}
	}
	locked("router 1", r1.url)
	locked("router 2", r2.url)
	// The lockout began on the router whose wrong key Redis counted
	// fourth: router 2's, unless router 1's third, queued for Redis as the
	// client got its 401, got there after it (a loaded machine). Router
	// 1's count is read before it stops; it learns of its own from
	// Redis's answer, which may come after the lock was published.
	var began1 float64
	for end := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		began1 = metricF(t, r1.url, "infera_auth_lockouts_total")
		if began1+metricF(t, r2.url, "infera_auth_lockouts_total") >= 1 || time.Now().After(end) {
			break
		}
	}
	r1.stop()
	r3 := startChild(t, "serve", 0, args...)
	if st, body := chatFromAddr(t, guesser, r3.url, key); st != 429 || !strings.Contains(body, "auth_lockout") {
		t.Fatalf("a router started during the lockout answers the locked address's right key %d %s", st, body)
	}
	if n := began1 + metricF(t, r2.url, "infera_auth_lockouts_total") + metricF(t, r3.url, "infera_auth_lockouts_total"); n != 1 {
		t.Fatalf("lockouts begun on routers 1, 2 and 3: %v, want 1 (by Redis's word, on the router whose wrong key it counted fourth)", n)
	}
}

// adminFromAddr sends GET /api/version with key to the admin listener at
// url from the loopback source address ip, and returns the status.
func adminFromAddr(t *testing.T, ip, url, key string) (int, string) {
	t.Helper()
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: 5 * time.Second}
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true,
		DialContext: func(ctx context.Context, n, a string) (net.Conn, error) { return d.DialContext(ctx, n, a) }}}
	req, _ := http.NewRequest("GET", url+"/api/version", nil)
	req.Header.Set("Authorization", "Bearer "+key)
	res, err := c.Do(req)
	if err != nil {
		t.Fatalf("from %s: %v", ip, err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b)
}

// The admin listeners of two `infera serve` processes sharing a
// redis-server count one address's wrong admin keys together: five
// through each (of the admin API's 10 a minute) lock it out on both, the
// right admin key refused, another address served; an admin listener
// started afterwards refuses it from its first request.
func TestE2EWrongAdminKeysThroughTwoRoutersSharingRedisLockTheAddressOut(t *testing.T) {
	rd := testsrv.StartRedis(t)
	_, eng := startEngine(t, "--speedup", "50")
	const guesser, other = "127.9.7.3", "127.9.7.4"
	serve := func() (router *child, admin string) {
		c := startChild(t, "serve", 0, "--workers", "e1="+eng, "--state", rd.URL,
			"--admin-port=-1", "--admin-key", e2eAdminKey)
		return c, c.adminAddr(t)
	}
	r1, a1 := serve()
	_, a2 := serve()
	for i := 0; i < 10; i++ {
		if st, body := adminFromAddr(t, guesser, []string{a1, a2}[i%2], fmt.Sprintf("wrong-admin-key-%d", i)); st != 401 {
			t.Fatalf("wrong admin key %d: %d %s", i+1, st, body)
		}
	}
	locked := func(name, url string) {
		t.Helper()
		deadline := time.Now().Add(2 * time.Second)
		for {
			st, body := adminFromAddr(t, guesser, url, e2eAdminKey)
			if st == 429 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s answers the locked address's right admin key %d %s", name, st, body)
			}
			time.Sleep(20 * time.Millisecond)
		}
		if st, body := adminFromAddr(t, other, url, e2eAdminKey); st != 200 {
			t.Fatalf("%s: another address got %d %s", name, st, body)
		}
	}
	locked("admin listener 1", a1)
	locked("admin listener 2", a2)
	r1.stop()
	_, a3 := serve()
	if st, body := adminFromAddr(t, guesser, a3, e2eAdminKey); st != 429 {
		t.Fatalf("an admin listener started during the lockout answers the locked address's right key %d %s", st, body)
	}
}
