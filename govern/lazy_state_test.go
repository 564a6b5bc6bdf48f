package govern

import (
	"context"
	"sync"
	"testing"
)

// A user's counters are made at its first request, which may come through
// a User identified before a reload: the request counts for the user as
// the current configuration has it, and a request identified after the
// reload sees it (the concurrency slot it holds, its quota), as when
// every user's counters were made by Apply.
func TestAFirstRequestIdentifiedBeforeAReloadCountsForTheUser(t *testing.T) {
	stores(t, func(t *testing.T, o Options) {
		key, hash := mintKey(t)
		clk := newFakeClock(t0)
		o.Now = clk.Now
		tmpl := `{"name":"t","concurrency":{"enabled":true,"limit":1},"quota":{"enabled":true,"windows":[{"period":"day","max_requests":2}]}}`
		c := userConfig(t, hash, tmpl, "")
		g := newGov(t, o, c)
		before := identify(t, g, key)
		if err := g.Apply(userConfig(t, hash, tmpl, "")); err != nil { // the same user, a new snapshot
			t.Fatal(err)
		}
		holder := admitOK(t, g, before, Request{}) // the user's first request
		holder.FirstToken()
		after := identify(t, g, key)
		if after == before {
			t.Fatal("the reload kept the User")
		}
		admitRejected(t, g, after, Request{}, CodeConcurrencyUser) // the slot is held
		holder.Done(Usage{})
		tk := admitOK(t, g, after, Request{}) // second of the day
		tk.FirstToken()
		tk.Done(Usage{})
		if err := g.Apply(userConfig(t, hash, tmpl, "")); err != nil {
			t.Fatal(err)
		}
		admitRejected(t, g, identify(t, g, key), Request{}, CodeQuotaRequestsDay)
	})
}

// A request of a user a reload removed after it was identified (the proxy
// identifies it again, but one may pass between the two) counts, as it
// did when the user's counters were made by Apply: the user added back
// keeps what it used.
func TestAFirstRequestOfARemovedUserCountsWhenTheUserIsBack(t *testing.T) {
	stores(t, func(t *testing.T, o Options) {
		key, hash := mintKey(t)
		clk := newFakeClock(t0)
		o.Now = clk.Now
		tmpl := `{"name":"t","quota":{"enabled":true,"windows":[{"period":"day","max_requests":1}]}}`
		c := userConfig(t, hash, tmpl, "")
		g := newGov(t, o, c)
		u := identify(t, g, key)
		if err := g.Apply(parseConfig(t, `{"users":[{"name":"bob","keys":[]}]}`)); err != nil {
			t.Fatal(err)
		}
		tk := admitOK(t, g, u, Request{}) // the day's only one
		tk.FirstToken()
		tk.Done(Usage{})
		if err := g.Apply(c); err != nil {
			t.Fatal(err)
		}
		admitRejected(t, g, identify(t, g, key), Request{}, CodeQuotaRequestsDay)
	})
}

// First requests of one user sent at once through the Users of several
// snapshots (reloads running meanwhile) share one set of counters: with a
// concurrency limit of 1, one is admitted.
func TestConcurrentFirstRequestsAcrossReloadsShareTheUsersCounters(t *testing.T) {
	key, hash := mintKey(t)
	tmpl := `{"name":"t","concurrency":{"enabled":true,"limit":1}}`
	for round := range 20 {
		g := newGov(t, Options{}, userConfig(t, hash, tmpl, ""))
		var users []*User
		for range 4 {
			users = append(users, identify(t, g, key))
			if err := g.Apply(userConfig(t, hash, tmpl, "")); err != nil {
				t.Fatal(err)
			}
		}
		var wg sync.WaitGroup
		var mu sync.Mutex
		var admitted []Ticket
		start := make(chan struct{})
		for i := range 16 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				u := users[i%len(users)]
				if i == 15 {
					u = identify(t, g, key)
				}
				tk, rej := g.Admit(context.Background(), u, Request{})
				if rej == nil {
					mu.Lock()
					admitted = append(admitted, tk)
					mu.Unlock()
				}
			}()
		}
		wg.Add(1)
		go func() { // a reload while they are admitted
			defer wg.Done()
			<-start
			if err := g.Apply(userConfig(t, hash, tmpl, "")); err != nil {
				t.Error(err)
			}
		}()
		close(start)
		wg.Wait()
		if len(admitted) != 1 {
			t.Fatalf("round %d: %d of 16 first requests admitted under a concurrency limit of 1", round, len(admitted))
		}
		admitted[0].Done(Usage{})
		admitOK(t, g, identify(t, g, key), Request{}).Done(Usage{})
	}
}
