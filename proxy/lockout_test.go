package proxy

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/infera/infera/config"
	"github.com/infera/infera/internal/lockout"
	"github.com/infera/infera/internal/logx"
)

// srcAnswer is one answer to a client of a given source address.
type srcAnswer struct {
	status int
	hdr    http.Header
	body   string
}

// sendFrom sends method path with the headers hdr (name, value pairs) from the
// loopback source address ip, on a connection of its own.
func sendFrom(t *testing.T, ip, url, method, path, body string, hdr ...string) srcAnswer {
	t.Helper()
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: 5 * time.Second}
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true,
		DialContext: func(ctx context.Context, n, a string) (net.Conn, error) { return d.DialContext(ctx, n, a) }}}
	req, _ := http.NewRequest(method, url+path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	res, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s from %s: %v", method, path, ip, err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return srcAnswer{res.StatusCode, res.Header, string(b)}
}

func lockoutFlags(failures int, window time.Duration) *config.Serve {
	f := defaultFlags()
	f.APIKey = "sk-right-0123456789"
	f.AuthLockoutFailures, f.AuthLockoutWindow = failures, window
	return f
}

func chatFrom(t *testing.T, ip, url, key string) srcAnswer {
	t.Helper()
	return sendFrom(t, ip, url, "POST", "/v1/chat/completions", chatBody, "Authorization", "Bearer "+key)
}

// N wrong keys from one address lock it out for the window: 429 with
// Retry-After in the client's error shape (OpenAI's, Anthropic's on
// /v1/messages), whatever key it sends, on every authenticated endpoint,
// until the window ends; other addresses are served meanwhile. The
// wrong keys may come as Authorization or x-api-key.
func TestWrongAPIKeysLockTheAddressOut(t *testing.T) {
	up := startUpstream(t, okHandler)
	f := lockoutFlags(5, 2*time.Second)
	r := startRouter(t, f, nil, up.url)
	const guesser, other = "127.9.0.1", "127.9.0.2"
	refused, locks := mLockoutRefused.Get(), mLockouts.Get()
	for i := 0; i < 5; i++ {
		var a srcAnswer
		if i%2 == 0 {
			a = chatFrom(t, guesser, r.url, fmt.Sprintf("sk-guess-%d", i))
		} else {
			a = sendFrom(t, guesser, r.url, "POST", "/v1/messages", `{"model":"m","max_tokens":4,"messages":[{"role":"user","content":"hi"}]}`,
				"x-api-key", fmt.Sprintf("sk-guess-%d", i))
		}
		if a.status != 401 {
			t.Fatalf("wrong key %d: %d %s", i+1, a.status, a.body)
		}
	}
	start := time.Now()
	a := chatFrom(t, guesser, r.url, f.APIKey)
	if a.status != 429 {
		t.Fatalf("the right key after %d wrong ones from the same address: %d %s", 5, a.status, a.body)
	}
	if ra := a.hdr.Get("Retry-After"); ra != "2" {
		t.Fatalf("Retry-After %q, want 2 (the window)", ra)
	}
	if ms, err := strconv.Atoi(a.hdr.Get("Retry-After-Ms")); err != nil || ms < 1000 || ms > 2000 {
		t.Fatalf("Retry-After-Ms %q", a.hdr.Get("Retry-After-Ms"))
	}
	var oa struct {
		Error struct{ Message, Type, Code string }
	}
	if err := json.Unmarshal([]byte(a.body), &oa); err != nil || oa.Error.Type != "rate_limit_error" || oa.Error.Code != "auth_lockout" || oa.Error.Message == "" {
		t.Fatalf("not OpenAI's error shape: %s", a.body)
	}
	var an struct {
		Type      string
		Error     struct{ Type, Message string }
		RequestID string `json:"request_id"`
	}
	a = sendFrom(t, guesser, r.url, "POST", "/v1/messages", `{"model":"m","max_tokens":4,"messages":[{"role":"user","content":"hi"}]}`, "x-api-key", f.APIKey)
	if err := json.Unmarshal([]byte(a.body), &an); a.status != 429 || err != nil || an.Type != "error" || an.Error.Type != "rate_limit_error" ||
		an.RequestID == "" || a.hdr.Get("Request-Id") != an.RequestID || a.hdr.Get("Retry-After") == "" {
		t.Fatalf("/v1/messages from the locked address: %d %s, want 429 in Anthropic's shape", a.status, a.body)
	}
	for _, path := range []string{"/v1/models", "/v1/models/m"} {
		if a := sendFrom(t, guesser, r.url, "GET", path, "", "Authorization", "Bearer "+f.APIKey); a.status != 429 {
			t.Fatalf("GET %s from the locked address: %d %s", path, a.status, a.body)
		}
	}
	if a := sendFrom(t, guesser, r.url, "POST", "/v1/embeddings", `{"model":"m","input":"x"}`, "Authorization", "Bearer "+f.APIKey); a.status != 429 {
		t.Fatalf("/v1/embeddings from the locked address: %d %s", a.status, a.body)
	}
	if a := chatFrom(t, other, r.url, f.APIKey); a.status != 200 {
		t.Fatalf("another address with the right key: %d %s", a.status, a.body)
	}
	if d := mLockoutRefused.Get() - refused; d != 5 {
		t.Fatalf("infera_auth_lockout_rejections_total rose by %d, want 5", d)
	}
	if d := mLockouts.Get() - locks; d != 1 {
		t.Fatalf("infera_auth_lockouts_total rose by %d, want 1", d)
	}
	// Still locked just before the end; served once the window ended.
	time.Sleep(time.Until(start.Add(1500 * time.Millisecond)))
	if a := chatFrom(t, guesser, r.url, f.APIKey); a.status != 429 {
		t.Fatalf("the right key 1.5 s into a 2 s lockout: %d %s", a.status, a.body)
	}
	time.Sleep(time.Until(start.Add(2100 * time.Millisecond)))
	if a := chatFrom(t, guesser, r.url, f.APIKey); a.status != 200 {
		t.Fatalf("the right key after the lockout: %d %s", a.status, a.body)
	}
}

