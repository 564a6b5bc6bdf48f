package admin

import (
	"runtime"
	"testing"

	"github.com/infera/infera/config"
)

// TestAnAuditDiffOfManyUsersAllocatesLittleBesideTheEncodings diffs the
// configs of an import of 20,000 users, into an empty config and over
// 20,000 others (every user's key changed), and bounds what the diff
// allocates beside the two encodings it compares (TotalAlloc), by the size
// of the new one. Measured: 0.73x and 1.19x (the members' slices and
// names, and the 200 members flattened). A map of every name on each side
// (to tell that the names are unique, to find a member by name, to tell
// whether the members moved) and the members' list grown step by step made
// it 2.0x and 4.0x.
func TestAnAuditDiffOfManyUsersAllocatesLittleBesideTheEncodings(t *testing.T) {
	if testing.Short() {
		t.Skip("builds 20,000 users")
	}
	if raceEnabled {
		t.Skip("measures memory, which the race detector changes")
	}
	s := newSealer("", testKey)
	parse := func(doc string) *config.Config {
		c, err := config.Parse([]byte(doc))
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	cur := parse(usersWithKeys(t, 20000))
	other := parse(usersWithKeys(t, 20000))
	f := func(name string, old *config.Config) {
		t.Helper()
		diffUpTo(s, old, cur, maxAuditChanges) // sizes the encodings
		var m0, m1, m2 runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&m0)
		for _, c := range []*config.Config{old, cur} {
			if _, err := s.encodeRedacted(c); err != nil {
				t.Fatal(err)
			}
		}
		runtime.ReadMemStats(&m1)
		changes, more := diffUpTo(s, old, cur, maxAuditChanges)
		runtime.ReadMemStats(&m2)
		data, err := s.encodeRedacted(cur)
		if err != nil {
			t.Fatal(err)
		}
		enc, n := m1.TotalAlloc-m0.TotalAlloc, uint64(len(data))
		if len(changes) != maxAuditChanges || more == 0 {
			t.Fatalf("%s: %d changes, %d more", name, len(changes), more)
		}
		rest := m2.TotalAlloc - m1.TotalAlloc - enc
		t.Logf("%s: %d allocated beside the encodings (%d): %.2fx the new encoding (%d bytes)", name, rest, enc, float64(rest)/float64(n), n)
		if rest > 16*n/10 && !raceEnabled {
			t.Errorf("%s: the diff allocated %.2fx the new encoding beside the encodings: want at most 1.6x", name, float64(rest)/float64(n))
		}
	}
	f("into an empty config", config.Default())
	f("over 20,000 users", other)
}
