package bench

import (
	"os"
	"testing"
	"time"
)

// procCPU reads this process's own CPU time, and it grows with work.
func TestProcCPUGrowsWithWork(t *testing.T) {
	a, err := procCPU(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	x := 0
	for end := time.Now().Add(100 * time.Millisecond); time.Now().Before(end); {
		for i := 0; i < 1000; i++ {
			x += i
		}
	}
	b, err := procCPU(os.Getpid())
	if err != nil || b <= a || x == 0 {
		t.Fatalf("cpu %d -> %d (%v)", a, b, err)
	}
	if _, err := procCPU(-1); err == nil {
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
