package config

import (
	"runtime"
	"testing"
)

// TestAnEncodingReservesAboutWhatItWrites encodes a config of 20,000 users
// and an empty one, one after the other: each encoding's buffer is about
// its own size, and the large one is not grown step by step. The buffer
// was sized like the previous encoding, whatever the config: the empty
// config's 2 KB were held in 3.9 MB after the large one, and the large one
// after the empty one, reallocated at each step of its growth, allocated
// 5.5 times its size (an import's audit entry encodes the old config,
// then the new one).
func TestAnEncodingReservesAboutWhatItWrites(t *testing.T) {
	large, err := Parse(usersDoc(20000))
	if err != nil {
		t.Fatal(err)
	}
	encode := func(c *Config) ([]byte, uint64) {
		t.Helper()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		b, err := EncodeJSON(c, nil)
		runtime.ReadMemStats(&after)
		if err != nil {
			t.Fatal(err)
		}
		return b, after.TotalAlloc - before.TotalAlloc
	}
	encode(large)
	for range 2 {
		b, _ := encode(Default())
		if cap(b) > 64<<10 {
			t.Errorf("the empty config's %d bytes are held in a buffer of %d", len(b), cap(b))
		}
		b, total := encode(large)
		t.Logf("%d users: %d bytes, %d allocated (%.2fx)", len(large.Users), len(b), total, float64(total)/float64(len(b)))
		// Measured: 1.7x (the buffer, an eighth more than the last
		// encoding's size, and encoding/json's own).
		if total > 2*uint64(len(b)) && !raceEnabled {
			t.Errorf("encoding %d bytes allocated %d (%.2fx)", len(b), total, float64(total)/float64(len(b)))
		}
	}
}
