package admin

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"github.com/infera/infera/config"
	"strings"
	"testing"
)

// editExport returns an export with its sha256 removed (as the import's
// error message invites for an edited file) and old replaced by new in
// its config, made compact.
func editExport(t *testing.T, export []byte, old, new string) string {
	t.Helper()
	var f map[string]json.RawMessage
	if err := json.Unmarshal(export, &f); err != nil {
		t.Fatal(err)
	}
	delete(f, "sha256")
	var compact bytes.Buffer
	if err := json.Compact(&compact, f["config"]); err != nil {
		t.Fatal(err)
	}
	cfg := compact.String()
	if !strings.Contains(cfg, old) {
		t.Fatalf("%q not in the export's config", old)
	}
	f["config"] = json.RawMessage(strings.ReplaceAll(cfg, old, new))
	out, err := json.Marshal(f)
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

// An export holds every upstream key sealed under the admin key. Edited to
// give an upstream the caller's address and imported, it sent the sealed
// key to that address as a bearer token: the same hole a redacted key had
// (TestARedactedSecretCannotFollowAnUpstreamToANewAddress), through the
// backup instead of a write.
func TestASealedSecretCannotFollowAnUpstreamToANewAddress(t *testing.T) {
	e := newEnv(t, envOpts{file: proxiesDoc, snapshotDir: t.TempDir()})
	exp := e.do("GET", "/api/backup/export", "")
	if exp.status != 200 {
		t.Fatalf("export: %d %s", exp.status, exp.body)
	}
	before := e.store.Load()

	// ext-a moved to the caller's address.
	moved := editExport(t, exp.body, `"http://127.0.0.1:9"`, `"http://attacker.invalid"`)
	e.wantRefused(e.doWithin("POST", "/api/backup/import", moved), before, "config.split_proxy.proxies[1].api_key", "re-enter the secret")
	// ext-a's sealed key on a new entry at the caller's address.
	added := editExport(t, exp.body, `{"name":"local"`, `{"name":"evil","address":"http://attacker.invalid","api_key":"`+sealedOf(t, exp.body, 1)+`","weight":1},{"name":"local"`)
	e.wantRefused(e.doWithin("POST", "/api/backup/import", added), before, "config.split_proxy.proxies[0].api_key", "re-enter the secret")
	// ext-a's sealed key on ext-b (another entry, another address).
	swapped := editExport(t, exp.body, sealedOf(t, exp.body, 2), sealedOf(t, exp.body, 1))
	e.wantRefused(e.doWithin("POST", "/api/backup/import", swapped), before, "config.split_proxy.proxies[2].api_key", "re-enter the secret")

	// A fresh gateway with the same admin key restores the export whole.
	e2 := newEnv(t, envOpts{snapshotDir: t.TempDir()})
	if r := e2.do("POST", "/api/backup/import", string(exp.body)); r.status != 200 {
		t.Fatalf("restore: %d %s", r.status, r.body)
	}
	ps := e2.store.Load().SplitProxy.Proxies
	if ps[1].APIKey.Reveal() != "sk-secret-a-111" || ps[2].APIKey.Reveal() != "sk-secret-b-222" {
		t.Fatalf("restored keys: %v %v", ps[1], ps[2])
	}
	// So does an edited export that leaves the entries' addresses alone.
	weighed := editExport(t, exp.body, `"weight":3`, `"weight":4`)
	if r := e2.do("POST", "/api/backup/import", weighed); r.status != 200 || e2.store.Load().SplitProxy.Proxies[0].Weight != 4 {
		t.Fatalf("edited restore: %d %s", r.status, r.body)
	}
}

// sealedOf returns the sealed api_key of split_proxy.proxies[i] in an export.
func sealedOf(t *testing.T, export []byte, i int) string {
	t.Helper()
	var f struct {
		Config struct {
			SplitProxy struct {
				Proxies []struct {
					APIKey string `json:"api_key"`
				} `json:"proxies"`
			} `json:"split_proxy"`
		} `json:"config"`
	}
	if err := json.Unmarshal(export, &f); err != nil || len(f.Config.SplitProxy.Proxies) <= i {
		t.Fatalf("export: %v", err)
	}
	k := f.Config.SplitProxy.Proxies[i].APIKey
	if !strings.HasPrefix(k, "enc:") {
		t.Fatalf("proxies[%d].api_key %q is not sealed", i, k)
	}
	return k
}

// sealV1 seals clear as builds before enc:v2 did: bound to nothing.
func sealV1(t *testing.T, s *sealer, clear string) string {
	t.Helper()
	nonce := make([]byte, s.aead.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		t.Fatal(err)
	}
	return sealedPrefixV1 + base64.RawURLEncoding.EncodeToString(s.aead.Seal(nonce, nonce, []byte(clear), nil))
}

// Keys sealed by earlier builds (enc:v1:) name no entry or address. The
// gateway's own storage (snapshots, Redis) still opens them; through the
// API they stand only for the key the same entry holds at the same
// address, like a redacted key.
func TestAKeySealedByAnEarlierBuildStaysWithItsEntryAndAddress(t *testing.T) {
	e := newEnv(t, envOpts{file: proxiesDoc, snapshotDir: t.TempDir()})
	exp := e.do("GET", "/api/backup/export", "")
	old := editExport(t, exp.body, sealedOf(t, exp.body, 1), sealV1(t, e.a.seal, "sk-secret-a-111"))
	old = editExport(t, []byte(old), `"weight":3`, `"weight":5`)

	// Into the gateway that holds the key, at the same address: kept.
	if r := e.do("POST", "/api/backup/import", old); r.status != 200 {
		t.Fatalf("import: %d %s", r.status, r.body)
	}
	if ps := e.store.Load().SplitProxy.Proxies; ps[0].Weight != 5 || ps[1].APIKey.Reveal() != "sk-secret-a-111" {
		t.Fatalf("imported: %v %v", ps[0], ps[1])
	}
	before := e.store.Load()
	// At another address, or into a gateway without that key: refused.
	moved := editExport(t, []byte(old), `"http://127.0.0.1:9"`, `"http://attacker.invalid"`)
	e.wantRefused(e.doWithin("POST", "/api/backup/import", moved), before, "config.split_proxy.proxies[1].api_key", "re-enter the secret")
	e2 := newEnv(t, envOpts{snapshotDir: t.TempDir()})
	e2.wantRefused(e2.doWithin("POST", "/api/backup/import", old), e2.store.Load(), "config.split_proxy.proxies[1].api_key", "re-enter the secret")

	// The gateway's own storage opens it as it did.
	doc, err := decodeDoc([]byte(`{"split_proxy":{"enabled":true,"proxies":[{"name":"local","local":true,"weight":1},
		{"name":"ext-a","address":"http://127.0.0.1:9","api_key":"` + sealV1(t, e.a.seal, "sk-secret-a-111") + `","weight":1}]}}`))
	if err != nil {
		t.Fatal(err)
	}
	c, err := e.a.seal.parseDoc(doc, nil)
	if err != nil || c.SplitProxy.Proxies[1].APIKey.Reveal() != "sk-secret-a-111" {
		t.Fatalf("stored enc:v1 key: %v", err)
	}
}

// A sealed key is checked as a key in clear is: one that cannot travel in
// a header is refused at its path, never sent.
func TestASealedKeyThatCannotTravelInAHeaderIsRefused(t *testing.T) {
	e := newEnv(t, envOpts{file: proxiesDoc})
	sealed, err := e.a.seal.seal("split_proxy.proxies/ext-a", "http://127.0.0.1:9", "sk-a\r\nX-Injected: 1")
	if err != nil {
		t.Fatal(err)
	}
	exp := e.do("GET", "/api/backup/export", "")
	bad := editExport(t, exp.body, sealedOf(t, exp.body, 1), sealed)
	e.wantRefused(e.doWithin("POST", "/api/backup/import", bad), e.store.Load(), "config.split_proxy.proxies[1].api_key", "not allowed in a bearer token")
}

// With --admin-seal-key the admin key no longer opens exports: a holder of
// the admin key (an operator of the console) cannot read the upstream keys
// out of a backup. Secrets the admin key sealed before still open, and the
// next export seals them with the seal key.
func TestASealKeySetApartKeepsExportsClosedToTheAdminKey(t *testing.T) {
	const sealKey = "seal-key-kept-off-the-console-7f3a"
	before := newEnv(t, envOpts{file: proxiesDoc})
	oldExport := before.do("GET", "/api/backup/export", "")

	e := newEnv(t, envOpts{sealKey: sealKey})
	if r := e.do("POST", "/api/backup/import", string(oldExport.body)); r.status != 200 {
		t.Fatalf("import of an export the admin key sealed: %d %s", r.status, r.body)
	}
	if k := e.store.Load().SplitProxy.Proxies[1].APIKey.Reveal(); k != "sk-secret-a-111" {
		t.Fatalf("imported key %q", k)
	}
	exp := e.do("GET", "/api/backup/export", "")
	sealed := sealedOf(t, exp.body, 1)
	const owner, addr = "split_proxy.proxies/ext-a", "http://127.0.0.1:9"
	if _, err := newSealer("", testKey).open(sealed, owner, addr); err == nil {
		t.Fatal("the admin key opens an export sealed with the seal key")
	}
	if k, err := newSealer(sealKey, "").open(sealed, owner, addr); err != nil || k != "sk-secret-a-111" {
		t.Fatalf("the seal key does not open its export: %v", err)
	}
	// A gateway with the admin key alone cannot restore it; one with the
	// seal key can.
	noSeal := newEnv(t, envOpts{})
	noSeal.wantRefused(noSeal.doWithin("POST", "/api/backup/import", string(exp.body)), noSeal.store.Load(), "config.split_proxy.proxies[1].api_key", "re-enter the secret")
	withSeal := newEnv(t, envOpts{sealKey: sealKey})
	if r := withSeal.do("POST", "/api/backup/import", string(exp.body)); r.status != 200 {
		t.Fatalf("restore with the seal key: %d %s", r.status, r.body)
	}
}

// A redacted secret ("***" and 8 hex digits) is in every API answer, in
// the ETag's digest and in the audit log's lines. It was 32 bits of an
// unkeyed SHA-256 of the secret, so whoever read one (a log reader, an
// operator when --admin-seal-key is set apart from the admin key) could
// confirm a guess of a weak mirror token or upstream key offline. Now it
// is keyed by the seal key: a guess hashed as anyone can hash it matches
// neither the answer nor the log, and replicas with the same seal key
// still agree on it (a redacted value read from one is kept by another).
func TestASecretsFingerprintCannotConfirmAGuessOffline(t *testing.T) {
	const guess = "password123"
	logs := captureLogs(t)
	e := newEnv(t, envOpts{file: `{}`, sealKey: "seal-key-one-0123456789"})
	r := e.put("mirror", `{"enabled":true,"target_address":"http://127.0.0.1:9","auth_token":"`+guess+`"}`, 200)
	shown, _ := r.json(t)["auth_token"].(string)
	fp, ok := isRedacted(shown)
	if !ok || fp == "" {
		t.Fatalf("auth_token answered %q, want ***xxxxxxxx", shown)
	}
	sum := sha256.Sum256([]byte("infera secret fingerprint\x00" + guess))
	if offline := hex.EncodeToString(sum[:4]); fp == offline {
		t.Fatalf("the fingerprint %s is the unkeyed hash of the secret: anyone can confirm a guess with it", fp)
	}
	e.do("GET", "/api/audit", "") // the audit line is logged by then
	if !strings.Contains(logs.String(), shown) {
		t.Fatalf("the audit line does not show the secret as %s:\n%s", shown, logs.String())
	}

	// The same secret under the same seal key: the same fingerprint, which
	// another replica (or this one after a restart) keeps on a write back.
	same := newEnv(t, envOpts{file: `{}`, sealKey: "seal-key-one-0123456789"})
	same.put("mirror", `{"enabled":true,"target_address":"http://127.0.0.1:9","auth_token":"`+guess+`"}`, 200)
	if got := same.do("GET", "/api/config/mirror", "").json(t)["auth_token"]; got != shown {
		t.Fatalf("another gateway with the same seal key shows %v, want %s", got, shown)
	}
	same.put("mirror", `{"enabled":true,"target_address":"http://127.0.0.1:9","auth_token":"`+shown+`","sampling_ratio":0.5}`, 200)
	if got := same.store.Load().Mirror.AuthToken.Reveal(); got != guess {
		t.Fatalf("a redacted token written back stood for %q, want the token kept", got)
	}
	// Another seal key: another fingerprint.
	other := newEnv(t, envOpts{file: `{}`, sealKey: "seal-key-two-0123456789"})
	other.put("mirror", `{"enabled":true,"target_address":"http://127.0.0.1:9","auth_token":"`+guess+`"}`, 200)
	if got := other.do("GET", "/api/config/mirror", "").json(t)["auth_token"]; got == shown {
		t.Fatalf("another seal key gives the same fingerprint %v: it does not depend on the key", got)
	}
}

// An operator who used the admin API with --api-key alone (the admin key's
// default: the file's and the snapshots' secrets are sealed under it) and
// then sets --admin-key apart, as security.md advises, still starts: the
// --api-key opens what it sealed, and the next write seals under the new
// admin key. The gateway refused to start ("re-enter the secret").
func TestSettingTheAdminKeyApartStillOpensWhatTheAPIKeySealed(t *testing.T) {
	const apiKey, adminKey = "api-key-0123456789abcdef", "admin-key-0123456789abcdef"
	before := FileSecretCodec(&config.Serve{APIKey: apiKey})
	sealed, err := before.Seal("split_proxy.proxies[\"ext\"].api_key", "http://10.0.0.1:8000", "sk-upstream-1")
	if err != nil {
		t.Fatal(err)
	}
	after := FileSecretCodec(&config.Serve{APIKey: apiKey, AdminKey: adminKey})
	got, err := after.Open(sealed, "split_proxy.proxies[\"ext\"].api_key", "http://10.0.0.1:8000")
	if err != nil || got != "sk-upstream-1" {
		t.Fatalf("with --admin-key set apart the file's secret: %q, %v", got, err)
	}
	resealed, err := after.Seal("split_proxy.proxies[\"ext\"].api_key", "http://10.0.0.1:8000", "sk-upstream-1")
	if err != nil {
		t.Fatal(err)
	}
	alone := FileSecretCodec(&config.Serve{AdminKey: adminKey})
	if got, err := alone.Open(resealed, "split_proxy.proxies[\"ext\"].api_key", "http://10.0.0.1:8000"); err != nil || got != "sk-upstream-1" {
		t.Fatalf("a write after the change does not seal under the admin key: %q, %v", got, err)
	}
	if _, err := alone.Open(sealed, "split_proxy.proxies[\"ext\"].api_key", "http://10.0.0.1:8000"); err == nil {
		t.Fatal("a key that never sealed it opened the secret")
	}
	// The same for snapshots, exports and Redis.
	o := OptionsFromFlags(&config.Serve{APIKey: apiKey, AdminKey: adminKey}, nil)
	s0 := newSealer("", apiKey)
	snap, err := s0.seal("mirror.auth_token", "http://10.0.0.2:8000", "tok-1")
	if err != nil {
		t.Fatal(err)
	}
	if got, err := newSealer(o.SealKey, o.Key, o.OlderKeys...).open(snap, "mirror.auth_token", "http://10.0.0.2:8000"); err != nil || got != "tok-1" {
		t.Fatalf("a snapshot sealed under --api-key: %q, %v", got, err)
	}
}
