package govern

import (
	"sync/atomic"

	"github.com/VictoriaMetrics/metrics"
)

// Hit results.
const (
	resRejected = iota
	resDryRun
	resQueued
	numResults
)

var resultNames = [numResults]string{"rejected", "dry_run", "queued"}

// hitCounters[code][result], resolved once: infera_user_limit_hits_total
// for user rules, infera_rate_limit_hits_total for seats.
var hitCounters [numCodes][numResults]*metrics.Counter

var (
	mAuthUnknown  = metrics.NewCounter(`infera_user_auth_failures_total{reason="unknown_key"}`)
	mAuthDisabled = metrics.NewCounter(`infera_user_auth_failures_total{reason="disabled"}`)

	userQueued    atomic.Int64
	seatQueued    atomic.Int64
	userQueueWait = metrics.NewHistogram(`infera_user_limit_queue_wait_seconds`)
	seatQueueWait = metrics.NewHistogram(`infera_rate_limit_queue_wait_seconds`)

	mStateErrors = metrics.NewCounter(`infera_governance_state_errors_total`)
	// mStateRoundTrips counts the dispatcher's pipelines (each one round
	// trip to Redis; heartbeats and the pub/sub connection aside).
	mStateRoundTrips = metrics.NewCounter(`infera_governance_state_round_trips_total`)
	mStateFailOpen   = metrics.NewCounter(`infera_governance_state_fail_total{mode="open"}`)
	mStateFailShut   = metrics.NewCounter(`infera_governance_state_fail_total{mode="closed"}`)
	// mStateUndone counts the returns queued for calls that failed after
	// they were sent (which may have run, or still run when Redis reads
	// them): a seat's (undoSeat), an admission's (unadmit).
	mStateUndone = metrics.NewCounter(`infera_governance_state_undone_total`)
	// mStateSettleExpired counts the settlements of requests (finishLua)
	// that failed ambiguously and did not land within settleResend: no
	// longer sent, lest a copy count twice. mStateSettleEvicted counts the
	// settlements (finishLua, and the returns of admissions: endUnadmit)
	// evicted from a full resend queue (maxRedo).
	mStateSettleExpired = metrics.NewCounter(`infera_governance_state_settlements_dropped_total{reason="expired"}`)
	mStateSettleEvicted = metrics.NewCounter(`infera_governance_state_settlements_dropped_total{reason="evicted"}`)
	// mStateReleaseExpired and mStateReleaseEvicted count the ends that
	// return a concurrency slot or a seat (a release, the return of a
	// member whose renewal or call failed, a settlement or an admission's
	// return holding a slot or seat) dropped the same ways: the slot or
	// seat stays taken in Redis until its lease expires (LeaseTTL after
	// its last renewal, which came before its return).
	mStateReleaseExpired = metrics.NewCounter(`infera_governance_state_releases_dropped_total{reason="expired"}`)
	mStateReleaseEvicted = metrics.NewCounter(`infera_governance_state_releases_dropped_total{reason="evicted"}`)
	// mStateSettleClosed and mStateReleaseClosed count the settlements
	// and the returns of slots and seats the router closed without
	// sending: its last pipeline failed, or their request ended after
	// Close.
	mStateSettleClosed  = metrics.NewCounter(`infera_governance_state_settlements_dropped_total{reason="closed"}`)
	mStateReleaseClosed = metrics.NewCounter(`infera_governance_state_releases_dropped_total{reason="closed"}`)
	// mStateStalled counts the calls failed at once while Redis was
	// stalled (a pipeline timed out less than a second before).
	mStateStalled = metrics.NewCounter(`infera_governance_state_stalled_total`)

	heldSeats [3]atomic.Int64 // all governors of the process
)

func init() {
	for c := CodeOutsidePeriod; c < CodeStateUnavailable; c++ {
		family := "infera_user_limit_hits_total"
		if c >= CodeConcurrencyOverall {
			family = "infera_rate_limit_hits_total"
		}
		for r := range numResults {
			hitCounters[c][r] = metrics.NewCounter(family + `{rule="` + c.String() + `",result="` + resultNames[r] + `"}`)
		}
	}
	metrics.NewGauge(`infera_user_limit_queue_length`, func() float64 { return float64(userQueued.Load()) })
	metrics.NewGauge(`infera_rate_limit_queue_length`, func() float64 { return float64(seatQueued.Load()) })
	for i, ph := range []string{"overall", "prefill", "decode"} {
		metrics.NewGauge(`infera_rate_limit_seats{counter="`+ph+`"}`, func() float64 { return float64(heldSeats[i].Load()) })
	}
}

// hit counts a rule that would refuse a request.
func hit(c Code, dry bool) {
	if c == CodeNone || c >= numCodes || hitCounters[c][0] == nil {
		return
	}
	if dry {
		hitCounters[c][resDryRun].Inc()
	} else {
		hitCounters[c][resRejected].Inc()
	}
}

// hits counts every rule of f.
func hits(f failures, dry bool) {
	for c := Code(0); f != 0 && c < numCodes; c++ {
		if f.has(c) {
			hit(c, dry)
			f &^= 1 << c
		}
	}
}

func hitQueued(c Code) {
	if c < numCodes && hitCounters[c][resQueued] != nil {
		hitCounters[c][resQueued].Inc()
	}
}

// userMetrics are the per-user series (for the first
// user_limit.metrics_max_users users).
type userMetrics struct {
	names    [3]string
	requests *metrics.Counter
	rejects  *metrics.Counter
	tokens   *metrics.FloatCounter
}

func newUserMetrics(s *metrics.Set, name string) *userMetrics {
	m := &userMetrics{names: [3]string{
		`infera_user_requests_total{user="` + name + `"}`,
		`infera_user_rejections_total{user="` + name + `"}`,
		`infera_user_quota_tokens_total{user="` + name + `"}`,
	}}
	m.requests = s.NewCounter(m.names[0])
	m.rejects = s.NewCounter(m.names[1])
	m.tokens = s.NewFloatCounter(m.names[2])
	return m
}

func (m *userMetrics) unregister(s *metrics.Set) {
	for _, n := range m.names {
		s.UnregisterMetric(n)
	}
}

func (u *User) rejected() {
	if u.m != nil {
		u.m.rejects.Inc()
	}
}
