package admin

import (
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"

	"github.com/infera/infera/config"
)

func TestAdminKeyRequiredAndNeverLogged(t *testing.T) {
	logs := captureLogs(t)
	e := newEnv(t, envOpts{})
	for _, auth := range []string{"", "Bearer wrong-key", "Bearer " + testKey + "x", "Basic " + testKey, testKey} {
		r := e.do("GET", "/api/config", "", "Authorization", auth)
		if r.status != http.StatusUnauthorized {
			t.Fatalf("auth %q: got %d", auth, r.status)
		}
		if strings.Contains(string(r.body), "wrong-key") {
			t.Fatal("presented key echoed")
		}
	}
	if r := e.do("GET", "/api/config", ""); r.status != 200 {
		t.Fatalf("right key: %d %s", r.status, r.body)
	}
	if r := e.do("GET", "/api/config", "", "Authorization", "bearer "+testKey); r.status != 200 {
		t.Fatalf("scheme is case-insensitive: %d", r.status)
	}
	if strings.Contains(logs.String(), testKey) || strings.Contains(logs.String(), "wrong-key") {
		t.Fatal("a key reached the log")
	}
	// The console's files need no key (they hold no data).
	res, err := http.Get(e.srv.URL + "/")
	if err != nil || res.StatusCode != 200 {
		t.Fatalf("console: %v %v", res, err)
	}
	res.Body.Close()
	if r := e.do("GET", "/api/nope", ""); r.status != 404 {
		t.Fatalf("unknown endpoint: %d", r.status)
	}
}

