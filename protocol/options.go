package protocol

import (
	"github.com/infera/infera/config"
	"github.com/infera/infera/internal/jsonscan"
)

// ReasoningMode says what happens to a request's reasoning controls.
type ReasoningMode uint8

const (
	// ReasoningPassthrough forwards the client's setting in OpenAI's
	// vocabulary: chat reasoning_effort untouched, Responses reasoning.effort
	// as reasoning_effort, Anthropic thinking as the reasoning_effort its
	// budget maps to.
	ReasoningPassthrough ReasoningMode = iota
	// ReasoningMap rewrites the setting into what the engines understand
	// (ReasoningOptions.Target).
	ReasoningMap
	// ReasoningDrop removes reasoning controls; the engine's default applies.
	ReasoningDrop
)

// ReasoningTarget is the engine-side spelling used by ReasoningMap.
type ReasoningTarget uint8

const (
	// TargetEnableThinking sets chat_template_kwargs.enable_thinking
	// (Qwen3-style chat templates).
	TargetEnableThinking ReasoningTarget = iota
	// TargetReasoningEffort sets reasoning_effort.
	TargetReasoningEffort
	// TargetBoth sets both.
	TargetBoth
)

// effort is a normalised reasoning level.
type effort uint8

const (
	effUnset   effort = iota // the client said nothing
	effOff                   // thinking disabled (Anthropic disabled)
	effOn                    // thinking on at no stated level (Anthropic adaptive)
	effNone                  // reasoning_effort "none"
	effMinimal               // "minimal"
	effLow
	effMedium
	effHigh
	effXHigh
	effOther // a value the router does not know (passthrough forwards it)
)

var effortNames = [...]string{effNone: "none", effMinimal: "minimal", effLow: "low", effMedium: "medium", effHigh: "high", effXHigh: "xhigh"}

func parseEffort(raw []byte) effort {
	var buf [32]byte
	if jsonscan.HasEscape(raw) {
		// As the engine reads it, decoded: "\u006eone" is "none".
		if len(raw) > len(buf) {
			return effOther
		}
		raw = unescape(buf[:0], raw)
	}
	for e := effNone; e <= effXHigh; e++ {
		if string(raw) == effortNames[e] {
			return e
		}
	}
	return effOther
}

// ReasoningOptions is the reasoning-effort mapping table.
type ReasoningOptions struct {
	Mode   ReasoningMode
	Target ReasoningTarget
	// ThinkingOff[e] is true when effort e turns thinking off for the
	// enable_thinking target (indexed by the effort names none..xhigh).
	thinkingOff [effXHigh + 1]bool
	// BudgetLowMax and BudgetMediumMax map Anthropic budget_tokens to an
	// effort (<= low max: low, <= medium max: medium, else high).
	BudgetLowMax, BudgetMediumMax int64
}

// Options steer request conversion. Build them once per config snapshot
// with NewOptions; they are read-only afterwards.
type Options struct {
	// PreserveSystemPosition keeps in-array Anthropic system messages in
	// place; off, all system content goes to the front as one message.
	PreserveSystemPosition bool
	Reasoning              ReasoningOptions
	// LaxStream reads a request's stream as vLLM's pydantic request models
	// read a bool (lax mode, jsonscan.LaxBool: 1, "true", "yes", "on"... are
	// true, 0, "false", "no", "off"... false), refusing what they refuse:
	// the engine's native endpoints, served as vLLM serves them. Off (the
	// router's conversion), stream is a JSON boolean or null, as the
	// Anthropic and OpenAI APIs specify.
	LaxStream bool
}

// readStream reads a request's stream value v (non-empty): whether it asks
// for a stream, or the 400 that refuses it (Options.LaxStream).
func (o *Options) readStream(v []byte) (bool, error) {
	if o.LaxStream {
		switch jsonscan.LaxBool(v) {
		case 't':
			return true, nil
		case 'f':
			return false, nil
		}
		if isNull(v) {
			return false, nil
		}
		// pydantic's wording, as vLLM answers it.
		return false, badRequest("stream", "stream: Input should be a valid boolean, unable to interpret input")
	}
	switch v[0] {
	case 't':
		return true, nil
	case 'f', 'n':
		return false, nil
	}
	return false, badRequest("stream", "stream must be a boolean")
}

