//go:build !race

package kvroute

import (
	"testing"

	"github.com/infera/infera/sched"
)

func TestKVAwarePickAllocs(t *testing.T) {
	fx := newKVFixture(t, 8)
	for i := range 8 {
		fx.cache(t, i, 0, i%5)
	}
	k := NewKVAware(KVAwareConfig{Index: fx.x})
	r := &sched.Request{BlockHashes: fx.hashes}
	k.PickKV(fx.ws, r)
	if n := testing.AllocsPerRun(200, func() { k.PickKV(fx.ws, r) }); n != 0 {
		t.Fatalf("PickKV allocates %.1f times per call, want 0", n)
	}
}
