package admin

import (
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/infera/infera/config"
)

// stopSnapshotClock makes every snapshot of e's admin be written in the
// same millisecond, as several are on a fast disk (a manual one, the
// pre-import one and an automatic one at once).
func stopSnapshotClock(e *env) {
	at := time.Date(2026, 12, 1, 6, 24, 31, 406_000_000, time.UTC)
	e.a.snaps.mu.Lock()
	e.a.snaps.now = func() time.Time { return at }
	e.a.snaps.mu.Unlock()
}

// writeSnapshotsInOneMillisecond creates n users, taking a manual snapshot
// (POST /api/backup) after each, all in one millisecond, and returns the
// snapshots' names in the order they were written: the i-th holds users
// u-0 to u-i.
func writeSnapshotsInOneMillisecond(t *testing.T, e *env, n int) []string {
	t.Helper()
	stopSnapshotClock(e)
	var names []string
	for i := range n {
		if r := e.do("POST", "/api/users", fmt.Sprintf(`{"name":"u-%d"}`, i)); r.status != 201 {
			t.Fatalf("create u-%d: %d %s", i, r.status, r.body)
		}
		r := e.do("POST", "/api/backup", "")
		if r.status != 201 {
			t.Fatalf("snapshot %d: %d %s", i, r.status, r.body)
		}
		var info SnapshotInfo
		if err := json.Unmarshal(r.body, &info); err != nil {
			t.Fatal(err)
		}
		names = append(names, info.Name)
	}
	return names
}

// listedManual is GET /api/backup's manual snapshots, in its order.
func listedManual(t *testing.T, e *env) []string {
	t.Helper()
	r := e.do("GET", "/api/backup", "")
	if r.status != 200 {
		t.Fatalf("backup: %d %s", r.status, r.body)
	}
	var b Backup
	if err := json.Unmarshal(r.body, &b); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, s := range b.Snapshots {
		if s.Kind == kindManual {
			out = append(out, s.Name)
		}
	}
	return out
}

func reversed(s []string) []string {
	s = slices.Clone(s)
	slices.Reverse(s)
	return s
}

// Twelve snapshots written in one millisecond (so their names differ only
// by the suffix: none, -1, ..., -9, -10, -11) are listed newest first in
// the order they were written: the one without a suffix is the oldest, and
// -10 is newer than -9.
func TestSnapshotsOfOneMillisecondAreListedInTheOrderWritten(t *testing.T) {
	dir := t.TempDir()
	keep := config.Backup{IntervalSeconds: 3600, Keep: 100}
	e := newEnv(t, envOpts{snapshotDir: dir, backup: &keep})
	names := writeSnapshotsInOneMillisecond(t, e, 12)
	if got, want := listedManual(t, e), reversed(names); !slices.Equal(got, want) {
		t.Fatalf("listed (newest first):\n%v\nwant the reverse of the order written:\n%v", got, want)
	}
	// The names are the snapshot's time and its place in that millisecond.
	for i, n := range names {
		want := "snapshot-20261201T062431.406Z-manual.json"
		if i > 0 {
			want = fmt.Sprintf("snapshot-20261201T062431.406Z-manual-%d.json", i)
		}
		if n != want {
			t.Errorf("snapshot %d is %s, want %s", i, n, want)
		}
	}
}

// Rotation keeps the last keep snapshots written, also when they were all
// written in one millisecond: the -9/-10 boundary and the one without a
// suffix (the first) included. Each name is new: the first name of the
// millisecond, rotated out, is not written again (it would be the oldest
// by name and rotated out at once, the newest data lost).
func TestRotationKeepsTheLastSnapshotsWrittenInOneMillisecond(t *testing.T) {
	dir := t.TempDir()
	keep := config.Backup{IntervalSeconds: 3600, Keep: 5}
	e := newEnv(t, envOpts{snapshotDir: dir, backup: &keep})
	names := writeSnapshotsInOneMillisecond(t, e, 12)
	if len(names) != len(slices.Compact(slices.Sorted(slices.Values(names)))) {
		t.Fatalf("a name was written twice: %v", names)
	}
	want := reversed(names[len(names)-5:])
	if got := listedManual(t, e); !slices.Equal(got, want) {
		t.Fatalf("kept (newest first):\n%v\nwant the last 5 written:\n%v\non disk: %v", got, want, snapshotDirNames(t, dir))
	}
}

// A start without a config file restores the last snapshot written, of
// either kind, when the newest ones share their millisecond.
func TestARestoreTakesTheLastSnapshotWrittenInItsMillisecond(t *testing.T) {
	dir := t.TempDir()
	keep := config.Backup{IntervalSeconds: 3600, Keep: 100}
	e := newEnv(t, envOpts{snapshotDir: dir, backup: &keep})
	names := writeSnapshotsInOneMillisecond(t, e, 11)
	// One more user, in an automatic snapshot of the same millisecond:
	// the last one written.
	if r := e.do("POST", "/api/users", `{"name":"u-11"}`); r.status != 201 {
		t.Fatalf("create u-11: %d %s", r.status, r.body)
	}
	info, err := e.a.snapshot(kindAuto)
	if err != nil || info.Name == "" {
		t.Fatalf("automatic snapshot: %+v %v", info, err)
	}
	names = append(names, info.Name)
	e.srv.Close()
	e.a.Close()

	e2 := newEnv(t, envOpts{snapshotDir: dir, backup: &keep})
	if n := len(e2.store.Load().Users); n != 12 {
		t.Fatalf("restored %d users, want the 12 of the last snapshot written (%s); written in order: %v", n, info.Name, names)
	}
}

func snapshotDirNames(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}