// NewOptions builds Options from the config section (validated by config),
// applying the same defaults for empty fields.
func NewOptions(p *config.Protocol) Options {
	o := Options{PreserveSystemPosition: p.PreserveAnthropicSystemPosition}
	switch p.ReasoningEffortMode {
	case config.ReasoningMapMode:
		o.Reasoning.Mode = ReasoningMap
	case config.ReasoningDrop:
		o.Reasoning.Mode = ReasoningDrop
	}
	switch p.ReasoningMap.Target {
	case config.TargetReasoningEffort:
		o.Reasoning.Target = TargetReasoningEffort
	case config.TargetBoth:
		o.Reasoning.Target = TargetBoth
	}
	off := p.ReasoningMap.ThinkingOffEfforts
	if off == nil {
		off = []string{"none", "minimal"}
	}
	for _, s := range off {
		if e := parseEffort([]byte(s)); e <= effXHigh {
			o.Reasoning.thinkingOff[e] = true
		}
	}
	o.Reasoning.BudgetLowMax = int64(p.ReasoningMap.BudgetLowMax)
	o.Reasoning.BudgetMediumMax = int64(p.ReasoningMap.BudgetMediumMax)
	o.Reasoning.fill()
	return o
}

// DefaultOptions are the options of the default configuration.
func DefaultOptions() Options { return NewOptions(&config.Protocol{}) }

func (r *ReasoningOptions) fill() {
	if r.BudgetLowMax <= 0 {
		r.BudgetLowMax = config.DefaultBudgetLowMax
	}
	if r.BudgetMediumMax <= 0 {
		r.BudgetMediumMax = config.DefaultBudgetMediumMax
	}
}

// budgetEffort maps an Anthropic thinking budget to an effort.
func (r *ReasoningOptions) budgetEffort(budget int64) effort {
	low, med := r.BudgetLowMax, r.BudgetMediumMax
	if low <= 0 {
		low = config.DefaultBudgetLowMax
	}
	if med <= 0 {
		med = config.DefaultBudgetMediumMax
	}
	switch {
	case budget <= low:
		return effLow
	case budget <= med:
		return effMedium
	}
	return effHigh
}

// reasoning is a request's reasoning control as the client gave it.
type reasoning struct {
	level effort
	raw   []byte // the raw effort string body (escaped), for effOther
}

// appendFields appends the engine-side fields for the request's level
// (each preceded by a comma) per the options. Passthrough forwards the
// level as reasoning_effort; map writes the target's fields; drop writes
// nothing.
func (r *ReasoningOptions) appendFields(dst []byte, rs reasoning) []byte {
	if rs.level == effUnset {
		return dst
	}
	switch r.Mode {
	case ReasoningDrop:
		return dst
	case ReasoningPassthrough:
		return appendEffortField(dst, rs)
	}
	if r.Target != TargetEnableThinking {
		dst = appendEffortField(dst, rs)
	}
	if r.Target != TargetReasoningEffort {
		dst = append(dst, `,"chat_template_kwargs":{"enable_thinking":`...)
		if r.thinkingOn(rs.level) {
			dst = append(dst, "true}"...)
		} else {
			dst = append(dst, "false}"...)
		}
	}
	return dst
}

func (r *ReasoningOptions) thinkingOn(e effort) bool {
	switch e {
	case effOff:
		return false
	case effOn, effOther:
		return true
	}
	return !r.thinkingOff[e]
}

// appendEffortField appends ,"reasoning_effort":"<level>" when the level is
// an effort (not plain on/off).
func appendEffortField(dst []byte, rs reasoning) []byte {
	switch {
	case rs.level >= effNone && rs.level <= effXHigh:
		dst = append(dst, `,"reasoning_effort":"`...)
		dst = append(dst, effortNames[rs.level]...)
		return append(dst, '"')
	case rs.level == effOther:
		dst = append(dst, `,"reasoning_effort":"`...)
		dst = append(dst, rs.raw...)
		return append(dst, '"')
	}
	return dst
}

