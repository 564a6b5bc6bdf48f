package admin

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/infera/infera/config"
	"github.com/infera/infera/govern"
)

// usersDoc is a config of n users, each with no key or one key.
func usersDoc(tb testing.TB, n int, withKeys bool) string {
	tb.Helper()
	var b strings.Builder
	b.WriteString(`{"users":[`)
	for i := 0; i < n; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		keys := "[]"
		if withKeys {
			_, h, err := govern.NewKey()
			if err != nil {
				tb.Fatal(err)
			}
			keys = `["` + h + `"]`
		}
		fmt.Fprintf(&b, `{"name":"u%d","keys":%s}`, i, keys)
	}
	b.WriteString(`]}`)
	return b.String()
}

func mustParse(tb testing.TB, doc string) *config.Config {
	tb.Helper()
	c, err := config.Parse([]byte(doc))
	if err != nil {
		tb.Fatal(err)
	}
	return c
}

// Lists that go from empty to filled are told by their members alone,
// whichever way the diff runs, and the diff says so for each of them.
func TestAuditDiffOfListsThatGainMembers(t *testing.T) {
	old := mustParse(t, usersDoc(t, 3, false))
	cur := mustParse(t, usersDoc(t, 3, true))
	for _, c := range diff(nil, old, cur) {
		if !strings.HasSuffix(c.Path, ".keys[0]") || c.Old != "(none)" || !strings.HasPrefix(c.New, "key ") {
			t.Errorf("old->new: unexpected change %+v", c)
		}
	}
	back := diff(nil, cur, old)
	if len(back) != 3 {
		t.Fatalf("new->old: %d changes, want 3: %+v", len(back), back)
	}
	for _, c := range back {
		if !strings.HasSuffix(c.Path, ".keys[0]") || c.New != "(none)" {
			t.Errorf("new->old: unexpected change %+v", c)
		}
	}
}

// The diff of n lists that all gain a member used to scan the whole
// flattened config once per list: 8k users took 5.5 s, 16k about 22 s
// (far more under -race). Now 16k users take a fraction of a second (3 s
// under -race). So as not to fail on a slow or loaded machine, the test
// fails only when the diff of 16k users is both slow in absolute terms and
// slower than linear growth from 1k users allows with a wide margin (16x
// the users: a linear diff takes about 16x the time, a quadratic one 256x).
func TestAuditDiffOfManyListsThatGainMembersIsNotQuadratic(t *testing.T) {
	timeDiff := func(n int) time.Duration {
		old := mustParse(t, usersDoc(t, n, false))
		cur := mustParse(t, usersDoc(t, n, true))
		start := time.Now()
		d := diff(nil, old, cur)
		el := time.Since(start)
		if len(d) != n {
			t.Fatalf("%d users: %d changes, want %d", n, len(d), n)
		}
		return el
	}
	small := min(timeDiff(1000), timeDiff(1000), timeDiff(1000))
	large := timeDiff(16000)
	t.Logf("diff: 1k users %v, 16k users %v", small, large)
	if large > 5*time.Second && large > 64*small {
		t.Fatalf("diff of 16k users gaining a key took %v, %.0fx the time of 1k users", large, float64(large)/float64(small))
	}
}

