package admin

import (
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/infera/infera/internal/lockout"
)

// Wrong admin keys are limited per client address: after 10 in a minute
// the address gets 429 with Retry-After, whatever key it sends (the right
// one included: no guessing at any speed), until the window ends.
func TestWrongAdminKeysLockTheAddressOut(t *testing.T) {
	e := newEnv(t, envOpts{})
	var mu sync.Mutex
	now := time.Now()
	e.a.fails = lockout.New(lockout.Options{Max: maxAuthFailures, Window: authWindow, Tracked: maxAuthTracked,
		Now: func() time.Time { mu.Lock(); defer mu.Unlock(); return now }})
	for i := 0; i < maxAuthFailures; i++ {
		if r := e.do("GET", "/api/version", "", "Authorization", "Bearer wrong-"+string(rune('a'+i))); r.status != 401 {
			t.Fatalf("wrong key %d: %d %s", i, r.status, r.body)
		}
	}
	for _, key := range []string{"Bearer wrong-z", "Bearer " + testKey} {
		r := e.do("GET", "/api/version", "", "Authorization", key)
		if r.status != 429 || r.hdr.Get("Retry-After") != "60" {
			t.Fatalf("after %d wrong keys: %d %s (Retry-After %q)", maxAuthFailures, r.status, r.body, r.hdr.Get("Retry-After"))
		}
	}
	// The window ends: the right key works again.
	mu.Lock()
	now = now.Add(authWindow)
	mu.Unlock()
	if r := e.do("GET", "/api/version", ""); r.status != 200 {
		t.Fatalf("after the window: %d %s", r.status, r.body)
	}
}

// Requests that present no key (a CORS preflight, a no-cors request a page
// on another origin makes) are refused but are no guess: any number of them
// leaves the operator's right key working.
func TestRequestsWithoutAKeyDoNotLockTheAddressOut(t *testing.T) {
	e := newEnv(t, envOpts{})
	for i := 0; i < 3*maxAuthFailures; i++ {
		method := "GET"
		if i%2 == 1 {
			method = "OPTIONS"
		}
		if r := e.do(method, "/api/version", "", "Authorization", ""); r.status != 401 {
			t.Fatalf("request %d without a key: %d %s", i, r.status, r.body)
		}
	}
	if r := e.do("GET", "/api/version", ""); r.status != 200 {
		t.Fatalf("the right key after requests without one: %d %s", r.status, r.body)
	}
}

// A page the operator opens can reach the loopback admin listener through
// DNS rebinding: its own name (rebind.attacker.example) resolves to
// 127.0.0.1 after the page loaded, so its fetches are same-origin to the
// browser and may carry any Authorization header. The admin listener
// refuses a Host it does not answer for (421) before the key is checked
// or counted: ten such fetches with a made-up key locked the operator
// (same address, 127.0.0.1) out for a minute, again every minute.
func TestAForeignHostCannotLockTheOperatorOut(t *testing.T) {
	e := newEnv(t, envOpts{})
	port := e.srv.URL[strings.LastIndex(e.srv.URL, ":")+1:]
	for i := 0; i < maxAuthFailures; i++ {
		req, _ := http.NewRequest("GET", e.srv.URL+"/api/version", nil)
		req.Host = "rebind.attacker.example:" + port // what the browser sends after the rebinding
		req.Header.Set("Authorization", "Bearer guess")
		req.Header.Set("Origin", "http://rebind.attacker.example:"+port)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, res.Body)
		res.Body.Close()
		if res.StatusCode != http.StatusMisdirectedRequest {
			t.Fatalf("a request for Host rebind.attacker.example: %d, want 421", res.StatusCode)
		}
	}
	// The operator, with the right key, from the same machine.
	if r := e.do("GET", "/api/version", ""); r.status != http.StatusOK {
		t.Fatalf("the operator's right key after %d requests for Host rebind.attacker.example: %d %s", maxAuthFailures, r.status, r.body)
	}
}

// The admin API answers for IP addresses, localhost, this machine's name,
// --admin-host and --admin-allowed-hosts (a leading dot: subdomains too),
// and nothing else a page could re-point at the listener.
func TestTheAdminAPIAnswersOnlyTheHostsItKnows(t *testing.T) {
	a := &Admin{o: Options{AllowedHosts: []string{"127.0.0.1", "admin.internal", ".svc.cluster.local"}}, hostname: "gw-1"}
	for host, want := range map[string]bool{
		"":                                 true,
		"127.0.0.1:8081":                   true,
		"10.1.2.3":                         true,
		"[::1]:8081":                       true,
		"localhost:8081":                   true,
		"LocalHost.":                       true,
		"console.localhost":                true,
		"gw-1:8081":                        true,
		"admin.internal":                   true,
		"infera.ns.svc.cluster.local:8081": true,
		"svc.cluster.local":                true,
		"rebind.attacker.example":          false,
		"admin.internal.evil.example":      false,
		"evilsvc.cluster.local":            false,
		"localhost.evil.example":           false,
		"gw-1.evil.example":                false,
	} {
		if got := a.hostAllowed(host); got != want {
			t.Errorf("Host %q: answered %v, want %v", host, got, want)
		}
	}
	if !(&Admin{o: Options{AllowedHosts: []string{"*"}}}).hostAllowed("any.example") {
		t.Error(`--admin-allowed-hosts "*" refused a name`)
	}
}
