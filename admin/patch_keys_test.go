package admin

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
)

// A merge patch matches each of its keys the target does not hold to a
// target key in another case. It compared each with every key of the
// target as the patch grew it, keys of the patch included: a PATCH of a
// section with 350,000 settings (4 MB, within the 4 MiB bound) ran for
// more than half an hour at 100% of a core, holding the admin lock, so
// every other write waited as long (it would have been refused 400 at
// its end). Now each is compared with the target's own keys alone, and
// the patch is refused at once.
func TestAPatchOfManySettingsIsRefusedPromptlyAndOtherWritesGoOn(t *testing.T) {
	e := newEnv(t, envOpts{})
	var b strings.Builder
	b.WriteString(`{"nested":{`)
	for i := range 60000 {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `"k%d":0`, i)
	}
	b.WriteString(`}}`)
	var wg sync.WaitGroup
	wg.Add(1)
	var r resp
	var took time.Duration
	go func() {
		defer wg.Done()
		start := time.Now()
		r = e.do("PATCH", "/api/config/session_affinity", b.String(), "If-Match", "*")
		took = time.Since(start)
	}()
	time.Sleep(50 * time.Millisecond)
	// Another operator's write meanwhile.
	start := time.Now()
	other := e.do("PATCH", "/api/config/session_affinity", `{"ttl_s":33}`, "If-Match", "*")
	otherTook := time.Since(start)
	wg.Wait()
	if r.status != 400 || took > 10*time.Second {
		t.Fatalf("a patch of 60,000 settings: %d after %v, want 400 at once: %.200s", r.status, took, r.body)
	}
	if other.status != 200 || otherTook > 10*time.Second {
		t.Fatalf("another write meanwhile: %d after %v", other.status, otherTook)
	}
}

// A patch key in another case is still the target's setting, nested ones
// too, and one the target does not hold is still refused at its path.
func TestAPatchKeyInAnotherCaseIsTheSetting(t *testing.T) {
	e := newEnv(t, envOpts{})
	r := e.do("PATCH", "/api/config/session_affinity", `{"TTL_S":600,"Header":"X-S"}`, "If-Match", "*")
	if r.status != 200 {
		t.Fatalf("%d %s", r.status, r.body)
	}
	if sa := e.store.Load().SessionAffinity; sa.TTLSeconds != 600 || sa.Header != "X-S" {
		t.Fatalf("ttl_s %v header %q after the patch", sa.TTLSeconds, sa.Header)
	}
	r = e.do("PATCH", "/api/config/session_affinity", `{"TTL_S":null}`, "If-Match", "*")
	if r.status != 200 || e.store.Load().SessionAffinity.TTLSeconds != 1800 {
		t.Fatalf("null in another case: %d %s", r.status, r.body)
	}
	r = e.do("PATCH", "/api/config/session_affinity", `{"bogus":1}`, "If-Match", "*")
	if p, _ := r.errPath(t); r.status != 400 || p != "session_affinity.bogus" {
		t.Fatalf("an unknown setting: %d %s", r.status, r.body)
	}
}

func FuzzFoldKeyAgreesWithEqualFold(f *testing.F) {
	for _, p := range [][2]string{{"ttl_s", "TTL_S"}, {"k", "\u212a"}, {"ß", "ẞ"}, {"σ", "ς"}, {"a", "b"}, {"\xff", "\xfe"}, {"Σ", "ς"}} {
		f.Add(p[0], p[1])
	}
	f.Fuzz(func(t *testing.T, a, b string) {
		if got, want := foldKey(a) == foldKey(b), strings.EqualFold(a, b); got != want {
			t.Fatalf("foldKey(%q) == foldKey(%q) is %v, EqualFold says %v", a, b, got, want)
		}
	})
}
