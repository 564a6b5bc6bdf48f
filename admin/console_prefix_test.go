package admin

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// The console works when a front proxy serves the admin listener under a
// path prefix (an ingress rule /infera-admin/ -> the admin service, the
// prefix stripped): it loads its files relative to the page, and asked the
// API at the origin's root (/api/version), which the proxy does not send
// to the admin listener, so signing in said "The admin API answered 404".
func TestTheConsoleWorksUnderAPathPrefix(t *testing.T) {
	ctx := newBrowser(t)
	e := newEnv(t, envOpts{file: `{}`, fleet: &fakeFleet{}})
	h := e.a.Handler()
	const prefix = "/infera-admin"
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rest, ok := strings.CutPrefix(r.URL.Path, prefix)
		if !ok {
			http.Error(w, "not routed to the admin listener", http.StatusNotFound)
			return
		}
		r.URL.Path, r.URL.RawPath = rest, ""
		h.ServeHTTP(w, r)
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
	base := srv.URL + prefix + "/"
	step("sign in", chromedp.Navigate(base), chromedp.WaitVisible(css("#admin-key")),
		chromedp.SendKeys(css("#admin-key"), testKey), chromedp.Click(css("#login")), chromedp.WaitVisible(css("#fleet")))
	step("a section", chromedp.Navigate(base+"#/section/session_affinity"), chromedp.WaitVisible(css(`[data-path="session_affinity.enabled"] .track`)),
		chromedp.Click(css(`[data-path="session_affinity.enabled"] .track`)), chromedp.Click(css("#save")),
		chromedp.Poll[chromedp.Void](`document.querySelector('#save-status').textContent.startsWith('Saved')`, chromedp.WithPollingTimeout(5*time.Second)))
	if !e.store.Load().SessionAffinity.Enabled {
		t.Fatal("the save did not reach the admin API")
	}
	step("users", chromedp.Navigate(base+"#/users"), chromedp.WaitVisible(css("#create-user")),
		chromedp.SendKeys(css("#new-user-name"), "erin"), chromedp.Click(css("#create-user-btn")), chromedp.WaitVisible(css("#new-key")))
	step("backup", chromedp.Navigate(base+"#/backup"), chromedp.WaitVisible(css("#export")))
}
