package admin

import (
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/infera/infera/config"
)

// TestAnImportChecksItsConfigOnceBeforeItStoresIt imports an export into a
// file store, into memory and into Redis (redis-server on loopback),
// counting the runs of the store's check
// (SetCheck), which runs with every Store.Check and Store.Apply beside
// config.Validate: the import checks its config once, before its dry run
// would answer, and stores that config as it was checked. Apply ran
// Validate and the check on it again (for 50,000 users each Validate
// allocates about 3.5 MB, two maps of every name and key id), and the
// Redis storage ran Store.Check again before its write. A change
// that another write overtook is made again from the document, and the
// config made then is checked when it is stored.
func TestAnImportChecksItsConfigOnceBeforeItStoresIt(t *testing.T) {
	quietLogs(t)
	body := exportOfUsers(t, 300)
	rs := startRedis(t)
	for _, o := range []envOpts{{file: `{}`}, {}, {state: rs.url()}} {
		name := "file"
		switch {
		case o.state != "":
			name = "redis"
		case o.file == "":
			name = "memory"
		}
		e := newEnv(t, o)
		var checks atomic.Int64
		e.store.SetCheck(func(*config.Config) error {
			checks.Add(1)
			return nil
		})
		if r := e.do("POST", "/api/backup/import", body); r.status != http.StatusOK {
			t.Fatalf("import: %d %.300s", r.status, r.body)
		}
		if n := checks.Load(); n != 1 {
			t.Errorf("%s: the import ran the store's check %d times: want once", name, n)
		}
		if got := len(e.store.Load().Users); got != 300 {
			t.Fatalf("%d users imported", got)
		}

		// Checked against version 1, committed over version 2.
		cur, ver := e.store.Current()
		data, err := encodeClear(cur)
		if err != nil {
			t.Fatal(err)
		}
		next, err := e.a.seal.parseConfig(data, cur)
		if err != nil {
			t.Fatal(err)
		}
		next.SessionAffinity.Enabled = !next.SessionAffinity.Enabled
		checks.Store(0)
		_, _, err = e.a.changeChecked(actor{Who: "test"}, "import", 0, next, ver-1, func(doc map[string]any) error {
			doc["session_affinity"].(map[string]any)["enabled"] = next.SessionAffinity.Enabled
			return nil
		}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if n := checks.Load(); n != 1 {
			t.Errorf("%s: a change made again from its document ran the store's check %d times when stored: want once", name, n)
		}
	}
}