// RewriteChatReasoning applies the reasoning mode to a chat completions
// body. It returns body itself when nothing changes (passthrough, or no
// reasoning_effort in the body), else the rewritten body appended to dst.
//
// map: reasoning_effort becomes the target's fields (it stays for the
// reasoning_effort and both targets); an explicit
// chat_template_kwargs.enable_thinking from the client is kept as is.
// drop: reasoning_effort is removed (chat_template_kwargs, an engine-level
// choice of the client, is left alone).
//
// The body must be a JSON object; otherwise an *Error is returned.
func RewriteChatReasoning(dst, body []byte, r *ReasoningOptions) ([]byte, error) {
	if r.Mode == ReasoningPassthrough || (r.Mode == ReasoningMap && r.Target == TargetReasoningEffort) {
		return body, nil
	}
	start := skipSpace(body, 0)
	if start >= len(body) || body[start] != '{' {
		return body, errNotObject
	}
	var last []byte
	kwIdx, idx := -1, 0
	end, err := walkObject(body, start, 0, func(key []byte, vs, ve int) error {
		switch string(key) {
		case "reasoning_effort":
			last = body[vs:ve]
		case "chat_template_kwargs":
			kwIdx = idx
		}
		idx++
		return nil
	})
	if err != nil || skipSpace(body, end) != len(body) {
		return body, errMalformedBody
	}
	if last == nil {
		return body, nil
	}
	var rs reasoning
	if !isNull(last) {
		raw, ok := rawStr(last)
		if !ok {
			return body, badRequest("reasoning_effort", "reasoning_effort must be a string")
		}
		rs.level, rs.raw = parseEffort(raw), raw
	}
	setKw := r.Mode == ReasoningMap && rs.level != effUnset
	on := r.thinkingOn(rs.level)
	out := append(dst, '{')
	n := 0
	prevEnd := start + 1
	idx = 0
	walkObject(body, start, 0, func(key []byte, vs, ve int) error {
		ks := skipSpace(body, prevEnd)
		if body[ks] == ',' {
			ks = skipSpace(body, ks+1)
		}
		prevEnd = ve
		i := idx
		idx++
		if string(key) == "reasoning_effort" {
			return nil
		}
		if n > 0 {
			out = append(out, ',')
		}
		n++
		if i == kwIdx && setKw && body[vs] == '{' {
			out = append(out, body[ks:vs]...)
			if hasMember(body[vs:ve], "enable_thinking") {
				out = append(out, body[vs:ve]...)
			} else {
				out = append(out, `{"enable_thinking":`...)
				out = appendBool(out, on)
				if j := skipSpace(body, vs+1); body[j] != '}' {
					out = append(out, ',')
					out = append(out, body[j:ve]...)
				} else {
					out = append(out, '}')
				}
			}
			setKw = false
			return nil
		}
		out = append(out, body[ks:ve]...)
		return nil
	})
	if r.Mode == ReasoningMap && rs.level != effUnset {
		if r.Target == TargetBoth {
			mark := len(out)
			out = appendEffortField(out, rs)
			if n == 0 {
				out = dropLeadingComma(out, mark)
			}
			n++
		}
		if setKw && kwIdx < 0 {
			if n > 0 {
				out = append(out, ',')
			}
			out = append(out, `"chat_template_kwargs":{"enable_thinking":`...)
			out = appendBool(out, on)
			out = append(out, '}')
		}
	}
	return append(out, '}'), nil
}

// dropLeadingComma removes a comma at out[at].
func dropLeadingComma(out []byte, at int) []byte {
	if at < len(out) && out[at] == ',' {
		copy(out[at:], out[at+1:])
		out = out[:len(out)-1]
	}
	return out
}

func appendBool(dst []byte, b bool) []byte {
	if b {
		return append(dst, "true"...)
	}
	return append(dst, "false"...)
}

// hasMember reports whether the object obj has the key.
func hasMember(obj []byte, key string) bool {
	found := false
	fields(obj, func(k []byte, vs, ve int) error {
		if string(k) == key {
			found = true
		}
		return nil
	})
	return found
}
