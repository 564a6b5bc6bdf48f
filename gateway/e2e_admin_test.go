package gateway

// End-to-end tests of the configuration center through the real `infera
// serve` wiring: the admin listener that gateway.New opens, the router it
// configures, real engines, a real redis-server and headless Chromium.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/browser"
	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"

	"github.com/infera/infera/config"
	"github.com/infera/infera/fleet"
	"github.com/infera/infera/govern"
	"github.com/infera/infera/internal/browsertest"
	"github.com/infera/infera/internal/testsrv"
)

const e2eAdminKey = "e2e-admin-key-5f1c9a7e"

// No gateway of this package's tests binds the fixed default admin port
// (8081: --api-key alone opens the admin listener there), which would
// collide between gateways and with a router running on the machine. A
// test that wants the listener passes --admin-port (startAdminServe);
// child processes inherit the variable.
func init() { os.Setenv("INFERA_ADMIN_PORT", "0") }

// adminGateway is one `infera serve` process (in-process) with its admin
// listener.
type adminGateway struct {
	t      *testing.T
	g      *Gateway
	router string // http://host:port of the inference listener
	admin  string // http://host:port of the admin listener
	once   sync.Once
}

// startAdminServe runs `infera serve args... --admin-port=-1 --admin-key
// <key>`: the admin listener binds a port of its own.
func startAdminServe(t *testing.T, args ...string) *adminGateway {
	t.Helper()
	args = append(args, "--admin-port=-1", "--admin-key", e2eAdminKey)
	f := parseServe(t, args...)
	g, err := New(f)
	if err != nil {
		t.Fatalf("infera serve %v: %v", args, err)
	}
	ln, err := netListen(t)
	if err != nil {
		g.Close()
		t.Fatal(err)
	}
	go g.Serve(ln)
	ag := &adminGateway{t: t, g: g, router: "http://" + ln.Addr().String()}
	if a := g.Admin().Addr(); a != nil {
		ag.admin = "http://" + a.String()
	} else {
		g.Close()
		t.Fatal("the admin listener is off")
	}
	t.Cleanup(ag.stop)
	return ag
}

// stop drains and closes the gateway, as `infera serve` does on SIGTERM
// (the admin writes its last snapshot).
func (ag *adminGateway) stop() {
	ag.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		ag.g.Shutdown(ctx)
		ag.g.Close()
	})
}

func netListen(t *testing.T) (net.Listener, error) {
	t.Helper()
	return net.Listen("tcp4", "127.0.0.1:0")
}

type apiResp struct {
	status int
	etag   string
	body   []byte
}

func (r apiResp) String() string { return fmt.Sprintf("%d %s", r.status, r.body) }

// errPath returns the path and message of an error answer.
func (r apiResp) errPath(t *testing.T) (string, string) {
	t.Helper()
	var e struct {
		Error struct {
			Path    string `json:"path"`
			Message string `json:"message"`
			Version uint64 `json:"version"`
		} `json:"error"`
	}
	if err := json.Unmarshal(r.body, &e); err != nil || e.Error.Message == "" {
		t.Fatalf("not an error answer: %s", r)
	}
	return e.Error.Path, e.Error.Message
}

// api calls the admin API with the admin key; hdr are name, value pairs.
func (ag *adminGateway) api(method, path, body string, hdr ...string) apiResp {
	ag.t.Helper()
	req, err := http.NewRequest(method, ag.admin+path, strings.NewReader(body))
	if err != nil {
		ag.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+e2eAdminKey)
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		ag.t.Fatal(err)
	}
	defer res.Body.Close()
	data, _ := io.ReadAll(res.Body)
	return apiResp{status: res.StatusCode, etag: res.Header.Get("ETag"), body: data}
}

// etag returns the current ETag.
func (ag *adminGateway) etag() string {
	ag.t.Helper()
	r := ag.api("GET", "/api/version", "")
	if r.status != 200 || r.etag == "" {
		ag.t.Fatalf("version: %s", r)
	}
	return r.etag
}

// patch merges body into section with the current ETag and wants 200.
func (ag *adminGateway) patch(section, body string) {
	ag.t.Helper()
	if r := ag.api("PATCH", "/api/config/"+section, body, "If-Match", ag.etag()); r.status != 200 {
		ag.t.Fatalf("PATCH %s %s: %s", section, body, r)
	}
}

// chat sends one chat completion to the router; hdr are name, value pairs.
func (ag *adminGateway) chat(hdr ...string) (int, string) {
	ag.t.Helper()
	return routerChat(ag.t, ag.router, hdr...)
}

