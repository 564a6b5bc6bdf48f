package admin

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// The console shows user keys by their id, never their stored hashes, on
// every page it has, those reachable only by URL included (#/section/users
// showed each user's key hashes in its form), and no answer of the admin
// API it reads carries one, but the export and stored snapshot downloads:
// the backup file keeps the hashes (docs/admin.md).
func TestTheConsoleNeverShowsKeyHashes(t *testing.T) {
	ctx := newBrowser(t)
	e := newEnv(t, envOpts{file: `{"user_limit":{"templates":[{"name":"gold","default":true}]}}`, snapshotDir: t.TempDir()})
	for _, name := range []string{"alice", "bob"} {
		if r := e.do("POST", "/api/users", `{"name":"`+name+`","template":"gold"}`); r.status != 201 {
			t.Fatalf("create %s: %d %s", name, r.status, r.body)
		}
	}
	if r := e.do("POST", "/api/users/alice/keys", ""); r.status != 201 {
		t.Fatalf("second key: %d %s", r.status, r.body)
	}
	// The export, made before bob gets another key: its import changes
	// bob's keys, which the import preview lists.
	exp := e.do("GET", "/api/backup/export", "")
	if exp.status != 200 {
		t.Fatalf("export: %d %s", exp.status, exp.body)
	}
	exported := filepath.Join(t.TempDir(), "export.json")
	if err := os.WriteFile(exported, exp.body, 0o600); err != nil {
		t.Fatal(err)
	}
	if r := e.do("POST", "/api/users/bob/keys", ""); r.status != 201 {
		t.Fatalf("bob's second key: %d %s", r.status, r.body)
	}
	if r := e.do("POST", "/api/backup", ""); r.status != 201 {
		t.Fatalf("snapshot: %d %s", r.status, r.body)
	}
	// What would give a hash away: the prefix, and each hash's salt and
	// digest (all hashes the test made, the export's included).
	secrets := []string{"ifr1$"}
	hashes := func() {
		for _, u := range e.store.Load().Users {
			for _, k := range u.Keys {
				parts := strings.Split(k, "$")
				secrets = append(secrets, k, parts[len(parts)-2], parts[len(parts)-1])
			}
		}
	}
	hashes()
	if len(secrets) != 1+3*4 {
		t.Fatalf("want 4 keys, have %d", (len(secrets)-1)/3)
	}
	leak := func(s string) string {
		for _, x := range secrets {
			if strings.Contains(s, x) {
				return x
			}
		}
		return ""
	}

	// Every answer the console's page reads, by path.
	var mu sync.Mutex
	answers := map[string][]byte{}
	h := e.a.Handler()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := &teeWriter{ResponseWriter: w}
		h.ServeHTTP(rec, r)
		mu.Lock()
		answers[r.Method+" "+r.URL.Path] = append(answers[r.Method+" "+r.URL.Path], rec.buf.Bytes()...)
		mu.Unlock()
	}))
	t.Cleanup(srv.Close)

	css := func(s string) chromedp.CSS { return chromedp.CSS(s) }
	step := func(what string, steps ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		sctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		defer cancel()
		if err := chromedp.Do(sctx, steps...); err != nil {
			body, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`location.href + '\n' + document.body.innerText.slice(0, 2000)`))
			t.Fatalf("%s: %v; the page shows:\n%s", what, err, body)
		}
	}
	// shown is everything the page holds for the eye: its markup, the
	// values of its fields (typed or set, which the markup may not have)
	// and its title.
	shown := func() string {
		t.Helper()
		s, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.title + '\n' + document.documentElement.outerHTML + '\n' +
			[...document.querySelectorAll('input, textarea, select')].map((el) => el.value).join('\n')`))
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	check := func(page string) {
		t.Helper()
		if x := leak(shown()); x != "" {
			body, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`location.href + '\n' + document.body.innerText.slice(0, 1500)`))
			t.Errorf("page %s shows a key hash (%q); the page shows:\n%s", page, x, body)
		}
	}

	step("sign in", chromedp.Navigate(srv.URL+"/"), chromedp.WaitVisible(css("#admin-key")),
		chromedp.SendKeys(css("#admin-key"), testKey), chromedp.Click(css("#login")), chromedp.WaitVisible(css("#fleet")))
	check("fleet")
	pages := map[string]string{
		"rules":  "#rules",
		"audit":  "#audit",
		"backup": "#export",
		"users":  `tr[data-user="alice"] td[data-usage] .stat, tr[data-user="alice"] td[data-usage] .muted:not(:empty)`,
	}
	for page, ready := range pages {
		step(page, chromedp.Navigate(srv.URL+"/#/"+page), chromedp.WaitVisible(css(ready)))
		check(page)
	}
	// Every section by its URL, users included: the menu leaves users out
	// (Users & keys is its page), but the URL opened a form of it.
	var sections []struct{ Key string }
	r := e.do("GET", "/api/schema", "")
	var schema struct{ Sections *[]struct{ Key string } }
	schema.Sections = &sections
	if err := json.Unmarshal(r.body, &schema); err != nil || len(sections) < 10 {
		t.Fatalf("schema: %v, %d sections", err, len(sections))
	}
	for _, s := range sections {
		step("section "+s.Key, chromedp.Navigate(srv.URL+"/#/section/"+s.Key),
			chromedp.WaitVisible(css(`form[data-section="`+s.Key+`"], #create-user`)))
		check("#/section/" + s.Key)
	}
	step("#/section/users opens Users & keys", chromedp.Navigate(srv.URL+"/#/section/users"), chromedp.WaitVisible(css(`tr[data-user="bob"]`)))
	if at, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`location.hash`)); at != "#/users" {
		t.Errorf("#/section/users is at %q, want #/users", at)
	}
	// The import preview lists bob's keys as they change (by id).
	step("import preview", chromedp.Navigate(srv.URL+"/#/backup"), chromedp.WaitVisible(css("#import-file")),
		chromedp.SetUploadFiles(css("#import-file"), []string{exported}),
		chromedp.WaitVisible(css("#import-confirm")))
	if p, _ := chromedp.Run(ctx, chromedp.Text(css("#import-preview"))); !strings.Contains(p, `users["bob"].keys`) {
		t.Fatalf("the import preview does not list bob's keys: %q", p)
	}
	check("import preview")

	mu.Lock()
	defer mu.Unlock()
	if len(answers) < 10 {
		t.Fatalf("the console read only %d answers", len(answers))
	}
	for path, body := range answers {
		if path == "GET /api/backup/export" || strings.HasPrefix(path, "GET /api/backup/snapshots/") {
			continue // the backup file keeps the hashes
		}
		if x := leak(string(body)); x != "" {
			t.Errorf("the console read %s, whose answer holds a key hash (%q)", path, x)
		}
	}
}

// teeWriter keeps a copy of what a handler writes.
type teeWriter struct {
	http.ResponseWriter
	buf bytes.Buffer
}

func (w *teeWriter) Write(p []byte) (int, error) {
	w.buf.Write(p)
	return w.ResponseWriter.Write(p)
}
