//go:build !race

package breaker

import (
	"testing"
	"time"
)

// Every method the request path calls allocates nothing, the settings
// passed by value included.
func TestBreakerCallsDoNotAllocate(t *testing.T) {
	var b Breaker
	count := Settings{Threshold: 2, Cooldown: time.Second, MaxCooldown: 4 * time.Second}
	ratio := Settings{Threshold: 10, Ratio: 0.5, Cooldown: time.Second, MaxCooldown: time.Second}
	now := int64(0)
	n := testing.AllocsPerRun(1000, func() {
		now += int64(300 * time.Millisecond)
		for _, s := range [2]Settings{count, ratio} {
			b.Available(s, now)
			ok, trial, _ := b.Admit(s, now)
			if ok {
				b.Failure(s, now, trial)
			}
			ok, trial, _ = b.Admit(s, now)
			if ok {
				b.Success(s, now, trial)
			}
			_, trial, _ = b.Admit(s, now)
			b.Abandon(trial)
			b.OpenUntil(s)
			b.Cooldown(s)
		}
		_ = b.State().String()
		b.Trips()
	})
	if n != 0 {
		t.Fatalf("%v allocations per run", n)
	}
}
