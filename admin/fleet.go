package admin

import "github.com/infera/infera/govern"

// Fleet is what the console shows of the running router. The router
// implements it; every method is called on an admin request (at most a few
// times a second per open console), never on the request path, and must be
// safe for concurrent use.
type Fleet interface {
	// Workers returns one entry per known worker, in a stable order.
	Workers() []WorkerInfo
	// RuleHits returns the hit counters of rules (rate limits, quotas,
	// canary and split rules), dry-run ones included.
	RuleHits() []RuleHit
}

// UsageSource is what a Fleet implements to answer GET
// /api/users/{name}/usage: where a user stands against its template's
// limits (govern.ErrNoUser for a name the router's governance does not
// know).
type UsageSource interface {
	UserUsage(name string) (govern.UserStatus, error)
}

// WorkerInfo is one worker as the fleet page shows it.
type WorkerInfo struct {
	ID      string   `json:"id"`
	URL     string   `json:"url"`
	Models  []string `json:"models"`
	Service string   `json:"service"`
	// Role is mixed, prefill or decode.
	Role string `json:"role"`
	// Status is StatusRoutable, StatusDraining or StatusExcluded.
	Status string `json:"status"`
	// Breaker is closed, open or half-open.
	Breaker string `json:"breaker"`
	// ActiveRequests and ActiveTokens are the worker's load as the
	// scheduler counts it; PendingRequests wait for their first token.
	ActiveRequests  int64 `json:"active_requests"`
	ActiveTokens    int64 `json:"active_tokens"`
	PendingRequests int64 `json:"pending_requests"`
	// KVBlocks is how many KV blocks of the worker the KV index holds; -1
	// when the router keeps no KV index (routing is not kv-aware).
	KVBlocks int64 `json:"kv_blocks"`
	// HitRate is the share (0..1) of prompt blocks routed to this worker
	// that were already cached there; -1 when unknown.
	HitRate float64 `json:"hit_rate"`
	// Requests and Failures count since the worker joined; -1 when the
	// router does not report them.
	Requests int64 `json:"requests"`
	Failures int64 `json:"failures"`
}

// Worker statuses.
const (
	// StatusRoutable: the scheduler may pick the worker.
	StatusRoutable = "routable"
	// StatusDraining: its discovery record says draining; no new requests.
	StatusDraining = "draining"
	// StatusExcluded: no new requests for now, for example while its
	// circuit breaker is open.
	StatusExcluded = "excluded"
)

// RuleHit is one rule's counters.
type RuleHit struct {
	// Rule names the rule, for example "rate_limit_rpm" (the error code a
	// refused client gets) or "canary.rules[0]".
	Rule string `json:"rule"`
	// Result is what the rule decided: ResultPass, ResultBlock,
	// ResultWouldBlock (dry run) or ResultQueued.
	Result string `json:"result"`
	// DryRun is true when the rule was evaluated without blocking.
	DryRun bool   `json:"dry_run"`
	Count  uint64 `json:"count"`
}

// Rule results.
const (
	ResultPass  = "pass"
	ResultBlock = "block"
	// ResultWouldBlock: a dry-run rule that would have blocked.
	ResultWouldBlock = "would_block"
	// ResultQueued: the request waited in the rule's queue.
	ResultQueued = "queued"
)

// noFleet answers when the router has not given a Fleet (yet).
type noFleet struct{}

func (noFleet) Workers() []WorkerInfo { return nil }
func (noFleet) RuleHits() []RuleHit   { return nil }
