package admin

import (
	"net/http"
	"reflect"
	"runtime"
	"testing"

	"github.com/infera/infera/config"
)

// TestAChangeComparesUsersWithoutEncodingThem commits a config of 20,000
// users over the same config (an import of the config serving): the
// change is found to change nothing without encoding the users. Telling
// it encoded both configs whole in clear (about 2.5 times the users'
// encoding allocated), the comparison's side only to compare.
func TestAChangeComparesUsersWithoutEncodingThem(t *testing.T) {
	if testing.Short() {
		t.Skip("builds 20,000 users")
	}
	quietLogs(t)
	e := newEnv(t, envOpts{})
	if r := e.do("POST", "/api/backup/import", exportOfUsers(t, 20000)); r.status != http.StatusOK {
		t.Fatalf("import: %d %.300s", r.status, r.body)
	}
	e.a.audit.drain()
	cur, ver := e.store.Current()
	data, err := encodeClear(cur)
	if err != nil {
		t.Fatal(err)
	}
	next, err := e.a.seal.parseConfig(data, cur)
	if err != nil {
		t.Fatal(err)
	}
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	got, gotVer, err := e.a.changeChecked(actor{Who: "test"}, "import", 0, next, ver, func(map[string]any) error {
		t.Error("the change was made again")
		return nil
	}, nil)
	runtime.ReadMemStats(&after)
	if err != nil || got != cur || gotVer != ver {
		t.Fatalf("a change to the same config: %v, version %d (was %d), the config serving kept: %v", err, gotVer, ver, got == cur)
	}
	total := after.TotalAlloc - before.TotalAlloc
	t.Logf("users encoded in %d bytes: telling the same config allocated %d", len(data), total)
	if total > uint64(len(data))/8 && !raceEnabled {
		t.Errorf("telling the same config allocated %d bytes: want at most %d (an eighth of the users' encoding)", total, len(data)/8)
	}
}

// TestSameAsAgreesWithTheEncodingsComparison compares configs that differ
// (or not) in their users, in the ways an encoding shows or hides (a nil
// and an empty list), and elsewhere: sameAs says what comparing their
// clear encodings (sameEncoding) says.
func TestSameAsAgreesWithTheEncodingsComparison(t *testing.T) {
	base := func() *config.Config {
		c, err := config.Parse([]byte(`{"user_limit":{"templates":[{"name":"t"}]},"users":[{"name":"a","keys":[],"template":"t"},{"name":"b","models":["m"],"enabled":false}]}`))
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	edits := map[string]func(c *config.Config){
		"nothing":            func(c *config.Config) {},
		"keys [] to nil":     func(c *config.Config) { c.Users[0].Keys = nil },
		"models to []":       func(c *config.Config) { c.Users[0].Models = []string{} },
		"models nil":         func(c *config.Config) { c.Users[1].Models = nil },
		"a key":              func(c *config.Config) { c.Users[0].Keys = []string{"x"} },
		"a name":             func(c *config.Config) { c.Users[1].Name = "c" },
		"a template":         func(c *config.Config) { c.Users[1].Template = "t" },
		"enabled":            func(c *config.Config) { c.Users[1].Enabled = true },
		"a model":            func(c *config.Config) { c.Users[1].Models = []string{"n"} },
		"a user less":        func(c *config.Config) { c.Users = c.Users[:1] },
		"users nil":          func(c *config.Config) { c.Users = nil },
		"users []":           func(c *config.Config) { c.Users = []config.User{} },
		"users swapped":      func(c *config.Config) { c.Users[0], c.Users[1] = c.Users[1], c.Users[0] },
		"another section":    func(c *config.Config) { c.SessionAffinity.Enabled = !c.SessionAffinity.Enabled },
		"a template setting": func(c *config.Config) { c.UserLimit.Templates[0].DryRun = true },
	}
	// sameUsers compares these five: a field it does not know would be
	// a difference it misses.
	if n := reflect.TypeFor[config.User]().NumField(); n != 5 {
		t.Fatalf("config.User has %d fields: compare the new ones in sameUsers", n)
	}
	for nx, ex := range edits {
		for ny, ey := range edits {
			x, y := base(), base()
			ex(x)
			ey(y)
			xd, err1 := encodeClear(x)
			yd, err2 := encodeClear(y)
			if err1 != nil || err2 != nil {
				t.Fatal(err1, err2)
			}
			if got, want := sameAs(x, y), sameEncoding(xd, yd); got != want {
				t.Errorf("%s / %s: sameAs %v, the encodings compare %v", nx, ny, got, want)
			}
		}
	}
}
