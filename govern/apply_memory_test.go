//go:build !race

package govern

import (
	"fmt"
	"runtime"
	"strings"
	"testing"
)

// TestApplyingManyUsersAllocatesLittleBesideWhatItKeeps applies a config
// of 20,000 users (each with a key and a template, as an admin import
// brings them) to a fresh governor, in one goroutine, and compares the
// bytes Apply allocates with the bytes it keeps (the compiled snapshot and
// the users' counters, live after a collection): the key and user maps
// are made at their size. Grown entry by entry, they left their smaller
// tables behind: 13.4 MB allocated for 10.0 MB kept (1.34x), 11.7 MB now
// (1.16x).
func TestApplyingManyUsersAllocatesLittleBesideWhatItKeeps(t *testing.T) {
	if testing.Short() {
		t.Skip("builds 20,000 users")
	}
	var sb strings.Builder
	sb.WriteString(`{"user_limit":{"templates":[{"name":"standard","rate":{"enabled":true,"rpm":60}}]},"users":[`)
	for i := range 20000 {
		if i > 0 {
			sb.WriteByte(',')
		}
		_, h := mintKey(t)
		fmt.Fprintf(&sb, `{"name":"user-%05d@example.com","template":"standard","keys":[%q]}`, i, h)
	}
	sb.WriteString("]}")
	c := parseConfig(t, sb.String())
	g := newGov(t, Options{}, nil)
	runtime.GC()
	var before, applied, kept runtime.MemStats
	runtime.ReadMemStats(&before)
	if err := g.Apply(c); err != nil {
		t.Fatal(err)
	}
	runtime.ReadMemStats(&applied)
	runtime.GC()
	runtime.ReadMemStats(&kept)
	runtime.KeepAlive(c)
	total := applied.TotalAlloc - before.TotalAlloc
	live := kept.HeapAlloc - before.HeapAlloc
	t.Logf("20,000 users: Apply allocated %d bytes and kept %d (%.2fx)", total, live, float64(total)/float64(live))
	if len(g.snap.Load().users) != 20000 {
		t.Fatalf("%d users applied", len(g.snap.Load().users))
	}
	if total > live*5/4 {
		t.Errorf("Apply allocated %.2fx what it kept: want at most 1.25x", float64(total)/float64(live))
	}
}

// The users a config brings cost the governance their User and key record
// until they send a request: their counters (about 200 bytes each, half
// of what Apply kept for a user) are made at their first request.
// Measured: 263 bytes kept a user (a User, a key record and their map
// entries); 502 while Apply made every user's counters.
func TestAppliedUsersWithoutRequestsKeepNoCounters(t *testing.T) {
	if testing.Short() {
		t.Skip("builds 20,000 users")
	}
	const n = 20000
	var sb strings.Builder
	keys := make([]string, 2)
	sb.WriteString(`{"user_limit":{"templates":[{"name":"standard","rate":{"enabled":true,"rpm":60}}]},"users":[`)
	for i := range n {
		if i > 0 {
			sb.WriteByte(',')
		}
		k, h := mintKey(t)
		if i < len(keys) {
			keys[i] = k
		}
		fmt.Fprintf(&sb, `{"name":"user-%05d@example.com","template":"standard","keys":[%q]}`, i, h)
	}
	sb.WriteString("]}")
	c := parseConfig(t, sb.String())
	g := newGov(t, Options{}, nil)
	runtime.GC()
	var before, kept runtime.MemStats
	runtime.ReadMemStats(&before)
	if err := g.Apply(c); err != nil {
		t.Fatal(err)
	}
	runtime.GC()
	runtime.ReadMemStats(&kept)
	runtime.KeepAlive(c)
	live := kept.HeapAlloc - before.HeapAlloc
	t.Logf("%d users: Apply kept %d bytes, %d a user", n, live, live/n)
	if live > 320*n {
		t.Errorf("Apply kept %d bytes a user: want at most 320 (no counters before a request)", live/n)
	}
	if len(g.states) != 0 {
		t.Fatalf("%d users have counters before any request", len(g.states))
	}
	// A request makes its user's counters, which later requests and
	// reloads keep.
	u := identify(t, g, keys[0])
	admitOK(t, g, u, Request{}).Done(Usage{})
	if err := g.Apply(c); err != nil {
		t.Fatal(err)
	}
	if len(g.states) != 1 || identify(t, g, keys[0]).st.Load() != u.st.Load() || identify(t, g, keys[1]).st.Load() != nil {
		t.Fatalf("%d users with counters after one request and a reload", len(g.states))
	}
}