// A request without a key is refused but is no guess (a CORS preflight, a
// health probe on the wrong path, a client not configured yet): any
// number of them leaves the address's right key working. A key in another
// scheme than Bearer is no key either.
func TestRequestsWithoutAKeyDoNotLockTheAddressOut(t *testing.T) {
	up := startUpstream(t, okHandler)
	f := lockoutFlags(3, time.Minute)
	r := startRouter(t, f, nil, up.url)
	const ip = "127.9.1.1"
	for i := 0; i < 10; i++ {
		hdr := []string{"Authorization", ""}
		if i%2 == 1 {
			hdr = []string{"Authorization", "Basic dXNlcjpwYXNz"}
		}
		if a := sendFrom(t, ip, r.url, "POST", "/v1/chat/completions", chatBody, hdr...); a.status != 401 {
			t.Fatalf("request %d without a key: %d %s", i, a.status, a.body)
		}
	}
	if a := chatFrom(t, ip, r.url, f.APIKey); a.status != 200 {
		t.Fatalf("the right key after requests without one: %d %s", a.status, a.body)
	}
}

// Wrong user keys count as wrong --api-key values do; a disabled user's
// key is a right key (403), not a guess.
func TestWrongUserKeysLockTheAddressOut(t *testing.T) {
	up := startUpstream(t, okHandler)
	ka, ha := mintKey(t)
	kb, hb := mintKey(t)
	f := lockoutFlags(3, time.Minute)
	f.APIKey = ""
	r, _ := govRouter(t, f, fmt.Sprintf(`{"users": [{"name": "alice", "keys": [%q]}, {"name": "bob", "keys": [%q], "enabled": false}]}`, ha, hb), up.url)
	const bob, guesser = "127.9.2.1", "127.9.2.2"
	for i := 0; i < 5; i++ {
		if a := chatFrom(t, bob, r.url, kb); a.status != 403 {
			t.Fatalf("a disabled user's key: %d %s", a.status, a.body)
		}
	}
	if a := chatFrom(t, bob, r.url, ka); a.status != 200 {
		t.Fatalf("a right key after a disabled user's five: %d %s", a.status, a.body)
	}
	wrong, _ := mintKey(t) // well-formed, of nobody
	for i := 0; i < 3; i++ {
		if a := chatFrom(t, guesser, r.url, wrong); a.status != 401 {
			t.Fatalf("wrong user key %d: %d %s", i+1, a.status, a.body)
		}
	}
	if a := chatFrom(t, guesser, r.url, ka); a.status != 429 || a.hdr.Get("Retry-After") != "60" {
		t.Fatalf("alice's key after 3 wrong ones from the address: %d (Retry-After %q) %s", a.status, a.hdr.Get("Retry-After"), a.body)
	}
}

