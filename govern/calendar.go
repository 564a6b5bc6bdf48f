package govern

import (
	"fmt"
	"sync/atomic"
	"time"

	"github.com/infera/infera/config"
)

// period is a quota window period.
type period uint8

const (
	period5h period = iota
	periodDay
	periodWeek
	periodMonth
	numPeriods
)

var periodNames = [numPeriods]string{"5h", "day", "week", "month"}

func parsePeriod(s string) (period, bool) {
	for p, n := range periodNames {
		if n == s {
			return period(p), true
		}
	}
	return 0, false
}

// window is one calendar window [start, end) in Unix seconds.
type window struct{ start, end int64 }

// holds reports whether counts kept for a window that started at stored
// belong to w at now (Unix seconds): the same start, or another start
// (a reload changed user_limit.timezone, which moves every window by the
// zones' offset) whose window is still running and did not end before w
// began. The window before w began about a length before it (a DST hour,
// or a shorter month, away): never taken for w. A start moved later keeps
// its counts exactly; one moved earlier keeps them all, a few of them
// made before w began (counting more, never fewer).
func (w window) holds(stored, now int64) bool {
	if stored == w.start {
		return true
	}
	n := w.end - w.start
	return stored != 0 && 4*(w.start-stored) < 3*n && stored < w.end && now < stored+n
}

// calendar answers, for an instant, the local wall-clock minute and weekday
// (allowed calling periods) and the current quota windows, in one timezone.
// It caches what it computed until the next zone transition or window
// boundary, so the request path does integer arithmetic and one atomic load.
type calendar struct {
	loc *time.Location
	cur atomic.Pointer[calState]
}

// calState is valid for instants in [from, until) (Unix seconds).
type calState struct {
	from, until int64
	off         int64 // zone offset, seconds east of UTC
	win         [numPeriods]window
	cal         *calendar
}

// later returns the window of period p that began at start, one after
// s's (another router, or a request that read the clock after this one,
// began it): its real end, which is not s's window's length after start
// when the two differ (months of 28 to 31 days, days of 23 or 25 hours
// across a DST change). It computes (one allocation): late refusals only.
func (s *calState) later(p period, start int64) window {
	return s.cal.compute(start).win[p]
}

func newCalendar(loc *time.Location) *calendar { return &calendar{loc: loc} }

// state returns the cached state for now (Unix seconds), recomputing it
// (one allocation) when now is outside its range.
func (c *calendar) state(now int64) *calState {
	if s := c.cur.Load(); s != nil && now >= s.from && now < s.until {
		return s
	}
	s := c.compute(now)
	c.cur.Store(s)
	return s
}

func (c *calendar) compute(now int64) *calState {
	t := time.Unix(now, 0).In(c.loc)
	_, off := t.Zone()
	s := &calState{off: int64(off), from: now - 1<<40, until: now + 1<<40, cal: c}
	zs, ze := t.ZoneBounds()
	if !zs.IsZero() {
		s.from = zs.Unix()
	}
	if !ze.IsZero() {
		s.until = ze.Unix()
	}
	y, m, d := t.Date()
	day := c.clamp(now, c.at(y, m, d, 0), c.at(y, m, d+1, 0))
	h0 := t.Hour() / 5 * 5
	five := c.clamp(now, c.at(y, m, d, h0), c.at(y, m, d, h0+5))
	if five.end > day.end {
		five.end = day.end
	}
	wd := (int(t.Weekday()) + 6) % 7 // days since Monday
	week := c.clamp(now, c.at(y, m, d-wd, 0), c.at(y, m, d-wd+7, 0))
	month := c.clamp(now, c.at(y, m, 1, 0), c.at(y, m+1, 1, 0))
	s.win = [numPeriods]window{five, day, week, month}
	for _, w := range s.win {
		s.from = max(s.from, w.start)
		s.until = min(s.until, w.end)
	}
	return s
}

// at is the instant the local wall clock reads hour h of day d (as
// time.Date normalises them). Where a DST jump skips that time (zones whose
// clocks go from 23:59 to 01:00), time.Date lands an hour beside it; the
// boundary is then the jump itself, the first instant of the new day.
// Where clocks go back over that time, it is its first occurrence (first).
func (c *calendar) at(y int, m time.Month, d, h int) time.Time {
	t := time.Date(y, m, d, h, 0, 0, 0, c.loc)
	n := time.Date(y, m, d, h, 0, 0, 0, time.UTC) // the wall clock wanted, normalised (UTC has no jumps)
	ny, nm, nd := n.Date()
	nh := n.Hour()
	if ty, tm, td := t.Date(); ty == ny && tm == nm && td == nd && t.Hour() == nh && t.Minute() == 0 {
		return c.first(t)
	}
	zs, ze := t.ZoneBounds()
	if !ze.IsZero() && t.Hour() != nh && (t.Hour()+1)%24 == nh {
		return ze // t is before the jump (the old offset applied)
	}
	if !zs.IsZero() {
		return zs // t is after it
	}
	return t
}

