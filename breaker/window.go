package breaker

import (
	"sync/atomic"
	"time"
)

// WindowSeconds is the span of the Ratio rule's rolling window.
const WindowSeconds = 10

// window counts outcomes over the last WindowSeconds in one-second
// buckets. Lock-free: a bucket is recycled by whoever first records in a
// new second, so a count racing with the recycling may be lost (the ratio
// is an estimate).
type window struct {
	buckets [WindowSeconds]bucket
}

type bucket struct {
	sec      atomic.Int64
	attempts atomic.Int64
	fails    atomic.Int64
}

// record counts one outcome at now (unix ns) and, for a failure, returns
// the outcomes and failures in the window ending at now's second (zeros
// for a success: only a failure can trip).
func (w *window) record(now int64, failed bool) (attempts, fails int64) {
	sec := now / int64(time.Second)
	bk := &w.buckets[uint64(sec)%WindowSeconds]
	if old := bk.sec.Load(); old != sec && bk.sec.CompareAndSwap(old, sec) {
		bk.attempts.Store(0)
		bk.fails.Store(0)
	}
	bk.attempts.Add(1)
	if !failed {
		return 0, 0
	}
	bk.fails.Add(1)
	for i := range w.buckets {
		bk := &w.buckets[i]
		if s := bk.sec.Load(); s > sec-WindowSeconds && s <= sec {
			attempts += bk.attempts.Load()
			fails += bk.fails.Load()
		}
	}
	return attempts, fails
}

func (w *window) reset() {
	for i := range w.buckets {
		w.buckets[i].sec.Store(0)
		w.buckets[i].attempts.Store(0)
		w.buckets[i].fails.Store(0)
	}
}
