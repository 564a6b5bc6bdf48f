package admin

import (
	"os"
	"strings"
	"testing"

	"github.com/infera/infera/config"
)

// threeSecretsDoc has three upstream secrets, which an admin write seals.
const threeSecretsDoc = `{"split_proxy":{"enabled":true,"strategy":"weight","proxies":[
	{"name":"local","local":true,"weight":3},
	{"name":"ext-a","address":"http://127.0.0.1:9","api_key":"sk-secret-a-111","weight":1},
	{"name":"ext-b","address":"http://127.0.0.1:10","api_key":"sk-secret-b-222","weight":1}]},
	"mirror":{"target_address":"http://127.0.0.1:11","auth_token":"sk-mirror-333"}}`

// wantsAllUnopened checks that err names every sealed secret, and none of
// the secrets themselves.
func wantsAllUnopened(t *testing.T, what string, err error) {
	t.Helper()
	if err == nil {
		t.Fatalf("%s: started under another seal key", what)
	}
	for _, p := range []string{"split_proxy.proxies[1].api_key", "split_proxy.proxies[2].api_key", "mirror.auth_token"} {
		if !strings.Contains(err.Error(), p) {
			t.Errorf("%s: the error does not name %s: %v", what, p, err)
		}
	}
	if strings.Contains(err.Error(), "sk-") {
		t.Errorf("%s: the error quotes a secret: %v", what, err)
	}
}

// A gateway started with the wrong seal key named only the first sealed
// secret it could not open ("split_proxy.proxies[1].api_key: cannot be
// opened"): an operator who re-entered it met the next one at the next
// start. Every one is named, in the file and in snapshots.
func TestEverySealedSecretThatCannotBeOpenedIsNamedAtStart(t *testing.T) {
	dir := t.TempDir()
	e := newEnv(t, envOpts{file: `{}`, snapshotDir: dir})
	if r := e.do("PUT", "/api/config", threeSecretsDoc, "If-Match", e.etag()); r.status != 200 {
		t.Fatalf("PUT /api/config: %d %s", r.status, r.body)
	}
	e.a.Close() // the shutdown snapshot
	data, err := os.ReadFile(e.path)
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(data), sealedPrefix); n != 3 {
		t.Fatalf("the file holds %d sealed secrets, want 3", n)
	}

	// The file, under another key.
	_, err = config.OpenWith(e.path, FileSecretCodec(&config.Serve{AdminKey: "another-admin-key-0123456789"}))
	wantsAllUnopened(t, "config file", err)
	// The file, without any key.
	_, err = config.OpenWith(e.path, nil)
	wantsAllUnopened(t, "config file without a key", err)
	// The snapshots, under another key.
	_, err = New(Options{Store: config.NewStore("", nil), Key: "another-admin-key-0123456789", SnapshotDir: dir})
	wantsAllUnopened(t, "snapshots", err)
	// The snapshots, without any key.
	_, err = New(Options{Store: config.NewStore("", nil), SnapshotDir: dir})
	wantsAllUnopened(t, "snapshots without a key", err)
}

func TestUnopenedSecretsNamesABoundedList(t *testing.T) {
	var others []string
	for range config.MaxNamedUnopened + 5 {
		others = append(others, "x.y")
	}
	err := config.UnopenedSecrets("a.b", "cannot be opened", others)
	if got := strings.Count(err.Msg, "x.y"); got != config.MaxNamedUnopened {
		t.Fatalf("named %d others, want %d: %s", got, config.MaxNamedUnopened, err.Msg)
	}
	if !strings.HasSuffix(err.Msg, "and 5 more") || err.Path != "a.b" {
		t.Fatalf("%s: %s", err.Path, err.Msg)
	}
}
