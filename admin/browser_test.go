package admin

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/browser"
	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/chromedp"

	"github.com/infera/infera/config"
	"github.com/infera/infera/internal/browsertest"
)

// TestConsoleInBrowser drives the console in headless Chromium the way an
// operator would: sign in, edit a section (a bad value shows its error next
// to the field, a good one applies), read canary weights as percentages,
// create a user and get its key once, export a backup and import it back.
// With INFERA_UPDATE_SCREENSHOTS=1 it saves docs/img/console.png (docs/img/console-fleet.png is taken from
// a real gateway's fleet by gateway's TestE2EAdminConsoleDrivesTheRouter).
func TestConsoleInBrowser(t *testing.T) {
	ctx := newBrowser(t)
	ff := &fakeFleet{
		workers: []WorkerInfo{
			{ID: "engine-a", URL: "http://127.0.0.1:8101", Models: []string{"qwen3-8b"}, Service: "qwen3-8b", Role: "mixed", Status: "routable", Breaker: "closed", ActiveRequests: 7, ActiveTokens: 5120, PendingRequests: 1, KVBlocks: 18342, HitRate: 0.62, Requests: 12004},
			{ID: "engine-b", URL: "http://127.0.0.1:8102", Models: []string{"qwen3-8b"}, Service: "qwen3-8b", Role: "mixed", Status: "routable", Breaker: "half-open", ActiveRequests: 2, ActiveTokens: 910, KVBlocks: 9120, HitRate: 0.41, Requests: 11876, Failures: 3},
		},
		rules: []RuleHit{{Rule: "user_limit.templates[gold].rate.rpm", Result: "would_block", DryRun: true, Count: 14}},
	}
	e := newEnv(t, envOpts{file: `{}`, snapshotDir: t.TempDir(), fleet: ff})
	if r := e.do("POST", "/api/templates", `{"name":"gold","default":true,"rate":{"enabled":true,"rpm":60}}`); r.status != 201 {
		t.Fatalf("template: %d %s", r.status, r.body)
	}

	dl := t.TempDir()
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
		s, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(sel)))
		if err != nil {
			t.Fatalf("text of %s: %v", sel, err)
		}
		return s
	}
	css := func(s string) chromedp.CSS { return chromedp.CSS(s) }
	// clear empties an input as select-all + delete would (chromedp.Clear
	// only resets the value attribute, not what was typed).
	clear := func(sel chromedp.CSS) chromedp.Action[chromedp.Void] {
		js, _ := json.Marshal(string(sel))
		return chromedp.Evaluate[chromedp.Void](`(() => { const el = document.querySelector(` + string(js) + `); el.value = ''; el.dispatchEvent(new Event('input', {bubbles: true})); })()`)
	}

	// Sign in: a wrong key is refused, the admin key opens the fleet page.
	step("open console", chromedp.Navigate(e.srv.URL+"/"), chromedp.WaitVisible(css("#admin-key")))
	step("wrong key", chromedp.SendKeys(css("#admin-key"), "not-the-key"), chromedp.Click(css("#login")), chromedp.WaitVisible(css("#login-error")))
	if !strings.Contains(text("#login-error"), "not the admin key") {
		t.Fatalf("login error: %q", text("#login-error"))
	}
	step("sign in", clear(css("#admin-key")), chromedp.SendKeys(css("#admin-key"), testKey), chromedp.Click(css("#login")),
		chromedp.WaitVisible(css(`tr[data-worker="engine-b"]`)))
	if row := text(`tr[data-worker="engine-b"]`); !strings.Contains(row, "half-open") || !strings.Contains(row, "41.0%") || !strings.Contains(row, "9120") {
		t.Fatalf("fleet row: %q", row)
	}
	saveShot := func(name string) {
		t.Helper()
		// No caret and no transition in flight: the same page gives the
		// same picture.
		step("settle", chromedp.Evaluate[chromedp.Void](`document.activeElement && document.activeElement.blur(); document.getElementById("toast")?.classList.remove("show")`), chromedp.Sleep(400*time.Millisecond))
		shot, err := chromedp.Run(ctx, chromedp.CaptureScreenshot())
		if err != nil {
			t.Fatal(err)
		}
		// The docs' picture is rewritten only on request: a run must not
		// leave the tree modified (anti-aliasing differs between runs).
		dir := t.TempDir()
		if os.Getenv("INFERA_UPDATE_SCREENSHOTS") == "1" {
			dir = "../docs/img"
		}
		if len(shot) < 1000 {
			t.Fatalf("screenshot %s: %d bytes", name, len(shot))
		}
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(dir+"/"+name, shot, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// The fleet page refreshes by itself.
	ff.mu.Lock()
	ff.workers[1].Breaker = "open"
	ff.mu.Unlock()
	step("live refresh", chromedp.WaitVisible(css(`tr[data-worker="engine-b"] .badge.bad + .badge, tr[data-worker="engine-b"] td:nth-child(4) .badge.bad`)))

	// Session affinity: a bad value shows its error at the field.
	step("section page", chromedp.Navigate(e.srv.URL+"/#/section/session_affinity"), chromedp.WaitVisible(css(`form[data-section="session_affinity"]`)))
	if help := text(`[data-path="session_affinity.require_session_id"] .help`); !strings.Contains(help, "HTTP 400") {
		t.Fatalf("help text: %q", help)
	}
	if def := text(`[data-path="session_affinity.ttl_s"] .def`); def != "Default: 1800 s" {
		t.Fatalf("default shown: %q", def)
	}
	step("bad value",
		chromedp.Click(css(`[data-path="session_affinity.enabled"] .track`)),
		chromedp.Click(css(`[data-path="session_affinity.require_session_id"] .track`)),
		clear(css("#f-session_affinity_ttl_s")), chromedp.SendKeys(css("#f-session_affinity_ttl_s"), "-5"),
		chromedp.Click(css("#save")),
		chromedp.WaitVisible(css(`[data-path="session_affinity.ttl_s"].invalid .err`)))
	if msg := text(`[data-path="session_affinity.ttl_s"] .err`); !strings.Contains(msg, "must be positive") {
		t.Fatalf("inline error: %q", msg)
	}
	if e.store.Load().SessionAffinity.Enabled {
		t.Fatal("a refused form was applied")
	}
	step("good value",
		clear(css("#f-session_affinity_ttl_s")), chromedp.SendKeys(css("#f-session_affinity_ttl_s"), "600"),
		chromedp.Click(css("#save")),
		chromedp.Poll[chromedp.Void](`document.querySelector('#save-status').textContent.startsWith('Saved')`, chromedp.WithPollingTimeout(5*time.Second)))
	sa := e.store.Load().SessionAffinity
	if !sa.Enabled || !sa.RequireSessionID || sa.TTLSeconds != 600 {
		t.Fatalf("the console's save did not reach the snapshot: %+v", sa)
	}
	c, _ := config.ReadFile(e.path)
	if !c.SessionAffinity.RequireSessionID {
		t.Fatal("the console's save did not reach the config file")
	}
	saveShot("console.png")
	// A half-typed number ("5e": the browser reads it as "") is refused at
	// its field; it was sent as cleared and saved the default (1800).
	step("not a number",
		clear(css("#f-session_affinity_ttl_s")), chromedp.SendKeys(css("#f-session_affinity_ttl_s"), "5e"),
		chromedp.Click(css("#save")),
		chromedp.WaitVisible(css(`[data-path="session_affinity.ttl_s"].invalid .err`)))
	if msg := text(`[data-path="session_affinity.ttl_s"] .err`); !strings.Contains(msg, "not a number") {
		t.Fatalf("inline error: %q", msg)
	}
	if got := e.store.Load().SessionAffinity.TTLSeconds; got != 600 {
		t.Fatalf("a half-typed number was saved: ttl_s %v", got)
	}
	step("fixed",
		clear(css("#f-session_affinity_ttl_s")), chromedp.SendKeys(css("#f-session_affinity_ttl_s"), "600"),
		chromedp.Click(css("#save")),
		chromedp.Poll[chromedp.Void](`document.querySelector('#save-status').textContent.startsWith('Saved')`, chromedp.WithPollingTimeout(5*time.Second)))

	// Canary weights read as percentages while typing.
	step("canary", chromedp.Navigate(e.srv.URL+"/#/section/canary"), chromedp.WaitVisible(css(`form[data-section="canary"]`)),
		chromedp.Click(css(`[data-add="canary.rules"]`)),
		chromedp.SendKeys(css("#f-canary_rules_0__model"), "*"),
		chromedp.Click(css(`[data-add="canary.rules[0].targets"]`)),
		chromedp.Click(css(`[data-add="canary.rules[0].targets"]`)),
		chromedp.SendKeys(css("#f-canary_rules_0__targets_0__service"), "stable"),
		clear(css("#f-canary_rules_0__targets_0__weight")), chromedp.SendKeys(css("#f-canary_rules_0__targets_0__weight"), "3"),
		chromedp.SendKeys(css("#f-canary_rules_0__targets_1__service"), "canary"),
		clear(css("#f-canary_rules_0__targets_1__weight")), chromedp.SendKeys(css("#f-canary_rules_0__targets_1__weight"), "1"))
	if p := text(`[data-pct="canary.rules[0].targets[0].weight"]`); p != "75%" {
		t.Fatalf("canary share: %q", p)
	}
	step("save canary", chromedp.Click(css(`[data-path="canary.enabled"] .track`)), chromedp.Click(css("#save")),
		chromedp.Poll[chromedp.Void](`document.querySelector('#save-status').textContent.startsWith('Saved')`, chromedp.WithPollingTimeout(5*time.Second)))
	if cn := e.store.Load().Canary; !cn.Enabled || len(cn.Rules) != 1 || cn.Rules[0].Targets[0].Weight != 3 {
		t.Fatalf("canary: %+v", cn)
	}

	// A user: its key is shown once, and only its hash is stored.
	step("users", chromedp.Navigate(e.srv.URL+"/#/users"), chromedp.WaitVisible(css("#create-user")),
		chromedp.SendKeys(css("#new-user-name"), "erin"),
		chromedp.Click(css("#create-user-btn")),
		chromedp.WaitVisible(css("#new-key")))
	key, err := chromedp.Run(ctx, chromedp.Value(css("#new-key")))
	if err != nil {
		t.Fatal(err)
	}
	users := e.store.Load().Users
	if len(users) != 1 || users[0].Name != "erin" || !verifyKey(t, key, users[0].Keys[0]) {
		t.Fatalf("user: %+v", users)
	}
	step("key stored", chromedp.Click(css("#key-done")), chromedp.WaitVisible(css(`tr[data-user="erin"]`)))
	if strings.Contains(text("body"), key) {
		t.Fatal("the key is still on the page after the dialog")
	}

	// Export a backup, change something, import the backup back.
	step("backup page", chromedp.Navigate(e.srv.URL+"/#/backup"), chromedp.WaitVisible(css("#export")),
		chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
			_, err := cdp.Call(ctx, tg, browser.SetDownloadBehavior, browser.SetDownloadBehaviorParams{
				Behavior: browser.SetDownloadBehaviorBehaviorAllow, DownloadPath: dl})
			return err
		}),
		chromedp.Click(css("#export")))
	// The export opens where the seal key is the same: the admin key only
	// by default (it said "sealed with the admin key", also under
	// --admin-seal-key, where the admin key opens nothing).
	if card := text("main"); !strings.Contains(card, "--admin-seal-key") {
		t.Fatalf("the backup page does not say which key seals an export's upstream secrets: %q", card)
	}
	// With --config the later of the file and the newest snapshot wins at
	// start (docs/admin.md); it said the file always did.
	if card := text("main"); strings.Contains(card, "then the file wins") {
		t.Fatalf("the backup page says the config file always wins at start: %q", card)
	}
	var exported string
	eventually(t, 10*time.Second, "export downloaded", func() bool {
		m, _ := filepath.Glob(filepath.Join(dl, "infera-snapshot-*.json"))
		if len(m) == 1 {
			data, _ := os.ReadFile(m[0])
			if json.Valid(data) {
				exported = m[0]
				return true
			}
		}
		return false
	})
	e.put("session_affinity", `{"enabled":false}`, 200)
	e.do("DELETE", "/api/users/erin", "", "If-Match", e.etag())
	step("import", chromedp.Navigate(e.srv.URL+"/#/backup"), chromedp.WaitVisible(css("#import-file")),
		chromedp.SetUploadFiles(css("#import-file"), []string{exported}),
		chromedp.WaitVisible(css("#import-confirm")))
	if preview := text("#import-preview"); !strings.Contains(preview, "session_affinity.enabled") {
		t.Fatalf("import preview: %q", preview)
	}
	step("confirm import", chromedp.Click(css("#import-confirm")),
		chromedp.Poll[chromedp.Void](`(document.querySelector('#toast') || {}).textContent?.startsWith('Imported')`, chromedp.WithPollingTimeout(5*time.Second)))
	c2 := e.store.Load()
	if !c2.SessionAffinity.Enabled || c2.SessionAffinity.TTLSeconds != 600 || len(c2.Users) != 1 || c2.Users[0].Name != "erin" {
		t.Fatalf("import did not restore: %+v users=%d", c2.SessionAffinity, len(c2.Users))
	}
}

