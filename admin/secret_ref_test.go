package admin

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/infera/infera/config"
)

// doWithin is env.do with a bounded wait.
func (e *env) doWithin(method, path, body string, hdr ...string) resp {
	e.t.Helper()
	req, err := http.NewRequest(method, e.srv.URL+path, strings.NewReader(body))
	if err != nil {
		e.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+testKey)
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	res, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
	if err != nil {
		e.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer res.Body.Close()
	data, _ := io.ReadAll(res.Body)
	return resp{status: res.StatusCode, etag: res.Header.Get("ETag"), body: data, hdr: res.Header}
}

// wantRefused expects a 400 naming path with a message containing msg,
// and the config unchanged.
func (e *env) wantRefused(r resp, before *config.Config, path, msg string) {
	e.t.Helper()
	if r.status != http.StatusBadRequest {
		e.t.Fatalf("want 400 at %s, got %d %s", path, r.status, r.body)
	}
	p, m := r.errPath(e.t)
	if p != path || !strings.Contains(m, msg) {
		e.t.Fatalf("refused at %q (%s), want %q (...%s...)", p, m, path, msg)
	}
	if e.store.Load() != before {
		e.t.Fatal("a refused write changed the config")
	}
}

// redactedKeys returns the redacted api_key of each split proxy entry.
func (e *env) redactedKeys() []string {
	e.t.Helper()
	r := e.doWithin("GET", "/api/config/split_proxy", "")
	var sp struct {
		Proxies []struct {
			APIKey string `json:"api_key"`
		} `json:"proxies"`
	}
	if err := json.Unmarshal(r.body, &sp); err != nil {
		e.t.Fatalf("%d %s", r.status, r.body)
	}
	var out []string
	for _, p := range sp.Proxies {
		out = append(out, p.APIKey)
	}
	return out
}

// A redacted fingerprint stood for its key wherever it was sent back: on a
// new entry, or on the same entry with a new address, the key went as a
// bearer token to an address the caller chose.
func TestARedactedSecretCannotFollowAnUpstreamToANewAddress(t *testing.T) {
	e := newEnv(t, envOpts{file: proxiesDoc})
	keyA := e.redactedKeys()[1]
	const local = `{"name":"local","local":true,"weight":3}`
	extB := `{"name":"ext-b","address":"http://127.0.0.1:10","api_key":"` + e.redactedKeys()[2] + `","weight":1}`
	patch := func(proxies ...string) resp {
		return e.doWithin("PATCH", "/api/config/split_proxy", `{"proxies":[`+strings.Join(proxies, ",")+`]}`, "If-Match", e.etag())
	}
	before := e.store.Load()

	// A new entry at the caller's address.
	e.wantRefused(patch(local,
		`{"name":"ext-a","address":"http://127.0.0.1:9","api_key":"`+keyA+`","weight":1}`,
		`{"name":"evil","address":"http://attacker.invalid","api_key":"`+keyA+`","weight":1}`),
		before, "split_proxy.proxies[2].api_key", "re-enter the secret")
	// The same entry, moved to the caller's address.
	e.wantRefused(patch(local, extB,
		`{"name":"ext-a","address":"http://attacker.invalid","api_key":"`+keyA+`","weight":1}`),
		before, "split_proxy.proxies[2].api_key", "the upstream's address changed")
	// Another entry's key on an existing entry.
	e.wantRefused(patch(local,
		`{"name":"ext-a","address":"http://127.0.0.1:9","api_key":"`+keyA+`","weight":1}`,
		`{"name":"ext-b","address":"http://127.0.0.1:10","api_key":"`+keyA+`","weight":1}`),
		before, "split_proxy.proxies[2].api_key", "re-enter the secret")

	// The same entry at the same address keeps its key, wherever it moved
	// in the list; a new address with the key in clear is accepted.
	if r := patch(local, `{"name":"ext-a","address":"http://127.0.0.1:9","api_key":"`+keyA+`","weight":2}`, extB); r.status != 200 {
		t.Fatalf("%d %s", r.status, r.body)
	}
	ps := e.store.Load().SplitProxy.Proxies
	if ps[1].APIKey.Reveal() != "sk-secret-a-111" || ps[2].APIKey.Reveal() != "sk-secret-b-222" || ps[1].Weight != 2 {
		t.Fatalf("keys not kept: %v %v", ps[1], ps[2])
	}
	if r := patch(local, extB, `{"name":"ext-a","address":"http://127.0.0.1:11","api_key":"sk-secret-a-111","weight":1}`); r.status != 200 {
		t.Fatalf("%d %s", r.status, r.body)
	}
	if p := e.store.Load().SplitProxy.Proxies[2]; p.Address != "http://127.0.0.1:11" || p.APIKey.Reveal() != "sk-secret-a-111" {
		t.Fatalf("re-entered key: %v", p)
	}
}

// A merge patch keeps the settings it does not name: changing only the
// mirror's (or the classifier's) address used to keep the token, which
// then went to the new address.
func TestAMergePatchCannotMoveATokenToANewAddress(t *testing.T) {
	e := newEnv(t, envOpts{file: `{"mirror":{"target_address":"http://127.0.0.1:9","auth_token":"sk-mirror-111"},
		"smart_model_selection":{"classifier_url":"http://127.0.0.1:10/classify","classifier_api_key":"sk-classify-222"}}`})
	before := e.store.Load()
	r := e.doWithin("PATCH", "/api/config/mirror", `{"target_address":"http://attacker.invalid"}`, "If-Match", e.etag())
	e.wantRefused(r, before, "mirror.auth_token", "the upstream's address changed")
	r = e.doWithin("PATCH", "/api/config/smart_model_selection", `{"classifier_url":"http://attacker.invalid/c"}`, "If-Match", e.etag())
	e.wantRefused(r, before, "smart_model_selection.classifier_api_key", "the upstream's address changed")

	// Other settings change and keep the token; a new address takes the
	// token in clear.
	if r := e.doWithin("PATCH", "/api/config/mirror", `{"sampling_ratio":5}`, "If-Match", e.etag()); r.status != 200 {
		t.Fatalf("%d %s", r.status, r.body)
	}
	if m := e.store.Load().Mirror; m.SamplingRatio != 5 || m.AuthToken.Reveal() != "sk-mirror-111" {
		t.Fatalf("mirror: %v", m)
	}
	if r := e.doWithin("PATCH", "/api/config/mirror", `{"target_address":"http://127.0.0.1:11","auth_token":"sk-mirror-111"}`, "If-Match", e.etag()); r.status != 200 {
		t.Fatalf("%d %s", r.status, r.body)
	}
	if m := e.store.Load().Mirror; m.TargetAddress != "http://127.0.0.1:11" || m.AuthToken.Reveal() != "sk-mirror-111" {
		t.Fatalf("mirror: %v", m)
	}
	// A write that changes nothing commits nothing.
	v := e.store.Version()
	if r := e.doWithin("PATCH", "/api/config/mirror", `{"sampling_ratio":5}`, "If-Match", e.etag()); r.status != 200 || e.store.Version() != v {
		t.Fatalf("no-op write: %d, version %d -> %d", r.status, v, e.store.Version())
	}
}

// env: and file: references sent through the API read the gateway host's
// variables and files and sent them upstream, and the errors of file:
// told whether a path exists and where its first blank is.
func TestSecretReferencesAreRefusedThroughTheAPI(t *testing.T) {
	e := newEnv(t, envOpts{file: proxiesDoc})
	hostFile := filepath.Join(t.TempDir(), "sa-token")
	if err := os.WriteFile(hostFile, []byte("eyJhbGciOi.host-only-token"), 0o600); err != nil {
		t.Fatal(err)
	}
	blank := filepath.Join(t.TempDir(), "blank")
	if err := os.WriteFile(blank, []byte("abc def"), 0o600); err != nil {
		t.Fatal(err)
	}
	before := e.store.Load()
	var answers []string
	for _, ref := range []string{"file:" + hostFile, "file:" + blank, "file:/etc/nonexistent", "file:" + t.TempDir(), "env:HOME", "env:INFERA_NOT_SET_ANYWHERE"} {
		body := `{"proxies":[{"name":"local","local":true,"weight":3},{"name":"x","address":"http://attacker.invalid","api_key":"` + ref + `","weight":1}]}`
		r := e.doWithin("PATCH", "/api/config/split_proxy", body, "If-Match", e.etag())
		e.wantRefused(r, before, "split_proxy.proxies[1].api_key", "read from the config file only")
		_, msg := r.errPath(t)
		answers = append(answers, msg)
	}
	for _, m := range answers[1:] {
		if m != answers[0] {
			t.Fatalf("the answers differ by reference: %q", answers)
		}
	}
	// A whole-config PUT and an import are refused the same way.
	r := e.doWithin("PUT", "/api/config", `{"mirror":{"target_address":"http://attacker.invalid","auth_token":"file:`+hostFile+`"}}`, "If-Match", e.etag())
	e.wantRefused(r, before, "mirror.auth_token", "read from the config file only")
	snap := `{"format":"` + snapshotFormat + `","format_version":1,"config":{"mirror":{"target_address":"http://attacker.invalid","auth_token":"env:HOME"}}}`
	for _, q := range []string{"?dry_run=1", ""} {
		r = e.doWithin("POST", "/api/backup/import"+q, snap)
		e.wantRefused(r, before, "config.mirror.auth_token", "read from the config file only")
	}
	// A sealed reference is a reference too.
	sealed, err := e.a.seal.seal("split_proxy.proxies/x", "http://attacker.invalid", "file:"+hostFile)
	if err != nil {
		t.Fatal(err)
	}
	body := `{"proxies":[{"name":"local","local":true,"weight":3},{"name":"x","address":"http://attacker.invalid","api_key":"` + sealed + `","weight":1}]}`
	e.wantRefused(e.doWithin("PATCH", "/api/config/split_proxy", body, "If-Match", e.etag()), before, "split_proxy.proxies[1].api_key", "read from the config file only")
}

// References in the config file keep working: a write through the API
// keeps an entry's reference as long as it is unchanged at the same
// address, and an export imports back.
func TestAConfigFileReferenceSurvivesAPIWrites(t *testing.T) {
	keyFile := filepath.Join(t.TempDir(), "mirror-token")
	if err := os.WriteFile(keyFile, []byte("sk-from-file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("INFERA_TEST_MEMBER_KEY", "sk-from-env")
	e := newEnv(t, envOpts{file: `{"mirror":{"target_address":"http://127.0.0.1:9","auth_token":"file:` + keyFile + `"},
		"global_scheduling":{"members":[{"name":"eu","url":"http://127.0.0.1:10","api_key":"env:INFERA_TEST_MEMBER_KEY"}]}}`})
	if r := e.doWithin("PATCH", "/api/config/mirror", `{"sampling_ratio":7}`, "If-Match", e.etag()); r.status != 200 {
		t.Fatalf("%d %s", r.status, r.body)
	}
	// The whole config as the API shows it, sent back.
	all := e.doWithin("GET", "/api/config", "")
	if r := e.doWithin("PUT", "/api/config", string(all.body), "If-Match", e.etag()); r.status != 200 {
		t.Fatalf("%d %s", r.status, r.body)
	}
	c := e.store.Load()
	if c.Mirror.SamplingRatio != 7 || c.Mirror.AuthToken.Ref() != "file:"+keyFile || c.Mirror.AuthToken.Reveal() != "sk-from-file" ||
		c.GlobalScheduling.Members[0].APIKey.Reveal() != "sk-from-env" {
		t.Fatalf("references lost: %v %v", c.Mirror, c.GlobalScheduling.Members)
	}
	data, _ := os.ReadFile(e.path)
	if !strings.Contains(string(data), `"file:`+keyFile+`"`) || strings.Contains(string(data), "sk-from") {
		t.Fatalf("the config file should keep the references:\n%s", data)
	}
	exp := e.doWithin("GET", "/api/backup/export", "")
	if r := e.doWithin("POST", "/api/backup/import", string(exp.body)); r.status != 200 {
		t.Fatalf("import of an export: %d %s", r.status, r.body)
	}

	// Moving the entry, or changing the reference, is refused.
	before := e.store.Load()
	r := e.doWithin("PATCH", "/api/config/mirror", `{"target_address":"http://attacker.invalid"}`, "If-Match", e.etag())
	e.wantRefused(r, before, "mirror.auth_token", "the upstream's address changed")
	r = e.doWithin("PATCH", "/api/config/mirror", `{"auth_token":"file:/etc/hostname"}`, "If-Match", e.etag())
	e.wantRefused(r, before, "mirror.auth_token", "read from the config file only")
	r = e.doWithin("PATCH", "/api/config/global_scheduling", `{"members":[{"name":"eu2","url":"http://127.0.0.1:10","api_key":"env:INFERA_TEST_MEMBER_KEY"}]}`, "If-Match", e.etag())
	e.wantRefused(r, before, "global_scheduling.members[0].api_key", "read from the config file only")
}

// The errors of a file: reference in the config file name the file and
// the system's reason, never its content or where a bad character is.
func TestAFileReferenceErrorTellsNoContent(t *testing.T) {
	dir := t.TempDir()
	blank := filepath.Join(dir, "blank")
	if err := os.WriteFile(blank, []byte("abc def-TOPSECRET"), 0o600); err != nil {
		t.Fatal(err)
	}
	f := func(path, want string) {
		t.Helper()
		_, err := config.Parse([]byte(`{"mirror":{"auth_token":"file:` + path + `"}}`))
		var fe *config.FieldError
		if !errors.As(err, &fe) || fe.Path != "mirror.auth_token" || !strings.Contains(fe.Msg, want) {
			t.Fatalf("file %s: %v, want ...%s...", path, err, want)
		}
		if strings.Contains(fe.Msg, "byte") || strings.Contains(fe.Msg, "TOPSECRET") || strings.Contains(fe.Msg, "abc") {
			t.Fatalf("file %s: the error describes the content: %v", path, err)
		}
	}
	f(blank, "holds a character not allowed in a bearer token")
	f(filepath.Join(dir, "missing"), "cannot read secret file")
	f(dir, "cannot read secret file")
	// A literal key still says where its bad character is.
	_, err := config.Parse([]byte(`{"mirror":{"auth_token":"abc def"}}`))
	if err == nil || !strings.Contains(err.Error(), "byte 3") {
		t.Fatalf("literal key: %v", err)
	}
}

// Every secret setting of the config is a slot: a secret outside the
// slots would escape the checks of parseDoc (and encodeClear refuses it).
func TestEverySecretIsASlot(t *testing.T) {
	var count func(t reflect.Type, seen map[reflect.Type]bool) int
	count = func(t reflect.Type, seen map[reflect.Type]bool) int {
		if t == secretType {
			return 1
		}
		switch t.Kind() {
		case reflect.Pointer, reflect.Slice, reflect.Array, reflect.Map:
			return count(t.Elem(), seen)
		case reflect.Struct:
			if seen[t] {
				return 0
			}
			seen[t] = true
			n := 0
			for i := 0; i < t.NumField(); i++ {
				n += count(t.Field(i).Type, seen)
			}
			return n
		}
		return 0
	}
	if n := count(reflect.TypeFor[config.Config](), map[reflect.Type]bool{}); n != 4 {
		t.Fatalf("%d secret settings, want 4: give a new one a slot in config.AppendSecretSlots and count it here", n)
	}
	c := config.Default()
	c.SplitProxy.Proxies = []config.Proxy{{Local: true}, {Name: "a", Address: "http://a", APIKey: config.NewSecret("k1")}}
	c.Mirror.AuthToken = config.NewSecret("k2")
	c.GlobalScheduling.Members = []config.Member{{Name: "m", URL: "http://m", APIKey: config.NewSecret("k3")}}
	c.SmartModelSelection.ClassifierAPIKey = config.NewSecret("k4")
	if _, err := encodeClear(c); err != nil {
		t.Fatal(err)
	}
}

// An import is decoded once, into the typed config, with its secrets
// found in its bytes where the config's types put them: a reference is
// refused (never read) however its keys are spelt, as encoding/json
// matches them (any case, escaped), in a section or in a list.
func TestAnImportedReferenceIsRefusedHoweverItsKeysAreSpelt(t *testing.T) {
	t.Setenv("INFERA_TEST_IMPORTED_REF", "sk-host-only")
	e := newEnv(t, envOpts{file: proxiesDoc})
	before := e.store.Load()
	f := func(cfg, path, msg string) {
		t.Helper()
		snap := `{"format":"` + snapshotFormat + `","format_version":1,"config":` + cfg + `}`
		for _, q := range []string{"?dry_run=1", ""} {
			e.wantRefused(e.doWithin("POST", "/api/backup/import"+q, snap), before, path, msg)
		}
	}
	const ref = `"env:INFERA_TEST_IMPORTED_REF"`
	f(`{"mirror":{"target_address":"http://attacker.invalid","auth_token":`+ref+`}}`, "config.mirror.auth_token", "read from the config file only")
	f(`{"MIRROR":{"target_address":"http://attacker.invalid","AUTH_TOKEN":`+ref+`}}`, "config.mirror.auth_token", "read from the config file only")
	f(`{"mirror":{"target_address":"http://attacker.invalid","auth\u005ftoken":`+ref+`}}`, "config.mirror.auth_token", "read from the config file only")
	f(`{"Split_Proxy":{"proxies":[{"name":"local","local":true,"weight":3},{"name":"x","address":"http://attacker.invalid","Api_Key":`+ref+`,"weight":1}]}}`,
		"config.split_proxy.proxies[1].api_key", "read from the config file only")
	// What walkDoc refused in a section holding secrets is refused at the
	// same path.
	f(`{"mirror":{"auth_token":7}}`, "config.mirror.auth_token", "want a string")
	f(`{"mirror":{"auth_tokn":`+ref+`}}`, "config.mirror.auth_tokn", `unknown field "auth_tokn"`)
	f(`{"mirror":{"auth_token":"***"}}`, "config.mirror.auth_token", "bare redacted placeholder")
}