func TestListenerOffWithoutKey(t *testing.T) {
	a, err := New(Options{Store: config.NewStore("", nil), Addr: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if err := a.Start(); err != nil {
		t.Fatal(err)
	}
	if a.Addr() != nil {
		t.Fatal("admin listener started without a key")
	}
	if a.checkKey("") {
		t.Fatal("empty key accepted")
	}
}

func TestListenerServesOnItsAddress(t *testing.T) {
	a, err := New(Options{Store: config.NewStore("", nil), Addr: "127.0.0.1:0", Key: testKey})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Start(); err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	req, _ := http.NewRequest("GET", "http://"+a.Addr().String()+"/api/version", nil)
	req.Header.Set("Authorization", "Bearer "+testKey)
	res, err := http.DefaultClient.Do(req)
	if err != nil || res.StatusCode != 200 {
		t.Fatalf("%v %v", res, err)
	}
	res.Body.Close()
}

func TestGetWholeConfigAndEachSection(t *testing.T) {
	e := newEnv(t, envOpts{})
	r := e.do("GET", "/api/config", "")
	if r.status != 200 || r.etag == "" || r.hdr.Get("X-Config-Version") != "1" {
		t.Fatalf("%d %q %s", r.status, r.etag, r.body)
	}
	whole := r.json(t)
	for _, s := range sections() {
		r := e.do("GET", "/api/config/"+s, "")
		if r.status != 200 {
			t.Fatalf("section %s: %d %s", s, r.status, r.body)
		}
		if _, ok := whole[s]; !ok {
			t.Fatalf("section %s missing from the whole config", s)
		}
	}
	if r := e.do("GET", "/api/config/nope", ""); r.status != 404 {
		t.Fatalf("unknown section: %d", r.status)
	}
	sa := e.do("GET", "/api/config/session_affinity", "").json(t)
	if sa["ttl_s"] != float64(1800) || sa["header"] != "X-Session-Id" {
		t.Fatalf("defaults: %v", sa)
	}
}

func TestValidationErrorsPointAtTheField(t *testing.T) {
	e := newEnv(t, envOpts{})
	f := func(section, body, wantPath string) {
		t.Helper()
		r := e.put(section, body, http.StatusBadRequest)
		if p, msg := r.errPath(t); p != wantPath || msg == "" {
			t.Fatalf("%s %s: error at %q (%s), want %q", section, body, p, msg, wantPath)
		}
	}
	f("session_affinity", `{"enabled":true,"ttl_s":-5}`, "session_affinity.ttl_s")
	f("session_affinity", `{"mode":"sticky"}`, "session_affinity.mode")
	f("session_affinity", `{"bogus":1}`, "session_affinity.bogus")
	f("session_affinity", `{"ttl_s":"long"}`, "session_affinity.ttl_s")
	f("session_affinity", `[1]`, "session_affinity")
	f("session_affinity", `{"max_entries":1.5}`, "session_affinity.max_entries")
	f("canary", `{"enabled":true,"rules":[{"model":"*","targets":[{"service":"a","weight":1},{"service":"b","weight":"x"}]}]}`, "canary.rules[0].targets[1].weight")
	f("canary", `{"rules":[{"model":"*","targets":[{"service":"a","weight":1,"colour":2}]}]}`, "canary.rules[0].targets[0].colour")
	f("canary", `{"rules":[{"model":"","targets":[{"service":"a","weight":1}]}]}`, "canary.rules[0].model")
	f("workers", `[{"url":"ftp://x"}]`, "workers[0].url")
	r := e.put("session_affinity", `{"ttl_s":`, http.StatusBadRequest)
	if _, msg := r.errPath(t); !strings.Contains(msg, "JSON") {
		t.Fatalf("syntax error: %s", msg)
	}
	if v := e.a.store.Version(); v != 1 {
		t.Fatalf("refused writes changed the version to %d", v)
	}
}

func TestSectionWriteAppliesAtomically(t *testing.T) {
	e := newEnv(t, envOpts{})
	before := e.store.Load()
	r := e.put("session_affinity", `{"enabled":true,"require_session_id":true,"ttl_s":60}`, 200)
	got := e.store.Load()
	if !got.SessionAffinity.Enabled || !got.SessionAffinity.RequireSessionID || got.SessionAffinity.TTLSeconds != 60 {
		t.Fatalf("not applied: %+v", got.SessionAffinity)
	}
	// PUT replaces the section: omitted settings take their defaults.
	if got.SessionAffinity.MaxEntries != 100000 || got.SessionAffinity.Header != "X-Session-Id" {
		t.Fatalf("omitted settings: %+v", got.SessionAffinity)
	}
	if before == got || before.SessionAffinity.Enabled {
		t.Fatal("the old snapshot was mutated instead of swapped")
	}
	if r.hdr.Get("X-Config-Version") != "2" {
		t.Fatalf("version %q", r.hdr.Get("X-Config-Version"))
	}
	// PATCH changes only what it names.
	r = e.do("PATCH", "/api/config/session_affinity", `{"ttl_s":90}`, "If-Match", e.etag())
	if r.status != 200 {
		t.Fatalf("patch: %d %s", r.status, r.body)
	}
	sa := e.store.Load().SessionAffinity
	if sa.TTLSeconds != 90 || !sa.RequireSessionID {
		t.Fatalf("patch: %+v", sa)
	}
	// A write that changes nothing makes no version.
	v := e.store.Version()
	e.do("PATCH", "/api/config/session_affinity", `{"ttl_s":90}`, "If-Match", e.etag())
	if e.store.Version() != v {
		t.Fatal("a no-op write made a version")
	}
	// The whole document can be replaced too.
	r = e.do("PUT", "/api/config", `{"load_balancing":{"algorithm":"round-robin"}}`, "If-Match", e.etag())
	if r.status != 200 || e.store.Load().LoadBalancing.Algorithm != "round-robin" || e.store.Load().SessionAffinity.Enabled {
		t.Fatalf("whole PUT: %d %s", r.status, r.body)
	}
}

func TestStaleVersionConflicts(t *testing.T) {
	e := newEnv(t, envOpts{})
	old := e.etag()
	if r := e.do("PUT", "/api/config/load_balancing", `{"algorithm":"round-robin"}`, "If-Match", old); r.status != 200 {
		t.Fatalf("first write: %d %s", r.status, r.body)
	}
	// The second operator still holds the old ETag.
	r := e.do("PUT", "/api/config/load_balancing", `{"algorithm":"least-tokens"}`, "If-Match", old)
	if r.status != http.StatusConflict {
		t.Fatalf("stale write: %d %s", r.status, r.body)
	}
	if r.etag == "" || r.json(t)["error"].(map[string]any)["version"] != float64(2) {
		t.Fatalf("conflict answer lacks the current version: %s", r.body)
	}
	if e.store.Load().LoadBalancing.Algorithm != "round-robin" {
		t.Fatal("the stale write was applied")
	}
	if r := e.do("PUT", "/api/config/load_balancing", `{"algorithm":"least-tokens"}`); r.status != http.StatusPreconditionRequired {
		t.Fatalf("write without If-Match: %d", r.status)
	}
	// An ETag of the same version number but other content (a restart in
	// between) does not match either.
	fake := `"2-000000000000"`
	if r := e.do("PUT", "/api/config/load_balancing", `{"algorithm":"least-tokens"}`, "If-Match", fake); r.status != http.StatusConflict {
		t.Fatalf("same version, other content: %d", r.status)
	}
	if r := e.do("PUT", "/api/config/load_balancing", `{"algorithm":"least-tokens"}`, "If-Match", "*"); r.status != 200 {
		t.Fatalf("If-Match *: %d", r.status)
	}
}

func TestAPIWriteGoesBackToTheConfigFile(t *testing.T) {
	e := newEnv(t, envOpts{file: `{"load_balancing":{"algorithm":"round-robin"}}`})
	e.put("session_affinity", `{"enabled":true,"ttl_s":42}`, 200)
	s2, err := config.Open(e.path)
	if err != nil {
		t.Fatal(err)
	}
	c := s2.Load()
	if !c.SessionAffinity.Enabled || c.SessionAffinity.TTLSeconds != 42 || c.LoadBalancing.Algorithm != "round-robin" {
		t.Fatalf("restart lost the write: %+v %+v", c.SessionAffinity, c.LoadBalancing)
	}
	fi, _ := os.Stat(e.path)
	if fi.Mode().Perm() != 0o600 {
		t.Fatalf("file permissions changed to %v", fi.Mode())
	}
}

func TestHandEditMakesAStaleAPIWriteConflict(t *testing.T) {
	e := newEnv(t, envOpts{file: `{}`})
	tag := e.etag()
	if err := os.WriteFile(e.path, []byte(`{"load_balancing":{"algorithm":"least-tokens"}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	r := e.do("PUT", "/api/config/session_affinity", `{"enabled":true}`, "If-Match", tag)
	if r.status != http.StatusConflict {
		t.Fatalf("API write over an unseen hand edit: %d %s", r.status, r.body)
	}
	if e.store.Load().LoadBalancing.Algorithm != "least-tokens" || e.store.Load().SessionAffinity.Enabled {
		t.Fatal("hand edit lost or API write applied")
	}
	// A write that would change nothing is stale too: answering 200 with
	// values the file no longer holds would hide the edit.
	tag = e.etag()
	if err := os.WriteFile(e.path, []byte(`{"load_balancing":{"algorithm":"least-tokens"},"debug":{"decision_header":true}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if r := e.do("PUT", "/api/config/debug", `{"decision_header":false}`, "If-Match", tag); r.status != http.StatusConflict {
		t.Fatalf("no-op API write over an unseen hand edit: %d %s", r.status, r.body)
	}
	if !e.store.Load().Debug.DecisionHeader {
		t.Fatal("the hand edit was not picked up")
	}
	// A hand edit that does not load refuses even a write that changes
	// nothing, with the reason.
	if err := os.WriteFile(e.path, []byte(`{"debug":{"decision_header":tru`), 0o600); err != nil {
		t.Fatal(err)
	}
	r = e.do("PUT", "/api/config/debug", `{"decision_header":true}`, "If-Match", "*")
	if _, msg := r.errPath(t); r.status != http.StatusConflict || !strings.Contains(msg, "edited by hand") {
		t.Fatalf("write over a broken hand edit: %d %s", r.status, r.body)
	}
	if err := os.WriteFile(e.path, []byte(`{"load_balancing":{"algorithm":"least-tokens"}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := e.store.Reload(); err != nil { // as the poll would
		t.Fatal(err)
	}
	// With the fresh ETag the write goes through and keeps the hand edit.
	e.put("session_affinity", `{"enabled":true}`, 200)
	c, _ := config.ReadFile(e.path)
	if c.LoadBalancing.Algorithm != "least-tokens" || !c.SessionAffinity.Enabled {
		t.Fatal("file does not hold both changes")
	}
	// A reload of a hand edit is audited as the file's doing.
	entries := e.a.audit.list(10)
	found := false
	for _, en := range entries {
		if en.Who == "config file" && len(en.Changes) > 0 && en.Changes[0].Path == "load_balancing.algorithm" {
			found = true
		}
	}
	if !found {
		t.Fatalf("hand edit not audited: %+v", entries)
	}
}

const proxiesDoc = `{"split_proxy":{"enabled":true,"strategy":"weight","proxies":[
	{"name":"local","local":true,"weight":3},
	{"name":"ext-a","address":"http://127.0.0.1:9","api_key":"sk-secret-a-111","weight":1},
	{"name":"ext-b","address":"http://127.0.0.1:10","api_key":"sk-secret-b-222","weight":1}]}}`

func TestSecretsAreRedactedAndKeptByFingerprint(t *testing.T) {
	logs := captureLogs(t)
	e := newEnv(t, envOpts{file: proxiesDoc})
	r := e.do("GET", "/api/config/split_proxy", "")
	if strings.Contains(string(r.body), "sk-secret") {
		t.Fatalf("secret in an API answer: %s", r.body)
	}
	var sp struct {
		Proxies []map[string]any `json:"proxies"`
	}
	json.Unmarshal(r.body, &sp)
	keyA := sp.Proxies[1]["api_key"].(string)
	if !strings.HasPrefix(keyA, "***") || len(keyA) != 11 {
		t.Fatalf("redacted form %q", keyA)
	}
	// The operator swaps the two external proxies and changes a weight,
	// sending the redacted keys back: each key follows its proxy.
	sp.Proxies[1], sp.Proxies[2] = sp.Proxies[2], sp.Proxies[1]
	sp.Proxies[0]["weight"] = 5
	body, _ := json.Marshal(map[string]any{"enabled": true, "strategy": "weight", "proxies": sp.Proxies})
	e.put("split_proxy", string(body), 200)
	got := e.store.Load().SplitProxy.Proxies
	if got[1].Name != "ext-b" || got[1].APIKey.Reveal() != "sk-secret-b-222" || got[2].APIKey.Reveal() != "sk-secret-a-111" {
		t.Fatalf("keys did not follow their proxies: %s=%s %s=%s", got[1].Name, got[1].APIKey.Reveal(), got[2].Name, got[2].APIKey.Reveal())
	}
	// A new key in clear replaces; a fingerprint matching nothing is refused.
	sp.Proxies[1]["api_key"] = "sk-new-333"
	body, _ = json.Marshal(map[string]any{"enabled": true, "strategy": "weight", "proxies": sp.Proxies})
	e.put("split_proxy", string(body), 200)
	if e.store.Load().SplitProxy.Proxies[1].APIKey.Reveal() != "sk-new-333" {
		t.Fatal("new key not applied")
	}
	sp.Proxies[2]["api_key"] = "***deadbeef"
	body, _ = json.Marshal(map[string]any{"enabled": true, "strategy": "weight", "proxies": sp.Proxies})
	r = e.put("split_proxy", string(body), 400)
	if p, _ := r.errPath(t); p != "split_proxy.proxies[2].api_key" {
		t.Fatalf("unknown fingerprint error at %q", p)
	}
	// The file keeps the keys sealed (the write stores none in clear: it
	// held every key in clear, the operator's and the API's); the gateway
	// opens them at start; the audit log and the log lines never show them.
	data, _ := os.ReadFile(e.path)
	for _, s := range []string{"sk-new-333", "sk-secret-a-111", "sk-secret-b-222"} {
		if strings.Contains(string(data), s) {
			t.Fatalf("config file holds %s in clear:\n%s", s, data)
		}
	}
	if strings.Count(string(data), `"enc:v2:`) != 2 {
		t.Fatalf("config file does not hold the two keys sealed:\n%s", data)
	}
	s2, err := config.OpenWith(e.path, FileSecretCodec(&config.Serve{AdminKey: testKey}))
	if err != nil {
		t.Fatal(err)
	}
	if ps := s2.Load().SplitProxy.Proxies; ps[1].APIKey.Reveal() != "sk-new-333" || ps[2].APIKey.Reveal() != "sk-secret-a-111" {
		t.Fatalf("a restart with the same key lost a key: %s %s", ps[1].APIKey.Reveal(), ps[2].APIKey.Reveal())
	}
	// Another key (or none) opens nothing: refused at the setting, never
	// sent upstream as the sealed text.
	for _, codec := range []config.SecretCodec{nil, FileSecretCodec(&config.Serve{AdminKey: "another-admin-key-0123456789"})} {
		_, err := config.OpenWith(e.path, codec)
		var fe *config.FieldError
		if !errors.As(err, &fe) || fe.Path != "split_proxy.proxies[1].api_key" {
			t.Fatalf("opened with another key: %v", err)
		}
	}
	audit := e.do("GET", "/api/audit", "")
	for _, s := range []string{"sk-new-333", "sk-secret-a-111", "sk-secret-b-222"} {
		if strings.Contains(string(audit.body), s) || strings.Contains(logs.String(), s) {
			t.Fatalf("secret %s in the audit log or a log line", s)
		}
	}
	if !strings.Contains(string(audit.body), `split_proxy.proxies[\"ext-b\"].api_key`) {
		t.Fatalf("key change not audited: %s", audit.body)
	}
}

func TestAuditRecordsWhoWhenWhat(t *testing.T) {
	logs := captureLogs(t)
	e := newEnv(t, envOpts{})
	e.put("session_affinity", `{"enabled":true,"ttl_s":60}`, 200)
	r := e.do("GET", "/api/audit?limit=5", "")
	var out struct {
		Entries []AuditEntry `json:"entries"`
	}
	json.Unmarshal(r.body, &out)
	if len(out.Entries) != 1 {
		t.Fatalf("entries: %s", r.body)
	}
	en := out.Entries[0]
	if en.Who != "admin-key" || !strings.HasPrefix(en.Remote, "127.0.0.1:") || en.Action != "PUT session_affinity" || en.Version != 2 || en.Time.IsZero() {
		t.Fatalf("entry: %+v", en)
	}
	want := map[string][2]string{"session_affinity.enabled": {"false", "true"}, "session_affinity.ttl_s": {"1800", "60"}}
	if len(en.Changes) != 2 {
		t.Fatalf("changes: %+v", en.Changes)
	}
	for _, c := range en.Changes {
		if w := want[c.Path]; w[0] != c.Old || w[1] != c.New {
			t.Fatalf("change %+v", c)
		}
	}
	if !strings.Contains(logs.String(), `msg="config changed" who=admin-key`) {
		t.Fatalf("no structured audit line:\n%s", logs.String())
	}
	if r := e.do("GET", "/api/audit?limit=x", ""); r.status != 400 {
		t.Fatalf("bad limit: %d", r.status)
	}
}

func TestAuditLogIsBounded(t *testing.T) {
	l := newAuditLog(3, nil)
	a, b := config.Default(), config.Default()
	b.Debug.DecisionHeader = true
	for i := 0; i < 5; i++ {
		l.add(actor{Who: "x"}, "a", uint64(i), a, b) // queued; list records them in order
	}
	got := l.list(0)
	if len(got) != 3 || got[0].Version != 4 || got[2].Version != 2 {
		t.Fatalf("ring: %+v", got)
	}
}

func TestFleetAndRuleHits(t *testing.T) {
	ff := &fakeFleet{
		workers: []WorkerInfo{{ID: "w1", URL: "http://127.0.0.1:1", Role: "mixed", Status: "routable", Breaker: "closed", ActiveRequests: 3, KVBlocks: 12, HitRate: 0.5}},
		rules:   []RuleHit{{Rule: "user_limit.templates[gold].rate.rpm", Result: "would_block", DryRun: true, Count: 7}},
	}
	e := newEnv(t, envOpts{})
	if r := e.do("GET", "/api/fleet", ""); r.status != 200 || !strings.Contains(string(r.body), `"workers":[]`) {
		t.Fatalf("fleet before the router gives one: %d %s", r.status, r.body)
	}
	e.a.SetFleet(ff)
	var fl struct{ Workers []WorkerInfo }
	json.Unmarshal(e.do("GET", "/api/fleet", "").body, &fl)
	if len(fl.Workers) != 1 || fl.Workers[0].KVBlocks != 12 || fl.Workers[0].HitRate != 0.5 {
		t.Fatalf("fleet: %+v", fl)
	}
	var rh struct{ Rules []RuleHit }
	json.Unmarshal(e.do("GET", "/api/rules", "").body, &rh)
	if len(rh.Rules) != 1 || rh.Rules[0].Count != 7 || !rh.Rules[0].DryRun {
		t.Fatalf("rules: %+v", rh)
	}
}

func TestBodyLimits(t *testing.T) {
	e := newEnv(t, envOpts{})
	big := `{"header":"` + strings.Repeat("a", maxBodyBytes) + `"}`
	r := e.do("PUT", "/api/config/session_affinity", big, "If-Match", "*")
	if r.status != http.StatusRequestEntityTooLarge {
		t.Fatalf("oversized body: %d", r.status)
	}
}

func TestAuditDiffOfAListThatGainsItems(t *testing.T) {
	a := config.Default()
	b := config.Default()
	b.Canary = config.Canary{Enabled: true, Rules: []config.CanaryRule{{Model: "*", Targets: []config.CanaryTarget{{Service: "s", Weight: 1}}}}}
	got := diff(nil, a, b)
	for _, c := range got {
		if c.Path == "canary.rules" {
			t.Fatalf("the list itself reported as removed: %+v", got)
		}
	}
	if len(got) != 4 {
		t.Fatalf("changes: %+v", got)
	}
	if back := diff(nil, b, a); len(back) != 4 {
		t.Fatalf("reverse changes: %+v", back)
	}
}

func TestOptionsFromFlags(t *testing.T) {
	st := config.NewStore("", nil)
	f := &config.Serve{AdminHost: "127.0.0.1", AdminPort: 8081, APIKey: "client-key"}
	o := OptionsFromFlags(f, st)
	if o.Addr != "127.0.0.1:8081" || o.Key != "client-key" || o.KeyLabel != "api-key" {
		t.Fatalf("api-key fallback: %+v", o)
	}
	f.AdminKey = "admin"
	if o = OptionsFromFlags(f, st); o.Key != "admin" || o.KeyLabel != "admin-key" {
		t.Fatalf("admin key: %+v", o)
	}
	f.AdminPort = 0
	if o = OptionsFromFlags(f, st); o.Addr != "" {
		t.Fatalf("--admin-port 0 keeps the listener off: %+v", o)
	}
	f.AdminHost, f.AdminPort = "::1", 9000
	if o = OptionsFromFlags(f, st); o.Addr != "[::1]:9000" {
		t.Fatalf("IPv6 host: %q", o.Addr)
	}
}

// --admin-port=-1 opens the admin listener on a free port the kernel
// picks, and Addr (as the startup log line) tells which.
func TestAdminPortMinusOneListensOnAFreePort(t *testing.T) {
	f := &config.Serve{Port: 8000, MaxBodyBytes: 1, BreakerCooldownS: 1, BreakerMaxCooldownS: 2, ConfigPoll: 1, MaxInflightBodyBytes: 1, KVBlockSize: 16,
		AdminHost: "127.0.0.1", AdminPort: config.AdminPortAny, AdminKey: "admin-key-0123456789abcdef"}
	if err := f.Validate(); err != nil {
		t.Fatalf("--admin-port=-1 refused: %v", err)
	}
	for _, p := range []int{-2, 65536} {
		g := *f
		g.AdminPort = p
		if err := g.Validate(); err == nil {
			t.Fatalf("--admin-port %d accepted", p)
		}
	}
	a, err := New(OptionsFromFlags(f, config.NewStore("", nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if err := a.Start(); err != nil {
		t.Fatal(err)
	}
	addr, ok := a.Addr().(*net.TCPAddr)
	if !ok || addr.Port == 0 || !addr.IP.IsLoopback() {
		t.Fatalf("admin listener at %v", a.Addr())
	}
	req, _ := http.NewRequest("GET", "http://"+addr.String()+"/api/config", nil)
	req.Header.Set("Authorization", "Bearer admin-key-0123456789abcdef")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != 200 {
		t.Fatalf("GET /api/config at %s: %d", addr, res.StatusCode)
	}
}

// TestSavingAnEmptyListWhereThereWasNoneMakesNoVersion: the console saves
// [] for a list the file does not have; that changes nothing, so it makes
// no version (which would also make every other admin's ETag stale).
func TestSavingAnEmptyListWhereThereWasNoneMakesNoVersion(t *testing.T) {
	e := newEnv(t, envOpts{})
	v := e.store.Version()
	for _, body := range []string{`{"members":[]}`, `{"members":null}`, `{"members":[]}`} {
		if r := e.do("PATCH", "/api/config/global_scheduling", body, "If-Match", e.etag()); r.status != 200 {
			t.Fatalf("%s: %d %s", body, r.status, r.body)
		}
	}
	if got := e.store.Version(); got != v {
		t.Fatalf("version %d after writes that changed nothing, want %d", got, v)
	}
}

// TestUserAndTemplateBodiesWithAKeyTwiceAreRefused: as in every other
// admin body, a key given twice is refused (decoding would keep one copy).
func TestUserAndTemplateBodiesWithAKeyTwiceAreRefused(t *testing.T) {
	e := newEnv(t, envOpts{})
	for _, c := range []struct{ method, path, body string }{
		{"POST", "/api/users", `{"name":"alice","name":"bob"}`},
		{"POST", "/api/templates", `{"name":"gold","rate":{"enabled":true,"rpm":60},"rate":{"enabled":false}}`},
		{"POST", "/api/templates", `{"name":"gold","rate":{"enabled":true,"rpm":5,"rpm":500}}`},
	} {
		r := e.do(c.method, c.path, c.body, "If-Match", e.etag())
		if r.status != 400 || !strings.Contains(string(r.body), "repeated") {
			t.Fatalf("%s %s %s: %d %s", c.method, c.path, c.body, r.status, r.body)
		}
	}
	if r := e.do("POST", "/api/users", `{"name":"carol"}`, "If-Match", e.etag()); r.status != 201 {
		t.Fatalf("create: %d %s", r.status, r.body)
	}
	if r := e.do("PUT", "/api/users/carol", `{"enabled":false,"enabled":true}`, "If-Match", e.etag()); r.status != 400 {
		t.Fatalf("PUT with enabled twice: %d %s", r.status, r.body)
	}
}

// TestUpdatingAUserWithoutTemplateKeepsItsTemplate: a PUT changes what it
// names; the quota template goes only with "template":"".
func TestUpdatingAUserWithoutTemplateKeepsItsTemplate(t *testing.T) {
	e := newEnv(t, envOpts{})
	if r := e.do("POST", "/api/templates", `{"name":"gold","rate":{"enabled":true,"rpm":60}}`, "If-Match", e.etag()); r.status != 201 {
		t.Fatalf("template: %d %s", r.status, r.body)
	}
	if r := e.do("POST", "/api/users", `{"name":"bob","template":"gold"}`, "If-Match", e.etag()); r.status != 201 {
		t.Fatalf("create: %d %s", r.status, r.body)
	}
	template := func() string {
		for _, u := range e.store.Load().Users {
			if u.Name == "bob" {
				return u.Template
			}
		}
		t.Fatal("no user bob")
		return ""
	}
	if r := e.do("PUT", "/api/users/bob", `{"enabled":false}`, "If-Match", e.etag()); r.status != 200 || template() != "gold" {
		t.Fatalf("PUT without template: %d %s; template %q", r.status, r.body, template())
	}
	if r := e.do("PUT", "/api/users/bob", `{"template":""}`, "If-Match", e.etag()); r.status != 200 || template() != "" {
		t.Fatalf("PUT with template \"\": %d %s; template %q", r.status, r.body, template())
	}
}

// TestATemplateBodysTypeErrorNamesTheFieldInTheBody: errors in a template
// body point into the body, a type error too (its path came with the
// config's prefix, which the other errors lose).
func TestATemplateBodysTypeErrorNamesTheFieldInTheBody(t *testing.T) {
	e := newEnv(t, envOpts{})
	r := e.do("POST", "/api/templates", `{"name":"t2","quota":{"enabled":true,"weights":{"input":1e309}}}`, "If-Match", e.etag())
	if r.status != 400 || !strings.Contains(string(r.body), `"path":"quota.weights.input"`) {
		t.Fatalf("%d %s", r.status, r.body)
	}
}

// If-Match compares strongly (RFC 9110 13.1.1): the current ETag marked
// weak does not match, and the answer says why.
func TestAWeakETagInIfMatchIsRefused(t *testing.T) {
	e := newEnv(t, envOpts{})
	tag := e.etag()
	r := e.do("PUT", "/api/config/load_balancing", `{"algorithm":"round-robin"}`, "If-Match", "W/"+tag)
	if r.status != http.StatusPreconditionFailed || !strings.Contains(string(r.body), "W/") || e.etag() != tag {
		t.Fatalf("weak ETag: %d %s", r.status, r.body)
	}
	if r := e.do("PUT", "/api/config/load_balancing", `{"algorithm":"round-robin"}`, "If-Match", "W/"+tag+", "+tag); r.status != 200 {
		t.Fatalf("the strong one of a list: %d %s", r.status, r.body)
	}
}

// Every body is one JSON value: a stray brace or bracket after it, or a
// second value, is refused (json.Decoder.More is false before '}' and ']').
func TestDataAfterTheJSONBodyIsRefused(t *testing.T) {
	e := newEnv(t, envOpts{})
	for _, tail := range []string{"}", "]", " {}", "x"} {
		if r := e.do("POST", "/api/users", `{"name":"carol"}`+tail); r.status != 400 {
			t.Fatalf("user body + %q: %d %s", tail, r.status, r.body)
		}
		if r := e.do("PATCH", "/api/config/session_affinity", `{"ttl_s":90}`+tail, "If-Match", e.etag()); r.status != 400 {
			t.Fatalf("section body + %q: %d %s", tail, r.status, r.body)
		}
		if r := e.do("PUT", "/api/config", `{}`+tail, "If-Match", e.etag()); r.status != 400 {
			t.Fatalf("config body + %q: %d %s", tail, r.status, r.body)
		}
		if r := e.do("POST", "/api/templates", `{"name":"gold"}`+tail); r.status != 400 {
			t.Fatalf("template body + %q: %d %s", tail, r.status, r.body)
		}
	}
	if len(e.store.Load().Users) != 0 || len(e.store.Load().UserLimit.Templates) != 0 {
		t.Fatal("a refused body changed the config")
	}
	if r := e.do("POST", "/api/users", "{\"name\":\"carol\"}\n \t"); r.status != 201 {
		t.Fatalf("trailing white space: %d %s", r.status, r.body)
	}
}

// Without a config file the startup sections (llm_gateway, storage) cannot
// change through any write: not a section write, not the whole config, and
// an import keeps this router's own.
func TestStartupSectionsDoNotChangeWithoutAConfigFile(t *testing.T) {
	e := newEnv(t, envOpts{})
	if r := e.do("PUT", "/api/config", `{"llm_gateway":{"persist_snapshot_dir":"/tmp/x"}}`, "If-Match", e.etag()); r.status != http.StatusConflict || !strings.Contains(string(r.body), "llm_gateway") {
		t.Fatalf("PUT /api/config: %d %s", r.status, r.body)
	}
	if r := e.do("PUT", "/api/config", `{"storage":[{"mount_path":"/mnt/x/"}]}`, "If-Match", e.etag()); r.status != http.StatusConflict || !strings.Contains(string(r.body), "storage") {
		t.Fatalf("PUT /api/config storage: %d %s", r.status, r.body)
	}
	// A snapshot from a router with a config file and its own startup settings.
	src := newEnv(t, envOpts{file: `{"llm_gateway":{"persist_snapshot_dir":"/tmp/x"},"session_affinity":{"enabled":true}}`})
	exp := src.do("GET", "/api/backup/export", "")
	if exp.status != 200 {
		t.Fatalf("export: %d", exp.status)
	}
	if r := e.do("POST", "/api/backup/import", string(exp.body)); r.status != 200 {
		t.Fatalf("import: %d %s", r.status, r.body)
	}
	got := e.store.Load()
	if !got.SessionAffinity.Enabled || got.LLMGateway.PersistSnapshotDir != "" {
		t.Fatalf("after the import: session affinity %v, persist_snapshot_dir %q", got.SessionAffinity.Enabled, got.LLMGateway.PersistSnapshotDir)
	}
	// With a config file the whole-config write carries it to the next start.
	if r := src.do("PUT", "/api/config", `{"llm_gateway":{"persist_snapshot_dir":"/tmp/y"}}`, "If-Match", src.etag()); r.status != 200 {
		t.Fatalf("with a config file: %d %s", r.status, r.body)
	}
}

// A merge patch names a setting in any case, as a PUT and the config file
// do. The patch key was kept beside the setting's own, so the two read as
// one setting given twice: 400 "repeated key" for a key given once, while
// a PUT with the same body was applied.
func TestAMergePatchKeyInAnotherCaseSetsTheSetting(t *testing.T) {
	e := newEnv(t, envOpts{})
	r := e.do("PATCH", "/api/config/session_affinity", `{"TTL_S":5,"Enabled":true}`, "If-Match", "*")
	if sa := e.store.Load().SessionAffinity; r.status != 200 || sa.TTLSeconds != 5 || !sa.Enabled {
		t.Fatalf("PATCH in another case: %d %s", r.status, r.body)
	}
	r = e.do("PATCH", "/api/config/session_affinity", `{"Ttl_S":null}`, "If-Match", "*")
	if sa := e.store.Load().SessionAffinity; r.status != 200 || sa.TTLSeconds != 1800 || !sa.Enabled {
		t.Fatalf("PATCH null in another case: %d %s", r.status, r.body)
	}
}
