package admin

import (
	"encoding/json"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/infera/infera/config"
)

// newSlowSyncRedisEnv is newEnv over Redis with a replica that checks the
// Redis version only once an hour, so a write made behind its back (no
// message) is seen only when its own CAS fails.
func newSlowSyncRedisEnv(t *testing.T, rs *redisServer, file string) *env {
	t.Helper()
	e := &env{t: t}
	e.path = filepath.Join(t.TempDir(), "infera.json")
	if err := os.WriteFile(e.path, []byte(file), 0o600); err != nil {
		t.Fatal(err)
	}
	var err error
	if e.store, err = config.Open(e.path); err != nil {
		t.Fatal(err)
	}
	e.a, err = New(Options{Store: e.store, Key: testKey, State: rs.url(), SyncInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.a.Start(); err != nil {
		t.Fatal(err)
	}
	e.srv = httptest.NewServer(e.a.Handler())
	t.Cleanup(func() { e.srv.Close(); e.a.Close() })
	return e
}

// An unconditional write (If-Match: *, or an import without If-Match) that
// loses the CAS to another replica is retried on the adopted data. The
// retry must keep the upstream keys the caller sent back redacted: they
// are the keys the entries hold, never a placeholder string (the retry
// used to read the first attempt's placeholders as literal keys).
func TestRetriedUnconditionalWriteKeepsRedactedUpstreamKeys(t *testing.T) {
	rs := startRedis(t)
	e := newSlowSyncRedisEnv(t, rs, proxiesDoc)
	r := e.do("GET", "/api/config/split_proxy", "")
	var sp map[string]any
	if err := json.Unmarshal(r.body, &sp); err != nil {
		t.Fatal(err)
	}
	sp["proxies"].([]any)[0].(map[string]any)["weight"] = 7 // the console saves the form with the redacted keys
	body, _ := json.Marshal(sp)

	writeBehindReplicas(t, rs, e) // another replica wrote; its message is lost
	r = e.do("PUT", "/api/config/split_proxy", string(body), "If-Match", "*")
	if r.status != 200 {
		t.Fatalf("PUT: %d %s", r.status, r.body)
	}
	got := e.store.Load().SplitProxy.Proxies
	if got[0].Weight != 7 || !e.store.Load().Debug.DecisionHeader {
		t.Fatalf("the write was not retried on the other replica's data")
	}
	if k := got[1].APIKey.Reveal(); k != "sk-secret-a-111" {
		t.Errorf("ext-a's upstream key is now %q, want sk-secret-a-111", k)
	}
	if k := got[2].APIKey.Reveal(); k != "sk-secret-b-222" {
		t.Errorf("ext-b's upstream key is now %q, want sk-secret-b-222", k)
	}
}

// The same for an import without If-Match ("apply on top of whatever is
// current"): restoring an export must restore the upstream keys it holds.
func TestRetriedImportKeepsTheSnapshotsUpstreamKeys(t *testing.T) {
	rs := startRedis(t)
	e := newSlowSyncRedisEnv(t, rs, proxiesDoc)
	exp := e.do("GET", "/api/backup/export", "")
	if exp.status != 200 {
		t.Fatalf("export: %d", exp.status)
	}
	e.put("load_balancing", `{"algorithm":"round-robin"}`, 200) // a change the import undoes
	writeBehindReplicas(t, rs, e)                               // another replica wrote; its message is lost
	r := e.do("POST", "/api/backup/import", string(exp.body))
	if r.status != 200 {
		t.Fatalf("import: %d %s", r.status, r.body)
	}
	got := e.store.Load().SplitProxy.Proxies
	if k := got[1].APIKey.Reveal(); k != "sk-secret-a-111" {
		t.Errorf("ext-a's upstream key is now %q, want sk-secret-a-111", k)
	}
	if k := got[2].APIKey.Reveal(); k != "sk-secret-b-222" {
		t.Errorf("ext-b's upstream key is now %q, want sk-secret-b-222", k)
	}
}