// A dry-run import runs the diff inside the request: a 4.4 MB snapshot
// where 12k users gain a key took a minute, past the admin listener's
// WriteTimeout. With 16k users (3.5 MB) the quadratic diff takes over 20 s
// here; the fixed one under a second (5 s under -race).
func TestADryRunImportOfManyNewKeysAnswersInTime(t *testing.T) {
	e := newEnv(t, envOpts{})
	const n = 16000
	doc := usersDoc(t, n, false)
	r := e.do("PUT", "/api/config/users", strings.TrimSuffix(strings.TrimPrefix(doc, `{"users":`), "}"), "If-Match", "*")
	if r.status != 200 {
		t.Fatalf("%d %.200s", r.status, r.body)
	}
	snap, err := e.a.seal.encodeSnapshot(mustParse(t, usersDoc(t, n, true)), 1, kindExport, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	// The quadratic diff took about a minute here (40 s for the diff of 16k
	// users alone); the linear one 2-6 s, with the race detector. The bound
	// leaves room for a loaded CI machine and still catches the quadratic
	// one; give up at 60 s rather than wait for it.
	start := time.Now()
	req, err := http.NewRequest("POST", e.srv.URL+"/api/backup/import?dry_run=1", strings.NewReader(string(snap)))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+testKey)
	res, err := (&http.Client{Timeout: 60 * time.Second}).Do(req)
	if err != nil {
		t.Fatalf("dry-run import of a %d-byte snapshot: no answer after %v: %v", len(snap), time.Since(start), err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusOK || !strings.Contains(string(body), `"valid":true`) {
		t.Fatalf("dry run: %d %.300s", res.StatusCode, body)
	}
	el := time.Since(start)
	t.Logf("dry-run import of a %d-byte snapshot: %v", len(snap), el)
	if el > 30*time.Second {
		t.Fatalf("dry-run import of a %d-byte snapshot took %v", len(snap), el)
	}
}

func BenchmarkAuditDiffListsThatGainMembers(b *testing.B) {
	for _, n := range []int{100, 2000} {
		old := mustParse(b, usersDoc(b, n, false))
		cur := mustParse(b, usersDoc(b, n, true))
		b.Run(fmt.Sprintf("users=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				if d := diff(nil, old, cur); len(d) != n {
					b.Fatalf("%d changes", len(d))
				}
			}
		})
	}
}

// Members of a list named uniquely are told by name: deleting the first of
// three users read as two renames (users[0].name "u0" -> "u1", its key
// changed) and a deletion of the last.
func TestAuditDiffTellsADeletedUserByName(t *testing.T) {
	old := mustParse(t, usersDoc(t, 3, true))
	cur := mustParse(t, `{}`)
	cur.Users = append(cur.Users, old.Users[1:]...)
	ch := diff(nil, old, cur)
	if len(ch) == 0 {
		t.Fatal("no change")
	}
	for _, c := range ch {
		if !strings.HasPrefix(c.Path, `users["u0"]`) || c.New != "(none)" {
			t.Errorf("unexpected change %+v: want only users[\"u0\"] gone", c)
		}
	}
}

// Members told by name that only moved are a change: split proxies are
// tried in list order (prefix rules, failover), and a reorder that sends a
// model to another upstream was recorded as no change at all (changed=0).
// Members added or removed are told by their own changes, not as a move.
func TestAuditDiffTellsMembersThatMoved(t *testing.T) {
	const sp = `{"split_proxy":{"enabled":true,"strategy":"prefix","proxies":[%s]}}`
	a := `{"name":"a","address":"http://10.0.0.1:8000","model_rules":["gpt-"]}`
	b := `{"name":"b","address":"http://10.0.0.2:8000","model_rules":["gpt-4"]}`
	c := `{"name":"c","address":"http://10.0.0.3:8000","model_rules":["o1"]}`
	local := `{"name":"local","local":true}`
	doc := func(members ...string) *config.Config {
		return mustParse(t, fmt.Sprintf(sp, strings.Join(members, ",")))
	}
	got := diff(nil, doc(a, b, local), doc(b, a, local))
	if len(got) != 1 || got[0].Path != "split_proxy.proxies" || got[0].Old != `["a","b","local"]` || got[0].New != `["b","a","local"]` {
		t.Fatalf("a reorder: %+v", got)
	}
	// Adding and removing members is no move.
	for _, d := range diff(nil, doc(a, b, local), doc(c, a, local)) {
		if d.Path == "split_proxy.proxies" {
			t.Fatalf("b removed and c added read as a move: %+v", d)
		}
	}
	if got := diff(nil, doc(a, b, local), doc(a, b, local)); len(got) != 0 {
		t.Fatalf("no change: %+v", got)
	}
}
