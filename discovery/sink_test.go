package discovery

import (
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/infera/infera/fleet"
)

// memSink is a Sink that records the current list.
type memSink struct {
	mu    sync.Mutex
	m     map[string]fleet.Record
	syncs int
	// upserts and removes count the calls per worker id.
	upserts, removes map[string]int
	// lists holds the ids the sink held after each call, sorted and
	// joined by commas, in call order.
	lists []string
}

func newMemSink() *memSink {
	return &memSink{m: map[string]fleet.Record{}, upserts: map[string]int{}, removes: map[string]int{}}
}

func (s *memSink) Sync(rs []fleet.Record) []error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.syncs++
	s.m = map[string]fleet.Record{}
	var errs []error
	for _, r := range rs {
		if err := r.Validate(); err != nil {
			errs = append(errs, err)
			continue
		}
		s.m[r.ID] = r
	}
	s.noteLocked()
	return errs
}

func (s *memSink) Upsert(r fleet.Record) error {
	if err := r.Validate(); err != nil {
		return err
	}
	s.mu.Lock()
	s.m[r.ID] = r
	s.upserts[r.ID]++
	s.noteLocked()
	s.mu.Unlock()
	return nil
}

func (s *memSink) Remove(id string) {
	s.mu.Lock()
	delete(s.m, id)
	s.removes[id]++
	s.noteLocked()
	s.mu.Unlock()
}

// noteLocked appends the ids held now to lists. s.mu must be held.
func (s *memSink) noteLocked() {
	ids := make([]string, 0, len(s.m))
	for id := range s.m {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	s.lists = append(s.lists, strings.Join(ids, ","))
}

// mark returns the number of calls so far, for listsSince.
func (s *memSink) mark() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.lists)
}

// listsSince returns the ids the sink held after each call since mark.
func (s *memSink) listsSince(mark int) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.lists[mark:])
}

func (s *memSink) get(id string) (fleet.Record, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.m[id]
	return r, ok
}

// calls returns how many times id was upserted and removed, and how many
// syncs (relists) the sink took.
func (s *memSink) calls(id string) (upserts, removes, syncs int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.upserts[id], s.removes[id], s.syncs
}

func (s *memSink) len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.m)
}

// waitFor polls cond for up to d.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func rec(id, url string) fleet.Record {
	return fleet.Record{ID: id, URL: url, Models: []string{"m"}, Role: "mixed", Status: fleet.StatusActive}
}
