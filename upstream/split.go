package upstream

import (
	"math/bits"
	"strings"
	"sync/atomic"

	"github.com/infera/infera/config"
)

// Plan appends to dst the indexes (into sp.Proxies) of the proxies to try
// for a request for model, in order, and returns it:
//
//  1. the primary choice. Under the weight strategy, an enabled proxy with
//     a positive weight chosen by r (a uniformly distributed value: use
//     Splitter.Next or a random number), with probability weight/sum.
//     Under the prefix strategy, the first enabled proxy in list order with
//     a model rule matching model (see MatchRule); when none matches, the
//     first local service entry (the list holds at least one; several let
//     local rules sit before and after external ones).
//  2. the failover targets: the enabled, failover-flagged external
//     proxies in list order, the primary excluded. The local service is
//     never a failover target.
//
// Disabled proxies never appear. The result is empty only when every proxy
// is disabled or weightless and none is a failover target; the caller then
// answers as when no worker is routable. Plan does not allocate when dst
// has room; it reads sp, an immutable config snapshot, and nothing else, so
// a reload takes effect on the next request.
//
// The caller tries the entries in order, moving on when one is unavailable
// (breaker open) or fails before the first response byte was relayed.
func Plan(dst []int, sp *config.SplitProxy, model []byte, r uint64) []int {
	primary := -1
	switch sp.Strategy {
	case config.SplitPrefix:
		primary = matchPrefix(sp, model)
	default: // weight; config validation refuses anything else
		primary = pickWeighted(sp, r, 0)
	}
	return PlanFrom(dst, sp, primary)
}

// PlanDrawn is Plan under the weight strategy with the entries of down
// (bit i is sp.Proxies[i]; the first 64 entries) left out of the primary
// draw: unavailable external entries (breaker open), whose share goes to
// the others by their weights, as a load balancer skips a server it
// marked down. When every weighted entry is down the draw is Plan's. The
// failover targets are Plan's too (a down one is skipped when tried). It
// does not allocate when dst has room.
func PlanDrawn(dst []int, sp *config.SplitProxy, r, down uint64) []int {
	primary := -1
	if down != 0 {
		primary = pickWeighted(sp, r, down)
	}
	if primary < 0 {
		primary = pickWeighted(sp, r, 0)
	}
	return PlanFrom(dst, sp, primary)
}

// PlanFrom is Plan with the primary choice given (-1: none): primary, then
// the failover targets. The split proxy gives the entry a session started
// on under the weight strategy (session affinity on). It does not
// allocate when dst has room.
func PlanFrom(dst []int, sp *config.SplitProxy, primary int) []int {
	if primary >= 0 {
		dst = append(dst, primary)
	}
	for i := range sp.Proxies {
		p := &sp.Proxies[i]
		if i != primary && p.Failover && !p.Local && p.Active() {
			dst = append(dst, i)
		}
	}
	return dst
}

func matchPrefix(sp *config.SplitProxy, model []byte) int {
	local := -1
	for i := range sp.Proxies {
		p := &sp.Proxies[i]
		if !p.Active() {
			continue
		}
		if p.Local && local < 0 {
			local = i // the first local entry takes what no rule matches
		}
		for _, rule := range p.ModelRules {
			if MatchRule(rule, model) {
				return i
			}
		}
	}
	return local
}

// pickWeighted draws an enabled entry with a positive weight, leaving out
// the entries of skip (bit i: entry i); -1 when none is left.
func pickWeighted(sp *config.SplitProxy, r, skip uint64) int {
	drawn := func(i int) bool {
		p := &sp.Proxies[i]
		return p.Active() && p.Weight > 0 && (i >= 64 || skip&(1<<i) == 0)
	}
	total := uint64(0)
	for i := range sp.Proxies {
		if drawn(i) {
			total += uint64(sp.Proxies[i].Weight)
		}
	}
	if total == 0 {
		return -1
	}
	// r as a fraction of 2^64, scaled to [0, total).
	x, _ := bits.Mul64(r, total)
	for i := range sp.Proxies {
		p := &sp.Proxies[i]
		if !drawn(i) {
			continue
		}
		if x < uint64(p.Weight) {
			return i
		}
		x -= uint64(p.Weight)
	}
	panic("BUG: weighted pick out of range")
}

// Splitter yields the r values of Plan for the weight strategy: the
// fractional parts of n*phi (golden ratio) for n = 1, 2, ..., a
// low-discrepancy sequence. Any run of N consecutive requests is split by
// the weights to within a few requests (not by chance, as a random r
// would), and interleaved rather than in bursts. It keeps no per-weight
// state, so a reload changing weights takes effect on the next request.
// Safe for concurrent use; the zero value is ready.
type Splitter struct {
	n atomic.Uint64
}

// golden is 2^64 / phi.
const golden = 0x9E3779B97F4A7C15

// Next returns the next r for Plan.
func (s *Splitter) Next() uint64 { return s.n.Add(1) * golden }

// MatchRule reports whether a split proxy model rule matches model,
// ignoring ASCII case: a rule containing '*' is an anchored wildcard
// pattern ('*' matches any run, possibly empty), a rule without '*'
// matches the models that start with it ("qwen" matches "Qwen2.5-72B").
// Surrounding spaces of the rule are ignored. It does not allocate.
func MatchRule(rule string, model []byte) bool {
	rule = strings.TrimSpace(rule)
	if strings.IndexByte(rule, '*') < 0 {
		return len(model) >= len(rule) && equalFold(rule, model[:len(rule)])
	}
	return MatchGlob(rule, model)
}

// MatchGlob reports whether the anchored, ASCII-case-insensitive pattern
// ('*' matches any run) matches s. It does not allocate.
func MatchGlob(pattern string, s []byte) bool {
	pi, si := 0, 0
	star, mark := -1, 0
	for si < len(s) {
		switch {
		case pi < len(pattern) && pattern[pi] == '*':
			star, mark = pi, si
			pi++
		case pi < len(pattern) && lower(pattern[pi]) == lower(s[si]):
			pi++
			si++
		case star >= 0:
			pi = star + 1
			mark++
			si = mark
		default:
			return false
		}
	}
	for pi < len(pattern) && pattern[pi] == '*' {
		pi++
	}
	return pi == len(pattern)
}

func equalFold(a string, b []byte) bool {
	if len(a) != len(b) {
		return false
	}
	for i := 0; i < len(a); i++ {
		if lower(a[i]) != lower(b[i]) {
			return false
		}
	}
	return true
}

func lower(c byte) byte {
	if c >= 'A' && c <= 'Z' {
		return c + 'a' - 'A'
	}
	return c
}
