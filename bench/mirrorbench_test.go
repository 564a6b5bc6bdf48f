package bench

import (
	"os"
	"testing"
	"time"
)

// procTimes reads this process's own CPU time, and it grows with work.
func TestProcTimesGrowWithWork(t *testing.T) {
	au, as, err := procTimes(os.Getpid())
	a := au + as
	if err != nil {
		t.Fatal(err)
	}
	x := 0
	for end := time.Now().Add(100 * time.Millisecond); time.Now().Before(end); {
		for i := 0; i < 1000; i++ {
			x += i
		}
	}
	bu, bs, err := procTimes(os.Getpid())
	b := bu + bs
	if err != nil || b <= a || x == 0 {
		t.Fatalf("cpu %d -> %d (%v)", a, b, err)
	}
	if _, _, err := procTimes(-1); err == nil {
		t.Fatal("no error for a missing process")
	}
}

func TestMirrorBodySize(t *testing.T) {
	for _, n := range []int{100, 1024, 32 << 10} {
		if b := mirrorBody(n); len(b) != n {
			t.Fatalf("body %d bytes, want %d", len(b), n)
		}
	}
}
