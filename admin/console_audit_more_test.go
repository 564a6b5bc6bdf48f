package admin

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// The audit page counts the changes an entry does not list: those past the
// first 12 and the ones the entry left out (more). An entry whose changes
// are empty with more > 0 showed "… -9 more" (12 taken off a list that had
// none), and one whose changes were null threw reading their length, so
// the page never showed.
func TestTheAuditPageCountsTheChangesItDoesNotList(t *testing.T) {
	ctx := newBrowser(t)
	e := newEnv(t, envOpts{})
	many := func(n int) []Change {
		out := make([]Change, n)
		for i := range out {
			out[i] = Change{Path: fmt.Sprintf("users[\"u%d\"]", i), Old: "null", New: "{...}"}
		}
		return out
	}
	entries := []AuditEntry{
		{Action: "import none-listed", Changes: nil, More: 5},
		{Action: "import empty-list", Changes: []Change{}, More: 3},
		{Action: "import fourteen", Changes: many(14), More: 2},
		{Action: "import two", Changes: many(2)},
	}
	l := e.a.audit
	l.mu.Lock()
	for i, en := range entries {
		en.Time, en.Who, en.Version = time.Now().UTC(), "admin-key", uint64(i+2)
		l.entries[l.next] = en
		l.next++
	}
	l.mu.Unlock()

	css := func(s string) chromedp.CSS { return chromedp.CSS(s) }
	sctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	if err := chromedp.Do(sctx, chromedp.Navigate(e.srv.URL+"/"), chromedp.WaitVisible(css("#admin-key")),
		chromedp.SendKeys(css("#admin-key"), testKey), chromedp.Click(css("#login")), chromedp.WaitVisible(css("#fleet")),
		chromedp.Navigate(e.srv.URL+"/#/audit"), chromedp.WaitVisible(css("#audit"))); err != nil {
		body, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`document.body.innerText.slice(0, 2000)`))
		t.Fatalf("audit page: %v; the page shows:\n%s", err, body)
	}
	rows, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](`[...document.querySelectorAll('#audit tbody tr')].map((r) => r.innerText)`))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"none-listed": "… 5 more", "empty-list": "… 3 more", "fourteen": "… 4 more", "two": ""}
	for _, row := range rows {
		for name, more := range want {
			if !strings.Contains(row, "import "+name) {
				continue
			}
			if more == "" && strings.Contains(row, "more") || more != "" && !strings.Contains(row, more) {
				t.Errorf("%s: the row reads %q, want %q", name, row, more)
			}
			delete(want, name)
		}
	}
	if len(want) > 0 {
		t.Fatalf("rows missing %v: %q", want, rows)
	}
}
