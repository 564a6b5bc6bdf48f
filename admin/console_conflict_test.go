package admin

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// The console took every 409 for a concurrent change. A Save while the
// config file holds a broken hand edit (which the API refuses with 409,
// naming the file and the parse error) said "Someone changed the
// configuration since you opened this page" with a Reload that dropped the
// edits and changed nothing, and the users page said "The configuration
// changed meanwhile: reloaded, please retry" and reloaded, hiding the
// reason for good. A 409 that carries another ETag is a concurrent change
// (Reload); any other says the API's reason.
func TestTheConsoleTellsAConcurrentChangeFromAnother409(t *testing.T) {
	ctx := newBrowser(t)
	e := newEnv(t, envOpts{file: `{"users":[{"name":"alice"}]}`})
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
	step("sign in", chromedp.Navigate(e.srv.URL+"/"), chromedp.WaitVisible(css("#admin-key")),
		chromedp.SendKeys(css("#admin-key"), testKey), chromedp.Click(css("#login")), chromedp.WaitVisible(css("#fleet")))

	// A concurrent change: the banner with Reload, as before.
	step("edit", chromedp.Navigate(e.srv.URL+"/#/section/session_affinity"), chromedp.WaitVisible(css("#f-session_affinity_ttl_s")),
		chromedp.SendKeys(css("#f-session_affinity_ttl_s"), "7"))
	if r := e.do("PATCH", "/api/config/session_affinity", `{"max_entries":5}`, "If-Match", "*"); r.status != 200 {
		t.Fatalf("concurrent change: %d %s", r.status, r.body)
	}
	step("save stale", chromedp.Click(css("#save")), chromedp.WaitVisible(css("#form-error")))
	if s := text("#form-error"); !strings.Contains(s, "Someone changed the configuration") {
		t.Fatalf("a Save after a concurrent change says %q", s)
	}
	step("reload", chromedp.Click(css("#form-error button")), chromedp.WaitNotVisible(css("#form-error")),
		chromedp.SendKeys(css("#f-session_affinity_ttl_s"), "7"))

	// A broken hand edit of the file: the API's reason, not a reload.
	data, err := os.ReadFile(e.path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(e.path, append(data, '}'), 0o600); err != nil {
		t.Fatal(err)
	}
	step("save over a broken file", chromedp.Click(css("#save")), chromedp.WaitVisible(css("#form-error")))
	if s := text("#form-error"); !strings.Contains(s, "edited by hand") || strings.Contains(s, "Someone changed") {
		t.Fatalf("a Save over a broken hand edit says %q; want the API's reason", s)
	}
	step("users", chromedp.Evaluate[chromedp.Void](`window.confirm = () => true`), chromedp.Navigate(e.srv.URL+"/#/users"), chromedp.WaitVisible(css(`tr[data-user="alice"]`)),
		chromedp.Click(css(`tr[data-user="alice"] .switch .track`)), chromedp.WaitVisible(css("#users-error")), chromedp.Sleep(2*time.Second))
	if s := text("#users-error"); !strings.Contains(s, "edited by hand") {
		t.Fatalf("disabling a user over a broken hand edit says %q (2 s later); want the API's reason", s)
	}
}
