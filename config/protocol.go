package config

import (
	"fmt"
	"time"
)

// Protocol is the "Protocol and conversion" section (JSON "protocol"): which
// client protocols the engines speak natively, how the others are converted
// to chat completions, streaming usage and reasoning-effort mapping. The
// reference is docs/protocols.md.
type Protocol struct {
	// ResponsesPassthrough: the engines serve POST /v1/responses themselves;
	// the router forwards the body byte for byte. Off (default), Responses
	// requests are converted to chat completions and back.
	ResponsesPassthrough bool `json:"responses_passthrough"`
	// AnthropicPassthrough: the engines serve POST /v1/messages (and
	// /v1/messages/count_tokens) themselves, as vLLM does. Off (default),
	// Messages requests are converted to chat completions and back.
	AnthropicPassthrough bool `json:"anthropic_passthrough"`
	// PreserveAnthropicSystemPosition keeps system messages that stand
	// inside an Anthropic messages array where they stand. Off (default),
	// all system content (the top-level system field first, then in-array
	// system messages in order) becomes one system message at the front, as
	// most chat templates require.
	PreserveAnthropicSystemPosition bool `json:"preserve_anthropic_system_position"`
	// ForceStreamUsage relays the engine's final usage chunk to every
	// streaming chat client, even one that did not set
	// stream_options.include_usage. The router always asks the engine for
	// usage; off (default), the usage chunk is removed for clients that did
	// not ask.
	ForceStreamUsage bool `json:"force_stream_usage"`
	// ReasoningEffortMode is passthrough (default), map or drop; see
	// docs/protocols.md for the table. "" means passthrough.
	ReasoningEffortMode string `json:"reasoning_effort_mode"`
	// ReasoningMap tunes the map mode (and the Anthropic thinking budget
	// thresholds used by every mode).
	ReasoningMap ReasoningMap `json:"reasoning_map"`
	// ResponsesStateTTLSeconds is how long the state store (--state redis)
	// keeps the record of a stored Response's id (which engine holds it,
	// for whom) after the create that made it, so that other routers find
	// it (docs/protocols.md, "Stored responses across routers"). A change
	// applies to the records made after it. 0 means the default, a day
	// (DefaultResponsesStateTTLSeconds).
	ResponsesStateTTLSeconds float64 `json:"responses_state_ttl_s"`
}

// Bounds of protocol.responses_state_ttl_s: a record shorter than a minute
// would be gone before a background response's first polls, one longer
// than 30 days outlives any engine's store (vLLM keeps its responses in
// memory) while Redis holds it.
const (
	DefaultResponsesStateTTLSeconds = 86400
	MinResponsesStateTTLSeconds     = 60
	MaxResponsesStateTTLSeconds     = 30 * 86400
)

// ResponsesStateTTL is protocol.responses_state_ttl_s as a Duration, its
// default for 0.
func (p *Protocol) ResponsesStateTTL() time.Duration {
	s := p.ResponsesStateTTLSeconds
	if s == 0 {
		s = DefaultResponsesStateTTLSeconds
	}
	return time.Duration(s * float64(time.Second))
}

// ReasoningMap is the reasoning-effort mapping table.
type ReasoningMap struct {
	// Target is what the engines understand in map mode:
	//   enable_thinking: chat_template_kwargs.enable_thinking (Qwen3-style
	//     templates; default)
	//   reasoning_effort: the OpenAI reasoning_effort field (gpt-oss)
	//   both: both fields
	Target string `json:"target"`
	// ThinkingOffEfforts are the reasoning_effort values that turn thinking
	// off for the enable_thinking target. Default ["none", "minimal"].
	ThinkingOffEfforts []string `json:"thinking_off_efforts"`
	// BudgetLowMax and BudgetMediumMax map an Anthropic thinking budget to
	// an effort: budget_tokens <= BudgetLowMax is low, <= BudgetMediumMax
	// medium, above that high. Defaults 4096 and 16384.
	BudgetLowMax    int `json:"budget_low_max"`
	BudgetMediumMax int `json:"budget_medium_max"`
}

