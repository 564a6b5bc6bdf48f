package govern

import (
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// UserStatus is where a user stands against its template's limits now:
// what the admin API's GET /api/users/{name}/usage answers
// (docs/governance.md#a-users-usage). With the counters in Redis the
// counters are the shared ones (all routers); the queue is this router's.
type UserStatus struct {
	User string `json:"user"`
	// Template is the user's quota template ("": none, nothing is limited).
	Template string `json:"template"`
	DryRun   bool   `json:"dry_run"`
	Enabled  bool   `json:"enabled"`
	// Active is the requests holding a concurrency slot (counted while the
	// template's concurrency rule is on); Queued those waiting in this
	// router's queue for one.
	Active           int `json:"active"`
	ConcurrencyLimit int `json:"concurrency_limit,omitempty"`
	Queued           int `json:"queued"`
	// RPM and TPM are the rate buckets (nil: the rule is off).
	RPM *BucketStatus `json:"rpm,omitempty"`
	TPM *BucketStatus `json:"tpm,omitempty"`
	// Quota is the current window of each periodic quota that is on.
	Quota []WindowStatus `json:"quota,omitempty"`
}

// BucketStatus is a token bucket: the limit per minute, what is left and
// the milliseconds until it is full again.
type BucketStatus struct {
	Limit     int64 `json:"limit"`
	Remaining int64 `json:"remaining"`
	ResetMS   int64 `json:"reset_ms"`
}

// WindowStatus is a periodic quota's current window: its bounds in the
// user_limit timezone, what it counted and its maximums (0: no limit).
// Tokens are weighted (the template's token weights).
type WindowStatus struct {
	Period      string  `json:"period"`
	Start       string  `json:"start"`
	End         string  `json:"end"`
	Requests    int64   `json:"requests"`
	MaxRequests int64   `json:"max_requests"`
	Tokens      float64 `json:"tokens"`
	MaxTokens   float64 `json:"max_tokens"`
}

// ErrNoUser is UserStatus's error for a name the configuration does not have.
var ErrNoUser = errors.New("no such user")

// UserStatus returns where the user called name stands now. With Redis it
// reads the shared counters (one round trip, at most 2 s).
func (g *Governor) UserStatus(name string) (UserStatus, error) {
	s := g.snap.Load()
	u := s.users[name]
	if u == nil {
		return UserStatus{}, ErrNoUser
	}
	us := UserStatus{User: name, Enabled: u.enabled, Template: u.tmplName}
	t := u.tmpl
	if t == nil {
		return us, nil
	}
	us.Template, us.DryRun = t.name, t.dry || s.userDry
	now := g.now().UnixNano()
	cs := s.cal.state(now / 1e9)
	// A user without a state has sent no request here: nothing counted,
	// nothing queued (with Redis, other routers' counts are read).
	st := u.st.Load()
	var rpm, tpm bucket
	var win [numPeriods]winCount
	if g.rds != nil {
		var err error
		if rpm, tpm, win, us.Active, err = g.rds.userCounters(name, now); err != nil {
			return UserStatus{}, err
		}
		if st != nil {
			st.mu.Lock()
			us.Queued = st.q.n
			st.mu.Unlock()
		}
	} else if st != nil {
		st.mu.Lock()
		rpm, tpm, win, us.Active, us.Queued = st.rpm, st.tpm, st.win, st.active, st.q.n
		st.mu.Unlock()
	}
	if t.concLimit > 0 {
		us.ConcurrencyLimit = t.concLimit
	} else {
		us.Active = 0 // not counted while the rule is off
	}
	if t.rpm > 0 {
		rpm.refill(t.rpm, now)
		us.RPM = bucketStatus(t.rpm, rpm.level)
	}
	if t.tpm > 0 {
		tpm.refill(t.tpm, now)
		us.TPM = bucketStatus(t.tpm, tpm.level)
	}
	if t.quota {
		for p := range numPeriods {
			w := &t.win[p]
			if !w.on {
				continue
			}
			cw := cs.win[p]
			ws := WindowStatus{Period: periodNames[p],
				Start:       time.Unix(cw.start, 0).In(s.cal.loc).Format(time.RFC3339),
				End:         time.Unix(cw.end, 0).In(s.cal.loc).Format(time.RFC3339),
				MaxRequests: w.maxReq, MaxTokens: float64(w.maxTok) / 1000}
			if c := win[p]; cw.holds(c.start, now/1e9) {
				ws.Requests, ws.Tokens = c.req, float64(c.tok)/1000
			}
			us.Quota = append(us.Quota, ws)
		}
	}
	return us, nil
}

func bucketStatus(capacity int64, level float64) *BucketStatus {
	left, reset := bucketLeft(capacity, level)
	return &BucketStatus{Limit: capacity, Remaining: left, ResetMS: (reset + 999_999) / 1_000_000}
}

// statusScript reads a user's counters: KEYS the user's hash and slot
// set, ARGV now (ms) then the hash's fields. It returns the fields' values
// (nil when absent) and the slots held.
var statusScript = redis.NewScript(`
local v = redis.call('HMGET', KEYS[1], unpack(ARGV, 2))
v[#ARGV] = redis.call('ZCOUNT', KEYS[2], '(' .. ARGV[1], '+inf')
return v
`)

// statusFields are the user hash's fields statusScript reads.
var statusFields = func() []any {
	f := []any{"rl", "rt", "tl", "tt"}
	for p := range numPeriods {
		n := "w" + strconv.Itoa(int(p))
		f = append(f, n+"s", n+"r", n+"k")
	}
	return f
}()

// userCounters reads st's counters from Redis: the buckets as last
// written (the caller refills them to now), the quota windows and the
// slots held. It is queued behind the ends already queued (one round
// trip): a request that ended before it is counted as ended.
func (r *redisState) userCounters(name string, now int64) (rpm, tpm bucket, win [numPeriods]winCount, active int, err error) {
	hk, sk := r.userKeys(name)
	args := append([]any{now / 1e6}, statusFields...)
	v, err := r.call(statusScript, []string{hk, sk}, args...).Slice()
	if err != nil {
		return
	}
	if len(v) != len(statusFields)+1 {
		err = fmt.Errorf("status script returned %d values", len(v))
		return
	}
	num := func(i int) (float64, bool) {
		switch x := v[i].(type) {
		case string:
			f, err := strconv.ParseFloat(x, 64)
			return f, err == nil
		case int64:
			return float64(x), true
		}
		return 0, false
	}
	// Levels are written with their time in ms; a bucket never written is
	// full (bucket.last 0).
	if l, ok := num(0); ok {
		if t, ok := num(1); ok {
			rpm = bucket{level: l, last: int64(t) * 1e6}
		}
	}
	if l, ok := num(2); ok {
		if t, ok := num(3); ok {
			tpm = bucket{level: l, last: int64(t) * 1e6}
		}
	}
	for p := range numPeriods {
		s, ok := num(4 + 3*int(p))
		if !ok {
			continue
		}
		req, _ := num(5 + 3*int(p))
		tok, _ := num(6 + 3*int(p))
		win[p] = winCount{start: int64(s), req: int64(req), tok: int64(tok)}
	}
	n, _ := num(len(statusFields))
	return rpm, tpm, win, int(n), nil
}
