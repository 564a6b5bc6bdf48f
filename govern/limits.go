package govern

import "math"

// Limits is a user's requests-per-minute and tokens-per-minute buckets as
// an admission left them (after its pre-deduction; a refused request's as
// they stood): what the answer's x-ratelimit-* headers show
// (docs/governance.md#rate-limit-headers). The zero Limits means that no
// rate applies: the user's template has neither RPM nor TPM, or the
// admission was a dry run (its counters must not make clients slow down).
type Limits struct {
	// RPM and TPM are the template's limits; 0: not limited.
	RPM, TPM int64
	// Requests and Tokens are what is left in the buckets, in whole
	// requests and tokens, never negative.
	Requests, Tokens int64
	// RequestsReset and TokensReset are the nanoseconds until the bucket
	// is full again (buckets refill continuously, the limit per minute).
	RequestsReset, TokensReset int64
}

// Any reports whether some rate applies.
func (l *Limits) Any() bool { return l.RPM > 0 || l.TPM > 0 }

// bucketLeft returns what a bucket of capacity at level holds in whole
// units (>= 0) and the nanoseconds until it is full. A bucket below zero
// (an admission larger than what was left) takes longer than a minute.
func bucketLeft(capacity int64, level float64) (left, reset int64) {
	c := float64(capacity)
	level = min(level, c)
	return int64(math.Floor(max(level, 0))), waitNanos(math.Ceil((c - level) * 60e9 / c))
}

// maxWait bounds a wait, in nanoseconds: 146 years, far past any
// Retry-After (retrySeconds caps it at 68 years), and room to round it up
// without overflow. A bucket far below zero (behind a reservation of a
// huge max_tokens, which a full bucket admits, or charged an engine's
// absurd usage) is centuries away from full; converted unbounded, the
// float overflowed int64 and a refusal told no Retry-After, a reset of 0.
const maxWait = 1 << 62

// waitNanos converts a wait in nanoseconds to int64, bounded by maxWait.
func waitNanos(ns float64) int64 {
	if !(ns < maxWait) { // NaN included
		return maxWait
	}
	return int64(ns)
}

// limitsLocked returns st's buckets under t. They must have been brought
// to now (checkLocked does). Lock must be held.
func (st *userState) limitsLocked(t *template) Limits {
	var l Limits
	if t.rpm > 0 {
		l.RPM = t.rpm
		l.Requests, l.RequestsReset = bucketLeft(t.rpm, st.rpm.level)
	}
	if t.tpm > 0 {
		l.TPM = t.tpm
		l.Tokens, l.TokensReset = bucketLeft(t.tpm, st.tpm.level)
	}
	return l
}

// remoteLimits is limitsLocked for the levels the Redis admission script
// returns: each in whole units, then millionths.
func remoteLimits(t *template, rpm, tpm []int64) Limits {
	var l Limits
	if t.rpm > 0 {
		l.RPM = t.rpm
		l.Requests, l.RequestsReset = bucketLeft(t.rpm, float64(rpm[0])+float64(rpm[1])/1e6)
	}
	if t.tpm > 0 {
		l.TPM = t.tpm
		l.Tokens, l.TokensReset = bucketLeft(t.tpm, float64(tpm[0])+float64(tpm[1])/1e6)
	}
	return l
}

// Limits returns the rate limits as the ticket's admission left them (the
// zero Limits for the zero Ticket). Call it before Done.
func (t Ticket) Limits() Limits {
	if t.ts == nil {
		return Limits{}
	}
	return t.ts.lim
}
