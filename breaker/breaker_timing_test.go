package breaker

import (
	"testing"
	"time"
)

// The request path calls Available for each candidate, Admit for the
// chosen one and one outcome per attempt; all of them must be cheap and
// allocate nothing.

func BenchmarkAvailableClosed(b *testing.B) {
	var br Breaker
	s := Settings{Threshold: 3, Cooldown: 5 * time.Second, MaxCooldown: time.Minute}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if !br.Available(s, 1) {
				b.Fatal("closed breaker not available")
			}
		}
	})
}

func BenchmarkAvailableOpen(b *testing.B) {
	var br Breaker
	s := Settings{Threshold: 1, Cooldown: 5 * time.Second, MaxCooldown: time.Minute}
	br.Failure(s, 0, false)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if br.Available(s, 1) {
				b.Fatal("open breaker available")
			}
		}
	})
}

func BenchmarkAdmitSuccess(b *testing.B) {
	var br Breaker
	s := Settings{Threshold: 3, Cooldown: 5 * time.Second, MaxCooldown: time.Minute}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			ok, trial, _ := br.Admit(s, 1)
			if !ok {
				b.Fatal("refused")
			}
			br.Success(s, 1, trial)
		}
	})
}

// A failure every other request with threshold 3: the count moves and is
// reset, the breaker never opens.
func BenchmarkAdmitFailureSuccess(b *testing.B) {
	var br Breaker
	s := Settings{Threshold: 3, Cooldown: 5 * time.Second, MaxCooldown: time.Minute}
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		ok, trial, _ := br.Admit(s, 1)
		if !ok {
			b.Fatal("refused")
		}
		if i&1 == 0 {
			br.Failure(s, 1, trial)
		} else {
			br.Success(s, 1, trial)
		}
	}
}

// The Ratio rule records every outcome in the window.
func BenchmarkRatioOutcomes(b *testing.B) {
	var br Breaker
	s := Settings{Threshold: 10, Ratio: 0.5, Cooldown: 10 * time.Second, MaxCooldown: 10 * time.Second}
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		now := int64(i) * int64(time.Millisecond)
		br.Admit(s, now)
		if i%4 == 0 {
			br.Failure(s, now, false)
		} else {
			br.Success(s, now, false)
		}
	}
}

// A full cycle: trip, refused within the cooldown, trial, close.
func BenchmarkTripTrialClose(b *testing.B) {
	var br Breaker
	s := Settings{Threshold: 1, Cooldown: time.Second, MaxCooldown: time.Minute}
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		now := int64(i) * 2 * int64(time.Second)
		br.Failure(s, now, false)
		br.Admit(s, now)
		_, trial, _ := br.Admit(s, now+int64(time.Second))
		br.Success(s, now+int64(time.Second), trial)
	}
}
