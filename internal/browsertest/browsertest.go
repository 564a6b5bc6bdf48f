package browsertest

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"sync"

	"github.com/chromedp/chromedp"
)

// T is the part of testing.TB these helpers use.
type T interface {
	Helper()
	Cleanup(func())
	Errorf(format string, args ...any)
	Fatal(args ...any)
	Skip(args ...any)
}

// FindChromium returns the browser binary, or skips the test (fails it with
// INFERA_REQUIRE_BROWSER=1) when there is none.
func FindChromium(t T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("INFERA_REQUIRE_BROWSER") == "1" {
		t.Fatal("no chromium found and INFERA_REQUIRE_BROWSER=1: apt-get install -y chromium")
	}
	t.Skip("browser test skipped: no chromium on PATH (apt-get install -y chromium; INFERA_REQUIRE_BROWSER=1 makes this a failure)")
	return ""
}

// ShortTempDir is a temporary directory with a short path, removed at the
// end of the test: a socket path (Chromium's singleton socket, kept in a
// directory of its own under TMPDIR) must fit 108 bytes, which
// t.TempDir's, named after the test, may not.
func ShortTempDir(t T) string {
	t.Helper()
	d, err := os.MkdirTemp("", "chr")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

// FailOnPageErrors fails the test, at its end, for what the page of ctx's
// tab wrote to the browser's console that is a fault of the page: an
// uncaught exception or unhandled rejection, a console.error, or a browser
// log entry at warning or error level other than a failed request's (a
// Content-Security-Policy violation, say). An error status the page asked
// for and shows (a 400 for a bad value, a 409 for a stale ETag) is logged by
// the browser as a failed resource, and is no fault.
//
// Call it before the page loads (right after the browser starts): what the
// page wrote before is not seen. Its cleanup must run before the browser's
// context is cancelled, so register it after the browser's own cleanup.
func FailOnPageErrors(t T, ctx context.Context) {
	t.Helper()
	bad := watch(ctx)
	t.Cleanup(func() {
		if b := bad(); len(b) > 0 {
			t.Errorf("the console's page wrote %d error(s) to the browser's console:\n%s", len(b), strings.Join(b, "\n"))
		}
	})
}

// watch collects the page faults (see FailOnPageErrors) of ctx's tab until
// ctx ends; the func returns those seen so far.
func watch(ctx context.Context) func() []string {
	var mu sync.Mutex
	var bad []string
	msgs := chromedp.Console(ctx) // subscribed now, read below
	go func() {
		for m, err := range msgs {
			if err != nil {
				return
			}
			if !isFault(m) {
				continue
			}
			mu.Lock()
			bad = append(bad, m.String())
			mu.Unlock()
		}
	}()
	return func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), bad...)
	}
}

// isFault reports whether a console message is a fault of the page.
func isFault(m chromedp.ConsoleMessage) bool {
	switch {
	case m.IsException(), m.Type == chromedp.ConsoleError && m.Source == "":
		return true
	case m.Source != "" && m.Source != "network" && (m.Type == chromedp.ConsoleError || m.Type == chromedp.ConsoleWarning):
		return true
	}
	return false
}
