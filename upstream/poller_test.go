package upstream

import (
	"bytes"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/infera/infera/config"
)

// fakeMember is a real HTTP server on loopback serving CapacityPath like a
// gateway: bearer authentication, a settable report, failure and hang
// switches.
type fakeMember struct {
	url   string
	keyV  atomic.Pointer[string]
	cap   atomic.Pointer[Capacity]
	fail  atomic.Bool
	hang  atomic.Bool
	polls atomic.Int64
	mu    sync.Mutex
	auths []string
	srv   *http.Server
	stop  chan struct{}
}

func startMember(t *testing.T, key string, c Capacity) *fakeMember {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	m := &fakeMember{url: "http://" + ln.Addr().String(), stop: make(chan struct{})}
	m.keyV.Store(&key)
	m.cap.Store(&c)
	m.srv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		m.polls.Add(1)
		m.mu.Lock()
		m.auths = append(m.auths, r.Header.Get("Authorization"))
		m.mu.Unlock()
		if r.URL.Path != CapacityPath || r.Method != http.MethodGet {
			http.NotFound(w, r)
			return
		}
		if r.Header.Get("Authorization") != "Bearer "+m.key() {
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		if m.hang.Load() {
			select {
			case <-r.Context().Done():
			case <-m.stop:
			}
			return
		}
		if m.fail.Load() {
			http.Error(w, "boom", http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Write(m.cap.Load().AppendJSON(nil))
	})}
	go m.srv.Serve(ln)
	t.Cleanup(func() {
		close(m.stop)
		m.srv.Close()
	})
	return m
}

func (m *fakeMember) member(name string) config.Member {
	return config.Member{Name: name, URL: m.url, APIKey: config.NewSecret(m.key())}
}

func (m *fakeMember) key() string { return *m.keyV.Load() }

func gsConfig(members ...config.Member) *config.GlobalScheduling {
	return &config.GlobalScheduling{Enabled: true, Members: members, PollIntervalMS: 20, PollTimeoutMS: 500, StaleAfterMS: 5000, MinFree: 1}
}

func capFor(free int, models ...string) Capacity {
	c := Capacity{Free: free, Workers: 1}
	for _, m := range models {
		c.Models = append(c.Models, ModelCapacity{Name: m, Free: free})
	}
	return c
}

// eventually polls cond for up to 5 s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for i := 0; i < 500; i++ {
		if cond() {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("timed out waiting for %s", what)
}

func pickName(p *Poller, model string) string {
	if m := p.Pick([]byte(model)); m != nil {
		return m.Name()
	}
	return ""
}

func TestPollerPicksMemberWithMostFreeCapacityForTheModel(t *testing.T) {
	a := startMember(t, "ka", capFor(2, "m"))
	b := startMember(t, "kb", capFor(5, "m", "x*"))
	c := startMember(t, "kc", capFor(9, "other"))
	p := NewPoller()
	defer p.Close()
	if err := p.Update(gsConfig(a.member("a"), b.member("b"), c.member("c"))); err != nil {
		t.Fatal(err)
	}
	eventually(t, "three reports", func() bool {
		for _, m := range p.Members() {
			if _, _, ok := m.Report(); !ok {
				return false
			}
		}
		return true
	})
	f := func(model, want string) {
		t.Helper()
		if got := pickName(p, model); got != want {
			t.Fatalf("Pick(%q) = %q, want %q", model, got, want)
		}
	}
	f("m", "b")
	f("M", "b")
	f("x-large", "b")
	f("other", "c")
	f("unknown", "")
	// min_free: a member reporting less is no candidate.
	a.cap.Store(ptr(capFor(0, "m")))
	b.cap.Store(ptr(capFor(0, "m")))
	eventually(t, "saturated members skipped", func() bool { return pickName(p, "m") == "" })
	// Every poll carried the member's own key.
	for _, m := range []*fakeMember{a, b, c} {
		m.mu.Lock()
		for _, h := range m.auths {
			if h != "Bearer "+m.key() {
				t.Fatalf("member got Authorization %q, want its key", h)
			}
		}
		m.mu.Unlock()
	}
}

func ptr[T any](v T) *T { return &v }

