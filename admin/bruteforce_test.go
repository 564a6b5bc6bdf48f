package admin

import (
	"testing"
	"time"
)

// Wrong admin keys are limited per client address: after 10 in a minute
// the address gets 429 with Retry-After, whatever key it sends (the right
// one included: no guessing at any speed), until the window ends.
func TestWrongAdminKeysLockTheAddressOut(t *testing.T) {
	e := newEnv(t, envOpts{})
	for i := 0; i < maxAuthFailures; i++ {
		if r := e.do("GET", "/api/version", "", "Authorization", "Bearer wrong-"+string(rune('a'+i))); r.status != 401 {
			t.Fatalf("wrong key %d: %d %s", i, r.status, r.body)
		}
	}
	for _, key := range []string{"Bearer wrong-z", "Bearer " + testKey} {
		r := e.do("GET", "/api/version", "", "Authorization", key)
		if r.status != 429 || r.hdr.Get("Retry-After") == "" {
			t.Fatalf("after %d wrong keys: %d %s (Retry-After %q)", maxAuthFailures, r.status, r.body, r.hdr.Get("Retry-After"))
		}
	}
	// The window ends: the right key works again.
	e.a.fails.mu.Lock()
	for _, w := range e.a.fails.m {
		w.start = w.start.Add(-authWindow - time.Second)
	}
	e.a.fails.mu.Unlock()
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