// first is the first instant whose wall clock reads what t's does. Where
// clocks go back over it (Gaza's went from 01:00 back to 00:00 in 2020 and
// 2021), that time comes twice, and time.Date may give the second one: the
// day then began an hour late, its first hour counted in the day before.
func (c *calendar) first(t time.Time) time.Time {
	zs, _ := t.ZoneBounds()
	if zs.IsZero() {
		return t
	}
	_, off := t.Zone()
	_, prev := zs.Add(-time.Second).Zone()
	if prev <= off {
		return t // the clocks went forward there, or the offset stayed
	}
	e := t.Add(-time.Duration(prev-off) * time.Second).In(c.loc)
	if e.Before(zs) && e.Year() == t.Year() && e.YearDay() == t.YearDay() && e.Hour() == t.Hour() && e.Minute() == t.Minute() {
		return e
	}
	return t
}

// clamp makes a window that contains now even where a zone transition at
// midnight makes time.Date land beside it.
func (c *calendar) clamp(now int64, a, b time.Time) window {
	w := window{a.Unix(), b.Unix()}
	if w.start > now {
		w.start = now
	}
	if w.end <= now {
		w.end = now + 1
	}
	return w
}

// local returns the wall-clock minute of the day (0..1439) and the weekday.
func (s *calState) local(now int64) (minute int, wd time.Weekday) {
	l := now + s.off
	days := l / 86400
	if l%86400 < 0 {
		days--
	}
	minute = int((l - days*86400) / 60)
	wd = time.Weekday(((days+4)%7 + 7) % 7) // 1970-01-01 was a Thursday
	return minute, wd
}

// minuteMask is the set of allowed minutes of each weekday.
type minuteMask [7][(1440 + 63) / 64]uint64

func (m *minuteMask) has(wd time.Weekday, minute int) bool {
	return m[wd][minute>>6]&(1<<(minute&63)) != 0
}

func (m *minuteMask) set(wd time.Weekday, from, to int) {
	for i := from; i <= to; i++ {
		m[wd][i>>6] |= 1 << (i & 63)
	}
}

// compileSegments builds the mask of allowed minutes; nil means always allowed.
func compileSegments(segs []config.PeriodSegment) (*minuteMask, error) {
	if len(segs) == 0 {
		return nil, nil
	}
	m := new(minuteMask)
	for _, s := range segs {
		from, ok1 := config.ParseClock(s.Start)
		to, ok2 := config.ParseClock(s.End)
		if !ok1 || !ok2 || to < from {
			return nil, fmt.Errorf("bad segment %q-%q", s.Start, s.End)
		}
		if len(s.Days) == 0 {
			for d := time.Sunday; d <= time.Saturday; d++ {
				m.set(d, from, to)
			}
			continue
		}
		for _, ds := range s.Days {
			d, ok := config.ParseWeekday(ds)
			if !ok {
				return nil, fmt.Errorf("bad day %q", ds)
			}
			m.set(d, from, to)
		}
	}
	return m, nil
}

// nextAllowed returns the first instant after now whose local minute is
// allowed, searching eight days of wall-clock time (zero when none is).
func (c *calendar) nextAllowed(m *minuteMask, now int64) time.Time {
	t := time.Unix(now, 0).In(c.loc)
	y, mo, d := t.Date()
	start := t.Hour()*60 + t.Minute() + 1
	for dd := 0; dd <= 8; dd++ {
		day := time.Date(y, mo, d+dd, 12, 0, 0, 0, c.loc)
		wd := day.Weekday()
		for mi := start; mi < 1440; mi++ {
			if !m.has(wd, mi) {
				continue
			}
			cand := time.Date(y, mo, d+dd, mi/60, mi%60, 0, 0, c.loc)
			if cand.Unix() > now {
				cmin, cwd := c.compute(cand.Unix()).local(cand.Unix())
				if m.has(cwd, cmin) { // skips wall-clock minutes a DST jump removed
					return cand
				}
			}
		}
		start = 0
	}
	return time.Time{}
}