func TestPollerTiesGoToListOrderAndForwardedIsCounted(t *testing.T) {
	a := startMember(t, "k", capFor(3, "m"))
	b := startMember(t, "k", capFor(3, "m"))
	p := NewPoller()
	defer p.Close()
	g := gsConfig(a.member("a"), b.member("b"))
	g.PollIntervalMS = 60000 // one poll each: forwarded counts are not reset
	g.StaleAfterMS = 60000
	if err := p.Update(g); err != nil {
		t.Fatal(err)
	}
	eventually(t, "reports", func() bool { return pickName(p, "m") != "" && a.polls.Load() > 0 && b.polls.Load() > 0 })
	eventually(t, "both reports", func() bool {
		_, _, okA := p.Members()[0].Report()
		_, _, okB := p.Members()[1].Report()
		return okA && okB
	})
	want := []string{"a", "b", "a", "b", "a", "b", ""} // 3 free each, min_free 1
	for i, w := range want {
		m := p.Pick([]byte("m"))
		got := ""
		if m != nil {
			got = m.Name()
			m.Forwarded()
		}
		if got != w {
			t.Fatalf("pick %d = %q, want %q", i, got, w)
		}
	}
}

func TestPollerDropsMembersThatFailTimeOutOrGoStale(t *testing.T) {
	a := startMember(t, "k", capFor(4, "m"))
	bad := startMember(t, "right", capFor(100, "m"))
	p := NewPoller()
	defer p.Close()
	wrong := bad.member("bad")
	wrong.APIKey = config.NewSecret("wrong")
	g := gsConfig(a.member("a"), wrong)
	g.PollTimeoutMS = 100
	g.StaleAfterMS = 300
	if err := p.Update(g); err != nil {
		t.Fatal(err)
	}
	eventually(t, "a picked", func() bool { return pickName(p, "m") == "a" })
	// The member refusing our key never becomes a candidate.
	eventually(t, "polls of the refusing member", func() bool { return bad.polls.Load() >= 3 })
	if _, _, ok := p.Members()[1].Report(); ok {
		t.Fatal("a member answering 401 has a report")
	}
	// A 500 clears the report at the next poll.
	a.fail.Store(true)
	eventually(t, "failing member dropped", func() bool { return pickName(p, "m") == "" })
	a.fail.Store(false)
	eventually(t, "member back", func() bool { return pickName(p, "m") == "a" })
	// Failed() (a forward failed) drops it until the next good poll.
	p.Members()[0].Failed()
	if _, _, ok := p.Members()[0].Report(); ok {
		t.Fatal("Failed did not clear the report")
	}
	eventually(t, "member back after Failed", func() bool { return pickName(p, "m") == "a" })
	// A member that hangs: its polls time out (100 ms) and clear it.
	a.hang.Store(true)
	start := time.Now()
	eventually(t, "hanging member dropped", func() bool { return pickName(p, "m") == "" })
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("hanging member dropped after %v", d)
	}
	a.hang.Store(false)
	eventually(t, "member back after hang", func() bool { return pickName(p, "m") == "a" })

	// A report older than stale_after_ms is ignored even while a poll is
	// still pending (timeout above staleness).
	g2 := gsConfig(a.member("a"))
	g2.PollIntervalMS = 50
	g2.PollTimeoutMS = 5000
	g2.StaleAfterMS = 150
	if err := p.Update(g2); err != nil {
		t.Fatal(err)
	}
	// A poll that began before the reload has the old 100 ms timeout:
	// hanging, it would fail and clear the report. The second poll the
	// member sees from now on began after the first ended (a member's
	// polls run one at a time), so after this point: with g2's timeout.
	n := a.polls.Load()
	eventually(t, "a poll begun after the reload", func() bool { return a.polls.Load() >= n+2 })
	eventually(t, "a picked", func() bool { return pickName(p, "m") == "a" })
	a.hang.Store(true)
	eventually(t, "stale report ignored", func() bool { return pickName(p, "m") == "" })
	if _, _, ok := p.Members()[0].Report(); !ok {
		t.Fatal("the report was cleared; this case must be decided by staleness")
	}
	a.hang.Store(false)
}

