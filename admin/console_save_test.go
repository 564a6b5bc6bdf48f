package admin

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// A section page keeps what the operator types while its Save is on its
// way (a write stores the whole config: about 200 ms at 10,000 users), and
// a second click on Save meanwhile sends nothing. The answer replaced the
// form with the saved section and said "Saved": the setting typed during
// the save was gone without a word. A double click sent the section twice
// with one ETag: the second was refused 409 and the page said "Not saved"
// about a section that was saved.
func TestASectionPageKeepsWhatIsTypedWhileItSaves(t *testing.T) {
	ctx := newBrowser(t)
	e := newEnv(t, envOpts{file: `{}`})
	var slow atomic.Bool
	var puts atomic.Int32
	h := e.a.Handler()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == "PUT" && strings.HasPrefix(r.URL.Path, "/api/config/") {
			puts.Add(1)
			if slow.Load() {
				time.Sleep(800 * time.Millisecond)
			}
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
	set := func(sel, v string) chromedp.Action[chromedp.Void] {
		js, _ := json.Marshal(v)
		return chromedp.Evaluate[chromedp.Void](`(() => { const el = document.querySelector("` + sel + `"); el.value = ` + string(js) + `; el.dispatchEvent(new Event('input', {bubbles: true})); })()`)
	}
	saved := chromedp.Poll[chromedp.Void](`document.querySelector('#save-status').textContent.startsWith('Saved')`, chromedp.WithPollingTimeout(5*time.Second))
	step("sign in", chromedp.Navigate(srv.URL+"/"), chromedp.WaitVisible(css("#admin-key")),
		chromedp.SendKeys(css("#admin-key"), testKey), chromedp.Click(css("#login")), chromedp.WaitVisible(css("#fleet")))
	step("page", chromedp.Navigate(srv.URL+"/#/section/session_affinity"), chromedp.WaitVisible(css("#f-session_affinity_ttl_s")))

	slow.Store(true)
	step("save, and type while it is on its way", set("#f-session_affinity_ttl_s", "600"), chromedp.Click(css("#save")),
		chromedp.Sleep(100*time.Millisecond), set("#f-session_affinity_max_entries", "5000"), saved)
	step("the answer", chromedp.Sleep(300*time.Millisecond))
	got, err := chromedp.Run(ctx, chromedp.Evaluate[[]any](`[document.querySelector('#f-session_affinity_max_entries').value, document.body.classList.contains('dirty')]`))
	if err != nil {
		t.Fatal(err)
	}
	if sa := e.store.Load().SessionAffinity; sa.TTLSeconds != 600 || sa.MaxEntries != 100000 {
		t.Fatalf("the save stored %+v: want ttl_s 600 and max_entries as it was", sa)
	}
	if got[0] != "5000" || got[1] != true {
		t.Fatalf("after the save's answer the field typed meanwhile shows %v and the page unsaved changes %v: want 5000, marked unsaved", got[0], got[1])
	}
	step("save again", chromedp.Click(css("#save")), chromedp.Poll[chromedp.Void](`!document.body.classList.contains('dirty')`, chromedp.WithPollingTimeout(5*time.Second)))
	if sa := e.store.Load().SessionAffinity; sa.TTLSeconds != 600 || sa.MaxEntries != 5000 {
		t.Fatalf("the second save stored %+v: want ttl_s 600 and max_entries 5000", sa)
	}

	// A double click: one write, and no error.
	n := puts.Load()
	step("double click", set("#f-session_affinity_ttl_s", "700"),
		chromedp.Evaluate[chromedp.Void](`document.querySelector('#save').click(); document.querySelector('#save').click()`),
		saved, chromedp.Sleep(500*time.Millisecond))
	shown, err := chromedp.Run(ctx, chromedp.Evaluate[string](`(() => { const b = document.querySelector('#form-error'); return b.hidden ? '' : b.textContent; })() + '|' + document.querySelector('#save-status').textContent`))
	if err != nil {
		t.Fatal(err)
	}
	if sa := e.store.Load().SessionAffinity; sa.TTLSeconds != 700 || puts.Load() != n+1 || !strings.HasPrefix(shown, "|Saved") {
		t.Fatalf("a double click on Save: ttl_s %v, %d writes sent, the page shows %q: want 700, one write, Saved", sa.TTLSeconds, puts.Load()-n, shown)
	}
}
