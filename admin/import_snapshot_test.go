package admin

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// The snapshot taken before an import holds exactly the data the import
// replaced, even while other writes (user creations, without If-Match)
// land around it: an import without If-Match applies on top of whatever
// is current, so a write that landed after the snapshot and before the
// import would be replaced without any snapshot holding it. Each import is
// checked: a manual snapshot at the version just before the import's, with
// every user created since the import before it.
func TestThePreImportSnapshotHoldsTheDataTheImportReplaced(t *testing.T) {
	dir := t.TempDir()
	e := newEnv(t, envOpts{snapshotDir: dir})
	exp := e.do("GET", "/api/backup/export", "")
	if exp.status != 200 {
		t.Fatalf("export: %d %s", exp.status, exp.body)
	}

	// Writers create users without If-Match until stop, bounded in count;
	// created records each creation's version.
	var (
		stop    atomic.Bool
		wg      sync.WaitGroup
		mu      sync.Mutex
		created = map[string]uint64{}
		next    atomic.Int64
	)
	const writers, maxCreations = 4, 4000
	for range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				n := next.Add(1)
				if n > maxCreations {
					return
				}
				name := fmt.Sprintf("user-%d", n)
				r := e.do("POST", "/api/users", `{"name":"`+name+`"}`)
				if r.status != 201 {
					t.Errorf("create %s: %d %s", name, r.status, r.body)
					return
				}
				v, err := strconv.ParseUint(r.hdr.Get("X-Config-Version"), 10, 64)
				if err != nil {
					t.Errorf("create %s: X-Config-Version %q", name, r.hdr.Get("X-Config-Version"))
					return
				}
				mu.Lock()
				created[name] = v
				mu.Unlock()
			}
		}()
	}
	defer func() {
		stop.Store(true)
		wg.Wait()
	}()

	deadline := time.Now().Add(15 * time.Second)
	var prev uint64 // the version of the import before
	for i := 0; i < 40 && time.Now().Before(deadline) && !t.Failed(); i++ {
		time.Sleep(time.Millisecond) // let a creation or two land
		r := e.do("POST", "/api/backup/import", string(exp.body))
		if r.status != 200 {
			t.Fatalf("import %d: %d %s", i, r.status, r.body)
		}
		var ans struct{ Version uint64 }
		if err := json.Unmarshal(r.body, &ans); err != nil {
			t.Fatal(err)
		}
		snap, ok := manualSnapshotAt(t, e, dir, ans.Version-1)
		if !ok {
			t.Fatalf("import %d made version %d: no manual snapshot holds version %d, the data it replaced (newest manual snapshot: version %d)",
				i, ans.Version, ans.Version-1, newestManualVersion(t, e, dir))
		}
		mu.Lock()
		for name, v := range created {
			if v > prev && v < ans.Version && !snap[name] {
				mu.Unlock()
				t.Fatalf("import %d made version %d: %s, created at version %d, is not in its snapshot", i, ans.Version, name, v)
			}
		}
		mu.Unlock()
		prev = ans.Version
	}
}

// manualSnapshotAt returns the users of the manual snapshot taken at
// version v, if there is one.
func manualSnapshotAt(t *testing.T, e *env, dir string, v uint64) (map[string]bool, bool) {
	t.Helper()
	list, err := e.a.snaps.list()
	if err != nil {
		t.Fatal(err)
	}
	for _, info := range list {
		if info.Kind != kindManual {
			continue
		}
		f := readSnapshotUsers(t, filepath.Join(dir, info.Name))
		if f.Version != v {
			continue
		}
		users := map[string]bool{}
		for _, u := range f.Config.Users {
			users[u.Name] = true
		}
		return users, true
	}
	return nil, false
}

func newestManualVersion(t *testing.T, e *env, dir string) uint64 {
	t.Helper()
	list, err := e.a.snaps.list()
	if err != nil {
		t.Fatal(err)
	}
	var v uint64
	for _, info := range list {
		if info.Kind == kindManual {
			v = max(v, readSnapshotUsers(t, filepath.Join(dir, info.Name)).Version)
		}
	}
	return v
}

type snapshotUsers struct {
	Version uint64 `json:"version"`
	Config  struct {
		Users []struct {
			Name string `json:"name"`
		} `json:"users"`
	} `json:"config"`
}

func readSnapshotUsers(t *testing.T, path string) snapshotUsers {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var f snapshotUsers
	if err := json.Unmarshal(data, &f); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return f
}
