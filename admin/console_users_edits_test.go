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

// Edits of the users page made one after another, faster than the admin
// API answers (each write validates and stores the whole config: about
// 200 ms at 10,000 users), all land, and none undoes another:
//
//   - a switch clicked while the page reloaded after the previous edit was
//     sent with the row's data from before that edit, under the new ETag:
//     disabling alice right after binding her to "silver" put her back on
//     "gold", silently (200, and the page then showed "gold");
//   - an edit made while the previous one was on its way was sent with the
//     ETag from before it, refused 409 and dropped, with "The configuration
//     changed meanwhile" about the operator's own edit.
func TestQuickEditsOnTheUsersPageAllLand(t *testing.T) {
	ctx := newBrowser(t)
	e := newEnv(t, envOpts{file: `{"user_limit":{"templates":[{"name":"gold"},{"name":"silver"}]},
		"users":[{"name":"alice","template":"gold"},{"name":"bob","template":"gold"}]}`})
	// slow holds the answers the page waits for: the users list it
	// reloads after an edit, and the writes themselves.
	var slowList, slowWrite atomic.Bool
	h := e.a.Handler()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == "GET" && r.URL.Path == "/api/users" && slowList.Load() {
			time.Sleep(1500 * time.Millisecond)
		}
		if r.Method == "PUT" && strings.HasPrefix(r.URL.Path, "/api/users/") && slowWrite.Load() {
			time.Sleep(700 * time.Millisecond)
		}
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
	selectTemplate := func(user, tpl string) chromedp.Action[chromedp.Void] {
		return chromedp.Evaluate[chromedp.Void](`(() => { const s = document.querySelector('tr[data-user="` + user + `"] select'); s.value = "` + tpl + `"; s.dispatchEvent(new Event('change')); })()`)
	}
	users := func() map[string][2]string {
		out := map[string][2]string{}
		for _, u := range e.store.Load().Users {
			en := "enabled"
			if !u.Enabled {
				en = "disabled"
			}
			out[u.Name] = [2]string{u.Template, en}
		}
		return out
	}
	settled := func(want map[string][2]string) {
		t.Helper()
		deadline := time.Now().Add(8 * time.Second)
		for time.Now().Before(deadline) {
			if got := users(); got["alice"] == want["alice"] && got["bob"] == want["bob"] {
				time.Sleep(2 * time.Second) // nothing more lands
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		if got := users(); got["alice"] != want["alice"] || got["bob"] != want["bob"] {
			body, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`document.body.innerText.slice(0, 1500)`))
			t.Fatalf("users now %v, want %v; the page shows:\n%s", got, want, body)
		}
	}
	step("sign in", chromedp.Navigate(srv.URL+"/"), chromedp.WaitVisible(css("#admin-key")),
		chromedp.SendKeys(css("#admin-key"), testKey), chromedp.Click(css("#login")), chromedp.WaitVisible(css("#fleet")))
	step("users", chromedp.Navigate(srv.URL+"/#/users"), chromedp.WaitVisible(css(`tr[data-user="alice"] select`)))

	// An edit while the page reloads after the previous one.
	slowList.Store(true)
	step("bind alice to silver", selectTemplate("alice", "silver"),
		chromedp.Poll[chromedp.Void](`(document.querySelector('#toast') || {}).textContent === 'Template of alice updated'`, chromedp.WithPollingTimeout(5*time.Second)))
	step("disable alice while the page reloads", chromedp.Click(css(`tr[data-user="alice"] .switch .track`)))
	settled(map[string][2]string{"alice": {"silver", "disabled"}, "bob": {"gold", "enabled"}})
	slowList.Store(false)

	// An edit while the previous one is on its way.
	step("reload", chromedp.Navigate(srv.URL+"/#/fleet"), chromedp.WaitVisible(css("#fleet")),
		chromedp.Navigate(srv.URL+"/#/users"), chromedp.WaitVisible(css(`tr[data-user="bob"] select`)))
	slowWrite.Store(true)
	step("bind bob to silver, then disable him at once", selectTemplate("bob", "silver"), chromedp.Click(css(`tr[data-user="bob"] .switch .track`)))
	settled(map[string][2]string{"alice": {"silver", "disabled"}, "bob": {"silver", "disabled"}})
}