func routerChat(t *testing.T, router string, hdr ...string) (int, string) {
	t.Helper()
	req, err := http.NewRequest("POST", router+"/v1/chat/completions",
		strings.NewReader(`{"model":"sim-model","max_tokens":2,"messages":[{"role":"user","content":"hello admin"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	data, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(data)
}

// wantChat checks the router's answer to a chat without (and, when sid is
// set, with) a session header.
func (ag *adminGateway) wantChat(what string, want int, hdr ...string) {
	ag.t.Helper()
	if st, body := ag.chat(hdr...); st != want {
		ag.t.Fatalf("%s: router answered %d, want %d: %s", what, st, want, body)
	}
}

// waitChat polls the router until it answers want (a replica adopting a
// change), for up to d; it returns how long that took.
func waitChat(t *testing.T, router string, d time.Duration, what string, want int, hdr ...string) time.Duration {
	t.Helper()
	start := time.Now()
	for {
		st, body := routerChat(t, router, hdr...)
		if st == want {
			return time.Since(start)
		}
		if time.Since(start) > d {
			t.Fatalf("%s: router still answers %d (want %d) after %v: %s", what, st, want, d, body)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestE2EAdminConsoleDrivesTheRouter drives the console of a real `infera
// serve` in headless Chromium, as an operator would, and checks the
// router's behaviour after each step: sign in; the fleet page shows the
// real worker; a bad value in Session affinity shows its error at the
// field and changes nothing; a good one (require a session id) makes the
// router refuse a request without the session header with 400; a user is
// created and its key used; a backup is exported, the config changed, and
// the backup imported back, which restores the router's behaviour.
func TestE2EAdminConsoleDrivesTheRouter(t *testing.T) {
	bin := browsertest.FindChromium(t)
	// Two engines publishing KV events, routed kv-aware: the fleet page
	// shows their KV blocks.
	var workers []string
	for _, id := range []string{"engine-a", "engine-b"} {
		_, url, ep := startKVEngine(t, "--speedup", "50", "--block-size", "16")
		workers = append(workers, fmt.Sprintf(`{"id":%q,"url":%q,"models":["sim-model"],"kv_events_endpoint":%q,"block_size":16}`, id, url, ep))
	}
	cfgPath := filepath.Join(t.TempDir(), "infera.json")
	if err := os.WriteFile(cfgPath, []byte(`{"workers":[`+strings.Join(workers, ",")+`]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	ag := startAdminServe(t, "--config", cfgPath, "--config-poll", "1h",
		"--router-policy", "kv-aware", "--kv-event-transport", "zmq", "--kv-block-size", "16")
	waitRoutable(t, ag.g, 2)
	time.Sleep(200 * time.Millisecond) // the SUB sockets connect
	for i := 0; i < 6; i++ {
		prompt := strings.Repeat(fmt.Sprintf("Conversation %d: a long shared system prompt. ", i), 12)
		if resp, b := doPost(t, ag.router+"/v1/chat/completions", `{"model":"sim-model","max_tokens":2,"messages":[{"role":"user","content":"`+prompt+`"}]}`); resp.StatusCode != 200 {
			t.Fatalf("warm-up %d: %d %s", i, resp.StatusCode, b)
		}
	}
	ag.wantChat("before any change", 200)

	ctx := newBrowser(t, bin)
	browsertest.FailOnPageErrors(t, ctx)
	dl := t.TempDir()
	step := func(what string, steps ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		sctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		defer cancel()
		if err := chromedp.Do(sctx, steps...); err != nil {
			ectx, ecancel := context.WithTimeout(ctx, 3*time.Second)
			defer ecancel()
			body, berr := chromedp.Run(ectx, chromedp.Evaluate[string](`location.href + '\n' + document.body.innerText.slice(0, 2000)`))
			t.Fatalf("%s: %v; the page shows (%v):\n%s", what, err, berr, body)
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
	clear := func(sel chromedp.CSS) chromedp.Action[chromedp.Void] {
		js, _ := json.Marshal(string(sel))
		return chromedp.Evaluate[chromedp.Void](`(() => { const el = document.querySelector(` + string(js) + `); el.value = ''; el.dispatchEvent(new Event('input', {bubbles: true})); })()`)
	}
	saved := chromedp.Poll[chromedp.Void](`document.querySelector('#save-status').textContent.startsWith('Saved')`, chromedp.WithPollingTimeout(5*time.Second))

	// Sign in with the admin key: the fleet page lists the gateway's worker.
	step("open console", chromedp.Navigate(ag.admin+"/"), chromedp.WaitVisible(css("#admin-key")))
	step("wrong key", chromedp.SendKeys(css("#admin-key"), "not-the-key"), chromedp.Click(css("#login")), chromedp.WaitVisible(css("#login-error")))
	step("sign in", clear(css("#admin-key")), chromedp.SendKeys(css("#admin-key"), e2eAdminKey), chromedp.Click(css("#login")),
		chromedp.WaitVisible(css(`tr[data-worker="engine-a"]`)))
	if row := text(`tr[data-worker="engine-a"]`); !strings.Contains(row, "routable") || !strings.Contains(row, "closed") || !strings.Contains(row, "sim-model") {
		t.Fatalf("fleet row of the real worker: %q", row)
	}
	// The page refreshes by itself until the KV events of the warm-up show.
	step("KV blocks", chromedp.Poll[chromedp.Void](`[...document.querySelectorAll('#fleet tbody tr td:nth-child(8)')].some((td) => Number(td.textContent) > 0)`,
		chromedp.WithPollingTimeout(5*time.Second)))
	if os.Getenv("INFERA_UPDATE_SCREENSHOTS") == "1" { // it shows the time of day
		saveScreenshot(t, ctx, "console-fleet.png")
	}

	// A bad value: the error shows at the field, nothing changes.
	step("section page", chromedp.Navigate(ag.admin+"/#/section/session_affinity"), chromedp.WaitVisible(css(`form[data-section="session_affinity"]`)))
	step("bad value",
		chromedp.Click(css(`[data-path="session_affinity.enabled"] .track`)),
		chromedp.Click(css(`[data-path="session_affinity.require_session_id"] .track`)),
		clear(css("#f-session_affinity_ttl_s")), chromedp.SendKeys(css("#f-session_affinity_ttl_s"), "-5"),
		chromedp.Click(css("#save")),
		chromedp.WaitVisible(css(`[data-path="session_affinity.ttl_s"].invalid .err`)))
	if msg := text(`[data-path="session_affinity.ttl_s"] .err`); !strings.Contains(msg, "must be positive") {
		t.Fatalf("inline error: %q", msg)
	}
	ag.wantChat("after a refused form", 200)

	// A good value: the router now requires the session header.
	step("good value", clear(css("#f-session_affinity_ttl_s")), chromedp.SendKeys(css("#f-session_affinity_ttl_s"), "600"),
		chromedp.Click(css("#save")), saved)
	ag.wantChat("session id required, none sent", 400)
	ag.wantChat("session id required and sent", 200, "X-Session-Id", "s-1")
	if c, err := config.ReadFile(cfgPath); err != nil || !c.SessionAffinity.RequireSessionID || c.SessionAffinity.TTLSeconds != 600 {
		t.Fatalf("the save did not reach the config file: %v", err)
	}

	// A user: its key is shown once.
	step("users", chromedp.Navigate(ag.admin+"/#/users"), chromedp.WaitVisible(css("#create-user")),
		chromedp.SendKeys(css("#new-user-name"), "erin"),
		chromedp.Click(css("#create-user-btn")),
		chromedp.WaitVisible(css("#new-key")))
	key, err := chromedp.Run(ctx, chromedp.Value(css("#new-key")))
	if err != nil || !strings.HasPrefix(key, "ifr_") {
		t.Fatalf("key %q: %v", key, err)
	}
	step("key stored", chromedp.Click(css("#key-done")), chromedp.WaitVisible(css(`tr[data-user="erin"]`)))
	auth := "Bearer " + key
	ag.wantChat("with the user's key", 200, "X-Session-Id", "s-1", "Authorization", auth)
	ag.wantChat("without a key once users exist", 401, "X-Session-Id", "s-1")
	ag.wantChat("with a wrong key", 401, "X-Session-Id", "s-1", "Authorization", auth[:len(auth)-2]+"xx")
	// The quota template and the binding the admin writes are what the
	// router enforces: one request a minute, then 429.
	if r := ag.api("POST", "/api/templates", `{"name":"tiny","rate":{"enabled":true,"rpm":1}}`); r.status != 201 {
		t.Fatalf("template: %s", r)
	}
	bind := func(body string) {
		t.Helper()
		if r := ag.api("PUT", "/api/users/erin", body, "If-Match", ag.etag()); r.status != 200 {
			t.Fatalf("PUT erin %s: %s", body, r)
		}
	}
	bind(`{"template":"tiny","enabled":true}`)
	st, body := 0, ""
	for i := 0; i < 3 && st != 429; i++ {
		st, body = ag.chat("X-Session-Id", "s-1", "Authorization", auth)
	}
	if st != 429 || !strings.Contains(body, "rate_limit_rpm") {
		t.Fatalf("rpm 1 bound through the admin: %d %s", st, body)
	}
	// The console's rule hit counters show the refusal.
	step("rule hits", chromedp.Navigate(ag.admin+"/#/rules"), chromedp.WaitVisible(css("#rules")),
		chromedp.Poll[chromedp.Void](`document.querySelector('#rules').innerText.includes('rate_limit_rpm')`, chromedp.WithPollingTimeout(5*time.Second)))
	// The users page shows erin's empty RPM bucket, from the router's counters.
	step("usage", chromedp.Navigate(ag.admin+"/#/users"), chromedp.WaitVisible(css(`td[data-usage="erin"]`)),
		chromedp.Poll[chromedp.Void](`(c => c && c.innerText.includes('RPM 0/1 left') && c.querySelector('.stat.full'))(document.querySelector('td[data-usage="erin"]'))`,
			chromedp.WithPollingTimeout(5*time.Second)))
	bind(`{"template":"","enabled":false}`)
	ag.wantChat("a disabled user", 403, "X-Session-Id", "s-1", "Authorization", auth)
	bind(`{"template":"","enabled":true}`)
	ag.wantChat("enabled again", 200, "X-Session-Id", "s-1", "Authorization", auth)
	// The models erin may call, set on the users page: another model only,
	// then every model again.
	setModels := func(what, v string) {
		t.Helper()
		// Through another page: the users page reads the current ETag.
		step(what, chromedp.Navigate(ag.admin+"/#/rules"), chromedp.WaitVisible(css("#rules")),
			chromedp.Navigate(ag.admin+"/#/users"), chromedp.WaitVisible(css(`input[data-models="erin"]`)),
			// As a user edits: erase the field's text, type, leave the field.
			chromedp.SendKeys(css(`input[data-models="erin"]`), kb.End+strings.Repeat(kb.Backspace, 64)+v),
			chromedp.Blur(css(`input[data-models="erin"]`)),
			chromedp.Poll[chromedp.Void](`(e => e && e.value === `+strconv.Quote(v)+`)(document.querySelector('input[data-models="erin"]'))`, chromedp.WithPollingTimeout(5*time.Second)))
	}
	setModels("models", "other-model, other-*")
	waitChat(t, ag.router, 5*time.Second, "a model outside erin's list", 403, "X-Session-Id", "s-1", "Authorization", auth)
	setModels("every model", "")
	waitChat(t, ag.router, 5*time.Second, "every model again", 200, "X-Session-Id", "s-1", "Authorization", auth)

	// Export a backup, change the config, import the backup: the router
	// requires the session header again.
	step("backup page", chromedp.Navigate(ag.admin+"/#/backup"), chromedp.WaitVisible(css("#export")),
		chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
			_, err := cdp.Call(ctx, tg, browser.SetDownloadBehavior, browser.SetDownloadBehaviorParams{
				Behavior: browser.SetDownloadBehaviorBehaviorAllow, DownloadPath: dl})
			return err
		}),
		chromedp.Click(css("#export")))
	exported := waitDownload(t, dl)
	ag.patch("session_affinity", `{"require_session_id":false}`)
	ag.wantChat("after turning the requirement off", 200, "Authorization", auth)
	step("import", chromedp.Navigate(ag.admin+"/#/backup"), chromedp.WaitVisible(css("#import-file")),
		chromedp.SetUploadFiles(css("#import-file"), []string{exported}),
		chromedp.WaitVisible(css("#import-confirm")))
	if preview := text("#import-preview"); !strings.Contains(preview, "session_affinity.require_session_id") {
		t.Fatalf("import preview: %q", preview)
	}
	step("confirm import", chromedp.Click(css("#import-confirm")),
		chromedp.Poll[chromedp.Void](`(document.querySelector('#toast') || {}).textContent?.startsWith('Imported')`, chromedp.WithPollingTimeout(5*time.Second)))
	ag.wantChat("after the import", 400, "Authorization", auth)
	ag.wantChat("after the import, with a session", 200, "X-Session-Id", "s-1", "Authorization", auth)
	if us := ag.g.Store().Load().Users; len(us) != 1 || us[0].Name != "erin" {
		t.Fatalf("users after the import: %+v", us)
	}
	// The audit log tells who did what, through the console.
	step("audit", chromedp.Navigate(ag.admin+"/#/audit"), chromedp.WaitVisible(css("#audit")))
	if a := text("#audit"); !strings.Contains(a, "import") || !strings.Contains(a, "session_affinity.require_session_id") {
		t.Fatalf("audit page: %q", a)
	}
}

// saveScreenshot writes the page as docs/img/name, without caret or toast.
func saveScreenshot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	if _, err := chromedp.Run(ctx, chromedp.Evaluate[chromedp.Void](`document.activeElement && document.activeElement.blur(); document.getElementById("toast")?.classList.remove("show")`)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(400 * time.Millisecond) // transitions end
	shot, err := chromedp.Run(ctx, chromedp.CaptureScreenshot())
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join("..", "docs", "img", name), shot, 0o644); err != nil {
		t.Fatal(err)
	}
}

// newBrowser starts headless Chromium for the test (stopped at its end)
// and returns its context, bounded to 60 s.
func newBrowser(t *testing.T, bin string) context.Context {
	t.Helper()
	actx, cancel := chromedp.NewExecAllocator(context.Background(),
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
		chromedp.Env("TMPDIR="+browsertest.ShortTempDir(t)),
	)
	ctx, cancel2 := chromedp.NewContext(actx)
	ctx, cancel3 := context.WithTimeout(ctx, 60*time.Second)
	t.Cleanup(func() { cancel3(); cancel2(); cancel() })
	if err := chromedp.Do(ctx); err != nil { // starts the browser, bound to ctx
		t.Fatalf("cannot start %s: %v", bin, err)
	}
	return ctx
}

// waitDownload returns the one exported snapshot downloaded into dir.
func waitDownload(t *testing.T, dir string) string {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		m, _ := filepath.Glob(filepath.Join(dir, "infera-snapshot-*.json"))
		if len(m) == 1 {
			if data, _ := os.ReadFile(m[0]); json.Valid(data) {
				return m[0]
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatal("the export was not downloaded")
	return ""
}

// Version conflicts and bad imports through the gateway: a stale ETag,
// two operators with the same ETag, a hand edit of the config file the
// poll has not seen yet and a write without If-Match are refused; a bad
// import (not JSON, not a snapshot, a checksum that does not match, an
// invalid setting) changes nothing, and the router keeps its behaviour.
func TestE2EAdminConflictsAndBadImportsChangeNothing(t *testing.T) {
	_, e1 := startEngine(t, "--speedup", "50")
	cfgPath := filepath.Join(t.TempDir(), "infera.json")
	if err := os.WriteFile(cfgPath, []byte(`{}`), 0o600); err != nil {
		t.Fatal(err)
	}
	ag := startAdminServe(t, "--workers", "engine-a="+e1, "--worker-model", "sim-model", "--config", cfgPath,
		"--config-poll", "1h", "--router-policy", "round-robin")
	waitRoutable(t, ag.g, 1)

	// A stale ETag gets 409 with the current version; nothing changes.
	old := ag.etag()
	ag.patch("session_affinity", `{"enabled":true,"require_session_id":true}`)
	ag.wantChat("requirement on", 400)
	r := ag.api("PATCH", "/api/config/session_affinity", `{"require_session_id":false}`, "If-Match", old)
	if r.status != 409 || r.etag != ag.etag() {
		t.Fatalf("stale ETag: %s (ETag %s)", r, r.etag)
	}
	ag.wantChat("after a stale write", 400)
	if r := ag.api("PATCH", "/api/config/session_affinity", `{"require_session_id":false}`); r.status != 428 {
		t.Fatalf("without If-Match: %s", r)
	}

	// Two operators with the same ETag: exactly one wins.
	tag := ag.etag()
	var wg sync.WaitGroup
	statuses := make([]int, 2)
	for i, alg := range []string{"round-robin", "least-tokens"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			statuses[i] = ag.api("PUT", "/api/config/load_balancing", `{"algorithm":"`+alg+`"}`, "If-Match", tag).status
		}()
	}
	wg.Wait()
	if statuses[0]+statuses[1] != 200+409 {
		t.Fatalf("two writes with one ETag answered %v, want one 200 and one 409", statuses)
	}

	// A hand edit of the file the poll has not seen yet (--config-poll 1h):
	// a write with the ETag from before it gets 409 and the edit is kept,
	// and the router serves it.
	tag = ag.etag()
	edit := `{"session_affinity":{"enabled":true,"require_session_id":false},"debug":{"decision_header":true}}`
	if err := os.WriteFile(cfgPath, []byte(edit), 0o600); err != nil {
		t.Fatal(err)
	}
	r = ag.api("PATCH", "/api/config/session_affinity", `{"require_session_id":true}`, "If-Match", tag)
	if r.status != 409 {
		t.Fatalf("write over an unseen hand edit: %s", r)
	}
	if data, _ := os.ReadFile(cfgPath); string(data) != edit {
		t.Fatalf("the hand edit was overwritten: %s", data)
	}
	ag.wantChat("the hand edit serves", 200)

	// Bad imports change nothing.
	ex := ag.api("GET", "/api/backup/export", "")
	if ex.status != 200 {
		t.Fatalf("export: %s", ex)
	}
	// edited returns the export with edit applied to its config document,
	// with or without its checksum.
	edited := func(keepSum bool, edit func(cfg map[string]any)) string {
		t.Helper()
		var snap map[string]any
		if err := json.Unmarshal(ex.body, &snap); err != nil {
			t.Fatal(err)
		}
		edit(snap["config"].(map[string]any))
		if !keepSum {
			delete(snap, "sha256")
		}
		data, _ := json.Marshal(snap)
		return string(data)
	}
	tampered := edited(true, func(cfg map[string]any) { cfg["debug"].(map[string]any)["decision_header"] = false })
	invalid := edited(false, func(cfg map[string]any) { cfg["session_affinity"].(map[string]any)["ttl_s"] = -5 })
	before, ver := ag.etag(), ag.g.Store().Version()
	for _, c := range []struct {
		name, body, path, msg string
	}{
		{"not JSON", `{"format":`, "", "JSON"},
		{"not a snapshot", `{"session_affinity":{}}`, "format", "not an infera snapshot"},
		{"checksum mismatch", tampered, "sha256", "does not match"},
		{"invalid setting", invalid, "config.session_affinity.ttl_s", "must be positive"},
	} {
		r := ag.api("POST", "/api/backup/import", c.body)
		if r.status != 400 {
			t.Fatalf("import %s: %s", c.name, r)
		}
		path, msg := r.errPath(t)
		if path != c.path || !strings.Contains(msg, c.msg) {
			t.Fatalf("import %s: error at %q: %q", c.name, path, msg)
		}
	}
	if ag.etag() != before || ag.g.Store().Version() != ver {
		t.Fatal("a refused import changed the config")
	}
	ag.wantChat("after refused imports", 200)
	if data, _ := os.ReadFile(cfgPath); string(data) != edit {
		t.Fatalf("a refused import rewrote the file: %s", data)
	}
}

// captureLogs tees slog output into a buffer for the test's duration.
func captureLogs(t *testing.T) *syncBuffer {
	lb := &syncBuffer{}
	old := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(io.MultiWriter(lb, os.Stderr), nil)))
	t.Cleanup(func() { slog.SetDefault(old) })
	return lb
}

type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

type snapshotInfo struct {
	Name string `json:"name"`
	Kind string `json:"kind"`
}

func (ag *adminGateway) snapshots() []snapshotInfo {
	ag.t.Helper()
	r := ag.api("GET", "/api/backup", "")
	var b struct {
		Mode      string         `json:"mode"`
		Snapshots []snapshotInfo `json:"snapshots"`
	}
	if r.status != 200 || json.Unmarshal(r.body, &b) != nil || b.Mode != "snapshots" {
		ag.t.Fatalf("backup: %s", r)
	}
	return b.Snapshots
}

// snapshotConfig reads the config of a stored snapshot (nil when it was
// rotated away meanwhile).
func snapshotConfig(t *testing.T, path string) *config.Config {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	var f struct {
		Config json.RawMessage `json:"config"`
	}
	if err := json.Unmarshal(data, &f); err != nil {
		t.Fatalf("snapshot %s: %v", path, err)
	}
	c, err := config.Parse(f.Config)
	if err != nil {
		t.Fatalf("snapshot %s: %v", path, err)
	}
	return c
}

// waitAutoSnapshot waits until the newest automatic snapshot satisfies
// cond and returns the automatic snapshots.
func (ag *adminGateway) waitAutoSnapshot(dir, what string, cond func(c *config.Config) bool) []snapshotInfo {
	ag.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		var auto []snapshotInfo
		for _, s := range ag.snapshots() {
			if s.Kind == "auto" {
				auto = append(auto, s)
			}
		}
		if len(auto) > 0 {
			if c := snapshotConfig(ag.t, filepath.Join(dir, auto[0].Name)); c != nil && cond(c) {
				return auto
			}
		}
		if time.Now().After(deadline) {
			ag.t.Fatalf("no automatic snapshot %s within 5 s: %+v", what, auto)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Snapshots through the gateway (--persist-snapshot-dir, no --config): a
// restarted gateway restores the newest snapshot; the backup section set
// through the API drives the automatic snapshots and their rotation (from
// the next backup cycle, as the configuration center doc says); when the
// newest snapshot is corrupt, the previous one is restored, with the
// reason logged, and the router behaves as that one says.
func TestE2EAdminSnapshotsRestoreAndSkipACorruptNewest(t *testing.T) {
	logs := captureLogs(t)
	_, e1 := startEngine(t, "--speedup", "50")
	dir := t.TempDir()
	args := []string{"--workers", "engine-a=" + e1, "--worker-model", "sim-model", "--persist-snapshot-dir", dir, "--router-policy", "round-robin"}

	// One automatic snapshot a second, two kept; the shutdown snapshot
	// holds the setting for the next start.
	ag := startAdminServe(t, args...)
	ag.patch("backup", `{"interval_s":1,"keep":2}`)
	ag.stop()
	ag = startAdminServe(t, args...)
	waitRoutable(t, ag.g, 1)
	if b := ag.g.Store().Load().Backup; b.IntervalSeconds != 1 || b.Keep != 2 {
		t.Fatalf("the newest snapshot was not restored: backup %+v", b)
	}
	ag.patch("session_affinity", `{"enabled":true,"require_session_id":true}`)
	ag.wantChat("session id required", 400)
	for _, alg := range []string{"round-robin", "least-tokens", "least-requests"} {
		ag.patch("load_balancing", `{"algorithm":"`+alg+`"}`)
		ag.waitAutoSnapshot(dir, "of load_balancing "+alg, func(c *config.Config) bool {
			return c.LoadBalancing.Algorithm == alg && c.SessionAffinity.RequireSessionID
		})
	}
	// Back to an hour. A new interval applies from the next cycle, which
	// may already have started: a restart (whose shutdown snapshot holds
	// it) makes the backup loop idle for sure, so the rotation can be
	// counted and nothing is snapshotted behind the test's back.
	ag.patch("backup", `{"interval_s":3600,"keep":2}`)
	ag.stop()
	ag = startAdminServe(t, args...)
	waitRoutable(t, ag.g, 1)
	var autos []snapshotInfo
	for _, s := range ag.snapshots() {
		if s.Kind == "auto" {
			autos = append(autos, s)
		}
	}
	if len(autos) != 2 {
		t.Fatalf("backup.keep 2, but %d automatic snapshots are kept after 6 changes: %+v", len(autos), autos)
	}
	if c := snapshotConfig(t, filepath.Join(dir, autos[0].Name)); c == nil || c.Backup.IntervalSeconds != 3600 || ag.g.Store().Load().Backup.IntervalSeconds != 3600 {
		t.Fatalf("the shutdown snapshot %s was not restored", autos[0].Name)
	}
	// The state that will be corrupted, newest.
	ag.patch("debug", `{"decision_header":true}`)
	r := ag.api("POST", "/api/backup", "")
	var newest snapshotInfo
	if r.status != 201 || json.Unmarshal(r.body, &newest) != nil || newest.Name == "" {
		t.Fatalf("manual snapshot: %s", r)
	}
	if s := ag.snapshots(); s[0].Name != newest.Name {
		t.Fatalf("the manual snapshot is not the newest: %+v", s)
	}
	ag.stop()

	// A torn newest snapshot (what a crash would leave without the
	// temp-file-and-rename): the previous one is restored.
	path := filepath.Join(dir, newest.Name)
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data[:len(data)/2], 0o600); err != nil {
		t.Fatal(err)
	}
	ag = startAdminServe(t, args...)
	waitRoutable(t, ag.g, 1)
	c := ag.g.Store().Load()
	if c.Debug.DecisionHeader || !c.SessionAffinity.RequireSessionID || c.Backup.IntervalSeconds != 3600 {
		t.Fatalf("restored %+v %+v %+v, want the snapshot before the corrupt one", c.Debug, c.SessionAffinity, c.Backup)
	}
	ag.wantChat("restored from the previous snapshot: session id required", 400)
	ag.wantChat("restored from the previous snapshot: with a session", 200, "X-Session-Id", "s-1")
	if l := logs.String(); !strings.Contains(l, "snapshot unusable; trying the previous one") || !strings.Contains(l, newest.Name) {
		t.Fatal("the fallback reason was not logged")
	}
}

// Two gateways sharing one Redis (--state redis://) serve one config: a
// change on one changes the other's router within a second; a stale ETag
// from the other replica is refused; Redis restarted without its data gets
// it back from a replica and writes work again; import on one replica
// (Import to Redis) reaches both.
func TestE2EAdminReplicasConvergeThroughRedis(t *testing.T) {
	rs := testsrv.StartStoppableRedis(t)
	_, e1 := startEngine(t, "--speedup", "50")
	args := []string{"--workers", "engine-a=" + e1, "--worker-model", "sim-model", "--state", rs.URL, "--router-policy", "round-robin"}
	a := startAdminServe(t, args...)
	b := startAdminServe(t, args...)
	waitRoutable(t, a.g, 1)
	waitRoutable(t, b.g, 1)
	if a.etag() != b.etag() {
		t.Fatalf("replicas start apart: %s %s", a.etag(), b.etag())
	}

	// Once the replicas are up (B's subscription is made in the background
	// after start; until then its version check, every second, catches a
	// change), a write on A changes B's router within a second.
	a.patch("debug", `{"decision_header":true}`)
	for deadline := time.Now().Add(5 * time.Second); !b.g.Store().Load().Debug.DecisionHeader; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("replica B did not adopt A's first write within 5 s")
		}
	}
	staleB := b.etag()
	a.patch("session_affinity", `{"enabled":true,"require_session_id":true}`)
	took := waitChat(t, b.router, time.Second, "replica B adopts A's write", 400)
	t.Logf("replica B's router changed %v after A's write", took)
	if r := b.api("PATCH", "/api/config/session_affinity", `{"require_session_id":false}`, "If-Match", staleB); r.status != 409 {
		t.Fatalf("stale ETag on B: %s", r)
	}
	a.wantChat("the stale write on B changed nothing", 400)

	// Redis restarts without its data: a replica puts its copy back, and a
	// write on B reaches A again.
	rs.Restart()
	deadline := time.Now().Add(5 * time.Second)
	for {
		if v, err := rs.Do("HGET", "infera:admin:data", "version"); err == nil && v != "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no replica put the management data back into the restarted Redis within 5 s")
		}
		time.Sleep(50 * time.Millisecond)
	}
	var r apiResp
	for deadline = time.Now().Add(5 * time.Second); ; {
		r = b.api("PATCH", "/api/config/session_affinity", `{"require_session_id":false}`, "If-Match", b.etag())
		if r.status == 200 || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond) // 503 while B reconnects
	}
	if r.status != 200 {
		t.Fatalf("write on B after the Redis restart: %s", r)
	}
	// A's subscription may still be reconnecting: its version check (every
	// second) catches the write then.
	waitChat(t, a.router, 2*time.Second, "replica A adopts B's write after the restart", 200)

	// Import to Redis on B: A's router follows. (Since the Redis restart
	// the subscriptions may still be reconnecting: 2 s, as above.)
	ex := a.api("GET", "/api/backup/export", "")
	a.patch("session_affinity", `{"require_session_id":true}`)
	waitChat(t, b.router, 2*time.Second, "B follows A", 400)
	if r := b.api("POST", "/api/backup/import", string(ex.body)); r.status != 200 {
		t.Fatalf("import to Redis: %s", r)
	}
	waitChat(t, a.router, 2*time.Second, "A adopts the import made on B", 200)
	if a.etag() != b.etag() {
		t.Fatalf("replicas apart after the import: %s %s", a.etag(), b.etag())
	}
}

// The fleet view the console shows is the gateway's: the real worker with
// its status, breaker and load, the KV blocks of the kv-aware index, and
// an excluded status while its breaker is open.
func TestE2EAdminFleetViewIsTheGateways(t *testing.T) {
	_, e1, ep := startKVEngine(t, "--speedup", "50", "--block-size", "16")
	ln, _ := netListen(t)
	dead := "http://" + ln.Addr().String()
	ln.Close()
	cfgPath := filepath.Join(t.TempDir(), "infera.json")
	cfg := fmt.Sprintf(`{"workers":[{"id":"kv","url":%q,"models":["sim-model"],"kv_events_endpoint":%q,"block_size":16},{"id":"dead","url":%q,"models":["sim-model"],"role":"mixed"}]}`, e1, ep, dead)
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	ag := startAdminServe(t, "--config", cfgPath, "--router-policy", "kv-aware", "--kv-event-transport", "zmq", "--kv-block-size", "16",
		"--breaker-failure-threshold", "1", "--breaker-cooldown-s", "60", "--request-max-retries", "1")
	waitRoutable(t, ag.g, 2)
	time.Sleep(200 * time.Millisecond) // the SUB socket connects
	// Distinct prompts until one is sent to the dead worker: its breaker
	// opens on that first failure and the retry goes to kv.
	for i := 0; ag.g.fleet.Get("dead").Breaker.State() != fleet.BreakerOpen; i++ {
		if i == 20 {
			t.Fatal("20 distinct prompts never reached the dead worker")
		}
		prompt := strings.Repeat(fmt.Sprintf("Shared system prompt %d for the fleet view. ", i), 20)
		body := `{"model":"sim-model","max_tokens":2,"messages":[{"role":"user","content":"` + prompt + `"}]}`
		if resp, b := doPost(t, ag.router+"/v1/chat/completions", body); resp.StatusCode != 200 {
			t.Fatalf("chat %d: %d %s", i, resp.StatusCode, b)
		}
	}
	type worker struct {
		ID       string   `json:"id"`
		URL      string   `json:"url"`
		Models   []string `json:"models"`
		Role     string   `json:"role"`
		Status   string   `json:"status"`
		Breaker  string   `json:"breaker"`
		Active   int64    `json:"active_requests"`
		KVBlocks int64    `json:"kv_blocks"`
		HitRate  float64  `json:"hit_rate"`
		Requests int64    `json:"requests"`
		Failures int64    `json:"failures"`
	}
	fleetNow := func() map[string]worker {
		r := ag.api("GET", "/api/fleet", "")
		var out struct{ Workers []worker }
		if r.status != 200 || json.Unmarshal(r.body, &out) != nil {
			t.Fatalf("fleet: %s", r)
		}
		m := map[string]worker{}
		for _, w := range out.Workers {
			m[w.ID] = w
		}
		return m
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		ws := fleetNow()
		kv, dw := ws["kv"], ws["dead"]
		if len(ws) != 2 || kv.URL != e1 || kv.Role != "mixed" || len(kv.Models) != 1 || kv.Models[0] != "sim-model" {
			t.Fatalf("fleet: %+v", ws)
		}
		// The dead worker's breaker opened on its first failure (the retry
		// went to kv): excluded for the 60 s cooldown.
		// kv answered every prompt and reported its usage (a hit rate in
		// 0..1); the dead worker never answered (-1: unknown).
		if kv.Status == "routable" && kv.Breaker == "closed" && kv.Active == 0 && kv.KVBlocks > 0 &&
			kv.HitRate >= 0 && kv.HitRate <= 1 && kv.Requests > 0 &&
			dw.Status == "excluded" && dw.Breaker == "open" && dw.KVBlocks == 0 && dw.HitRate == -1 && dw.Failures >= 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("fleet view within 5 s: %+v", ws)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// The rule hit counters the console shows are govern's: a concurrency
// limit that refuses a seat, and the same limit in dry run, move them.
func TestFleetViewRuleHitsAreGovernsCounters(t *testing.T) {
	gv, err := govern.New(govern.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer gv.Close()
	apply := func(dry bool) {
		t.Helper()
		c := config.Default()
		c.RateLimit = config.DefaultRateLimit()
		c.RateLimit.OverallConcurrency = 1
		c.RateLimit.DryRun = dry
		if err := c.Validate(); err != nil {
			t.Fatal(err)
		}
		if err := gv.Apply(c); err != nil {
			t.Fatal(err)
		}
	}
	count := func(rule, result string) uint64 {
		for _, h := range (fleetView{}).RuleHits() {
			if h.Rule == rule && h.Result == result {
				if h.DryRun != (result == "would_block") {
					t.Fatalf("dry_run of %+v", h)
				}
				return h.Count
			}
		}
		return 0
	}
	targets := []govern.Target{{Instance: "engine-a", Service: "sim-model"}}
	blocked, wouldBlock := count("concurrency_overall", "block"), count("concurrency_overall", "would_block")

	apply(false)
	held, _, rej := gv.TryAcquire(targets, govern.PhaseMixed)
	if rej != nil {
		t.Fatal(rej)
	}
	if _, _, rej := gv.TryAcquire(targets, govern.PhaseMixed); rej == nil || rej.Code != govern.CodeConcurrencyOverall {
		t.Fatalf("second seat: %v", rej)
	}
	if n := count("concurrency_overall", "block"); n != blocked+1 {
		t.Fatalf("block hits %d, want %d", n, blocked+1)
	}
	apply(true)
	over, _, rej := gv.TryAcquire(targets, govern.PhaseMixed)
	if rej != nil {
		t.Fatalf("dry run refused: %v", rej)
	}
	if n := count("concurrency_overall", "would_block"); n != wouldBlock+1 {
		t.Fatalf("would_block hits %d, want %d", n, wouldBlock+1)
	}
	over.Done()
	held.Done()
}

// With the config in Redis, a router with etcd discovery refuses an admin
// write adding static workers, as it refuses them in its config file (it
// accepted them, ignored them, and could not start again); a router with
// static discovery sharing the config may list them, and the etcd router
// still starts, logging that it ignores them.
func TestE2EARedisSharedConfigKeepsStaticWorkersOffAnEtcdRouter(t *testing.T) {
	rs := testsrv.StartRedis(t)
	etcd := testsrv.StartEtcd(t)
	_, e1 := startEngine(t, "--speedup", "50")
	etcdArgs := []string{"--discovery-backend", "etcd", "--etcd-endpoint", etcd.Endpoint, "--request-transport", "http",
		"--kv-event-transport", "zmq", "--state", rs.URL, "--router-policy", "round-robin"}
	b := startAdminServe(t, etcdArgs...)
	workers := `[{"id":"engine-a","url":"` + e1 + `","models":["sim-model"]}]`
	if r := b.api("PUT", "/api/config/workers", workers, "If-Match", "*"); r.status != 400 || !strings.Contains(string(r.body), `"workers"`) {
		t.Fatalf("static workers written through the etcd router: %s", r)
	}
	a := startAdminServe(t, "--discovery-backend", "static", "--request-transport", "http", "--kv-event-transport", "zmq", "--state", rs.URL, "--router-policy", "round-robin")
	if r := a.api("PUT", "/api/config/workers", workers, "If-Match", "*"); r.status != 200 {
		t.Fatalf("static workers written through the static router: %s", r)
	}
	waitRoutable(t, a.g, 1)
	c := startAdminServe(t, etcdArgs...) // it starts on the shared config that lists them
	if n := len(c.g.Store().Load().Workers); n != 1 {
		t.Fatalf("the shared config has %d workers on the etcd router, want the 1 it ignores", n)
	}
}

// Removing the last user of a router without --api-key opens its front
// door (documented): the change is logged as a warning, not made unseen.
func TestRemovingTheLastUserWithoutAnAPIKeyWarnsTheRouterIsOpen(t *testing.T) {
	logs := captureLogs(t)
	_, e1 := startEngine(t, "--speedup", "50")
	ag := startAdminServe(t, "--workers", "engine-a="+e1, "--worker-model", "sim-model", "--router-policy", "round-robin")
	waitRoutable(t, ag.g, 1)
	if r := ag.api("PUT", "/api/config/users", `[{"name":"last"}]`, "If-Match", ag.etag()); r.status != 200 {
		t.Fatalf("PUT users: %s", r)
	}
	if strings.Contains(logs.String(), "no users left") {
		t.Fatalf("warned while a user was left: %s", logs.String())
	}
	if r := ag.api("DELETE", "/api/users/last", "", "If-Match", ag.etag()); r.status != 200 && r.status != 204 {
		t.Fatalf("DELETE user: %s", r)
	}
	if !strings.Contains(logs.String(), "no users left and no --api-key") {
		t.Fatalf("the last user's removal opened the router without a warning: %s", logs.String())
	}
}
