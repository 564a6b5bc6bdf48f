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
// them (one allocation), the next ones nothing.
func TestAUsersFirstAdmissionAllocatesItsCountersOnce(t *testing.T) {
	k1, h1 := mintKey(t)
	k2, h2 := mintKey(t)
	c := parseConfig(t, fmt.Sprintf(`{"user_limit":{"timezone":"UTC","templates":[%s]},%s,
		"users":[{"name":"alice","keys":[%q],"template":"t"},{"name":"bob","keys":[%q],"template":"t"}]}`,
		allChecksTemplate, allChecksRateLimit, h1, h2))
	g := newGov(t, Options{}, c)
	admissionCycle(g, []byte(k1)) // the scope's counters and the calendar state
	bob := identify(t, g, k2)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	ok := admitCycle(g, bob)
	runtime.ReadMemStats(&after)
	if !ok {
		t.Fatal("refused")
	}
	if n := after.Mallocs - before.Mallocs; n != 1 {
		t.Errorf("%d allocations at a user's first admission: want 1 (its counters)", n)
	}
	if n := testing.AllocsPerRun(100, func() { admitCycle(g, bob) }); n != 0 {
		t.Fatalf("%v allocations per admission after the first", n)
	}
}
