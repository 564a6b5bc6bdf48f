package radix

import (
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"
)

// chain returns n chained hashes for tokens seq (a stand-in for kv.HashBlocks).
func chain(seq ...uint64) []uint64 {
	out := make([]uint64, len(seq))
	h := uint64(0x9e3779b97f4a7c15)
	for i, t := range seq {
		h = mix(h ^ (t+1)*0xbf58476d1ce4e5b9)
		out[i] = h
	}
	return out
}

func mix(z uint64) uint64 {
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

func TestMatch(t *testing.T) {
	a := chain(1, 2, 3, 4, 5, 6)
	b := chain(1, 2, 3, 9, 9) // shares 3 blocks with a
	c := chain(7, 7)

	type op func(x *Index)
	store := func(w, r int, hs []uint64, from int) op {
		return func(x *Index) {
			t.Helper()
			var p uint64
			if from > 0 {
				p = hs[from-1]
			}
			if err := x.Store(w, r, hs[0], p, from > 0, hs[from:]); err != nil {
				t.Fatalf("Store: %s", err)
			}
		}
	}
	remove := func(w, r int, hs ...uint64) op {
		return func(x *Index) { x.Remove(w, r, a[0], hs) }
	}
	f := func(name string, ops []op, q []uint64, want []Overlap) {
		t.Helper()
		x := New()
		for _, o := range ops {
			o(x)
		}
		got := sorted(x.Match(nil, q))
		if !slices.Equal(got, want) {
			t.Fatalf("%s: Match = %v, want %v", name, got, want)
		}
	}
	f("empty", nil, a, nil)
	f("full", []op{store(0, 0, a, 0)}, a, []Overlap{{0, 6}})
	f("prefix of query", []op{store(0, 0, a[:3], 0)}, a, []Overlap{{0, 3}})
	f("query shorter", []op{store(0, 0, a, 0)}, a[:2], []Overlap{{0, 2}})
	f("two workers diverge", []op{store(1, 0, a, 0), store(0, 0, b, 0)}, a, []Overlap{{0, 3}, {1, 6}})
	f("other chain", []op{store(0, 0, c, 0)}, a, nil)
	f("stored in two events", []op{store(2, 0, a[:2], 0), store(2, 0, a, 2)}, a, []Overlap{{2, 6}})
	f("dp ranks", []op{store(3, 1, a[:4], 0), store(3, 0, a[:1], 0)}, a, []Overlap{{3, 4}})
	f("dp rank removed, other rank holds", []op{store(3, 1, a[:4], 0), store(3, 0, a[:4], 0), remove(3, 0, a[1])}, a, []Overlap{{3, 4}})
	f("dp rank removed, no other rank", []op{store(3, 1, a[:1], 0), store(3, 0, a[:4], 0), remove(3, 0, a[1])}, a, []Overlap{{3, 1}})
	f("tail removed", []op{store(0, 0, a, 0), remove(0, 0, a[4:]...)}, a, []Overlap{{0, 4}})
	f("middle removed", []op{store(0, 0, a, 0), remove(0, 0, a[2])}, a, []Overlap{{0, 2}})
	f("first removed", []op{store(0, 0, a, 0), store(1, 0, a, 0), remove(0, 0, a[0])}, a, []Overlap{{1, 6}})
	f("clear", []op{store(0, 0, a, 0), store(1, 0, a[:2], 0), func(x *Index) { x.Clear(0, 0) }}, a, []Overlap{{1, 2}})
	f("remove worker", []op{store(0, 1, a, 0), store(0, 0, a, 0), store(1, 0, a[:1], 0), func(x *Index) { x.RemoveWorker(0) }}, a, []Overlap{{1, 1}})
	f("removed then restored", []op{store(0, 0, a, 0), remove(0, 0, a[1:]...), store(0, 0, a, 1)}, a, []Overlap{{0, 6}})

	x := New()
	if err := x.Store(0, 0, a[0], 12345, true, a[1:]); err != ErrUnknownParent {
		t.Fatalf("Store with unknown parent: err = %v, want ErrUnknownParent", err)
	}
	if err := x.Store(MaxWorkers, 0, 0, 0, false, a); err == nil {
		t.Fatalf("Store with worker out of range: want error")
	}
}

func sorted(o []Overlap) []Overlap {
	slices.SortFunc(o, func(a, b Overlap) int { return a.Worker - b.Worker })
	return o
}

// model is the obviously-correct reference: each member's set of hashes.
type model map[uint32]map[uint64]bool

func (m model) match(q []uint64) []Overlap {
	holds := func(w int, h uint64) bool { // any rank of w
		for v, set := range m {
			if int(v>>16) == w && set[h] {
				return true
			}
		}
		return false
	}
	var out []Overlap
	for w := range 8 {
		k := 0
		for k < len(q) && holds(w, q[k]) {
			k++
		}
		if k > 0 {
			out = append(out, Overlap{Worker: w, Blocks: k})
		}
	}
	return out
}

// TestModel applies random stores and removals to the index and to a naive
// model and compares every Match and the entry counts.
func TestModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	// Paths through a small token alphabet so chains share prefixes.
	var paths [][]uint64
	for range 40 {
		n := 1 + rng.IntN(24)
		seq := make([]uint64, n)
		for i := range seq {
			seq[i] = uint64(rng.IntN(3))
		}
		paths = append(paths, chain(seq...))
	}
	x := New()
	m := model{}
	nonEmpty := 0
	steps := 20000
	if testing.Short() {
		steps = 4000
	}
	for step := range steps {
		w, r := rng.IntN(5), rng.IntN(2)
		v := member(w, r)
		set := m[v]
		if set == nil {
			set = map[uint64]bool{}
			m[v] = set
		}
		p := paths[rng.IntN(len(paths))]
		switch op := rng.IntN(10); {
		case op < 5: // store p[a:b], the engine holds p[a-1]
			a := 0
			for a < len(p) && set[p[a]] && rng.IntN(4) != 0 {
				a++
			}
			if a > 0 && !set[p[a-1]] {
				a = 0
			}
			if a >= len(p) {
				continue
			}
			b := a + 1 + rng.IntN(len(p)-a)
			if b > len(p) {
				b = len(p)
			}
			if a >= b {
				continue
			}
			var par uint64
			if a > 0 {
				par = p[a-1]
			}
			if err := x.Store(w, r, p[0], par, a > 0, p[a:b]); err != nil {
				t.Fatalf("step %d: Store: %s", step, err)
			}
			for _, h := range p[a:b] {
				set[h] = true
			}
		case op < 9: // remove a random subset of p
			var rm []uint64
			for _, h := range p {
				if rng.IntN(3) == 0 {
					rm = append(rm, h)
				}
			}
			x.Remove(w, r, p[0], rm)
			for _, h := range rm {
				delete(set, h)
			}
		default:
			if rng.IntN(3) == 0 {
				x.RemoveWorker(w)
				for v2 := range m {
					if int(v2>>16) == w {
						delete(m, v2)
					}
				}
			} else {
				x.Clear(w, r)
				delete(m, v)
			}
		}
		q := paths[rng.IntN(len(paths))]
		got, want := sorted(x.Match(nil, q)), m.match(q)
		if !slices.Equal(got, want) {
			t.Fatalf("step %d: Match = %v, want %v", step, got, want)
		}
		if len(want) > 0 {
			nonEmpty++
		}
	}
	if nonEmpty < steps/4 {
		t.Fatalf("only %d of %d matches were non-empty: the model test is too weak", nonEmpty, steps)
	}
	t.Logf("%d of %d matches non-empty; %+v", nonEmpty, steps, x.Stats())
	var entries int64
	perWorker := map[int]int64{}
	for v, set := range m {
		entries += int64(len(set))
		perWorker[int(v>>16)] += int64(len(set))
	}
	if st := x.Stats(); st.Entries != entries {
		t.Fatalf("Stats.Entries = %d, want %d", st.Entries, entries)
	}
	for w := range 5 {
		if got := x.WorkerBlocks(w); got != perWorker[w] {
			t.Fatalf("WorkerBlocks(%d) = %d, want %d", w, got, perWorker[w])
		}
	}
	for w := range 5 {
		x.RemoveWorker(w)
	}
	if st := x.Stats(); st.Blocks != 0 || st.Nodes != 0 || st.Entries != 0 {
		t.Fatalf("after removing every worker: %+v, want empty", st)
	}
}

