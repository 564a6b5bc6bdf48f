package radix

import (
	"math/rand/v2"
	"testing"
)

// TestLocMapModel applies random inserts, overwrites and deletes to a
// locMap and to a Go map and compares every lookup, with tables small
// enough that they grow, split and double the directory many times.
func TestLocMapModel(t *testing.T) {
	f := func(name string, maxSlots int, keyOf func(rng *rand.Rand) uint64) {
		t.Helper()
		rng := rand.New(rand.NewPCG(3, uint64(maxSlots)))
		m := locMap{maxSlots: maxSlots}
		want := map[uint64]ref{}
		var keys []uint64
		for step := range 30000 {
			switch op := rng.IntN(10); {
			case op < 6 || len(keys) == 0: // insert or overwrite
				k := keyOf(rng)
				r := ref{node: rng.Uint32(), off: rng.Uint32()}
				p, found := m.insert(k)
				if _, ok := want[k]; ok != found {
					t.Fatalf("%s step %d: insert(%#x) found=%v, want %v", name, step, k, found, ok)
				}
				if !found {
					keys = append(keys, k)
				}
				*p = r
				want[k] = r
			case op < 9: // delete a present key
				i := rng.IntN(len(keys))
				k := keys[i]
				keys[i] = keys[len(keys)-1]
				keys = keys[:len(keys)-1]
				m.del(k)
				delete(want, k)
			default: // delete an absent key
				m.del(keyOf(rng) | 1<<63)
				for k := range want {
					if k&(1<<63) != 0 {
						m.del(k)
						delete(want, k)
					}
				}
				keys = keys[:0]
				for k := range want {
					keys = append(keys, k)
				}
			}
			if m.len() != len(want) {
				t.Fatalf("%s step %d: len = %d, want %d", name, step, m.len(), len(want))
			}
			if step%997 == 0 {
				for k, r := range want {
					if got, ok := m.get(k); !ok || got != r {
						t.Fatalf("%s step %d: get(%#x) = %v %v, want %v", name, step, k, got, ok, r)
					}
				}
			}
			k := keyOf(rng)
			got, ok := m.get(k)
			if r, wok := want[k]; ok != wok || got != r {
				t.Fatalf("%s step %d: get(%#x) = %v %v, want %v %v", name, step, k, got, ok, r, wok)
			}
		}
		used := 0
		for i, tb := range m.dir {
			if i > 0 && m.dir[i-1] == tb {
				continue
			}
			used += tb.used
			if tb.used*4 > len(tb.slots)*3 || len(tb.slots) > maxSlots {
				t.Fatalf("%s: table of %d slots holds %d", name, len(tb.slots), tb.used)
			}
		}
		if m.hasZero {
			used++
		}
		if used != len(want) {
			t.Fatalf("%s: tables hold %d keys, want %d", name, used, len(want))
		}
		if m.depth < 2 && maxSlots < 64 {
			t.Fatalf("%s: directory depth %d: the test never split a table", name, m.depth)
		}
	}
	random := func(rng *rand.Rand) uint64 { return rng.Uint64() }
	small := func(rng *rand.Rand) uint64 { return uint64(rng.IntN(3000)) } // includes 0, collides often
	strided := func(rng *rand.Rand) uint64 { return uint64(rng.IntN(3000)) << 40 }
	f("random keys, tiny tables", 16, random)
	f("small keys, tiny tables", 16, small)
	f("strided keys, tiny tables", 32, strided)
	f("small keys, default tables", maxTableSlots, small)
}

// The location map keeps mixHash(key) in its slots instead of the key: that
// is sound only because mixHash is a bijection that sends 0 (the empty
// mark) to 0. Each step of it is undone here (a right xorshift by 33 is its
// own inverse; an odd multiplier has an inverse modulo 2^64), so distinct
// keys never share a mixed hash.
func TestMixHashIsABijectionThatKeepsZero(t *testing.T) {
	inv := func(c uint64) uint64 { // Newton's iteration for c^-1 mod 2^64
		x := c
		for range 6 {
			x *= 2 - c*x
		}
		return x
	}
	m1, m2 := inv(0xff51afd7ed558ccd), inv(0xc4ceb9fe1a85ec53)
	unmix := func(k uint64) uint64 {
		k ^= k >> 33
		k *= m2
		k ^= k >> 33
		k *= m1
		k ^= k >> 33
		return k
	}
	if mixHash(0) != 0 {
		t.Fatalf("mixHash(0) = %#x, want 0", mixHash(0))
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 100000 {
		k := rng.Uint64()
		if k&1 == 0 {
			k >>= rng.IntN(64) // small keys too
		}
		if u := unmix(mixHash(k)); u != k {
			t.Fatalf("unmix(mixHash(%#x)) = %#x", k, u)
		}
	}
}