func TestPollerFollowsReloads(t *testing.T) {
	a := startMember(t, "k", capFor(4, "m"))
	b := startMember(t, "k", capFor(8, "m"))
	p := NewPoller()
	var sent atomic.Int64
	p.client.Transport = countingTransport{&sent, p.client.Transport}
	if err := p.Update(gsConfig(a.member("a"))); err != nil {
		t.Fatal(err)
	}
	eventually(t, "a picked", func() bool { return pickName(p, "m") == "a" })
	first := p.Members()[0]
	// Adding b: a keeps its state (same name, URL, key), b is polled.
	if err := p.Update(gsConfig(a.member("a"), b.member("b"))); err != nil {
		t.Fatal(err)
	}
	if p.Members()[0] != first {
		t.Fatal("unchanged member was replaced")
	}
	eventually(t, "b picked", func() bool { return pickName(p, "m") == "b" })
	// Removing a: its polls stop.
	if err := p.Update(gsConfig(b.member("b"))); err != nil {
		t.Fatal(err)
	}
	n := a.polls.Load()
	time.Sleep(100 * time.Millisecond)
	if d := a.polls.Load() - n; d > 1 {
		t.Fatalf("removed member polled %d more times", d)
	}
	// A changed key starts the member afresh with the new key.
	nb := b.member("b")
	nb.APIKey = config.NewSecret("rotated")
	b.keyV.Store(ptr("rotated"))
	old := p.Members()[0]
	if err := p.Update(gsConfig(nb)); err != nil {
		t.Fatal(err)
	}
	if p.Members()[0] == old {
		t.Fatal("a member with a new key kept its old state")
	}
	eventually(t, "b with the rotated key", func() bool { return pickName(p, "m") == "b" })
	// Disabled: no picks, no polls.
	off := gsConfig(nb)
	off.Enabled = false
	if err := p.Update(off); err != nil {
		t.Fatal(err)
	}
	if pickName(p, "m") != "" || len(p.Members()) != 0 {
		t.Fatal("disabled section still picks")
	}
	// An invalid list changes nothing.
	if err := p.Update(gsConfig(a.member("x"), a.member("x"))); err == nil {
		t.Fatal("duplicate names accepted")
	}
	p.Close()
	p.Close()
	if err := p.Update(gsConfig(a.member("a"))); err == nil {
		t.Fatal("Update after Close accepted")
	}
	// Counted where the poller sends them: a request it sent before Close
	// (and gave up on) may reach a member's handler later, on a loaded
	// machine.
	n = sent.Load()
	time.Sleep(60 * time.Millisecond)
	if sent.Load() != n {
		t.Fatal("polls continue after Close")
	}
}

// countingTransport counts the requests a Poller sends.
type countingTransport struct {
	n    *atomic.Int64
	next http.RoundTripper
}

func (c countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	c.n.Add(1)
	return c.next.RoundTrip(r)
}

// A reload that shortens poll_interval_ms applies to members already
// polled: their loops slept out the old interval, so a member polled every
// minute was polled next a minute later, and with stale_after_ms lowered
// with it, its report was stale (not a candidate) all that while.
func TestAReloadedPollIntervalAppliesToTheNextPoll(t *testing.T) {
	a := startMember(t, "k", capFor(4, "m"))
	p := NewPoller()
	defer p.Close()
	var sent atomic.Int64
	p.client.Transport = countingTransport{&sent, p.client.Transport}
	slow := gsConfig(a.member("a"))
	slow.PollIntervalMS, slow.StaleAfterMS = 60_000, 120_000
	if err := p.Update(slow); err != nil {
		t.Fatal(err)
	}
	eventually(t, "first poll", func() bool { return a.polls.Load() == 1 })
	if err := p.Update(gsConfig(a.member("a"))); err != nil { // 20 ms
		t.Fatal(err)
	}
	eventually(t, "polls at the new interval", func() bool { return a.polls.Load() >= 3 })
	// Lengthened again: the member waits the new interval from its last
	// poll, it is not polled at once.
	if err := p.Update(slow); err != nil {
		t.Fatal(err)
	}
	// Counted where the poller sends them: a poll sent before the reload
	// may reach the member's handler later, on a loaded machine.
	time.Sleep(50 * time.Millisecond)
	n := sent.Load()
	time.Sleep(200 * time.Millisecond)
	if d := sent.Load() - n; d != 0 {
		t.Fatalf("polled %d times within 200 ms of a reload to a 60 s interval", d)
	}
}

