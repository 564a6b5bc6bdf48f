package admin

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/infera/infera/config"
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

// slowSnapshotWrites holds the first snapshot file written from now on
// until the returned release is called (at the latest 30 s later), and
// signals on started when that write has begun: a slow disk or a fsync
// of an object-storage mount. Later writes go through at once.
func slowSnapshotWrites(t *testing.T, e *env) (started <-chan struct{}, release func()) {
	t.Helper()
	gate, begun := make(chan struct{}), make(chan struct{}, 1)
	var calls atomic.Int32
	e.a.snaps.mu.Lock()
	e.a.snaps.writeFile = func(path string, data []byte, perm os.FileMode) error {
		if calls.Add(1) == 1 {
			begun <- struct{}{}
			select {
			case <-gate:
			case <-time.After(30 * time.Second):
			}
		}
		return config.WriteFileAtomic(path, data, perm)
	}
	e.a.snaps.mu.Unlock()
	return begun, sync.OnceFunc(func() { close(gate) })
}

// manualSnapshots returns the versions and users of the stored manual
// snapshots, newest first.
func manualSnapshots(t *testing.T, e *env, dir string) []snapshotUsers {
	t.Helper()
	list, err := e.a.snaps.list()
	if err != nil {
		t.Fatal(err)
	}
	var out []snapshotUsers
	for _, info := range list {
		if info.Kind == kindManual {
			out = append(out, readSnapshotUsers(t, filepath.Join(dir, info.Name)))
		}
	}
	return out
}

func userNames(f snapshotUsers) []string {
	var out []string
	for _, u := range f.Config.Users {
		out = append(out, u.Name)
	}
	slices.Sort(out)
	return out
}

// An admin write sent while an import's pre-import snapshot is being
// written (its file write held) is answered before that write ends: the
// snapshot is written outside the admin lock. The import then applies
// over the data with that write in it, and its snapshot is of that data:
// the one manual snapshot left is at the version just before the
// import's and holds the user created meanwhile.
func TestAWriteDuringAPreImportSnapshotDoesNotWaitForItsFileWrite(t *testing.T) {
	dir := t.TempDir()
	e := newEnv(t, envOpts{snapshotDir: dir})
	for _, name := range []string{"a", "b"} {
		if r := e.do("POST", "/api/users", `{"name":"`+name+`"}`); r.status != 201 {
			t.Fatalf("create %s: %d %s", name, r.status, r.body)
		}
	}
	// The export holds a and b; b is deleted, so the import changes the
	// data (and takes a snapshot).
	exp := e.do("GET", "/api/backup/export", "")
	if exp.status != 200 {
		t.Fatalf("export: %d %s", exp.status, exp.body)
	}
	if r := e.do("DELETE", "/api/users/b", "", "If-Match", "*"); r.status != 200 && r.status != 204 {
		t.Fatalf("delete b: %d %s", r.status, r.body)
	}
	started, release := slowSnapshotWrites(t, e)
	defer release()

	imported := make(chan resp, 1)
	go func() { imported <- e.do("POST", "/api/backup/import", string(exp.body)) }()
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("the import wrote no snapshot")
	}
	wrote := make(chan resp, 1)
	go func() { wrote <- e.do("POST", "/api/users", `{"name":"during"}`) }()
	var blocked bool
	select {
	case r := <-wrote:
		if r.status != 201 {
			t.Errorf("create during: %d %s", r.status, r.body)
		}
	case <-time.After(5 * time.Second):
		blocked = true
	}
	release()
	if blocked {
		<-wrote
	}
	r := <-imported
	if blocked {
		t.Fatal("a user creation sent while the pre-import snapshot was being written waited for that write to end (5 s and more)")
	}
	if r.status != 200 {
		t.Fatalf("import: %d %s", r.status, r.body)
	}
	var ans struct{ Version uint64 }
	if err := json.Unmarshal(r.body, &ans); err != nil {
		t.Fatal(err)
	}
	snaps := manualSnapshots(t, e, dir)
	if len(snaps) != 1 {
		t.Fatalf("%d manual snapshots, want the pre-import one alone: %+v", len(snaps), snaps)
	}
	if got, want := snaps[0].Version, ans.Version-1; got != want {
		t.Errorf("the pre-import snapshot is of version %d, want %d, the one the import (version %d) replaced", got, want, ans.Version)
	}
	if got, want := userNames(snaps[0]), []string{"a", "during"}; !slices.Equal(got, want) {
		t.Errorf("the pre-import snapshot holds users %v, want %v, the data the import replaced", got, want)
	}
	var now []string
	for _, u := range e.store.Load().Users {
		now = append(now, u.Name)
	}
	if want := []string{"a", "b"}; !slices.Equal(now, want) {
		t.Errorf("after the import: users %v, want the export's %v", now, want)
	}
}

// An import with If-Match that a write overtakes while its snapshot is
// being written is refused (409) and leaves no snapshot: nothing was
// imported over the data it holds.
func TestAnImportOvertakenDuringItsSnapshotIsRefusedAndLeavesNoSnapshot(t *testing.T) {
	dir := t.TempDir()
	e := newEnv(t, envOpts{snapshotDir: dir})
	if r := e.do("POST", "/api/users", `{"name":"a"}`); r.status != 201 {
		t.Fatalf("create a: %d %s", r.status, r.body)
	}
	exp := e.do("GET", "/api/backup/export", "")
	if r := e.do("DELETE", "/api/users/a", "", "If-Match", "*"); r.status != 200 && r.status != 204 {
		t.Fatalf("delete a: %d %s", r.status, r.body)
	}
	etag := e.etag()
	started, release := slowSnapshotWrites(t, e)
	defer release()
	imported := make(chan resp, 1)
	go func() { imported <- e.do("POST", "/api/backup/import", string(exp.body), "If-Match", etag) }()
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("the import wrote no snapshot")
	}
	wrote := make(chan resp, 1)
	go func() { wrote <- e.do("POST", "/api/users", `{"name":"during"}`) }()
	var w resp
	select {
	case w = <-wrote:
	case <-time.After(5 * time.Second):
		release()
		w = <-wrote
	}
	if w.status != 201 {
		t.Errorf("create during: %d %s", w.status, w.body)
	}
	release()
	if r := <-imported; r.status != 409 {
		t.Fatalf("import: %d %s, want 409", r.status, r.body)
	}
	if snaps := manualSnapshots(t, e, dir); len(snaps) != 0 {
		t.Fatalf("the refused import left %d manual snapshots: %+v", len(snaps), snaps)
	}
	if names := snapshotDirNames(t, dir); len(names) != 0 {
		t.Fatalf("files left in the snapshot directory: %v", names)
	}
}
