//go:build !race

package govern

import "testing"

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
