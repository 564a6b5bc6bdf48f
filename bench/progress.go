package bench

import (
	"fmt"
	"io"
	"os"
	"sync"
	"time"
)

// Progress prints a one-line status of a long run (requests done, virtual
// or elapsed time, current hit rate), rewritten in place with a carriage
// return at most every Interval. It prints only when its output is a
// terminal, so logs, pipes and files stay clean. The zero value and nil are
// silent. It is safe for concurrent use.
type Progress struct {
	// Interval is the least time between two lines (default 200ms).
	Interval time.Duration

	mu    sync.Mutex
	w     io.Writer
	label string
	last  time.Time
	width int
	now   func() time.Time
}

// IsTerminal reports whether f is a character device (a terminal; also
// /dev/null, where output is invisible anyway).
func IsTerminal(f *os.File) bool {
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// NewProgress returns a Progress writing to f when f is a terminal, and a
// silent one otherwise. label prefixes every line (e.g. the policy).
func NewProgress(f *os.File, label string) *Progress {
	p := &Progress{label: label, now: time.Now}
	if IsTerminal(f) {
		p.w = f
	}
	return p
}

// newProgressTo returns a Progress that always writes to w (tests).
func newProgressTo(w io.Writer, label string, now func() time.Time) *Progress {
	return &Progress{w: w, label: label, now: now}
}

// Update prints "label: done/total requests, <clock> <t>, hit rate h"
// unless the previous line is younger than Interval. clock names t
// ("virtual" in simulations, "elapsed" against real processes).
func (p *Progress) Update(done, total int, clock string, t time.Duration, cached, prompt int64) {
	if p == nil || p.w == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.now()
	iv := p.Interval
	if iv <= 0 {
		iv = 200 * time.Millisecond
	}
	if !p.last.IsZero() && now.Sub(p.last) < iv {
		return
	}
	p.last = now
	hit := 0.0
	if prompt > 0 {
		hit = float64(cached) / float64(prompt)
	}
	pct := 0.0
	if total > 0 {
		pct = 100 * float64(done) / float64(total)
	}
	line := fmt.Sprintf("%s: %d/%d requests (%.0f%%), %s %s, hit rate %.3f", p.label, done, total, pct, clock, t.Round(time.Second), hit)
	pad := max(0, p.width-len(line))
	p.width = len(line)
	fmt.Fprintf(p.w, "\r%s%*s", line, pad, "")
}

// Done erases the progress line (call before printing results).
func (p *Progress) Done() {
	if p == nil || p.w == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.width > 0 {
		fmt.Fprintf(p.w, "\r%*s\r", p.width, "")
		p.width = 0
	}
	p.last = time.Time{}
}
