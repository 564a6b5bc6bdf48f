//go:build !race

package govern

import (
	"fmt"
	"runtime"
	"testing"
)

func TestAdmissionPassingEveryCheckAllocatesNothing(t *testing.T) {
	key, hash := mintKey(t)
	g := newGov(t, Options{}, userConfig(t, hash, allChecksTemplate, allChecksRateLimit))
	k := []byte(key)
	admissionCycle(g, k) // first use creates the scope's counters and the calendar state
	if n := testing.AllocsPerRun(1000, func() {
		if !admissionCycle(g, k) {
			t.Fatal("refused")
		}
	}); n != 0 {
		t.Fatalf("%v allocations per admission", n)
	}
}

func TestModelCheckAllocatesNothing(t *testing.T) {
	m := compileModels([]string{"Qwen/Qwen3-8B", "llama-*-instruct"})
	if n := testing.AllocsPerRun(100, func() {
		if !m.allows("Llama-3-70B-Instruct") {
			t.Fatal("refused")
		}
	}); n != 0 {
		t.Fatalf("%v allocations per check", n)
	}
}

// A user's counters are made at its first admission: that one allocates
// them (one allocation), the next ones nothing. The count is read from the
// process's malloc total, which other goroutines add to (a Redis client of
// an earlier test redialing, say: CI counted 7 once), so the first
// admissions of several users are measured and the fewest must be 1.
func TestAUsersFirstAdmissionAllocatesItsCountersOnce(t *testing.T) {
	const n = 5
	k1, h1 := mintKey(t)
	keys, users := make([]string, n), ""
	for i := range keys {
		k, h := mintKey(t)
		keys[i] = k
		users += fmt.Sprintf(`,{"name":"u%d","keys":[%q],"template":"t"}`, i, h)
	}
	c := parseConfig(t, fmt.Sprintf(`{"user_limit":{"timezone":"UTC","templates":[%s]},%s,
		"users":[{"name":"alice","keys":[%q],"template":"t"}%s]}`,
		allChecksTemplate, allChecksRateLimit, h1, users))
	g := newGov(t, Options{}, c)
	admissionCycle(g, []byte(k1)) // the scope's counters and the calendar state
	fewest := uint64(1 << 62)
	for _, k := range keys {
		u := identify(t, g, k)
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		ok := admitCycle(g, u)
		runtime.ReadMemStats(&after)
		if !ok {
			t.Fatal("refused")
		}
		fewest = min(fewest, after.Mallocs-before.Mallocs)
		if n := testing.AllocsPerRun(100, func() { admitCycle(g, u) }); n != 0 {
			t.Fatalf("%v allocations per admission after the first", n)
		}
	}
	if fewest != 1 {
		t.Errorf("%d allocations at a user's first admission (the fewest of %d users): want 1 (its counters)", fewest, n)
	}
}
