package admin

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/infera/infera/govern"
)

// countingUsage answers every user's usage after a short pause, counting
// the calls.
type countingUsage struct {
	fakeFleet
	calls atomic.Int64
}

func (f *countingUsage) UserUsage(name string) (govern.UserStatus, error) {
	f.calls.Add(1)
	time.Sleep(200 * time.Microsecond)
	return govern.UserStatus{User: name, Template: "t", RPM: &govern.BucketStatus{Limit: 5, Remaining: 4}}, nil
}

// The users page asked every user's usage at once: with 3,000 users
// Chromium failed 1,647 of the requests (net::ERR_INSUFFICIENT_RESOURCES)
// and their cells stayed "…" for good, the rows took 9-15 s to appear, and
// each edit's re-render queued 3,000 more behind the ones still pending
// (5 s after disabling a user, 243 had answered and every cell was "…").
// It asks for the rows on screen, and those scrolled to.
func TestTheUsersPageFillsEveryUsersUsageWithThousandsOfUsers(t *testing.T) {
	const n = 3000
	var b strings.Builder
	b.WriteString(`{"user_limit":{"templates":[{"name":"t","default":true,"rate":{"enabled":true,"rpm":5}}]},"users":[`)
	for i := 0; i < n; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"name":"u%d"}`, i)
	}
	b.WriteString(`]}`)
	ctx := newBrowser(t)
	f := &countingUsage{}
	e := newEnv(t, envOpts{file: b.String(), fleet: f})
	css := func(s string) chromedp.CSS { return chromedp.CSS(s) }
	step := func(what string, steps ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		sctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		if err := chromedp.Do(sctx, steps...); err != nil {
			t.Fatalf("%s: %v (%d usage calls)", what, err, f.calls.Load())
		}
	}
	filled := func(user string) chromedp.Action[chromedp.Void] {
		return chromedp.Poll[chromedp.Void](`(document.querySelector('td[data-usage="`+user+`"]') || {}).textContent?.includes('RPM 4/5')`,
			chromedp.WithPollingTimeout(15*time.Second), chromedp.WithPollingInterval(100*time.Millisecond))
	}
	step("sign in", chromedp.Navigate(e.srv.URL+"/"), chromedp.WaitVisible(css("#admin-key")),
		chromedp.SendKeys(css("#admin-key"), testKey), chromedp.Click(css("#login")), chromedp.WaitVisible(css("#fleet")))
	step("users", chromedp.Navigate(e.srv.URL+"/#/users"), chromedp.WaitVisible(css(`tr[data-user="u0"]`)), filled("u0"), filled("u5"))
	step("the last user", chromedp.Evaluate[chromedp.Void](`document.querySelector('tr[data-user="u2999"]').scrollIntoView()`), filled("u2999"))
	// An edit re-renders the page: the new rendering fills its cells.
	step("disable u0", chromedp.Evaluate[chromedp.Void](`window.scrollTo(0, 0)`), chromedp.Click(css(`tr[data-user="u0"] .switch .track`)),
		chromedp.Poll[chromedp.Void](`(document.querySelector('#toast') || {}).textContent === 'u0 disabled'`, chromedp.WithPollingTimeout(10*time.Second)),
		filled("u0"), filled("u5"))
	t.Logf("%d usage calls", f.calls.Load())
	if c := f.calls.Load(); c > 600 {
		t.Fatalf("%d usage calls for two renderings of %d users and one scroll: want those on screen", c, n)
	}
}