// A reload that shortens the poll interval (and the staleness bound with
// it) must not leave a kept member out of Pick until the poll its old
// interval scheduled: the report it holds is stale by the new bound.
func TestPollerPollsAtOnceWhenAReloadShortensTheInterval(t *testing.T) {
	a := startMember(t, "k", capFor(4, "m"))
	p := NewPoller()
	defer p.Close()
	slow := gsConfig(a.member("a"))
	slow.PollIntervalMS, slow.StaleAfterMS = 30000, 60000
	if err := p.Update(slow); err != nil {
		t.Fatal(err)
	}
	eventually(t, "a picked", func() bool { return pickName(p, "m") == "a" })
	time.Sleep(120 * time.Millisecond) // older than the new bound below
	fast := gsConfig(a.member("a"))
	fast.PollIntervalMS, fast.StaleAfterMS = 20, 100
	if err := p.Update(fast); err != nil {
		t.Fatal(err)
	}
	eventually(t, "a picked after the reload", func() bool { return pickName(p, "m") == "a" })
	n := a.polls.Load()
	eventually(t, "polls at the new interval", func() bool { return a.polls.Load() >= n+3 })
}

// A member a reload removes takes every one of its series off /metrics,
// its poll and forward counters as well as its free gauge.
func TestPollerRemovedMemberLeavesMetrics(t *testing.T) {
	a := startMember(t, "k", capFor(4, "m"))
	b := startMember(t, "k", capFor(4, "m"))
	p := NewPoller()
	defer p.Close()
	if err := p.Update(gsConfig(a.member("gone-a"), b.member("kept-b"))); err != nil {
		t.Fatal(err)
	}
	eventually(t, "gone-a picked", func() bool { return pickName(p, "m") == "gone-a" })
	p.Pick([]byte("m")).Forwarded()
	if err := p.Update(gsConfig(b.member("kept-b"))); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	p.set.WritePrometheus(&buf)
	if strings.Contains(buf.String(), `member="gone-a"`) {
		t.Fatalf("a removed member's series stay:\n%s", buf.String())
	}
	for _, want := range []string{`infera_global_capacity_polls_total{member="kept-b",result="ok"}`, `infera_global_member_free{member="kept-b"}`} {
		if !strings.Contains(buf.String(), want) {
			t.Fatalf("kept member's %s missing:\n%s", want, buf.String())
		}
	}
}

// A model name longer than any gateway serves is forwarded to no member,
// even one that reports "*": matching a client's megabytes-long name
// against a member's patterns took seconds of CPU per request, to forward
// a request the member refuses.
func TestPollerPicksNoMemberForAModelNameLongerThanAnyGatewayServes(t *testing.T) {
	a := startMember(t, "k", capFor(4, "*"))
	p := NewPoller()
	defer p.Close()
	if err := p.Update(gsConfig(a.member("a"))); err != nil {
		t.Fatal(err)
	}
	longest := strings.Repeat("m", MaxModelBytes)
	eventually(t, "a picked", func() bool { return pickName(p, longest) == "a" })
	if got := pickName(p, longest+"m"); got != "" {
		t.Fatalf("a %d-byte model name was forwarded to %q", len(longest)+1, got)
	}
}

// With min_free 0 a member reporting no room is still chosen, once per
// report: what was forwarded to it since counts against its room, so the
// next pick finds it below 0 (docs/upstreams.md, min_free).
func TestAMemberWithoutRoomTakesOneForwardPerReportAtMinFreeZero(t *testing.T) {
	a := startMember(t, "k", capFor(0, "m"))
	p := NewPoller()
	defer p.Close()
	g := gsConfig(a.member("a"))
	g.PollIntervalMS, g.StaleAfterMS = 60000, 60000 // one poll: the forwarded count is not reset
	g.MinFree = 0
	if err := p.Update(g); err != nil {
		t.Fatal(err)
	}
	eventually(t, "a's report", func() bool { _, _, ok := p.Members()[0].Report(); return ok })
	m := p.Pick([]byte("m"))
	if m == nil {
		t.Fatal("a member reporting 0 free was not picked at min_free 0")
	}
	m.Forwarded()
	if got := pickName(p, "m"); got != "" {
		t.Fatalf("picked %q again before its next report", got)
	}
	g2 := *g
	g2.MinFree = 1
	if err := p.Update(&g2); err != nil {
		t.Fatal(err)
	}
	if got := pickName(p, "m"); got != "" {
		t.Fatalf("min_free 1: picked %q, which reports 0 free", got)
	}
}
