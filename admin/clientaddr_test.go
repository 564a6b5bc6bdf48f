package admin

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
)

// adminFrom sends GET /api/version from the loopback source address ip
// with the key and, unless empty, X-Forwarded-For xff.
func adminFrom(t *testing.T, url, ip, key, xff string) int {
	t.Helper()
	req, _ := http.NewRequest("GET", url+"/api/version", nil)
	req.Header.Set("Authorization", "Bearer "+key)
	if xff != "" {
		req.Header.Set("X-Forwarded-For", xff)
	}
	res, err := clientFrom(ip).Do(req)
	if err != nil {
		t.Fatalf("from %s: %v", ip, err)
	}
	res.Body.Close()
	return res.StatusCode
}

func trustedEnv(t *testing.T) string {
	t.Helper()
	e := newEnv(t, envOpts{trustedProxies: []string{"127.0.0.1/32"}})
	if !strings.HasPrefix(e.srv.URL, "http://127.0.0.1:") {
		t.Skip("needs the IPv4 loopback")
	}
	return e.srv.URL
}

// Behind a trusted proxy (--trusted-proxies 127.0.0.1/32), the admin API
// locks clients out one by one, by the address X-Forwarded-For names:
// one operator's wrong keys do not lock out another, nor the proxy.
func TestAdminClientsBehindATrustedProxyAreLockedOutOneByOne(t *testing.T) {
	url := trustedEnv(t)
	const lb = "127.0.0.1"
	for i := 0; i < maxAuthFailures; i++ {
		if got := adminFrom(t, url, lb, "wrong-guess", "203.0.113.1"); got != 401 {
			t.Fatalf("client a's wrong key %d: %d", i+1, got)
		}
	}
	if got := adminFrom(t, url, lb, testKey, "203.0.113.1"); got != 429 {
		t.Fatalf("client a after %d wrong keys, with the right one: %d, want 429", maxAuthFailures, got)
	}
	for _, xff := range []string{"198.51.100.7, 203.0.113.2", "203.0.113.3", ""} {
		if got := adminFrom(t, url, lb, testKey, xff); got != 200 {
			t.Fatalf("X-Forwarded-For %q, locked out with client a: %d", xff, got)
		}
	}
	for i := 0; i < maxAuthFailures; i++ {
		adminFrom(t, url, lb, "wrong-guess", "203.0.113.2")
	}
	if got := adminFrom(t, url, lb, testKey, "203.0.113.2"); got != 429 {
		t.Fatalf("client b after %d wrong keys: %d, want 429", maxAuthFailures, got)
	}
	if got := adminFrom(t, url, lb, testKey, "203.0.113.3"); got != 200 {
		t.Fatalf("client c after a and b were locked out: %d", got)
	}
}

// A client that is not a trusted proxy (127.0.0.2) is its own address to
// the admin API whatever X-Forwarded-For it sends: a fresh one with every
// guess does not lift its lockout.
func TestAnUntrustedPeerCannotEscapeItsAdminLockoutWithXForwardedFor(t *testing.T) {
	url := trustedEnv(t)
	const guesser = "127.0.0.2"
	for i := 0; i < maxAuthFailures; i++ {
		if got := adminFrom(t, url, guesser, "wrong-guess", fmt.Sprintf("203.0.113.%d", 10+i)); got != 401 {
			t.Fatalf("wrong key %d: %d", i+1, got)
		}
	}
	for _, xff := range []string{"", "203.0.113.99", "127.0.0.1", "203.0.113.99, 127.0.0.1"} {
		if got := adminFrom(t, url, guesser, testKey, xff); got != 429 {
			t.Fatalf("the right key from %s with X-Forwarded-For %q: %d, want 429", guesser, xff, got)
		}
	}
	if got := adminFrom(t, url, "127.0.0.1", testKey, guesser); got != 429 {
		t.Fatalf("a client the trusted proxy names %s: %d, want 429", guesser, got)
	}
	if got := adminFrom(t, url, "127.0.0.1", testKey, "203.0.113.10"); got != 200 {
		t.Fatalf("a client the trusted proxy names 203.0.113.10 (an address the guesser claimed): %d", got)
	}
}

// The audit log names the client X-Forwarded-For gave, and the trusted
// proxy it came through.
func TestTheAuditLogNamesTheClientBehindATrustedProxy(t *testing.T) {
	e := newEnv(t, envOpts{trustedProxies: []string{"127.0.0.1", "::1"}})
	e.put("session_affinity", `{"enabled":true,"ttl_s":60}`, 200)
	e.do("PUT", "/api/config/session_affinity", `{"enabled":false,"ttl_s":60}`, "If-Match", e.etag(), "X-Forwarded-For", "198.51.100.1, 203.0.113.5")
	r := e.do("GET", "/api/audit?limit=5", "")
	var out struct {
		Entries []AuditEntry `json:"entries"`
	}
	json.Unmarshal(r.body, &out)
	if len(out.Entries) != 2 {
		t.Fatalf("entries: %s", r.body)
	}
	var got []string
	for _, en := range out.Entries {
		got = append(got, en.Remote)
	}
	// Newest first.
	if !strings.HasPrefix(got[0], "203.0.113.5 (via ") || strings.Contains(got[1], "via") {
		t.Fatalf("audit remotes %q: want the client via the proxy, then the proxy's own change as before", got)
	}
}
