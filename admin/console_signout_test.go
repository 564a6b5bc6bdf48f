package admin

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// When the admin API refuses the console's key in the middle of a session
// (the router restarted with another --admin-key), every page goes back
// to the sign-in form and says why, and the page throws nothing: each
// refused call threw "Uncaught (in promise) Error: unauthorized" into the
// browser's console (and the fleet page's refresh threw again every 2 s
// until the form was shown). newBrowser fails the test on such errors.
func TestARefusedKeyReturnsToSignInWithoutPageErrors(t *testing.T) {
	ctx := newBrowser(t)
	e := newEnv(t, envOpts{file: `{"users":[{"name":"alice"}]}`})
	css := func(s string) chromedp.CSS { return chromedp.CSS(s) }
	for _, page := range []string{"users", "section/session_affinity", "fleet"} {
		sctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		err := chromedp.Do(sctx, chromedp.Navigate(e.srv.URL+"/#/rules"), chromedp.WaitVisible(css("#admin-key")),
			chromedp.SendKeys(css("#admin-key"), testKey), chromedp.Click(css("#login")), chromedp.WaitVisible(css("#rules")),
			// The key the router had is no longer the admin key.
			chromedp.Evaluate[chromedp.Void](`S.key = 'a-key-the-router-no-longer-has'; sessionStorage.setItem('infera.adminKey', S.key)`),
			chromedp.Navigate(e.srv.URL+"/#/"+page), chromedp.WaitVisible(css("#login-error")), chromedp.Sleep(300*time.Millisecond))
		cancel()
		if err != nil {
			t.Fatalf("%s: %v", page, err)
		}
		msg, err := chromedp.Run(ctx, chromedp.Text(css("#login-error")))
		if err != nil || !strings.Contains(msg, "refused") {
			t.Fatalf("%s: the sign-in form says %q (%v): want why", page, msg, err)
		}
	}
}
