package browsertest

import (
	"context"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

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
// The cleanup first has the page log a marker and waits until it is read
// (up to flushWait): the console's messages are read in the order the page
// wrote them, so every fault written before the test ended is counted. A
// report taken at once missed a fault whose message was still on its way.
func FailOnPageErrors(t T, ctx context.Context) {
	t.Helper()
	w := watch(ctx)
	t.Cleanup(func() {
		w.flush(ctx)
		if b := w.faults(); len(b) > 0 {
			t.Errorf("the console's page wrote %d error(s) to the browser's console:\n%s", len(b), strings.Join(b, "\n"))
		}
	})
}

// flushWait bounds the wait for a flush's marker (a page that is gone or
// hangs never logs it: the report then has what was read by then).
const flushWait = 5 * time.Second

// watcher collects the page faults (see FailOnPageErrors) of a tab.
type watcher struct {
	mu   sync.Mutex
	bad  []string
	mark map[string]chan struct{} // flush markers not read yet
}

// flushes numbers the markers of a process's flushes.
var flushes atomic.Int64

// watch collects the page faults (see FailOnPageErrors) of ctx's tab until
// ctx ends.
func watch(ctx context.Context) *watcher {
	w := &watcher{mark: map[string]chan struct{}{}}
	msgs := chromedp.Console(ctx) // subscribed now, read below
	go func() {
		for m, err := range msgs {
			if err != nil {
				return
			}
			w.mu.Lock()
			if ch, ok := w.mark[m.Text]; ok && m.Type == chromedp.ConsoleDebug && m.Source == "" {
				close(ch)
				delete(w.mark, m.Text)
			} else if isFault(m) {
				w.bad = append(w.bad, m.String())
			}
			w.mu.Unlock()
		}
	}()
	return w
}

// faults returns the faults read so far.
func (w *watcher) faults() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.bad...)
}

// flush has the page log a marker and waits until the watcher reads it:
// every message the page wrote before is read by then.
func (w *watcher) flush(ctx context.Context) {
	marker := "browsertest-flush-" + strconv.FormatInt(flushes.Add(1), 10) + "-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	ch := make(chan struct{})
	w.mu.Lock()
	w.mark[marker] = ch
	w.mu.Unlock()
	defer func() {
		w.mu.Lock()
		delete(w.mark, marker)
		w.mu.Unlock()
	}()
	fctx, cancel := context.WithTimeout(ctx, flushWait)
	defer cancel()
	if _, err := chromedp.Run(fctx, chromedp.Evaluate[bool]("console.debug("+strconv.Quote(marker)+"), true")); err != nil {
		return
	}
	select {
	case <-ch:
	case <-fctx.Done():
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