// Reasoning effort modes.
const (
	ReasoningPassthrough = "passthrough"
	ReasoningMapMode     = "map"
	ReasoningDrop        = "drop"
)

// Reasoning map targets.
const (
	TargetEnableThinking  = "enable_thinking"
	TargetReasoningEffort = "reasoning_effort"
	TargetBoth            = "both"
)

// ReasoningEfforts are the reasoning_effort values the router knows.
var ReasoningEfforts = []string{"none", "minimal", "low", "medium", "high", "xhigh"}

// Default budget thresholds.
const (
	DefaultBudgetLowMax    = 4096
	DefaultBudgetMediumMax = 16384
)

// defaultProtocol is the section's defaults (Default() sets
// Protocol: defaultProtocol()).
func defaultProtocol() Protocol {
	return Protocol{
		ReasoningEffortMode: ReasoningPassthrough,
		ReasoningMap: ReasoningMap{
			Target:             TargetEnableThinking,
			ThinkingOffEfforts: []string{"none", "minimal"},
			BudgetLowMax:       DefaultBudgetLowMax,
			BudgetMediumMax:    DefaultBudgetMediumMax,
		},
		ResponsesStateTTLSeconds: DefaultResponsesStateTTLSeconds,
	}
}

// validate checks the section. Empty mode and target and zero budgets
// stand for their defaults (a document may set only some fields of the
// section; the protocol package applies the same defaults).
func (p *Protocol) validate() error {
	switch p.ReasoningEffortMode {
	case "", ReasoningPassthrough, ReasoningMapMode, ReasoningDrop:
	default:
		return fieldErr("protocol.reasoning_effort_mode", "%q: want passthrough, map or drop", p.ReasoningEffortMode)
	}
	m := &p.ReasoningMap
	switch m.Target {
	case "", TargetEnableThinking, TargetReasoningEffort, TargetBoth:
	default:
		return fieldErr("protocol.reasoning_map.target", "%q: want enable_thinking, reasoning_effort or both", m.Target)
	}
	for i, e := range m.ThinkingOffEfforts {
		if !knownEffort(e) {
			return fieldErr(fmt.Sprintf("protocol.reasoning_map.thinking_off_efforts[%d]", i), "%q: want one of none, minimal, low, medium, high, xhigh", e)
		}
	}
	if m.BudgetLowMax < 0 || m.BudgetLowMax > 1<<30 {
		return fieldErr("protocol.reasoning_map.budget_low_max", "must be in [0, %d]", 1<<30)
	}
	if m.BudgetMediumMax < 0 || m.BudgetMediumMax > 1<<30 {
		return fieldErr("protocol.reasoning_map.budget_medium_max", "must be in [0, %d]", 1<<30)
	}
	if ttl := p.ResponsesStateTTLSeconds; ttl != 0 && !(ttl >= MinResponsesStateTTLSeconds && ttl <= MaxResponsesStateTTLSeconds) {
		return fieldErr("protocol.responses_state_ttl_s", "%g: want 0 (the default, %d) or [%d, %d] s", ttl,
			DefaultResponsesStateTTLSeconds, MinResponsesStateTTLSeconds, MaxResponsesStateTTLSeconds)
	}
	low, med := m.BudgetLowMax, m.BudgetMediumMax
	if low == 0 {
		low = DefaultBudgetLowMax
	}
	if med == 0 {
		med = DefaultBudgetMediumMax
	}
	if med <= low {
		return fieldErr("protocol.reasoning_map.budget_medium_max", "%d must be above budget_low_max (%d)", med, low)
	}
	return nil
}

func knownEffort(e string) bool {
	for _, k := range ReasoningEfforts {
		if e == k {
			return true
		}
	}
	return false
}
