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

// TestAnEncodingAllocatesNothingPerListMember encodes a config of 2,000
// users and one of 4,000: the list is encoded member by member, from the
// member where it lies (appendPlain), so the allocations do not grow with
// the members. Each member was copied to the heap to be handed to
// encoding/json (reflect.Value.Interface of an addressable struct):
// one allocation of a User per user and per encoding.
func TestAnEncodingAllocatesNothingPerListMember(t *testing.T) {
	if raceEnabled {
		t.Skip("counts allocations, which the race detector changes")
	}
	allocs := func(users int) float64 {
		c, err := Parse(usersDoc(users))
		if err != nil {
			t.Fatal(err)
		}
		EncodeJSON(c, nil) // the size hint
		return testing.AllocsPerRun(5, func() {
			if _, err := EncodeJSON(c, nil); err != nil {
				t.Fatal(err)
			}
		})
	}
	few, many := allocs(2000), allocs(4000)
	t.Logf("allocations per encoding: %.0f for 2,000 users, %.0f for 4,000", few, many)
	if many-few > 20 {
		t.Errorf("2,000 more users cost %.0f more allocations per encoding: want none per user", many-few)
	}
}

// TestTheFirstEncodingOfALargeConfigReservesAboutItsSize encodes a config
// of 20,000 users as the first encoding of a large config in the process
// (a router started on an empty config that takes an import of many users
// has encoded none): it reserves about its own size from the users, where
// it started from 512 bytes and grew step by step (append grows a large
// slice by a quarter, so it allocated about five times what it wrote: 52
// MB for the config file of an import of 50,000 users, 8.5 MB, measured
// in a router process).
func TestTheFirstEncodingOfALargeConfigReservesAboutItsSize(t *testing.T) {
	if raceEnabled {
		t.Skip("measures allocations, which the race detector changes")
	}
	large, err := Parse(usersDoc(20000))
	if err != nil {
		t.Fatal(err)
	}
	defer encodeSizeHint.Store(encodeSizeHint.Load())
	for _, models := range []bool{false, true} {
		if models {
			// Users with models and without keys encode otherwise.
			for i := range large.Users {
				if i%2 == 0 {
					large.Users[i].Models = []string{"qwen3-*", "llama-3.1-8b"}
					large.Users[i].Keys = nil
				}
			}
		}
		encodeSizeHint.Store(nil)
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		b, err := EncodeJSON(large, nil)
		runtime.ReadMemStats(&after)
		if err != nil {
			t.Fatal(err)
		}
		total := after.TotalAlloc - before.TotalAlloc
		t.Logf("models %v: %d bytes, %d allocated (%.2fx), buffer %d", models, len(b), total, float64(total)/float64(len(b)), cap(b))
		// Measured: 1.14x (the buffer, an eighth over the estimate, and
		// encoding/json's own), as an encoding after a large one (1.13x,
		// TestAnEncodingReservesAboutWhatItWrites); 4.9x to 5.8x before.
		if total > uint64(len(b))*3/2 {
			t.Errorf("the first encoding of %d bytes allocated %d (%.2fx): want at most 1.5x", len(b), total, float64(total)/float64(len(b)))
		}
		if cap(b) > len(b)*3/2 {
			t.Errorf("%d bytes encoded into a buffer of %d", len(b), cap(b))
		}
	}
}
