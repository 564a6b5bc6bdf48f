package browsertest

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// fakeT records what FailOnPageErrors reports, and runs its cleanups when
// asked.
type fakeT struct {
	*testing.T
	cleanups []func()
	errs     []string
}

func (f *fakeT) Cleanup(fn func())              { f.cleanups = append(f.cleanups, fn) }
func (f *fakeT) Errorf(format string, a ...any) { f.errs = append(f.errs, fmt.Sprintf(format, a...)) }
func (f *fakeT) end() {
	for i := len(f.cleanups) - 1; i >= 0; i-- {
		f.cleanups[i]()
	}
}

// startBrowser starts the browser at bin for the test (a tab, bounded to
// 60 s) and returns its context.
func startBrowser(t *testing.T, bin string) context.Context {
	t.Helper()
	actx, cancel := chromedp.NewExecAllocator(context.Background(),
		chromedp.ExecPath(bin), chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.Env("TMPDIR="+ShortTempDir(t)))
	t.Cleanup(cancel)
	ctx, cancel2 := chromedp.NewContext(actx)
	t.Cleanup(cancel2)
	ctx, cancel3 := context.WithTimeout(ctx, 60*time.Second)
	t.Cleanup(cancel3)
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("cannot start %s: %v", bin, err)
	}
	return ctx
}

// FailOnPageErrors fails a test for an uncaught exception, a console.error
// and a Content-Security-Policy violation of the page, and not for a
// console.log or a request the server answered 400 (a refusal the page
// asked for and shows).
func TestFailOnPageErrorsFailsOnFaultsOfThePageOnly(t *testing.T) {
	bin := FindChromium(t)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Security-Policy", "default-src 'self'")
		switch r.URL.Path {
		case "/bad":
			http.Error(w, "refused", http.StatusBadRequest)
		case "/clean.js":
			w.Header().Set("Content-Type", "text/javascript")
			fmt.Fprint(w, `console.log('fine'); fetch('bad').then(() => { document.title = 'done'; });`)
		case "/faulty.js":
			w.Header().Set("Content-Type", "text/javascript")
			fmt.Fprint(w, `console.error('page-error-marker');
setTimeout(() => { throw new Error('uncaught-marker'); });
const s = document.createElement('script'); s.textContent = 'window.x = 1'; document.body.append(s);`)
		default:
			name := strings.TrimPrefix(r.URL.Path, "/")
			fmt.Fprintf(w, `<!doctype html><html><head><title>%s</title></head><body><script src="%s.js"></script></body></html>`, name, name)
		}
	}))
	t.Cleanup(srv.Close)

	ctx := startBrowser(t, bin)

	// A clean page: a log line and a 400 answer.
	clean := &fakeT{T: t}
	FailOnPageErrors(clean, ctx)
	if err := chromedp.Do(ctx, chromedp.Navigate(srv.URL+"/clean"),
		chromedp.Poll[chromedp.Void](`document.title === 'done'`, chromedp.WithPollingTimeout(10*time.Second))); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond) // the 400's log entry, if it counted
	clean.end()
	if len(clean.errs) != 0 {
		t.Fatalf("a page that logged a line and was answered 400 failed the test: %q", clean.errs)
	}

	// A faulty page: each fault is reported.
	faulty := &fakeT{T: t}
	FailOnPageErrors(faulty, ctx)
	seen := watch(ctx).faults
	if err := chromedp.Do(ctx, chromedp.Navigate(srv.URL+"/faulty")); err != nil {
		t.Fatal(err)
	}
	want := []string{"page-error-marker", "uncaught-marker", "Content Security Policy"}
	deadline := time.Now().Add(10 * time.Second)
	for {
		got := strings.Join(seen(), "\n")
		missing := ""
		for _, w := range want {
			if !strings.Contains(got, w) {
				missing = w
			}
		}
		if missing == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 10 s the page's faults seen lack %q: %q", missing, got)
		}
		time.Sleep(20 * time.Millisecond)
	}
	faulty.end()
	if len(faulty.errs) != 1 {
		t.Fatalf("a faulty page: %d reports, want 1: %q", len(faulty.errs), faulty.errs)
	}
	for _, w := range want {
		if !strings.Contains(faulty.errs[0], w) {
			t.Errorf("the report lacks %q:\n%s", w, faulty.errs[0])
		}
	}
	if !strings.Contains(faulty.errs[0], "wrote 3 error(s)") {
		t.Errorf("the report counts other than the 3 faults:\n%s", faulty.errs[0])
	}
}

// A fault the page writes just before the test ends is in the report: the
// report waits until every message written before it is read. Taken at
// once, it missed one still on its way (the watcher reads on a goroutine
// of its own).
func TestFailOnPageErrorsCountsAFaultWrittenJustBeforeTheEnd(t *testing.T) {
	bin := FindChromium(t)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, `<!doctype html><title>page</title><p>page</p>`)
	}))
	t.Cleanup(srv.Close)
	ctx := startBrowser(t, bin)
	if err := chromedp.Do(ctx, chromedp.Navigate(srv.URL)); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 20; i++ {
		ft := &fakeT{T: t}
		FailOnPageErrors(ft, ctx)
		for j := 0; j <= i%3; j++ {
			if _, err := chromedp.Run(ctx, chromedp.Evaluate[bool](fmt.Sprintf("console.error('late-%d-%d'), true", i, j))); err != nil {
				t.Fatal(err)
			}
		}
		ft.end()
		if len(ft.errs) != 1 || !strings.Contains(ft.errs[0], fmt.Sprintf("wrote %d error(s)", i%3+1)) {
			t.Fatalf("round %d: %d error(s) written just before the end, reported: %q", i, i%3+1, ft.errs)
		}
	}
}