// A set secret shows in the console as an empty field with its
// fingerprint, and an empty field keeps it. Nothing in the console removed
// one: a mirror's token, or the key of a split proxy entry turned into the
// local service (which takes none, so every save was refused) stayed until
// the entry was deleted. Remove clears it; saving without it keeps it.
func TestTheConsoleRemovesASetSecret(t *testing.T) {
	ctx := newBrowser(t)
	e := newEnv(t, envOpts{file: `{"mirror":{"enabled":true,"target_address":"http://127.0.0.1:9","auth_token":"mirror-token-0123"}}`})
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
	saved := chromedp.Poll[chromedp.Void](`document.querySelector('#save-status').textContent.startsWith('Saved')`, chromedp.WithPollingTimeout(5*time.Second))
	step("sign in", chromedp.Navigate(e.srv.URL+"/"), chromedp.WaitVisible(css("#admin-key")),
		chromedp.SendKeys(css("#admin-key"), testKey), chromedp.Click(css("#login")), chromedp.WaitVisible(css("#fleet")))
	step("mirror page", chromedp.Navigate(e.srv.URL+"/#/section/mirror"), chromedp.WaitVisible(css("#f-mirror_auth_token")))
	step("save another setting",
		chromedp.SendKeys(css("#f-mirror_sampling_ratio"), "5"), chromedp.Click(css("#save")), saved)
	if m := e.store.Load().Mirror; m.AuthToken.Reveal() != "mirror-token-0123" || m.SamplingRatio == 0 {
		t.Fatalf("a save that left the token's field empty: token %q, sampling ratio %v (want the token kept)", m.AuthToken.Reveal(), m.SamplingRatio)
	}
	step("remove the token", chromedp.WaitVisible(css(`[data-clear="mirror.auth_token"]`)),
		chromedp.Click(css(`[data-clear="mirror.auth_token"]`)), chromedp.Click(css("#save")), saved)
	if m := e.store.Load().Mirror; m.AuthToken.IsSet() || !m.Enabled {
		t.Fatalf("after Remove and Save: token set %v, mirror enabled %v (want no token, the rest kept)", m.AuthToken.IsSet(), m.Enabled)
	}
	if c, _ := config.ReadFile(e.path); c.Mirror.AuthToken.IsSet() {
		t.Fatal("the removed token is still in the config file")
	}
}

