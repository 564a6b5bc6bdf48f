package admin

import (
	"runtime/debug"
	"sync"
)

// importGCPercent is the collector's target (GOGC) while an import runs,
// when the process's own is higher. An import holds up to about 2.8 times
// its body live; at the default GOGC=100 the heap may grow to twice what
// the last collection found live, and a collection that ran while the body
// and the config decoded from it were both live let a router's heap grow
// by 4.6x the body (one import in a few dozen under load). At 25 the heap
// stays within a quarter above what is live; the extra collections cost
// milliseconds, for an import that takes about a second.
const importGCPercent = 25

// lowGCBodyBytes is the body size from which an import lowers the
// collector's target: below it the heap's growth is small in bytes
// whatever GOGC, and the process-wide change is not worth its collections.
// A body of unknown length (chunked) lowers it too.
const lowGCBodyBytes = 1 << 20

var lowGC struct {
	sync.Mutex
	n    int // imports running with the target lowered
	prev int // the process's target, restored when the last one ends
}

// lowerGC lowers the collector's target to importGCPercent (never raises
// it) until the returned func is called. Imports of several admins in one
// process nest: the process's own target comes back when the last ends.
func lowerGC() (restore func()) {
	lowGC.Lock()
	if lowGC.n == 0 {
		// GOGC=off (-1) is above any target: the import lowers it too.
		lowGC.prev = debug.SetGCPercent(importGCPercent)
		if lowGC.prev >= 0 && lowGC.prev < importGCPercent {
			debug.SetGCPercent(lowGC.prev)
		}
	}
	lowGC.n++
	lowGC.Unlock()
	return sync.OnceFunc(func() {
		lowGC.Lock()
		lowGC.n--
		if lowGC.n == 0 {
			debug.SetGCPercent(lowGC.prev)
		}
		lowGC.Unlock()
	})
}