// TestConcurrent runs stores, removals, matches and worker removals from
// several goroutines (meaningful under -race).
func TestConcurrent(t *testing.T) {
	x := New()
	var paths [][]uint64
	for i := range 64 {
		seq := make([]uint64, 32)
		for j := range seq {
			seq[j] = uint64(i % 8)
			if j > 8 {
				seq[j] = uint64(i)
			}
		}
		paths = append(paths, chain(seq...))
	}
	deadline := time.Now().Add(500 * time.Millisecond)
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() { // one writer per worker, as the kv manager does
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			for i := 0; i < 20000 && time.Now().Before(deadline); i++ {
				p := paths[rng.IntN(len(paths))]
				switch rng.IntN(4) {
				case 0, 1:
					_ = x.Store(w, 0, p[0], 0, false, p)
				case 2:
					x.Remove(w, 0, p[0], p[rng.IntN(len(p)):])
				default:
					if rng.IntN(50) == 0 {
						x.RemoveWorker(w)
					}
				}
			}
		}()
	}
	for g := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 9))
			var dst []Overlap
			for i := 0; i < 50000 && time.Now().Before(deadline); i++ {
				p := paths[rng.IntN(len(paths))]
				dst = x.Match(dst[:0], p)
				for _, o := range dst {
					if o.Blocks < 1 || o.Blocks > len(p) || o.Worker >= 4 {
						t.Errorf("bad overlap %+v", o)
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	for w := range 4 {
		x.RemoveWorker(w)
	}
	if st := x.Stats(); st.Nodes != 0 || st.Entries != 0 {
		t.Fatalf("after removing every worker: %+v, want empty", st)
	}
}
