package sched

// Layer names what chose the worker of a Decision.
type Layer uint8

// Layers, in pipeline order.
const (
	LayerNone     Layer = iota
	LayerDirect         // router mode direct: the header named the worker
	LayerAffinity       // layer 1: session affinity
	LayerKV             // layer 2 with the KV index as match basis (kv-aware)
	LayerPrefix         // layer 2: prefix caching over the prefix index
	LayerLB             // layer 3: load balancing
	LayerFallback       // local round-robin / forced dispatch
	numLayers
)

var layerNames = [numLayers]string{"none", "direct", "affinity", "kv", "prefix", "lb", "fallback"}

func (l Layer) String() string {
	if l < numLayers {
		return layerNames[l]
	}
	return "unknown"
}

// Reason says why a layer decided (or why earlier layers passed).
type Reason uint8

// Reasons a Decision may carry.
const (
	ReasonNone              Reason = iota
	ReasonHeader                   // direct: worker named by header
	ReasonAffinityHit              // bound worker reused
	ReasonPrefixHit                // prefix hit, see Decision.Ratio
	ReasonKVHit                    // KV scorer chose
	ReasonNoSession                // affinity on, request without session id
	ReasonAffinityNew              // session not bound yet (bound now)
	ReasonAffinityRebind           // bound worker left, is open or not a candidate
	ReasonAffinityOverload         // soft mode: bound worker above avg x ratio; or its seats are full (kept bound)
	ReasonPrefixMiss               // no indexed prefix
	ReasonPrefixBelow              // match below the hit rate threshold
	ReasonPrefixOverload           // every hit worker failed a load guard
	ReasonSchedTimeout             // decision exceeded the wait timeout
	ReasonSchedBreakerOpen         // the scheduling breaker is open
	ReasonAllBreakersOpen          // every candidate's breaker is open
	ReasonWorkerBreakerBusy        // chosen worker's probe slot was taken
	numReasons
)

var reasonNames = [numReasons]string{"", "header", "affinity-hit", "prefix-hit", "kv-hit", "no-session",
	"affinity-new", "affinity-rebind", "affinity-overloaded", "prefix-miss", "prefix-below-threshold",
	"prefix-overloaded", "sched-timeout", "sched-breaker-open", "all-breakers-open", "worker-probe-busy"}

func (r Reason) String() string {
	if r < numReasons {
		return reasonNames[r]
	}
	return "unknown"
}

// Policy is --router-policy: how auto mode scores workers.
type Policy uint8

// Policies.
const (
	PolicyKVAware Policy = iota
	PolicyRoundRobin
	PolicyLeastRequests
	PolicyLeastTokens
	PolicyConfig // layer 3 algorithm from the config's load_balancing section
)

// ParsePolicy maps a --router-policy value to a Policy.
func ParsePolicy(s string) (Policy, bool) {
	switch s {
	case "kv-aware":
		return PolicyKVAware, true
	case "round-robin":
		return PolicyRoundRobin, true
	case "least-requests":
		return PolicyLeastRequests, true
	case "least-tokens":
		return PolicyLeastTokens, true
	case "config":
		return PolicyConfig, true
	}
	return PolicyKVAware, false
}

func (p Policy) String() string {
	switch p {
	case PolicyRoundRobin:
		return "round-robin"
	case PolicyLeastRequests:
		return "least-requests"
	case PolicyLeastTokens:
		return "least-tokens"
	case PolicyConfig:
		return "config"
	}
	return "kv-aware"
}

// balancer returns the fixed layer-3 algorithm of a load-balancing policy.
func (p Policy) balancer() (Balancer, bool) {
	switch p {
	case PolicyRoundRobin:
		return RoundRobin, true
	case PolicyLeastRequests:
		return LeastRequests, true
	case PolicyLeastTokens:
		return LeastTokens, true
	}
	return 0, false
}

// Mode is --router-mode: who decides.
type Mode uint8

// Router modes.
const (
	ModeAuto   Mode = iota // select in-process
	ModeDirect             // trust x-worker-instance-id (GAIE endpoint picker)
)

// ParseMode maps a --router-mode value to a Mode.
func ParseMode(s string) (Mode, bool) {
	switch s {
	case "auto":
		return ModeAuto, true
	case "direct":
		return ModeDirect, true
	}
	return ModeAuto, false
}

func (m Mode) String() string {
	if m == ModeDirect {
		return "direct"
	}
	return "auto"
}