// The console is opened under a name the admin API does not answer for
// (a Kubernetes service name not in --admin-allowed-hosts): signing in
// said only "The admin API answered 421.", not why, nor the flag that
// fixes it, which the API's answer names.
func TestTheConsoleSaysWhyTheAdminAPIRefusedTheSignIn(t *testing.T) {
	ctx := newBrowser(t, chromedp.Flag("host-resolver-rules", "MAP admin.example 127.0.0.1"))
	e := newEnv(t, envOpts{})
	url := strings.Replace(e.srv.URL, "127.0.0.1", "admin.example", 1)
	css := func(s string) chromedp.CSS { return chromedp.CSS(s) }
	sctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	if err := chromedp.Do(sctx, chromedp.Navigate(url+"/"), chromedp.WaitVisible(css("#admin-key")),
		chromedp.SendKeys(css("#admin-key"), testKey), chromedp.Click(css("#login")), chromedp.WaitVisible(css("#login-error"))); err != nil {
		t.Fatal(err)
	}
	msg, err := chromedp.Run(ctx, chromedp.Text(css("#login-error")))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(msg, "421") || !strings.Contains(msg, "--admin-allowed-hosts") {
		t.Fatalf("the sign-in error says %q: want the status and the API's reason (--admin-allowed-hosts)", msg)
	}
}

// newBrowser starts headless Chromium for the test, stopped at its end,
// and returns the context of its tab (60 s); it skips without Chromium.
func newBrowser(t *testing.T, opts ...chromedp.ExecAllocatorOption) context.Context {
	t.Helper()
	bin := browsertest.FindChromium(t)
	actx, cancel := chromedp.NewExecAllocator(context.Background(), append([]chromedp.ExecAllocatorOption{
		chromedp.ExecPath(bin),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.WindowSize(1360, 1000),
		chromedp.UserDataDir(t.TempDir()),
		// Chromium keeps its singleton socket in a directory of its own
		// under TMPDIR, which a killed browser leaves behind: one per run.
		chromedp.Env("TMPDIR=" + browsertest.ShortTempDir(t)),
	}, opts...)...)
	t.Cleanup(cancel)
	ctx, cancel2 := chromedp.NewContext(actx)
	t.Cleanup(cancel2)
	ctx, cancel3 := context.WithTimeout(ctx, 60*time.Second)
	t.Cleanup(cancel3)
	if err := chromedp.Do(ctx); err != nil { // starts the browser, bound to ctx
		t.Fatalf("cannot start %s: %v", bin, err)
	}
	browsertest.FailOnPageErrors(t, ctx)
	return ctx
}