// The table of addresses stays bounded when more addresses than it tracks
// send wrong keys, and the limit still holds for the next address and for
// an address locked before the flood.
func TestTheLockoutHoldsAndStaysBoundedUnderManyAddresses(t *testing.T) {
	up := startUpstream(t, okHandler)
	f := lockoutFlags(10, time.Minute)
	r := startRouter(t, f, nil, up.url)
	const locked, late = "127.10.0.1", "127.10.0.2"
	for i := 0; i < 10; i++ {
		chatFrom(t, locked, r.url, "sk-guess")
	}
	n := lockout.DefaultTracked + 1000
	for i := 0; i < n; i++ {
		if a := chatFrom(t, fmt.Sprintf("127.11.%d.%d", i/250, i%250+1), r.url, "sk-guess"); a.status != 401 && a.status != 429 {
			t.Fatalf("address %d: %d", i, a.status)
		}
	}
	if l := r.srv.fails.Len(); l > lockout.DefaultTracked {
		t.Fatalf("%d addresses tracked after %d sent a wrong key, bound %d", l, n, lockout.DefaultTracked)
	}
	if a := chatFrom(t, locked, r.url, f.APIKey); a.status != 429 {
		t.Fatalf("an address locked before %d others sent wrong keys: %d", n, a.status)
	}
	for i := 1; i <= 11; i++ {
		if a := chatFrom(t, late, r.url, "sk-guess"); a.status == 429 {
			return
		}
	}
	t.Fatalf("10 wrong keys from %s after %d other addresses sent one each, and the next not refused", late, n)
}

// Neither the wrong keys nor the right one reach a log line or an answer
// of a lockout; the lockout is logged with the address.
func TestALockoutLogsTheAddressNeverTheKeys(t *testing.T) {
	logs := captureLogs(t)
	old := lockoutLog
	lockoutLog = &logx.Throttle{} // no line of an earlier test's lockout in the way
	t.Cleanup(func() { lockoutLog = old })
	up := startUpstream(t, okHandler)
	f := lockoutFlags(2, time.Minute)
	f.APIKey = "sk-RIGHT-SECRET-0123"
	r := startRouter(t, f, nil, up.url)
	const ip = "127.9.3.1"
	for i := 0; i < 2; i++ {
		chatFrom(t, ip, r.url, "sk-GUESSED-SECRET-"+strconv.Itoa(i))
	}
	a := chatFrom(t, ip, r.url, f.APIKey)
	if a.status != 429 || strings.Contains(a.body, "SECRET") {
		t.Fatalf("%d %s", a.status, a.body)
	}
	waitUntil(t, "the lockout's log line", func() bool { return strings.Contains(logs.String(), "locked out") })
	l := logs.String()
	if strings.Contains(l, "SECRET") || !strings.Contains(l, ip) {
		t.Fatalf("the log has a key, or not the address:\n%s", l)
	}
}
