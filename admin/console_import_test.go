package admin

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// An operator whose file the import refused fixes it and chooses it again:
// the console checks it again. The file field kept the refused file, so
// choosing the same file fired no change: the refusal stayed on screen and
// nothing happened, whatever the file now held (the page had to be
// reloaded, or another file chosen).
func TestChoosingAFixedImportFileAgainChecksItAgain(t *testing.T) {
	ctx := newBrowser(t)
	e := newEnv(t, envOpts{file: `{}`})
	e.put("session_affinity", `{"enabled":true}`, 200)
	exp := e.do("GET", "/api/backup/export", "").body
	e.put("session_affinity", `{"enabled":false}`, 200)
	f := filepath.Join(t.TempDir(), "infera-snapshot.json")
	if err := os.WriteFile(f, exp[:100], 0o600); err != nil { // a truncated download
		t.Fatal(err)
	}
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
	step("sign in", chromedp.Navigate(e.srv.URL+"/"), chromedp.WaitVisible(css("#admin-key")),
		chromedp.SendKeys(css("#admin-key"), testKey), chromedp.Click(css("#login")), chromedp.WaitVisible(css("#fleet")))
	step("choose the truncated file", chromedp.Navigate(e.srv.URL+"/#/backup"), chromedp.WaitVisible(css("#import-file")),
		chromedp.SetUploadFiles(css("#import-file"), []string{f}), chromedp.WaitVisible(css("#backup-error")))
	if msg, _ := chromedp.Run(ctx, chromedp.Text(css("#backup-error"))); !strings.Contains(msg, "cannot be imported") || !strings.Contains(msg, "infera-snapshot.json") {
		t.Fatalf("the refusal says %q: want the file's name and why", msg)
	}
	if err := os.WriteFile(f, exp, 0o600); err != nil { // downloaded again
		t.Fatal(err)
	}
	step("choose it again", chromedp.SetUploadFiles(css("#import-file"), []string{f}), chromedp.WaitVisible(css("#import-confirm")),
		chromedp.WaitNotVisible(css("#backup-error")))
	step("import", chromedp.Click(css("#import-confirm")),
		chromedp.Poll[chromedp.Void](`(document.querySelector('#toast') || {}).textContent?.startsWith('Imported')`, chromedp.WithPollingTimeout(5*time.Second)))
	if !e.store.Load().SessionAffinity.Enabled {
		t.Fatal("the fixed file was not imported")
	}
}
