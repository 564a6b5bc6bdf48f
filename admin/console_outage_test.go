package admin

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// The router stops (a restart, a crash) or a front proxy answers 502 while
// the console is open. The console threw on the failed fetch and showed
// nothing: the fleet page kept its last numbers under "live" and its
// refreshing stopped for good after a page change, a page opened meanwhile
// never replaced the one shown (and opening it again once the API was back
// did nothing: same address), a Save said "Unsaved changes" and nothing
// else, Sign in did nothing at all, and a 502 page rendered as "No users
// yet.". Each now says the API
// failed, and the page comes back with Retry or the next Save.
func TestTheConsoleSaysWhenTheAdminAPIFails(t *testing.T) {
	ctx := newBrowser(t)
	e := newEnv(t, envOpts{file: `{}`})
	if r := e.do("POST", "/api/users", `{"name":"alice"}`); r.status != 201 {
		t.Fatalf("user: %d %s", r.status, r.body)
	}
	// down: the API's connections are closed unanswered (the router is
	// gone); gateway: a front proxy answers 502 with its own HTML page.
	var down, gateway atomic.Bool
	api := e.a.Handler()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/api/") {
			switch {
			case down.Load():
				c, _, err := http.NewResponseController(w).Hijack()
				if err == nil {
					c.Close()
				}
				return
			case gateway.Load():
				w.Header().Set("Content-Type", "text/html")
				w.WriteHeader(http.StatusBadGateway)
				w.Write([]byte("<html><body><h1>502 Bad Gateway</h1></body></html>"))
				return
			}
		}
		api.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)

	css := func(s string) chromedp.CSS { return chromedp.CSS(s) }
	step := func(what string, steps ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		sctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		defer cancel()
		if err := chromedp.Do(sctx, steps...); err != nil {
			body, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`document.body.innerText.slice(0, 2000)`))
			t.Fatalf("%s: %v; the page shows:\n%s", what, err, body)
		}
	}
	text := func(sel string) string {
		t.Helper()
		s, err := chromedp.Run(ctx, chromedp.Text(css(sel)))
		if err != nil {
			t.Fatalf("text of %s: %v", sel, err)
		}
		return s
	}
	poll := func(js string) chromedp.Action[chromedp.Void] {
		return chromedp.Poll[chromedp.Void](js, chromedp.WithPollingTimeout(8*time.Second))
	}

	// Signing in while the API is down says so (the button did nothing).
	down.Store(true)
	step("sign in while down", chromedp.Navigate(srv.URL+"/"), chromedp.WaitVisible(css("#admin-key")),
		chromedp.SendKeys(css("#admin-key"), testKey), chromedp.Click(css("#login")), chromedp.WaitVisible(css("#login-error")))
	if s := text("#login-error"); !strings.Contains(s, "cannot be reached") {
		t.Fatalf("signing in with the API down says %q", s)
	}
	down.Store(false)
	step("sign in", chromedp.Click(css("#login")), chromedp.WaitVisible(css("#fleet")),
		poll(`document.querySelector('#fleet-live').textContent.startsWith('live ·')`))

	// The fleet page, refreshing every 2 s, says its numbers are stale.
	down.Store(true)
	step("fleet stale", poll(`document.querySelector('#fleet-live').textContent.startsWith('not refreshed since')`))
	if s := text("#fleet-live"); !strings.Contains(s, "cannot be reached") {
		t.Fatalf("the fleet stamp with the API down says %q", s)
	}
	// A page opened while the API is down says so, and Retry loads it.
	step("section while down", chromedp.Navigate(srv.URL+"/#/section/session_affinity"), chromedp.WaitVisible(css("#page-error")))
	if s := text("#page-error"); !strings.Contains(s, "cannot be reached") {
		t.Fatalf("a section opened with the API down says %q", s)
	}
	down.Store(false)
	step("retry", chromedp.Click(css("#retry")), chromedp.WaitVisible(css("#f-session_affinity_ttl_s")))

	// A Save while the API is down says it was not saved, and why; the
	// edit stays, and Save once it is back applies it.
	step("edit", chromedp.SendKeys(css("#f-session_affinity_ttl_s"), "7"))
	down.Store(true)
	step("save while down", chromedp.Click(css("#save")), chromedp.WaitVisible(css("#form-error")))
	if s, st := text("#form-error"), text("#save-status"); !strings.Contains(s, "cannot be reached") || st != "Not saved" {
		t.Fatalf("a Save with the API down: banner %q, status %q", s, st)
	}
	down.Store(false)
	step("save when back", chromedp.Click(css("#save")),
		poll(`document.querySelector('#save-status').textContent.startsWith('Saved')`))
	if ttl := e.store.Load().SessionAffinity.TTLSeconds; ttl == 1800 {
		t.Fatalf("the Save once the API was back left ttl_s at its default %v", ttl)
	}

	// A front proxy's 502 is not "No users yet.".
	gateway.Store(true)
	step("users through a 502", chromedp.Navigate(srv.URL+"/#/users"), chromedp.WaitVisible(css("#page-error")))
	if s := text("#page-error"); !strings.Contains(s, "HTTP 502") {
		t.Fatalf("the users page through a 502 says %q", s)
	}
	gateway.Store(false)
	step("users back", chromedp.Click(css("#retry")), chromedp.WaitVisible(css(`tr[data-user="alice"]`)))
}
