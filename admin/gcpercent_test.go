package admin

import (
	"runtime/debug"
	"sync"
	"testing"
)

func TestImportsLowerTheCollectorsTargetUntilTheLastEnds(t *testing.T) {
	for _, own := range []int{100, 400, -1, 10} {
		old := debug.SetGCPercent(own)
		want := min(own, importGCPercent)
		if own < 0 {
			want = importGCPercent
		}
		a := lowerGC()
		if got := debug.SetGCPercent(-1); got != want {
			t.Errorf("GOGC %d: %d during an import, want %d", own, got, want)
		}
		debug.SetGCPercent(want)
		var wg sync.WaitGroup
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r := lowerGC()
				r()
				r() // a second call changes nothing
			}()
		}
		wg.Wait()
		if got := debug.SetGCPercent(want); got != want {
			t.Errorf("GOGC %d: %d while the first import still runs, want %d", own, got, want)
		}
		b := lowerGC()
		a() // the first ends before the second
		if got := debug.SetGCPercent(want); got != want {
			t.Errorf("GOGC %d: %d while the second import still runs, want %d", own, got, want)
		}
		b()
		if got := debug.SetGCPercent(old); got != own {
			t.Errorf("GOGC %d: %d after the imports, want it back", own, got)
		}
	}
}
