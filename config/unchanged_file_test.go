package config

import (
	"os"
	"path/filepath"
	"runtime"
	"testing"
)

// TestTellingTheFileUnchangedDoesNotReadItWhole opens a config file of
// 20,000 users and tells it unchanged, as every admin write does two or
// three times (a reload, and Apply's look for a hand edit): the file is
// hashed as it is read, not read whole first (an import over a config
// file of 50,000 users read 15 MB three times, with the import's config
// live).
func TestTellingTheFileUnchangedDoesNotReadItWhole(t *testing.T) {
	path := filepath.Join(t.TempDir(), "infera.json")
	c, err := Parse(usersDoc(20000))
	if err != nil {
		t.Fatal(err)
	}
	data, err := MarshalFile(c)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	measure := func(what string, f func() error) {
		t.Helper()
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		err := f()
		runtime.ReadMemStats(&after)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		total := after.TotalAlloc - before.TotalAlloc
		t.Logf("%s of a file of %d bytes: allocated %d", what, len(data), total)
		if total > uint64(len(data))/16 && !raceEnabled {
			t.Errorf("%s allocated %d bytes: want at most %d (a sixteenth of the file)", what, total, len(data)/16)
		}
	}
	v := s.Version()
	measure("a reload", func() error {
		_, err := s.Reload()
		return err
	})
	measure("a look for a hand edit", func() error {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.pickUpHandEditLocked()
	})
	if s.Version() != v {
		t.Fatalf("version %d, was %d: the unchanged file was taken for a change", s.Version(), v)
	}
	// A change is still found.
	if err := os.WriteFile(path, []byte(`{"session_affinity":{"enabled":true}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if changed, err := s.Reload(); err != nil || !changed || !s.Load().SessionAffinity.Enabled {
		t.Fatalf("an edit: changed %v, %v", changed, err)
	}
}
