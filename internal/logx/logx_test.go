package logx

import (
	"testing"
	"time"
)

func TestThrottle(t *testing.T) {
	th := &Throttle{Every: time.Hour}
	if ok, _ := th.Allow(); !ok {
		t.Fatal("first line suppressed")
	}
	for i := 0; i < 5; i++ {
		if ok, _ := th.Allow(); ok {
			t.Fatal("line within the interval allowed")
		}
	}
	th.last.Store(0) // the interval has passed
	if ok, n := th.Allow(); !ok || n != 5 {
		t.Fatalf("after the interval: ok=%v suppressed=%d, want true 5", ok, n)
	}
}
